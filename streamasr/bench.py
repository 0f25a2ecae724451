"""Streaming benchmark: speed, memory and WER of one long stream, made of corpus utterances
joined with pauses and fed piece by piece (the stream itself is never held in memory)."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from dataclasses import dataclass

import jiwer
import numpy as np

from .audio import audio_duration_ms, load_audio, ms_to_samples
from .bundle import Bundle
from .manifest import Utterance
from .session import Session, SessionOptions
from .text import normalize_transcript

PAUSE_MS = 1000  # between the utterances of a stream


def rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def stream_plan(utterances: list[Utterance], minutes: float, pause_ms: float) -> list[Utterance]:
    """The utterances, cycled, that one stream of at least `minutes` plays, each followed by a
    pause: whole utterances, so that their transcripts are the stream's reference."""
    plan, total_ms = [], 0.0
    while total_ms < minutes * 60_000:
        plan.append(utterances[len(plan) % len(utterances)])
        total_ms += (plan[-1].duration_ms or audio_duration_ms(plan[-1].audio)) + pause_ms
    return plan


def long_stream(plan: list[Utterance], pause_ms: float, piece_ms: float) -> Iterator[np.ndarray]:
    """Pieces of utterance, pause, utterance, ... (one utterance in memory at a time)."""
    piece, pause = ms_to_samples(piece_ms), np.zeros(ms_to_samples(pause_ms), np.float32)
    for utterance in plan:
        audio = np.concatenate([load_audio(utterance.audio), pause])
        for start in range(0, len(audio), piece):
            yield audio[start : start + piece]


def stream_wer(plan: list[Utterance], words: list[str]) -> float | None:
    """WER (%) of a stream's transcript against its utterances' transcripts in a row; None
    when an utterance has none."""
    if any(u.text is None for u in plan):
        return None
    reference = " ".join(normalize_transcript(u.text) for u in plan)
    return 100 * jiwer.wer(reference, normalize_transcript(" ".join(words)))


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
    wer: float | None  # the whole stream's transcript (None: the manifest has no transcripts)


def bench_stream(
    bundle: Bundle, utterances: list[Utterance], minutes: float, options: SessionOptions
) -> BenchResult:
    plan = stream_plan(utterances, minutes, PAUSE_MS)
    session = Session(bundle, options, stream=f"bench-{minutes}min")
    start = rss_mb()
    peak = start
    for i, piece in enumerate(long_stream(plan, PAUSE_MS, piece_ms=100)):
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
        wer=stream_wer(plan, [w.text for w in session.transcript_words]),
    )
