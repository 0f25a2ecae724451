"""The word LM (a normalized Kneser-Ney model in ARPA form) and the streaming CTC beam search."""

from __future__ import annotations

import math

import pytest
import torch

from streamasr.decoding import BLANK, BeamOptions
from streamasr.lm import build_arpa

SENTENCES = [s.split() for s in ["a dog runs", "a dog sits", "the dog runs fast", "a cat sits"]]


def kenlm(path, words):
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    vocab = Dictionary()
    for word in words:
        vocab.add_entry(word)
    return KenLM(str(path), vocab), vocab


def log10_prob(lm, vocab, context, word):
    state = lm.start(False)
    for w in context:
        state, _ = lm.score(state, vocab.get_index(w))
    return lm.finish(state)[1] if word == "</s>" else lm.score(state, vocab.get_index(word))[1]


@pytest.mark.parametrize("order", [2, 3])
def test_arpa_probabilities_sum_to_one(tmp_path, order):
    sizes = build_arpa(SENTENCES, tmp_path / "lm.arpa", order)
    assert sizes[1] == 10  # 7 words, </s>, <unk> and <s> (a context only)
    words = sorted({w for s in SENTENCES for w in s}) + ["<unk>", "</s>"]
    lm, vocab = kenlm(tmp_path / "lm.arpa", words)
    for context in ([], ["a"], ["a", "dog"], ["dog", "runs"], ["cat", "runs"], ["<unk>"]):
        total = sum(10 ** log10_prob(lm, vocab, context, w) for w in words)
        assert total == pytest.approx(1.0, abs=1e-5), context


def test_seen_continuations_beat_unseen_ones(tmp_path):
    build_arpa(SENTENCES, tmp_path / "lm.arpa", 3)
    words = sorted({w for s in SENTENCES for w in s}) + ["<unk>", "</s>"]
    lm, vocab = kenlm(tmp_path / "lm.arpa", words)
    assert log10_prob(lm, vocab, ["a", "dog"], "runs") > log10_prob(lm, vocab, ["a", "dog"], "fast")
    assert log10_prob(lm, vocab, [], "dog") > log10_prob(lm, vocab, [], "fast")


def spelled(bundle, words: list[str], noise: float, seed: int) -> torch.Tensor:
    """CTC log-probs that spell `words` (each piece for 2 frames, blanks between) under noise."""
    frames = [BLANK] * 3
    for word in words:
        for piece in bundle.en.encode(word):
            frames += [piece, piece, BLANK]
    frames += [BLANK] * 3
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(frames), len(bundle.en), generator=gen) * noise
    logits[torch.arange(len(frames)), torch.tensor(frames)] += 6.0
    return logits.log_softmax(-1)


@pytest.mark.parametrize("chunk", [1, 4, 9])
def test_streaming_beam_search_equals_the_whole_utterance_search(tiny_lm_bundle, chunk):
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=1.0, seed=chunk)
    search = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, commit_ms=None))
    whole = search.decode(log_probs)
    assert whole == words
    search.begin()
    streamed, emitted_at = [], []
    for start in range(0, log_probs.shape[0], chunk):
        new = search.step(log_probs[start : start + chunk])
        streamed += new
        emitted_at += [start] * len(new)
    streamed += search.end()
    assert streamed == whole  # words emitted while streaming are never revised
    assert emitted_at and emitted_at[0] < log_probs.shape[0] // 2  # and come before the end


def test_the_lexicon_repairs_a_misspelling(tiny_lm_bundle):
    """The frames of 'n' in 'snow' favour 'w' ('swow'): greedy spells it, the search cannot."""
    from streamasr.decoding import ctc_greedy_tokens

    en = tiny_lm_bundle.en
    words = "two dogs play in the snow".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=0.0, seed=0)
    n, w = en.sp.piece_to_id("n"), en.sp.piece_to_id("w")
    frames = log_probs.argmax(-1) == n
    assert frames.any()
    log_probs[frames, w] = log_probs[frames, n] + 1.0
    assert en.decode(ctc_greedy_tokens(log_probs)).split()[-1] == "swow"
    search = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8))
    assert search.decode(log_probs) == words


@pytest.mark.parametrize("chunk", [1, 4])
def test_a_commit_lookback_bounds_the_delay_of_every_word(tiny_lm_bundle, chunk):
    """Without it a word waits until the whole beam agrees; with it, at most the lookback."""
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=1.0, seed=chunk)
    last_frame, frame = [], 3  # frame of each word's last piece, as `spelled` lays them out
    for word in words:
        frame += 3 * len(tiny_lm_bundle.en.encode(word))
        last_frame.append(frame - 2)
    frame_ms = tiny_lm_bundle.config.frame_ms
    lookback = 4
    search = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, commit_ms=lookback * frame_ms))
    search.begin()
    streamed, seen = [], []  # seen: frames read when each word was emitted
    for start in range(0, log_probs.shape[0], chunk):
        new = search.step(log_probs[start : start + chunk])
        streamed += new
        seen += [min(start + chunk, log_probs.shape[0])] * len(new)
    streamed += search.end()
    assert streamed == words
    assert all(s - 1 - f <= lookback + chunk + 2 for s, f in zip(seen, last_frame))


