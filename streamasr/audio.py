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


class AudioReader:
    """A sound file read block by block as 16 kHz mono float32: the samples `load_audio` gives,
    in memory that does not grow with the file. Each block is resampled with enough of the
    signal on both sides (torchaudio's sinc kernel is `width` input samples each way) that its
    samples are the whole signal's; the file is opened, and checked, at construction."""

    def __init__(self, path: str | Path, block_ms: int = 10_000):
        self.path = Path(path)
        self.file = _open(self.path)
        self.rate, self.frames = self.file.samplerate, self.file.frames
        divisor = math.gcd(self.rate, SAMPLE_RATE)
        self.orig, self.new = self.rate // divisor, SAMPLE_RATE // divisor  # samples per stride
        width = math.ceil(6 * self.orig / (0.99 * min(self.orig, self.new)))  # resample's kernel
        self.margin = 0 if self.rate == SAMPLE_RATE else self.orig * (width // self.orig + 2)
        self.block = self.orig * max(1, round(self.rate * block_ms / 1000 / self.orig))

    @property
    def duration_ms(self) -> float:
        return self.frames * 1000 / self.rate

    def close(self) -> None:
        self.file.close()

    def _read(self, frames: int) -> np.ndarray:
        try:
            return self.file.read(frames, dtype="float32", always_2d=True).mean(axis=1)
        except (sf.LibsndfileError, RuntimeError) as err:
            raise AudioError(f"{self.path}: not a readable audio file ({err})") from None

    def blocks(self) -> Iterator[np.ndarray]:
        """The 16 kHz samples, a block at a time; closes the file at the end."""
        pending, base = np.zeros(0, np.float32), 0  # input samples from index `base` on
        start, total = 0, self.frames
        with self.file:
            while start < total:
                end = min(total, start + self.block)
                while base + len(pending) < min(total, end + self.margin):
                    more = self._read(min(total, end + self.margin) - base - len(pending))
                    if not len(more):  # shorter than its header said
                        total = end = base + len(pending)
                        break
                    pending = np.concatenate([pending, more])
                low = max(0, start - self.margin)
                segment = pending[low - base : min(total, end + self.margin) - base]
                if self.rate == SAMPLE_RATE:
                    yield segment[start - low : end - low]
                else:
                    out = AF.resample(torch.from_numpy(segment), self.rate, SAMPLE_RATE).numpy()
                    first = (start - low) // self.orig * self.new  # whole-signal alignment
                    last = None if end == total else first + (end - start) // self.orig * self.new
                    yield out[first:last]
                start = end
                drop = max(0, start - self.margin) - base
                pending, base = pending[drop:], base + drop


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
