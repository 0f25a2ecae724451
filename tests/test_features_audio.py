"""Audio decoding at the edge and streaming features."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from streamasr.audio import (
    SAMPLE_RATE,
    AudioError,
    AudioReader,
    StreamResampler,
    in_room,
    load_audio,
    to_mono_16k,
)
from streamasr.features import FeatureConfig, LogMel, RunningStats, SoundOnset, StreamingLogMel
from streamasr.sources import FileSource


@pytest.mark.parametrize("cuts", [[160], [1], [37, 401, 5], [100_000]])
def test_streaming_features_equal_whole_signal(tone, cuts):
    logmel = LogMel(FeatureConfig())
    whole = logmel(torch.from_numpy(tone))
    stream = StreamingLogMel(logmel)
    state, pieces, position, i = stream.init_state(), [], 0, 0
    while position < len(tone):
        size = cuts[i % len(cuts)]
        frames, state = stream.step(torch.from_numpy(tone[position : position + size]), state)
        pieces.append(frames)
        position, i = position + size, i + 1
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max().item() <= 1e-4
    assert state.pending.numel() < logmel.config.win_samples


def test_running_stats_match_torch():
    frames = torch.randn(500, 80) * 3 + 1
    stats = RunningStats(80)
    stats.update(frames[:123])
    stats.update(frames[123:])
    result = stats.result()
    assert torch.allclose(result.mean, frames.mean(0), atol=1e-5)
    assert torch.allclose(result.std, frames.std(0, unbiased=False), atol=1e-4)


def test_any_rate_and_channels_become_16k_mono(tmp_path, tone):
    stereo = np.stack([tone, tone], axis=1)
    sf.write(tmp_path / "a.wav", stereo[::2], 8000)  # 8 kHz stereo
    sf.write(tmp_path / "b.flac", np.repeat(tone, 3)[:, None], 48000)
    sf.write(tmp_path / "c.ogg", tone, 16000)
    for name, seconds in (
        ("a.wav", len(tone) / 16000),
        ("b.flac", len(tone) / 16000),
        ("c.ogg", len(tone) / 16000),
    ):
        audio = load_audio(tmp_path / name)
        assert audio.dtype == np.float32 and audio.ndim == 1
        assert abs(len(audio) / 16000 - seconds) < 0.01


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "no such file"),
        (lambda p: p.write_text("not audio"), "not a readable audio file"),
        (lambda p: sf.write(p, np.zeros(0, np.float32), 16000), "no audio samples"),
    ],
)
def test_bad_files_raise_one_line_errors(tmp_path, make, message):
    path = tmp_path / "x.wav"
    make(path)
    with pytest.raises(AudioError, match=message) as err:
        load_audio(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("rate, channels", [(16000, 1), (44100, 2), (8000, 1), (22050, 2)])
@pytest.mark.parametrize("block_ms", [100, 1000])
def test_a_file_read_block_by_block_is_the_whole_file(tmp_path, rate, channels, block_ms):
    """Each block is resampled with enough of its neighbours to be the whole signal's samples:
    exactly at 16 kHz, to float rounding otherwise; no block holds more than its share."""
    rng = np.random.default_rng(rate)
    signal = (0.1 * rng.standard_normal((3 * rate + 77, channels))).astype(np.float32)
    sf.write(tmp_path / "x.wav", signal, rate, subtype="FLOAT")
    whole = load_audio(tmp_path / "x.wav")
    blocks = list(AudioReader(tmp_path / "x.wav", block_ms=block_ms).blocks())
    assert max(len(b) for b in blocks) <= block_ms * SAMPLE_RATE // 1000 + 16
    streamed = np.concatenate(blocks)
    assert streamed.dtype == np.float32 and len(streamed) == len(whole)
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=0 if rate == SAMPLE_RATE else 1e-6)
    source, pieces = FileSource(tmp_path / "x.wav"), []  # 100 ms pieces across the blocks
    while (piece := source.read()) is not None:
        pieces.append(piece)
    assert {len(p) for p in pieces[:-1]} == {1600}
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rate", [44100, 48000, 8000, 22050, SAMPLE_RATE])
def test_a_stream_resampled_piece_by_piece_is_the_whole_signal_resampled(rate):
    rng = np.random.default_rng(rate)
    signal = (0.1 * rng.standard_normal(2 * rate + 333)).astype(np.float32)
    cuts = np.cumsum(rng.integers(1, rate // 5, size=100))
    resampler = StreamResampler(rate)
    out = [resampler.push(piece) for piece in np.split(signal, cuts[cuts < len(signal)])]
    out = np.concatenate([*out, resampler.flush()])
    np.testing.assert_allclose(out, to_mono_16k(signal, rate), rtol=0, atol=1e-6)
    assert resampler.margin < rate // 40  # what it holds back: under 25 ms


def test_a_room_adds_a_decaying_tail_of_the_set_power():
    click = np.zeros(SAMPLE_RATE, dtype=np.float32)
    click[1000] = 1.0
    wet = in_room(click, rt60_s=0.5, drr_db=6.0, seed="a")
    assert len(wet) == len(click) and np.abs(wet[:1000]).max() < 1e-6  # causal, same length
    assert wet[1000] == pytest.approx(1.0, abs=1e-5)  # the direct sound
    assert np.abs(wet[1001:1040]).max() < 1e-6  # reflections begin 2.5 ms later
    assert np.sum(wet[1001:] ** 2) == pytest.approx(10**-0.6, rel=1e-3)  # 6 dB below it
    energy = wet[1040:] ** 2  # 60 dB per 0.5 s: 54 dB between 0-50 ms and 450-500 ms
    assert 10 * np.log10(energy[:800].mean() / energy[7200:8000].mean()) == pytest.approx(54, abs=3)
    assert np.array_equal(wet, in_room(click, 0.5, 6.0, seed="a"))  # a file meets one room
    assert not np.array_equal(wet, in_room(click, 0.5, 6.0, seed="b"))


def onsets(audio, cut_frames=50, **options):
    """SoundOnset fed audio's log-mel frames in pieces: its onset after each piece."""
    frames, sound, seen = LogMel()(torch.from_numpy(audio)), SoundOnset(**options), []
    for start in range(0, frames.shape[0], cut_frames):
        sound.update(frames[start : start + cut_frames])
        seen.append(sound.onset)
    return seen