def tiny_word_rnn(words, layers=2, seed=0):
    from streamasr.word_rnn import WordRnn, WordRnnConfig

    torch.manual_seed(seed)
    return WordRnn(words, WordRnnConfig(dim=16, layers=layers, dropout=0.0)).eval()


def test_word_rnn_steps_equal_the_whole_sentence():
    """One word at a time (numpy, for the search) equals the whole sentence (torch)."""
    rnn = tiny_word_rnn(["a", "dog", "runs", "cat"])
    ids = rnn.encode("a dog runs a cat".split())
    with torch.inference_mode():
        whole = rnn(torch.tensor([ids]))[0].log_softmax(-1)
    state = rnn.init_state()
    for t, word in enumerate(ids[:-1]):
        log10_probs, state = rnn.step(word, state)
        torch.testing.assert_close(
            torch.from_numpy(log10_probs), whole[t] / math.log(10), atol=1e-5, rtol=0
        )


def test_word_rnn_learns_its_sentences_and_round_trips(tmp_path):
    from streamasr.word_rnn import WordRnn, perplexity, train_word_rnn

    words = sorted({w for s in SENTENCES for w in s})
    rnn = tiny_word_rnn(words, layers=1)
    before = perplexity(rnn, SENTENCES)
    history = train_word_rnn(rnn, SENTENCES * 8, SENTENCES, epochs=3, lr=1e-2, batch_sentences=4)
    assert len(history) == 3 and perplexity(rnn, SENTENCES) == pytest.approx(min(history))
    assert min(history) < before / 2
    rnn.save(tmp_path / "rnn.safetensors")
    loaded = WordRnn.load(tmp_path / "rnn.safetensors")
    assert loaded.words == rnn.words
    ids = torch.tensor([rnn.encode(["a", "cat", "runs"])])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids), rnn(ids), atol=0, rtol=0)


@pytest.fixture(scope="module")
def tiny_rnn_bundle(tiny_lm_bundle, tmp_path_factory):
    """The tiny LM folder plus a (seeded, untrained) word LSTM over its lexicon."""
    import shutil

    from streamasr.bundle import load_bundle
    from streamasr.lm import LEXICON_FILE
    from streamasr.word_rnn import WORD_RNN_FILE

    folder = tmp_path_factory.mktemp("tiny_rnn_model")
    shutil.copytree(tiny_lm_bundle.lm_folder, folder, dirs_exist_ok=True)
    words = [line.split("\t")[0] for line in open(folder / LEXICON_FILE, encoding="utf-8")]
    tiny_word_rnn(words).save(folder / WORD_RNN_FILE)
    return load_bundle(folder)


@pytest.mark.parametrize("mix", [0.3, 1.0])
def test_the_mixed_lm_scores_each_word_by_both_models(tiny_rnn_bundle, mix):
    """Each word, and the sentence end, scores log10(mix p_lstm + (1 - mix) p_ngram)."""
    from streamasr.decoding import MixedLM

    lm = tiny_rnn_bundle.word_lm
    words = "a dog runs across the grass".split()
    ids = [lm.words.get_index(w) for w in words]
    with torch.inference_mode():
        rnn_log_probs = lm.rnn(torch.tensor([lm.rnn.encode(words)]))[0].log_softmax(-1)
    mixed = MixedLM(lm, mix)
    state, ngram = mixed.start(False), lm.kenlm.start(False)
    targets = [lm.rnn.index[w] for w in words] + [lm.rnn.eos_id]
    for t, target in enumerate(targets):
        if t < len(ids):
            state, score = mixed.score(state, ids[t])
            ngram, ngram_score = lm.kenlm.score(ngram, ids[t])
        else:
            state, score = mixed.finish(state)
            ngram, ngram_score = lm.kenlm.finish(ngram)
        p = mix * rnn_log_probs[t, target].exp().item() + (1 - mix) * 10**ngram_score
        assert score == pytest.approx(math.log10(p), abs=1e-5)
    assert mixed.score(mixed.start(False), ids[0])[1] == pytest.approx(
        mixed.score(mixed.start(False), ids[0])[1]
    )  # a new segment starts afresh


@pytest.mark.parametrize("chunk", [1, 4])
def test_beam_search_with_the_mixed_lm_streams_as_it_decodes(tiny_rnn_bundle, chunk):
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_rnn_bundle, words, noise=1.0, seed=chunk)
    search = tiny_rnn_bundle.beam_search(BeamOptions(beam_size=8, commit_ms=None, lm_mix=0.5))
    assert type(search.word_lm).__name__ == "MixedLM"
    assert search.decode(log_probs) == words
    search.begin()
    streamed = []
    for start in range(0, log_probs.shape[0], chunk):
        streamed += search.step(log_probs[start : start + chunk])
    assert streamed + search.end() == words
