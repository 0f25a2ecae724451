"""Audio at the edge: decode any common file, down-mix, resample to the one internal rate."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16_000  # Hz; every internal signal is 16 kHz mono float32
SAMPLES_PER_MS = SAMPLE_RATE // 1000


class AudioError(ValueError):
    """An audio input the user can fix (missing, unreadable, empty)."""


def ms_to_samples(ms: float) -> int:
    return int(round(ms * SAMPLES_PER_MS))


def to_mono_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    """(T,) or (T, C) float array at `rate` -> (T',) float32 at SAMPLE_RATE."""
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if rate != SAMPLE_RATE:
        resampled = AF.resample(torch.from_numpy(samples), rate, SAMPLE_RATE)
        samples = resampled.numpy()
    return samples


def audio_duration_ms(path: str | Path) -> float:
    """A sound file's length from its header, without decoding it."""
    info = sf.info(str(path))
    return info.frames * 1000 / info.samplerate


def _open(path: Path) -> sf.SoundFile:
    """`path` opened for reading; AudioError with a one-line reason if it cannot be."""
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a directory, expected an audio file")
    try:
        f = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError) as err:
        raise AudioError(f"{path}: not a readable audio file ({err})") from None
    if f.frames == 0:
        f.close()
        raise AudioError(f"{path}: the file holds no audio samples")
    return f


def load_audio(path: str | Path) -> np.ndarray:
    """Read a wav/flac/ogg file of any rate and channel count as 16 kHz mono float32.

    Raises AudioError with a one-line reason for a missing, unreadable or empty file.
    """
    path = Path(path)
    with _open(path) as f:
        try:
            samples = f.read(dtype="float32", always_2d=False)
        except (sf.LibsndfileError, RuntimeError) as err:
            raise AudioError(f"{path}: not a readable audio file ({err})") from None
        return to_mono_16k(samples, f.samplerate)


class StreamResampler:
    """A signal arriving in pieces, resampled to 16 kHz as `to_mono_16k` resamples it whole:
    each stretch is resampled with enough of the signal on both sides (torchaudio's sinc kernel
    reaches `width` input samples each way), so its samples are the whole signal's, `margin`
    input samples later. At 16 kHz it hands pieces through."""

    def __init__(self, rate: int):
        self.rate = rate
        divisor = math.gcd(rate, SAMPLE_RATE)
        self.orig, self.new = rate // divisor, SAMPLE_RATE // divisor  # samples per stride
        width = math.ceil(6 * self.orig / (0.99 * min(self.orig, self.new)))  # resample's kernel
        self.margin = 0 if rate == SAMPLE_RATE else self.orig * math.ceil(width / self.orig)
        self.pending = np.zeros(0, np.float32)  # input samples from index `base` on
        self.base = 0
        self.done = 0  # input samples whose output was handed out (a multiple of `orig`)

    def push(self, samples: np.ndarray) -> np.ndarray:
        """(T,) float32 at `rate` -> the 16 kHz samples now certain (maybe none yet)."""
        if self.rate == SAMPLE_RATE:
            return samples
        self.pending = np.concatenate([self.pending, samples])
        end = (self.base + len(self.pending) - self.margin) // self.orig * self.orig
        return self._resample(end, final=False) if end > self.done else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The end of the signal: the rest of its 16 kHz samples."""
        if self.rate == SAMPLE_RATE or self.base + len(self.pending) <= self.done:
            return np.zeros(0, np.float32)
        return self._resample(self.base + len(self.pending), final=True)

    def _resample(self, end: int, final: bool) -> np.ndarray:
        low = max(0, self.done - self.margin)
        segment = torch.from_numpy(np.ascontiguousarray(self.pending[low - self.base :]))
        out = AF.resample(segment, self.rate, SAMPLE_RATE).numpy()
        first = (self.done - low) // self.orig * self.new  # the whole signal's alignment
        last = None if final else first + (end - self.done) // self.orig * self.new
        self.done = end
        drop = max(0, end - self.margin) - self.base
        self.pending, self.base = self.pending[drop:], self.base + drop
        return out[first:last]


class AudioReader:
    """A sound file read block by block as 16 kHz mono float32: the samples `load_audio` gives
    (`StreamResampler`), in memory that does not grow with the file. The file is opened, and
    checked, at construction."""

    def __init__(self, path: str | Path, block_ms: int = 10_000):
        self.path = Path(path)
        self.file = _open(self.path)
        self.block_frames = max(1, self.file.samplerate * block_ms // 1000)

    @property
    def duration_ms(self) -> float:
        return self.file.frames * 1000 / self.file.samplerate

    def blocks(self) -> Iterator[np.ndarray]:
        """The 16 kHz samples, a block at a time; closes the file at the end."""
        resampler = StreamResampler(self.file.samplerate)
        with self.file:
            while len(block := self._read(self.block_frames)):
                if len(out := resampler.push(block)):
                    yield out
            if len(tail := resampler.flush()):
                yield tail

    def _read(self, frames: int) -> np.ndarray:
        try:
            return self.file.read(frames, dtype="float32", always_2d=True).mean(axis=1)
        except (sf.LibsndfileError, RuntimeError) as err:
            raise AudioError(f"{self.path}: not a readable audio file ({err})") from None


class AudioRecorder:
    """The 16 kHz mono audio a session hears, written to a sound file as it arrives (16-bit PCM;
    the container from the suffix: .wav, .flac, .ogg...), flushed piece by piece so that what was
    heard is on disk whatever ends the stream. A sample that is not finite is written as the
    silence the session reads it as."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.file = sf.SoundFile(self.path, "w", samplerate=SAMPLE_RATE, channels=1)
        except TypeError:  # soundfile's word for a suffix that names no format
            raise AudioError(f"{self.path}: not a sound file name (.wav, .flac, .ogg)") from None
        except (sf.LibsndfileError, RuntimeError) as err:
            raise AudioError(f"{self.path}: cannot be written ({err})") from None

    def write(self, piece: np.ndarray) -> None:
        self.file.write(np.nan_to_num(piece, nan=0.0, posinf=0.0, neginf=0.0))
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> AudioRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def in_room(samples: np.ndarray, rt60_s: float, drr_db: float, seed: str) -> np.ndarray:
    """`samples` as heard in a synthetic room: convolved with the direct sound and a tail of
    Gaussian noise that starts 2.5 ms later and decays by 60 dB in `rt60_s`, holding `drr_db` dB
    less power than the direct sound; cut to the input's length. `seed` (a file's id) draws the
    tail, so a file meets the same room in every run."""
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    onset, length = ms_to_samples(2.5), max(ms_to_samples(2.5) + 1, ms_to_samples(rt60_s * 1000))
    t = np.arange(length - onset) / SAMPLE_RATE
    tail = rng.standard_normal(length - onset) * 10 ** (-3 * t / rt60_s)
    tail *= np.sqrt(10 ** (-drr_db / 10) / np.sum(tail**2))
    response = np.concatenate([[1.0], np.zeros(onset - 1), tail]).astype(np.float32)
    wet = AF.fftconvolve(torch.from_numpy(samples), torch.from_numpy(response))
    return wet[: len(samples)].numpy()
