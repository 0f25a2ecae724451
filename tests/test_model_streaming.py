"""Streaming equivalence: every `step` path equals its whole-sequence `forward`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from streamasr.model import wait_k_visible_frames, wait_k_visible_positions


@pytest.mark.parametrize("chunk_frames", [2, 4])
def test_encoder_step_equals_forward_under_chunk_mask(tiny_model, chunk_frames):
    torch.manual_seed(1)
    sub = tiny_model.encoder.subsampling.factor
    num_frames = 37  # longer than the lookback (8) many times over; last chunk partial
    feats = torch.randn(
        1, num_frames * sub + sub - 1, tiny_model.cfg.n_mels
    )  # a ragged tail: dropped
    with torch.no_grad():
        full, lengths = tiny_model.encoder(feats, torch.tensor([feats.shape[1]]), chunk_frames)
        state = tiny_model.encoder.init_state()
        pieces = []
        for start in range(0, num_frames, chunk_frames):
            stop = min(start + chunk_frames, num_frames)
            out, state = tiny_model.encoder.step(feats[:, start * sub : stop * sub], state)
            pieces.append(out)
    streamed = torch.cat(pieces, dim=1)
    assert lengths.item() == num_frames == streamed.shape[1]
    assert (streamed - full).abs().max().item() <= 1e-4
    # Caches stay bounded by the lookback however long the stream ran.
    assert all(layer.keys.shape[2] <= tiny_model.cfg.left_context_frames for layer in state.layers)


def _with_lookahead(cfg, frames, right=0):
    from dataclasses import replace

    from streamasr.model import SpeechTranslator

    torch.manual_seed(0)
    model = SpeechTranslator(
        replace(cfg, lookahead_frames=frames, right_context_frames=right)
    ).eval()
    with torch.no_grad():  # Lookahead starts at zero; random weights make it count here
        for param in model.encoder.lookahead.parameters() if frames else ():
            param.normal_(0, 0.2)
    return model


@pytest.mark.parametrize(
    "chunk_frames, ahead, right",
    [(2, 1, 0), (4, 2, 0), (4, 4, 0), (2, 5, 0), (4, 0, 0), (4, 0, 2), (2, 0, 3), (4, 2, 2),
     (8, 0, 4), (2, 1, 5)],
)  # fmt: skip
@pytest.mark.parametrize("piece_frames", [None, 3])
def test_encoder_step_with_lookahead_equals_forward(
    tiny_config, tiny_model, chunk_frames, ahead, right, piece_frames
):
    """Chunk by chunk (or in pieces of 3 frames, across chunk boundaries), then the end; with
    lookahead, right context inside the blocks, or both."""
    model = _with_lookahead(tiny_config, ahead, right) if ahead or right else tiny_model
    ahead += right
    torch.manual_seed(1)
    sub, num_frames = model.encoder.subsampling.factor, 37
    step = piece_frames or chunk_frames
    feats = torch.randn(1, num_frames * sub, tiny_config.n_mels)
    with torch.no_grad():
        full, _ = model.encoder(feats, torch.tensor([num_frames * sub]), chunk_frames)
        state = model.encoder.init_state(chunk_frames=chunk_frames)
        pieces, emitted = [], []
        for start in range(0, num_frames, step):
            stop = min(start + step, num_frames)
            out, state = model.encoder.step(feats[:, start * sub : stop * sub], state)
            pieces.append(out)
            emitted.append((stop, state.frames_done))
        out, state = model.encoder.step(feats[:, :0], state, final=True)
        pieces.append(out)
    streamed = torch.cat(pieces, dim=1)
    assert streamed.shape[1] == num_frames == state.frames_done
    assert (streamed - full).abs().max().item() <= 1e-4
    # Audio up to frame `stop` completes the chunks of the grid that end `ahead` before it.
    for stop, done in emitted:
        assert done == max(0, (stop // chunk_frames) * chunk_frames - ahead)
    assert all(layer.keys.shape[2] <= tiny_config.left_context_frames for layer in state.layers)


@pytest.mark.parametrize("chunk_frames, right", [(2, 0), (4, 2)])
def test_self_conditioned_encoder_step_equals_forward(tiny_config, chunk_frames, right):
    """Self-conditioned CTC after block 1 of 3: chunk by chunk (with right context too) equals
    the whole pass under the chunk mask; the pass hands out the intermediate head's log-probs;
    the conditioning changes the frames, and grafted (its projection zero) it changes nothing."""
    from dataclasses import replace

    from streamasr.model import SpeechTranslator

    cfg = replace(tiny_config, encoder_layers=3, right_context_frames=right)
    torch.manual_seed(0)
    plain = SpeechTranslator(cfg).eval()
    model = SpeechTranslator(replace(cfg, self_condition_layers=(1,))).eval()
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("encoder.conditioners.1.") for name in missing)
    torch.manual_seed(1)
    sub, num_frames = model.encoder.subsampling.factor, 37
    feats = torch.randn(1, num_frames * sub, cfg.n_mels)
    length = torch.tensor([num_frames * sub])
    with torch.no_grad():
        grafted, _ = model.encoder(feats, length, chunk_frames)
        assert torch.equal(grafted, plain.encoder(feats, length, chunk_frames)[0])
        model.encoder.conditioners["1"].back.weight.normal_(0, 0.5)  # trained, it counts
        intermediate = []
        full, _ = model.encoder(feats, length, chunk_frames, intermediate)
        assert (full - grafted).abs().max().item() > 1e-2
        state = model.encoder.init_state(chunk_frames=chunk_frames)
        pieces = []
        for start in range(0, num_frames, chunk_frames):
            out, state = model.encoder.step(
                feats[:, start * sub : (start + chunk_frames) * sub], state
            )
            pieces.append(out)
        pieces.append(model.encoder.step(feats[:, :0], state, final=True)[0])
    streamed = torch.cat(pieces, dim=1)
    assert streamed.shape[1] == num_frames
    assert (streamed - full).abs().max().item() <= 1e-4
    assert len(intermediate) == 1 and intermediate[0].shape == (1, num_frames, cfg.en_vocab)
    assert torch.allclose(intermediate[0].exp().sum(-1), torch.ones(1, num_frames))


def test_lookahead_sees_ahead_and_starts_as_identity(tiny_config):
    from streamasr.model import SpeechTranslator

    torch.manual_seed(2)
    feats = torch.randn(1, 64, tiny_config.n_mels)
    lengths = torch.tensor([64])
    model = _with_lookahead(tiny_config, 2)
    changed = feats.clone()
    changed[:, 36:40] += 1.0  # encoder frame 9: one frame into the next chunk of 8 (offset 2)
    with torch.no_grad():
        before, _ = model.encoder(feats, lengths, 8)
        after, _ = model.encoder(changed, lengths, 8)
        torch.manual_seed(0)
        plain = SpeechTranslator(tiny_config).eval()
        fresh = SpeechTranslator(dataclasses.replace(tiny_config, lookahead_frames=2)).eval()
        fresh.load_state_dict(plain.state_dict(), strict=False)
        assert torch.equal(
            fresh.encoder(feats, lengths, -1)[0], plain.encoder(feats, lengths, -1)[0]
        )
    moved = (after - before).abs().amax(dim=-1)[0]
    assert moved[:5].max() == 0  # chunk [0, 6) ends before frame 9 and its 2 lookahead frames
    assert moved[5] == 0 and moved[6:].min() > 0  # frame 5 looks at 6, 7; chunk [6, 14) sees 9


def test_right_context_sees_its_frames_and_no_further(tiny_config):
    """Chunks of 8 frames on the grid shifted by 2 frames of right context: [0, 6), [6, 14),
    ... The blocks of [0, 6) also run over frames 6 and 7, not 8; full context is unchanged."""
    torch.manual_seed(2)
    feats = torch.randn(1, 96, tiny_config.n_mels)
    lengths = torch.tensor([96])
    model = _with_lookahead(tiny_config, 0, right=2)
    with torch.no_grad():
        before, _ = model.encoder(feats, lengths, 8)
        moved = []
        for frame in (7, 8):  # chunk [0, 6) sees frames 6 and 7; chunk [6, 14) holds both
            changed = feats.clone()
            changed[:, 4 * frame : 4 * frame + 4] += 1.0
            after, _ = model.encoder(changed, lengths, 8)
            moved.append((after - before).abs().amax(dim=-1)[0])
        plain = _with_lookahead(tiny_config, 0)
        plain.load_state_dict(model.state_dict())  # the same weights, no right context
        assert not torch.allclose(plain.encoder(feats, lengths, 8)[0], before)
        assert torch.equal(
            plain.encoder(feats, lengths, -1)[0], model.encoder(feats, lengths, -1)[0]
        )
    assert moved[0][:6].min() > 0 and moved[0][6:14].min() > 0
    assert moved[1][:6].max() == 0 and moved[1][6:14].min() > 0


@pytest.mark.parametrize("right", [0, 3])
def test_encoder_padding_does_not_change_valid_frames(tiny_config, tiny_model, right):
    model = _with_lookahead(tiny_config, 0, right) if right else tiny_model
    torch.manual_seed(2)
    feats = torch.randn(2, 96, tiny_model.cfg.n_mels)
    with torch.no_grad():
        batch, _ = model.encoder(feats, torch.tensor([96, 64]), 4)
        alone, _ = model.encoder(feats[1:, :64], torch.tensor([64]), 4)
    assert (batch[1, : alone.shape[1]] - alone[0]).abs().max().item() <= 1e-5


def test_step_rejects_ragged_feature_count(tiny_model):
    with pytest.raises(ValueError, match="multiple of 4 feature frames"):
        tiny_model.encoder.step(torch.randn(1, 7, 80), tiny_model.encoder.init_state())


@pytest.mark.parametrize("wait_k", [1, 3, None])
def test_incremental_decoder_equals_full_recomputation(tiny_model, wait_k):
    torch.manual_seed(3)
    cfg = tiny_model.cfg
    memory = torch.randn(1, 30, cfg.d_model)
    tokens = torch.randint(3, cfg.de_vocab, (1, 12))
    visible = wait_k_visible_frames(12, torch.tensor([30]), wait_k, cfg.unit_frames, 1)
    dec = tiny_model.decoder
    with torch.no_grad():
        full = dec(tokens, memory, visible)
        state = dec.init_state()
        read = 0
        steps = []
        for i in range(12):
            need = int(visible[0, i])
            if need > read:  # read frames in uneven pieces, as a session would
                state = dec.extend_memory(memory[:, read:need], state)
                read = need
            logits, state = dec.step(tokens[:, i], state, need)
            steps.append(logits)
    assert (torch.stack(steps, 1) - full).abs().max().item() <= 1e-4


def test_wait_k_visible_frames():
    visible = wait_k_visible_frames(5, torch.tensor([10]), 2, unit_frames=4, tokens_per_unit=2)
    assert visible.tolist() == [[8, 8, 10, 10, 10]]
    assert wait_k_visible_frames(3, torch.tensor([7]), None, 4, 1).tolist() == [[7, 7, 7]]
    # The first unit 3 frames short: units end at frames 1, 5, 9, ...
    shifted = wait_k_visible_frames(4, torch.tensor([10]), 1, 4, 1, unit_shift_frames=3)
    assert shifted.tolist() == [[1, 5, 9, 10]]


@pytest.mark.parametrize("shift", [0, 5])
@pytest.mark.parametrize("wait_k", [1, 2, None])
def test_greedy_wait_k_equals_greedy_by_full_recomputation(tiny_config, wait_k, shift):
    """Also with the first unit shortened (`unit_shift_frames`, units that follow a lookahead)."""
    from dataclasses import replace

    from streamasr.decoding import (
        DEFAULT_TRANSLATION,
        SpeechWaitKTranslator,
        TranslationSearch,
        repeating_tokens,
        speech_units,
        translate_segment,
    )
    from streamasr.model import SpeechTranslator
    from streamasr.policy import WaitK

    torch.manual_seed(0)
    tiny_model = SpeechTranslator(replace(tiny_config, unit_shift_frames=shift)).eval()
    torch.manual_seed(4)
    cfg, bos, eos = tiny_model.cfg, 1, 2
    # units of 8 frames (the first 8 - shift), the last one partial
    memory = torch.randn(1, 23, cfg.d_model)
    units = speech_units(tiny_model, memory)
    assert [u.shape[1] for u in units] == ([8, 8, 7] if shift == 0 else [3, 8, 8, 4])
    with torch.no_grad():
        greedy = TranslationSearch(beam=1)
        translator = SpeechWaitKTranslator(tiny_model, WaitK(wait_k), bos, eos, greedy)
        fast = translate_segment(translator, units)
        tokens, unit = [bos], cfg.unit_frames
        full_units = (memory.shape[1] + shift) // unit
        for i in range(len(fast) + 1):
            visible = wait_k_visible_frames(i + 1, torch.tensor([23]), wait_k, unit, 1, shift)
            logits = tiny_model.decoder(torch.tensor([tokens]), memory, visible)[0, -1]
            logits[[0, bos]] = float("-inf")
            logits[repeating_tokens(tokens[1:], DEFAULT_TRANSLATION.no_repeat_ngram)] = float(
                "-inf"
            )
            written_early = wait_k is not None and wait_k + i <= full_units
            if written_early:
                logits[eos] = float("-inf")
            token = int(logits.argmax())
            if token == eos:
                break
            tokens.append(token)
    assert fast == tokens[1 : len(fast) + 1]
    assert fast or wait_k is None  # finite k writes before the end, when eos is not allowed


@pytest.mark.parametrize("wait_k", [1, 2, None])
def test_cascade_wait_k_equals_full_recomputation(tiny_config, tiny_bundle_dir, wait_k):
    """Words read one at a time through the causal transcript encoder, decoded with caches,
    equal encoding the whole transcript and decoding each token from scratch."""
    from dataclasses import replace

    from streamasr.decoding import (
        DEFAULT_TRANSLATION,
        TranscriptWaitKTranslator,
        TranslationSearch,
        repeating_tokens,
        translate_segment,
    )
    from streamasr.model import SpeechTranslator, wait_k_visible_positions
    from streamasr.policy import WaitK
    from streamasr.text import Tokenizer

    en = Tokenizer(tiny_bundle_dir / "en.model")
    cfg = replace(tiny_config, en_vocab=len(en), transcript_encoder_layers=2)
    torch.manual_seed(5)
    model = SpeechTranslator(cfg).eval()
    words = "a man in an orange hat looks at something".split()
    bos, eos = 1, 2
    with torch.no_grad():
        fast = translate_segment(
            TranscriptWaitKTranslator(model, en, WaitK(wait_k), bos, eos, TranslationSearch(1)),
            [[w] for w in words],
        )
        source, ends = en.encode_words(words)
        memory = model.transcript_encoder(torch.tensor([source]))
        tokens = [bos]
        for i in range(len(fast) + 1):
            visible = wait_k_visible_positions(i + 1, [ends], wait_k, 1)
            logits = model.transcript_decoder(torch.tensor([tokens]), memory, visible)[0, -1]
            logits[[0, bos]] = float("-inf")
            logits[repeating_tokens(tokens[1:], DEFAULT_TRANSLATION.no_repeat_ngram)] = float(
                "-inf"
            )
            if wait_k is not None and wait_k + i <= len(words):
                logits[eos] = float("-inf")  # written before the source had ended
            token = int(logits.argmax())
            if token == eos:
                break
            tokens.append(token)
    assert fast == tokens[1 : len(fast) + 1]
    assert fast


@pytest.mark.parametrize(
    "wait_k,closing,own_encoder",
    [(1, 0, False), (2, 0, False), (2, 2, False), (3, 1, False), (None, 0, False)]
    + [(2, 2, True), (None, 0, True)],
)
def test_cascade_whole_source_equals_full_recomputation(
    tiny_config, tiny_bundle_dir, wait_k, closing, own_encoder
):
    """With cascade_whole_source, the tokens written once the source has ended read the whole
    transcript encoded without the causal mask (`own_encoder`: by a second encoder of its own):
    decoding with caches, the last `closing` words arriving with the end, equals decoding each
    token from scratch with the memory `written_after_the_source` names, logits and greedy
    tokens."""
    from dataclasses import replace

    from streamasr.decoding import (
        DEFAULT_TRANSLATION,
        TranscriptWaitKTranslator,
        TranslationSearch,
        repeating_tokens,
    )
    from streamasr.model import SpeechTranslator
    from streamasr.policy import WaitK
    from streamasr.text import Tokenizer
    from streamasr.train_cascade import written_after_the_source

    en = Tokenizer(tiny_bundle_dir / "en.model")
    cfg = replace(
        tiny_config,
        en_vocab=len(en),
        transcript_encoder_layers=2,
        cascade_whole_source=True,
        cascade_whole_encoder=own_encoder,
    )
    torch.manual_seed(5)
    model = SpeechTranslator(cfg).eval()
    words = "a man in an orange hat looks at something".split()
    bos, eos = 1, 2
    search = TranslationSearch(beam=1)
    with torch.no_grad():
        translator = TranscriptWaitKTranslator(model, en, WaitK(wait_k), bos, eos, search)
        stepped, step = [], translator.decoder.step

        def logged_step(*args):
            logits, decoder = step(*args)
            stepped.append(logits[0].clone())
            return logits, decoder

        translator.decoder.step = logged_step
        state, fast = translator.init_state(), []
        for word in words[: len(words) - closing]:
            state = translator.read([word], state)
            new, state = translator.write(state, source_finished=False)
            fast += new
        state = translator.read(words[len(words) - closing :], state)
        new, state = translator.write(state, source_finished=True)
        written_before_end = len(fast)
        fast += new

        source, ends = en.encode_words(words)
        causal = model.transcript_encoder(torch.tensor([source]))
        encoder = model.whole_encoder if own_encoder else model.transcript_encoder
        whole = encoder(torch.tensor([source]), causal=False)
        assert not torch.allclose(causal, whole, atol=1e-4)  # the future changes the encoding
        if own_encoder:  # and the second encoder's weights are not the causal one's
            shared = model.transcript_encoder(torch.tensor([source]), causal=False)
            assert not torch.allclose(shared, whole, atol=1e-4)
        tokens = [bos]
        for i in range(len(fast) + 1):
            visible = wait_k_visible_positions(i + 1, [ends], wait_k, 1)
            after = written_after_the_source(i + 1, [ends], wait_k, 1, [closing])
            assert after[0, -1].item() == (i >= written_before_end)
            logits = model.transcript_decoder(
                torch.tensor([tokens]), causal, visible, (whole, after)
            )[0, -1]
            if i < len(stepped):  # (none after the length cap)
                assert (logits - stepped[i]).abs().max().item() <= 1e-4
            if after[0, -1]:  # the causal encoding alone would have given other logits
                alone = model.transcript_decoder(torch.tensor([tokens]), causal, visible)[0, -1]
                assert (alone - logits).abs().max().item() > 1e-3
            logits[[0, bos]] = float("-inf")
            logits[repeating_tokens(tokens[1:], DEFAULT_TRANSLATION.no_repeat_ngram)] = float(
                "-inf"
            )
            if i < written_before_end:
                logits[eos] = float("-inf")  # written before the source had ended
            token = int(logits.argmax())
            if token == eos:
                break
            tokens.append(token)
    assert fast == tokens[1 : len(fast) + 1]  # (the fast path may stop at its length cap)
    assert len(fast) > written_before_end  # some tokens read the whole source
    with torch.no_grad():  # the tail by beam search reads the whole source's caches too
        beam = TranscriptWaitKTranslator(model, en, WaitK(wait_k), bos, eos, TranslationSearch(4))
        state = beam.init_state()
        for word in words[: len(words) - closing]:
            _, state = beam.write(beam.read([word], state), source_finished=False)
        tail, state = beam.write(beam.read(words[len(words) - closing :], state), True)
    assert state.tokens[:written_before_end] == tuple(fast[:written_before_end])
    assert tail and state.done


def test_whole_source_encoding_ignores_padding(tiny_config):
    from dataclasses import replace

    from streamasr.model import TranscriptEncoder

    torch.manual_seed(6)
    enc = TranscriptEncoder(replace(tiny_config, transcript_encoder_layers=2)).eval()
    tokens = torch.randint(3, tiny_config.en_vocab, (2, 15))
    tokens[1, 9:] = 0  # the second row is 9 pieces, right-padded
    with torch.no_grad():
        both = enc(tokens, causal=False)
        alone = enc(tokens[1:, :9], causal=False)
        prefix = enc(tokens[:1, :9], causal=False)
    assert (both[1, :9] - alone[0]).abs().max().item() <= 1e-5
    assert (both[0, :9] - prefix[0]).abs().max().item() > 1e-3  # a position sees what follows


def test_written_after_the_source():
    from streamasr.train_cascade import written_after_the_source

    ends = [[2, 3, 7], [4]]
    # wait-1: token i needs 1 + i units; 3 units read before the end (closing 0), 2 (closing 1)
    after = written_after_the_source(5, ends, 1, 1, [0, 0])
    assert after.tolist() == [[False, False, False, True, True], [False, True, True, True, True]]
    after = written_after_the_source(5, ends, 1, 1, [1, 1])
    assert after.tolist() == [[False, False, True, True, True], [True] * 5]
    assert written_after_the_source(3, ends, None, 1, [0, 0]).all()


def test_transcript_encoder_is_causal(tiny_config):
    from dataclasses import replace

    from streamasr.model import TranscriptEncoder

    torch.manual_seed(6)
    enc = TranscriptEncoder(replace(tiny_config, transcript_encoder_layers=2)).eval()
    tokens = torch.randint(3, tiny_config.en_vocab, (2, 15))
    with torch.no_grad():
        full = enc(tokens)
        prefix = enc(tokens[:, :9])
    assert (full[:, :9] - prefix).abs().max().item() <= 1e-5


def test_wait_k_visible_positions():
    assert wait_k_visible_positions(4, [[2, 3, 7]], 1, 1).tolist() == [[2, 3, 7, 7]]
    assert wait_k_visible_positions(3, [[2, 3, 7], [4]], 2, 2).tolist() == [[3, 3, 7], [4, 4, 4]]
    assert wait_k_visible_positions(2, [[2, 3, 7]], None, 1).tolist() == [[7, 7]]


def test_repeating_tokens():
    from streamasr.decoding import repeating_tokens

    assert repeating_tokens([5, 6, 7, 5, 6], 3) == [7]  # 5 6 7 again
    assert sorted(repeating_tokens([5, 6, 5, 7, 5], 2)) == [6, 7]
    assert repeating_tokens([5, 6, 7], 3) == []
    assert repeating_tokens([5, 6, 7], 1) == [5, 6, 7]
    assert repeating_tokens([5, 5, 5], 0) == []  # guard off
    assert repeating_tokens([], 4) == []


@pytest.mark.parametrize("n", [2, 3])
def test_translation_never_repeats_an_ngram(tiny_model, n):
    """A tiny random decoder loops; with the guard no n-gram of pieces comes twice, and the
    guard is what changed the output."""
    from streamasr.decoding import (
        SpeechWaitKTranslator,
        TranslationSearch,
        speech_units,
        translate_segment,
    )
    from streamasr.policy import WaitK

    def ngrams(tokens):
        return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]

    torch.manual_seed(4)
    units = speech_units(tiny_model, torch.randn(1, 40, tiny_model.cfg.d_model))
    with torch.no_grad():
        free, guarded = (
            translate_segment(
                SpeechWaitKTranslator(tiny_model, WaitK(2), 1, 2, TranslationSearch(1, g)), units
            )
            for g in (0, n)
        )
    assert len(set(ngrams(free))) < len(ngrams(free))  # it loops without the guard
    assert len(set(ngrams(guarded))) == len(ngrams(guarded))


@pytest.mark.parametrize("wait_k", [1, None])
def test_translation_beam_scores_equal_full_recomputation(tiny_model, wait_k):
    """The tail beam search's best hypothesis, scored from scratch (the whole target prefix
    through the decoder, the same visibility and bans), has the score the cached search reports;
    with a beam of 1 it is the greedy search."""
    from streamasr.decoding import (
        SpeechWaitKTranslator,
        TranslationSearch,
        repeating_tokens,
        speech_units,
    )
    from streamasr.policy import WaitK

    torch.manual_seed(6)
    cfg, bos, eos = tiny_model.cfg, 1, 2
    memory = torch.randn(1, 23, cfg.d_model)

    def read_all(search):
        translator = SpeechWaitKTranslator(tiny_model, WaitK(wait_k), bos, eos, search)
        state = translator.init_state()
        for unit in speech_units(tiny_model, memory):
            state = translator.read(unit, state)
            _, state = translator.write(state, source_finished=False)
        return translator, state

    with torch.no_grad():
        translator, state = read_all(TranslationSearch(beam=4))
        new, score, _ = translator.finish_by_beam(state)
        assert new
        tokens = [bos, *state.tokens, *new]
        targets = [*state.tokens, *new, eos][: translator._max_tokens(state)]
        visible = wait_k_visible_frames(len(tokens), torch.tensor([23]), wait_k, cfg.unit_frames, 1)
        log_probs = tiny_model.decoder(torch.tensor([tokens]), memory, visible)[0].log_softmax(-1)
        total = 0.0
        for i in range(len(state.tokens), len(targets)):
            row = log_probs[i].clone()
            row[[0, bos]] = float("-inf")
            row[repeating_tokens(tokens[1 : i + 1], 4)] = float("-inf")
            total += float(row[targets[i]])
        assert score == pytest.approx(total / (len(targets) - len(state.tokens)), abs=1e-4)

        greedy, state = read_all(TranslationSearch(beam=1))
        by_beam, _, _ = greedy.finish_by_beam(state)
        assert by_beam == greedy.write(state, source_finished=True)[0]


@pytest.mark.parametrize("chunk_ms", [160, 320, 640])
def test_shifted_units_end_with_the_chunks_of_a_lookahead_encoder(tiny_config, chunk_ms):
    """With the first unit as many frames short as the lookahead, a chunk of audio completes
    every unit whose unit_ms of audio has arrived; with whole units, a unit that ends with a
    chunk waits for the next one."""
    from dataclasses import replace

    from streamasr.decoding import SpeechWaitKTranslator
    from streamasr.model import SpeechTranslator
    from streamasr.policy import WaitK

    torch.manual_seed(0)
    feats = torch.randn(1, 256, 80)  # 2.56 s of 10 ms feature frames
    piece = chunk_ms // 10
    for shift in (3, 0):
        cfg = replace(
            tiny_config, left_context_frames=16, lookahead_frames=3, unit_shift_frames=shift
        )
        model = SpeechTranslator(cfg).eval()
        translator = SpeechWaitKTranslator(model, WaitK(1), 1, 2)
        state = model.encoder.init_state(1, chunk_frames=cfg.chunk_frames(chunk_ms))
        units = translator.init_state()
        with torch.no_grad():
            for end in range(piece, feats.shape[1] + 1, piece):
                frames, state = model.encoder.step(feats[:, end - piece : end], state)
                units = translator.read(frames, units)
                arrived = end * 10 // cfg.unit_ms  # units of audio so far
                late = shift == 0 and end * 10 % cfg.unit_ms == 0
                assert len(units.unit_ends) == arrived - late, (shift, end)


def test_companion_posteriors_are_the_weighted_mean_of_both(tiny_config):
    from streamasr.model import SpeechTranslator

    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_config, companion_encoder_layers=1, companion_weight=0.3)
    model = SpeechTranslator(cfg).eval()
    feats = torch.randn(2, 64, cfg.n_mels)
    with torch.no_grad():
        frames, fused = model.encode_transcript(feats, torch.tensor([64, 48]), 4)
        main = model.ctc_log_probs(frames).exp()
        second, _ = model.companion.encoder(feats, torch.tensor([64, 48]), 4)
        other = model.companion.ctc_head(second).log_softmax(-1).exp()
    assert torch.allclose(fused.exp(), 0.7 * main + 0.3 * other, atol=1e-6)
    assert torch.allclose(fused.logsumexp(-1), torch.zeros(2, 16), atol=1e-5)
    with pytest.raises(ValueError, match="companion_weight"):
        dataclasses.replace(cfg, companion_weight=1.0)
