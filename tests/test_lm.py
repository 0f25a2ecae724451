"""The word LM (a normalized Kneser-Ney model in ARPA form) and the streaming CTC beam search."""

from __future__ import annotations

import math

import pytest
import torch

from streamasr.decoding import BLANK, BeamOptions
from streamasr.lm import WORD_BOOST, boost_arpa, build_arpa, parse_word_boosts

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


# general-text frequencies: two words the sentences lack, one they have
PRIOR = {"bird": 3e-4, "zebra": 1e-5, "dog": 1e-4}


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("prior", [None, PRIOR])
def test_arpa_probabilities_sum_to_one(tmp_path, order, prior):
    sizes = build_arpa(SENTENCES, tmp_path / "lm.arpa", order, prior)
    new = ["bird", "zebra"] if prior else []
    assert sizes[1] == 10 + len(new)  # 7 words, </s>, <unk>, <s> (a context only), the prior's
    words = sorted({w for s in SENTENCES for w in s} | set(new)) + ["<unk>", "</s>"]
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


def test_a_prior_opens_the_vocabulary_by_frequency(tmp_path):
    """Unseen words take the prior's share of the novel-word mass, in its proportions; the
    seen words keep their order."""
    build_arpa(SENTENCES, tmp_path / "closed.arpa", 3)
    build_arpa(SENTENCES, tmp_path / "open.arpa", 3, PRIOR)
    words = sorted({w for s in SENTENCES for w in s}) + ["bird", "zebra", "<unk>", "</s>"]
    closed, closed_vocab = kenlm(tmp_path / "closed.arpa", words)
    lm, vocab = kenlm(tmp_path / "open.arpa", words)
    for context in ([], ["a", "dog"], ["the", "cat"]):
        bird, zebra, unk = (log10_prob(lm, vocab, context, w) for w in ("bird", "zebra", "<unk>"))
        assert bird - zebra == pytest.approx(math.log10(30), abs=1e-4)
        assert bird > unk  # a word of the vocabulary now, not <unk>
        assert log10_prob(closed, closed_vocab, context, "bird") == pytest.approx(
            log10_prob(closed, closed_vocab, context, "<unk>")
        )
        seen = sorted(
            {w for s in SENTENCES for w in s}, key=lambda w: log10_prob(lm, vocab, context, w)
        )
        assert seen == sorted(seen, key=lambda w: log10_prob(closed, closed_vocab, context, w))


def test_a_boost_raises_a_word_in_every_context_and_adds_one_the_lm_lacks(tmp_path):
    build_arpa(SENTENCES, tmp_path / "lm.arpa", 3)
    boost_arpa(tmp_path / "lm.arpa", tmp_path / "boosted.arpa", {"sits": 0.1, "zebra": 0.5})
    seen = sorted({w for s in SENTENCES for w in s}) + ["</s>"]
    lm, vocab = kenlm(tmp_path / "lm.arpa", seen)
    boosted, boosted_vocab = kenlm(tmp_path / "boosted.arpa", [*seen, "zebra", "<unk>"])
    contexts = ([], ["a"], ["a", "dog"], ["the", "dog"], ["a", "cat"], ["dog", "sits"], ["cat"])
    for context in contexts:
        for word in seen:
            before = log10_prob(lm, vocab, context, word)
            after = log10_prob(boosted, boosted_vocab, context, word)
            assert before + 0.1 <= 0  # no probability was capped at 1
            assert after == pytest.approx(before + (0.1 if word == "sits" else 0), abs=1e-5)
    rarest = min(log10_prob(lm, vocab, [], w) for w in seen)
    zebra = log10_prob(boosted, boosted_vocab, [], "zebra")
    assert zebra == pytest.approx(rarest + 0.5, abs=1e-5)
    assert zebra > log10_prob(boosted, boosted_vocab, [], "<unk>")
    boost_arpa(tmp_path / "lm.arpa", tmp_path / "capped.arpa", {"sits": 5.0})  # KenLM loads it
    capped, capped_vocab = kenlm(tmp_path / "capped.arpa", seen)
    assert log10_prob(capped, capped_vocab, ["a", "cat"], "sits") == 0.0
    assert parse_word_boosts("# names\nZebra 0.5\nsits  # a verb\nNew-York -1\n\n") == {
        "zebra": 0.5, "sits": WORD_BOOST, "new": -1.0, "york": -1.0
    }  # fmt: skip
    for text, message in (("# nothing\n", "no words"), ("zebra inf\n", "line 1: the bonus")):
        with pytest.raises(ValueError, match=message):
            parse_word_boosts(text)


def test_an_open_vocabulary_recognizes_a_word_the_transcripts_lack(tiny_bundle_dir, tmp_path):
    import shutil

    from conftest import SENTENCES_EN

    from streamasr.bundle import load_bundle
    from streamasr.lm import build_transcript_lm
    from streamasr.text import Tokenizer

    words = "a black dog runs across the green meadow".split()
    assert not any("meadow" in s.lower() for s in SENTENCES_EN)
    decoded = {}
    for prior in (None, {"meadow": 1e-5, "green": 1e-4}):
        folder = tmp_path / str(bool(prior))
        shutil.copytree(tiny_bundle_dir, folder)
        build_transcript_lm(SENTENCES_EN, Tokenizer(folder / "en.model"), folder, prior=prior)
        bundle = load_bundle(folder)
        search = bundle.beam_search(BeamOptions(beam_size=8, token_beam=None))
        decoded[bool(prior)] = search.decode(spelled(bundle, words, noise=1.0, seed=0))
    assert decoded[True] == words
    assert "meadow" not in decoded[False]


