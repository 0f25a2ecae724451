"""Audio at the edge: decode any common file, down-mix, resample to the one internal rate."""

from __future__ import annotations

import zlib
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


def load_audio(path: str | Path) -> np.ndarray:
    """Read a wav/flac/ogg file of any rate and channel count as 16 kHz mono float32.

    Raises AudioError with a one-line reason for a missing, unreadable or empty file.
    """
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a directory, expected an audio file")
    try:
        samples, rate = sf.read(str(path), dtype="float32", always_2d=False)
    except (sf.LibsndfileError, RuntimeError) as err:
        raise AudioError(f"{path}: not a readable audio file ({err})") from None
    if samples.size == 0:
        raise AudioError(f"{path}: the file holds no audio samples")
    return to_mono_16k(samples, rate)


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
