"""Streaming benchmark: speed and memory of one long stream, made of corpus utterances joined
with pauses and fed piece by piece (the stream itself is never held in memory)."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .audio import load_audio, ms_to_samples
from .bundle import Bundle
from .manifest import Utterance
from .session import Session, SessionOptions


def rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def long_stream(
    utterances: list[Utterance], minutes: float, pause_ms: float, piece_ms: float
) -> Iterator[np.ndarray]:
    """Pieces of utterance, pause, utterance, ... until `minutes` of audio, cycling the list."""
    total, piece = ms_to_samples(minutes * 60_000), ms_to_samples(piece_ms)
    sent, index = 0, 0
    while sent < total:
        audio = np.concatenate(
            [
                load_audio(utterances[index % len(utterances)].audio),
                np.zeros(ms_to_samples(pause_ms), np.float32),
            ]
        )
        index += 1
        for start in range(0, len(audio), piece):
            chunk = audio[start : start + piece][: total - sent]
            if len(chunk) == 0:
                return
            sent += len(chunk)
            yield chunk


@dataclass(frozen=True)
class BenchResult:
    minutes: float
    rtf: float
    chunk_p50_ms: float
    chunk_p99_ms: float
    rss_start_mb: float
    rss_peak_mb: float  # highest resident memory sampled during the stream
    rss_end_mb: float
    segments: int


def bench_stream(
    bundle: Bundle, utterances: list[Utterance], minutes: float, options: SessionOptions
) -> BenchResult:
    session = Session(bundle, options, stream=f"bench-{minutes}min")
    start = rss_mb()
    peak = start
    for i, piece in enumerate(long_stream(utterances, minutes, pause_ms=1000, piece_ms=100)):
        session.accept(piece)
        if i % 100 == 0:  # every 10 s of audio
            peak = max(peak, rss_mb())
    session.finish()
    compute = np.array(session.chunk_compute_ms)
    return BenchResult(
        minutes=minutes,
        rtf=compute.sum() / session.audio_ms,
        chunk_p50_ms=float(np.percentile(compute, 50)),
        chunk_p99_ms=float(np.percentile(compute, 99)),
        rss_start_mb=start,
        rss_peak_mb=max(peak, rss_mb()),
        rss_end_mb=rss_mb(),
        segments=len(session.segments),
    )