def test_lm_text_adds_your_own_words_and_names_those_it_cannot_spell(
    tiny_bundle_dir, tmp_path, capsys
):
    import shutil

    from conftest import SENTENCES_EN

    from streamasr.bundle import load_bundle
    from streamasr.cli import main

    sentences, own = tmp_path / "train.txt", tmp_path / "own.txt"
    sentences.write_text("".join(s + "\n" for s in SENTENCES_EN))
    own.write_text("A black dog runs across the green meadow.\n\nquokka\n")
    words = "a black dog runs across the green meadow".split()
    decoded = {}
    for texts in ([sentences], [sentences, own]):
        folder = tmp_path / str(len(texts))
        shutil.copytree(tiny_bundle_dir, folder)
        flags = [arg for path in texts for arg in ("--text", str(path))]
        assert main(["lm", *flags, "--model", str(folder), "--open-vocab", "0"]) == 0
        bundle = load_bundle(folder)
        search = bundle.beam_search(BeamOptions(beam_size=8, token_beam=None))
        decoded[len(texts)] = search.decode(spelled(bundle, words, noise=1.0, seed=0))
    assert "meadow" not in decoded[1]
    assert decoded[2] == words
    out, err = capsys.readouterr()
    assert f"from {len(SENTENCES_EN) + 2} sentences, {len(SENTENCES_EN) + 2} of them from" in out
    assert "pieces cannot spell these words, so they will not be recognized (1): quokka" in err
    assert main(["lm", "--model", str(folder)]) == 2
    assert "lm needs --corpus DIR, --multi30k DIR or --text FILE" in capsys.readouterr().err
    assert main(["lm", "--text", str(tmp_path / "nowhere.txt"), "--model", str(folder)]) == 2
    assert "nowhere.txt: no such file" in capsys.readouterr().err


def test_boosted_words_are_recognized_where_the_lm_lacked_them(tiny_lm_bundle):
    from streamasr.bundle import load_bundle

    words = "a black dog runs across the green meadow".split()
    folder = tiny_lm_bundle.lm_folder
    arpa = (folder / "lm.arpa").read_bytes()
    bundle = load_bundle(folder)  # its own copy: the fixture's is shared
    options = BeamOptions(beam_size=8, token_beam=None)
    log_probs = spelled(bundle, words, noise=1.0, seed=0)
    assert "meadow" not in bundle.beam_search(options).decode(log_probs)
    assert bundle.boost_words({"meadow": 1.0, "quokka": 1.0}) == ["quokka"]  # no q piece
    assert bundle.beam_search(options).decode(log_probs) == words
    assert (folder / "lm.arpa").read_bytes() == arpa  # the model folder stays as it was


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
    # every piece tried: the toy's flat noise makes a frame's 8 likeliest pieces a lottery
    options = BeamOptions(beam_size=8, commit_ms=None, token_beam=None)
    search = tiny_lm_bundle.beam_search(options)
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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_token_beam_keeps_the_words_of_the_whole_search(tiny_lm_bundle, seed):
    """Trying only a frame's 8 likeliest pieces (the default) finds what trying all finds."""
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=1.0, seed=seed)
    every = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, token_beam=None))
    top = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, token_beam=8))
    assert top.decode(log_probs) == every.decode(log_probs) == words


def test_a_blank_penalty_keeps_a_word_whose_pieces_barely_lose_to_blank(tiny_lm_bundle):
    """The frames of 'black' favour blank a little: the search drops the word, a penalty on the
    blank brings it back, and the caller's log-probs are left as they were."""
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=0.0, seed=0)
    black = set(tiny_lm_bundle.en.encode("black"))
    frames = torch.tensor([int(i) in black for i in log_probs.argmax(-1)])
    log_probs[frames, BLANK] = log_probs[frames].max(-1).values + 1.5
    log_probs = log_probs.log_softmax(-1)
    before = log_probs.clone()
    plain = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, blank_penalty=0.0))
    plain = plain.decode(log_probs)
    assert "black" not in plain
    penalized = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, blank_penalty=2.0))
    assert penalized.decode(log_probs) == words
    assert torch.equal(log_probs, before)


def test_logadd_merging_sums_the_paths_that_max_merging_keeps_one_of(tiny_lm_bundle):
    """The same words either way; merged by log-add the best hypothesis scores the sum of its
    CTC paths, which is above the single best path's score."""
    words = "a black dog runs across the green grass".split()
    log_probs = spelled(tiny_lm_bundle, words, noise=1.0, seed=3)
    scores = {}
    for log_add in (False, True):
        search = tiny_lm_bundle.beam_search(BeamOptions(beam_size=8, log_add=log_add))
        assert search.decode(log_probs) == words
        scores[log_add] = search.decoder.get_best_hypothesis().score
    assert scores[True] > scores[False]
