"""The session: piece-size invariance, event invariants, segments, flat state."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from streamasr import session as session_module
from streamasr.decoding import TranslationSearch
from streamasr.session import Session, SessionOptions, WallClock


def run(bundle, audio, piece_samples, **options):
    session = Session(bundle, SessionOptions(**options), stream="t")
    events = []
    for start in range(0, len(audio), piece_samples):
        events += session.accept(audio[start : start + piece_samples])
    events += session.finish()
    return session, events


def texts(events):
    return [(e.segment, e.type, e.text, e.final) for e in events]


@pytest.mark.parametrize("translate_from", ["speech", "transcript"])
@pytest.mark.parametrize("wait_k, beam", [(1, 1), (3, 1), (None, 1), (1, 3), (None, 3)])
def test_output_does_not_depend_on_piece_size(tiny_bundle, tone, wait_k, beam, translate_from):
    audio = np.concatenate([tone, np.zeros(16000, np.float32), tone])
    options = dict(
        wait_k=wait_k, translate_from=translate_from, translation=TranslationSearch(beam=beam)
    )
    results = [texts(run(tiny_bundle, audio, n, **options)[1]) for n in (160, 16000, len(audio))]
    assert results[0] == results[1] == results[2]
    assert any(t == "transcript" and text for _, t, text, _ in results[0])
    assert any(t == "translation" and text for _, t, text, _ in results[0])


def test_cascade_translation_waits_for_k_words(tiny_bundle, tone):
    """From the transcript, wait-k writes nothing before k words of the segment are out."""
    session, events = run(tiny_bundle, tone, 1600, wait_k=2, translate_from="transcript")
    first_translation = next(e for e in events if e.type == "translation" and e.text)
    words_before = [
        w for e in events[: events.index(first_translation)] if e.type == "transcript"
        for w in e.text.split()
    ]  # fmt: skip
    assert len(words_before) >= 2 or first_translation.final
    assert (
        first_translation.delay_ms
        >= session.transcript_words[min(1, len(words_before) - 1)].delay_ms
    )


def test_events_are_ordered_and_segments_closed(tiny_bundle, tone):
    audio = np.concatenate([tone, np.zeros(24000, np.float32), tone])
    session, events = run(tiny_bundle, audio, 1600, wait_k=2)
    assert events, "expected events from the tiny model"
    delays = [e.delay_ms for e in events]
    assert delays == sorted(delays)
    assert all(e.elapsed_ms >= e.delay_ms for e in events)
    assert delays[-1] <= len(audio) / 16
    for seg in {e.segment for e in events}:
        for kind in ("transcript", "translation"):
            finals = [e for e in events if e.segment == seg and e.type == kind and e.final]
            assert len(finals) == 1, (seg, kind)
    # concatenated deltas equal the closed segments' text
    for seg in session.segments:
        words = " ".join(
            e.text for e in events if e.segment == seg.index and e.type == "transcript" and e.text
        )
        assert words == seg.transcript


@pytest.mark.parametrize("chunk_ms", [160, 640])
def test_other_chunk_sizes_run(tiny_bundle, tone, chunk_ms):
    _, events = run(tiny_bundle, tone, 4000, chunk_ms=chunk_ms, wait_k=3)
    assert events[-1].final


def test_bad_chunk_size_is_rejected(tiny_bundle):
    with pytest.raises(ValueError, match="multiple of 40"):
        Session(tiny_bundle, SessionOptions(chunk_ms=100))


def test_state_stays_bounded_on_long_stream(tiny_bundle, tone):
    audio = np.tile(np.concatenate([tone, np.zeros(16000, np.float32)]), 6)  # ~20 s
    session, _ = run(tiny_bundle, audio, 8000, wait_k=3, max_segment_ms=2000)
    lookback = tiny_bundle.config.left_context_frames
    assert all(layer.keys.shape[2] <= lookback for layer in session.encoder_state.layers)
    assert session.pending_feats.shape[0] < session.feature_frames_per_chunk
    assert len(session.segments) >= 5  # the decoder is reset at least every 2 s of audio
    assert session.translator_state.decoder.layers[0].cross_keys.shape[2] <= 2000 // 80 + 8


def test_a_pause_closes_a_segment(tiny_bundle, tone):
    audio = np.concatenate([tone, np.zeros(32000, np.float32), tone])
    session, events = run(tiny_bundle, audio, 1600, wait_k=2, endpoint_ms=800)
    assert len(session.segments) >= 2
    first_final = next(e for e in events if e.type == "transcript" and e.final)
    assert first_final.delay_ms < len(tone) / 16 + 2000 + 320  # closed during the pause


def test_beam_search_sessions_are_piece_size_invariant_and_final(tiny_lm_bundle, tone):
    from conftest import SENTENCES_EN

    audio = np.concatenate([tone, np.zeros(24000, np.float32), tone])
    runs = [run(tiny_lm_bundle, audio, n, wait_k=2) for n in (160, 16000, len(audio))]
    assert texts(runs[0][1]) == texts(runs[1][1]) == texts(runs[2][1])
    session, events = runs[0]
    assert session.beam is not None
    words = [w.text for w in session.transcript_words]
    assert words and set(words) <= {w for s in SENTENCES_EN for w in s.split()}
    for seg in session.segments:  # streamed deltas add up to each segment's final transcript
        deltas = [e.text for e in events if e.segment == seg.index and e.type == "transcript"]
        assert " ".join(d for d in deltas if d) == seg.transcript


def test_greedy_search_can_be_chosen_over_the_lm(tiny_lm_bundle, tiny_bundle, tone):
    greedy = run(tiny_lm_bundle, tone, 4000, wait_k=2, beam=None)
    plain = run(tiny_bundle, tone, 4000, wait_k=2)
    assert greedy[0].beam is None
    assert texts(greedy[1]) == texts(plain[1])


def test_wall_clock_never_dates_the_stream_after_its_audio(monkeypatch):
    """A first piece delivered late must not make later emissions earlier than their audio."""
    now = [10.0]
    monkeypatch.setattr(session_module.time, "perf_counter", lambda: now[0])
    clock = WallClock()
    clock.audio_arrived(100.0)  # 100 ms in, but delivered 300 ms late ...
    now[0] += 0.1
    clock.audio_arrived(600.0)  # ... and then a burst: 600 ms of audio 100 ms later
    assert clock.now_ms() == pytest.approx(600.0)
    now[0] += 0.05
    clock.audio_arrived(650.0)  # on time from here: the estimate stays
    assert clock.now_ms() == pytest.approx(650.0)
    assert clock.t0 == pytest.approx(9.5)


@pytest.fixture(scope="module", params=[(3, 0), (0, 3), (1, 2)], ids=lambda p: f"ahead{p}")
def lookahead_bundle(tiny_bundle, request):
    """The tiny bundle with 3 frames of lookahead, of right context, or 1 and 2 of both; the
    lookahead's weights random (they start at zero)."""
    import dataclasses

    import torch

    from streamasr.model import SpeechTranslator

    lookahead, right = request.param
    cfg = dataclasses.replace(
        tiny_bundle.config, lookahead_frames=lookahead, right_context_frames=right
    )
    model = SpeechTranslator(cfg).eval()
    model.load_state_dict(tiny_bundle.model.state_dict(), strict=False)
    with torch.no_grad():
        for param in model.encoder.lookahead.parameters() if lookahead else ():
            param.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    return dataclasses.replace(tiny_bundle, config=cfg, model=model)