def test_sound_onset_finds_where_sound_began_and_forgets_it_after_a_pause(tone):
    silence = np.zeros(16000, np.float32)  # 100 frames
    seen = onsets(np.concatenate([silence, tone, silence]))
    assert seen[:2] == [None, None]
    assert 99 <= seen[2] <= 101  # the tone's first frame (the window reaches back 15 ms)
    assert seen[2:6] == [seen[2]] * 4  # held through the tone
    assert seen[-1] is None  # ended by the silence after it
    assert onsets(np.concatenate([silence, tone]), cut_frames=7)[-1] == seen[2]  # any cut
    # quiet runs shorter than quiet_ms do not end the sound
    gap = np.zeros(1600, np.float32)  # 100 ms
    assert onsets(np.concatenate([silence, tone, gap, tone]))[-1] == seen[2]


def test_sound_onset_learns_a_steady_noise_as_its_floor(tone):
    """Noise 33 dB above digital silence is sound until the rising floor reaches it; then a
    tone over it is heard from its start. A stream that opens with the tone hears it too."""
    rng = np.random.default_rng(1)
    noise = (0.003 * rng.standard_normal(30 * 16000)).astype(np.float32)
    seen = onsets(np.concatenate([noise, noise[: len(tone)] + tone]), cut_frames=100)
    assert seen[0] == 0  # heard at first: the floor starts at digital silence
    assert seen[28] is None  # 28 s in: the noise is the floor
    assert 3000 <= seen[-1] <= 3001  # the tone, from its first frame
    assert onsets(tone)[0] == 0