@pytest.mark.parametrize("chunk_ms", [160, 320])
def test_lookahead_session_equals_the_whole_pass(lookahead_bundle, tone, chunk_ms):
    from streamasr.decoding import ctc_greedy_tokens
    from streamasr.evaluate import ctc_log_probs

    audio = np.concatenate([tone, np.zeros(16000, np.float32), tone])
    options = dict(chunk_ms=chunk_ms, pause_lookback_ms=None)  # the whole pass never forgets
    results = [run(lookahead_bundle, audio, n, **options) for n in (160, 16000)]
    assert texts(results[0][1]) == texts(results[1][1])
    session = results[0][0]
    chunk_frames = lookahead_bundle.config.chunk_frames(chunk_ms)
    log_probs = ctc_log_probs(lookahead_bundle, audio, chunk_frames)[0]
    assert session.encoder_state.frames_done == log_probs.shape[0]
    whole = lookahead_bundle.en.decode(ctc_greedy_tokens(log_probs)).split()
    assert [w.text for w in session.transcript_words] == whole != []


@pytest.fixture(scope="module")
def companion_bundle(companion_bundle_dir):
    from streamasr.bundle import load_bundle

    return load_bundle(companion_bundle_dir)


@pytest.mark.parametrize("chunk_ms", [160, 320])
def test_companion_session_equals_the_whole_pass(companion_bundle, tone, chunk_ms, monkeypatch):
    """Two encoders stepped chunk by chunk, each with its own carried state, give the fused
    log-probs of both run over the whole stream under the chunk mask; the fusion is neither
    encoder's alone."""
    from streamasr.decoding import ctc_greedy_tokens
    from streamasr.evaluate import ctc_log_probs

    model, stepped = companion_bundle.model, []
    fuse = model.transcript_log_probs

    def spy(frames, companion_frames):
        stepped.append(fuse(frames, companion_frames)[0])
        return stepped[-1][None]

    monkeypatch.setattr(model, "transcript_log_probs", spy)
    audio = np.concatenate([tone, np.zeros(16000, np.float32), tone])  # longer than the lookback
    options = dict(chunk_ms=chunk_ms, pause_lookback_ms=None)  # the whole pass never forgets
    results = [run(companion_bundle, audio, n, **options) for n in (160, 16000)]
    assert texts(results[0][1]) == texts(results[1][1])
    monkeypatch.undo()
    chunk_frames = companion_bundle.config.chunk_frames(chunk_ms)
    whole = ctc_log_probs(companion_bundle, audio, chunk_frames)[0]
    streamed = torch.cat(stepped[: len(stepped) // 2])  # the first run's chunks
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max().item() <= 1e-4
    session = results[0][0]
    words = companion_bundle.en.decode(ctc_greedy_tokens(whole)).split()
    assert [w.text for w in session.transcript_words] == words != []
    alone = dataclasses.replace(companion_bundle, model=SimpleNamespace(
        encode_transcript=lambda *a: (None, model.ctc_log_probs(model.encoder(*a)[0]))
    ))  # fmt: skip
    assert (ctc_log_probs(alone, audio, chunk_frames)[0] - whole).abs().max().item() > 1e-2


@pytest.mark.parametrize("companion", [False, True], ids=["one-encoder", "companion"])
@pytest.mark.parametrize("pause_lookback_ms", [None, 160])
def test_pause_lookback_forgets_the_silence_before_speech(
    tiny_bundle, companion_bundle, tone, monkeypatch, pause_lookback_ms, companion
):
    """With a pause lookback, speech after 1.28 s of silence is read as after 3.84 s: the
    encoders do not look back past the pause's last frames. Without it, the longer lookback
    (64 frames, 2.56 s here) still reaches the stream's start after the shorter pause."""
    bundle = companion_bundle if companion else tiny_bundle
    model, log_probs = bundle.model, []
    encoders = [model.encoder] + ([model.companion.encoder] if companion else [])
    for encoder in encoders:
        monkeypatch.setattr(
            encoder, "cfg", dataclasses.replace(encoder.cfg, left_context_frames=64)
        )
    fuse = model.transcript_log_probs

    def spy(frames, companion_frames):
        log_probs.append(fuse(frames, companion_frames)[0])
        return log_probs[-1][None]

    monkeypatch.setattr(model, "transcript_log_probs", spy)
    speech_frames = len(tone) // 640  # 40 ms encoder frames
    after = []
    for pause_s in (1.28, 3.84):  # whole 320 ms chunks: the speech starts on a chunk boundary
        log_probs.clear()
        audio = np.concatenate([np.zeros(int(pause_s * 16000), np.float32), tone])
        session, _ = run(bundle, audio, 3200, pause_lookback_ms=pause_lookback_ms)
        after.append(torch.cat(log_probs)[-speech_frames:])
        assert any(w.text for w in session.transcript_words)  # the tone was read as speech
    gap = (after[0] - after[1]).abs().max().item()
    if pause_lookback_ms is None:
        assert gap > 1e-3
    else:
        assert gap <= 1e-4


@pytest.mark.parametrize("sound_margin_db", [None, 10.0])
def test_pause_lookback_keeps_the_sound_heard_before_the_first_token(
    tiny_bundle, tone, monkeypatch, sound_margin_db
):
    """Until the greedy labels find speech the encoder forgets all but the pause lookback, except
    the frames since the sound began: a word's first frames come before its token."""
    from streamasr import model as model_module

    model = tiny_bundle.model
    blank = model.ctc_log_probs

    def no_token(frames):  # speech whose token has not come yet
        log_probs = torch.full_like(blank(frames), -30.0)
        log_probs[..., 0] = 0.0
        return log_probs

    keeps = []
    forget = model_module.EncoderState.forget

    def spy(state, keep_frames):
        keeps.append((state.frames_done, keep_frames))
        return forget(state, keep_frames)

    monkeypatch.setattr(model, "ctc_log_probs", no_token)
    monkeypatch.setattr(model_module.EncoderState, "forget", spy)
    audio = np.concatenate([np.zeros(int(1.28 * 16000), np.float32), tone])  # onset: frame 32
    run(tiny_bundle, audio, 3200, pause_lookback_ms=160, sound_margin_db=sound_margin_db)
    lookback = 160 // tiny_bundle.config.frame_ms
    before = [keep for done, keep in keeps if done <= 32]
    during = [(done, keep) for done, keep in keeps if done > 32]
    assert before and all(keep == lookback for keep in before)
    assert len(during) >= 3
    for done, keep in during:
        assert keep == (lookback if sound_margin_db is None else lookback + done - 32)


def test_nonfinite_samples_are_read_as_silence_and_counted(tiny_bundle, tone):
    """One NaN or infinity would poison the carried caches and silence the rest of the stream."""
    audio = np.concatenate([tone, np.zeros(8000, np.float32), tone])
    bad_at = [100, len(tone) + 4000, len(audio) - 100]
    poisoned, zeroed = audio.copy(), audio.copy()
    poisoned[bad_at] = [np.nan, np.inf, -np.inf]
    zeroed[bad_at] = 0
    session, events = run(tiny_bundle, poisoned, 1600, wait_k=2)
    assert session.nonfinite_samples == 3
    assert texts(events) == texts(run(tiny_bundle, zeroed, 1600, wait_k=2)[1])
    assert any(e.type == "transcript" and e.text for e in events)
    assert np.isnan(poisoned[100])  # the caller's audio is left as it was


def test_partials_add_tentative_words_and_change_nothing_else(tiny_lm_bundle, tiny_bundle, tone):
    audio = np.concatenate([tone, np.zeros(24000, np.float32), tone])
    translating = dict(wait_k=2, translate=True, translate_from="transcript")
    _, plain = run(tiny_lm_bundle, audio, 1600, **translating)
    session, events = run(tiny_lm_bundle, audio, 1600, partials=True, **translating)
    # the translator reads committed words only, never the tentative ones (sessions 32-35 did)
    assert any(e.type == "translation" and e.text for e in plain)
    assert texts([e for e in events if e.type != "partial"]) == texts(plain)
    partials = [e for e in events if e.type == "partial"]
    assert any(e.text for e in partials) and not any(e.final for e in partials)
    for seg in session.segments:  # tentative words come before their segment closes
        last = max(i for i, e in enumerate(events) if e.segment == seg.index and e.final)
        assert all(events.index(p) < last for p in partials if p.segment == seg.index)
    for i, e in enumerate(events):  # words committed in a chunk: a partial follows them there
        if e.type == "transcript" and e.text and not e.final:
            after = events[i + 1 :]
            assert any(p.type == "partial" and p.delay_ms == e.delay_ms for p in after)
    _, greedy = run(tiny_bundle, audio, 1600, wait_k=2, partials=True)  # no beam: none
    assert not any(e.type == "partial" for e in greedy)


def test_integer_samples_are_refused_with_what_was_expected(tiny_bundle):
    session = Session(tiny_bundle, SessionOptions())
    with pytest.raises(ValueError, match=r"expected float samples in \[-1, 1\], got int16"):
        session.accept(np.zeros(1600, np.int16))
    assert session.audio_ms == 0  # nothing was taken in
