"""Streaming benchmark: speed, memory and WER of one long stream, made of corpus utterances
joined with pauses and fed piece by piece (the stream itself is never held in memory)."""

from __future__ import annotations

import resource
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

import jiwer
import numpy as np

from .audio import audio_duration_ms, load_audio, ms_to_samples
from .bundle import Bundle
from .manifest import Utterance
from .session import Segment, Session, SessionOptions
from .text import normalize_transcript

PAUSE_MS = 1000  # between the utterances of a stream


def rss_mb() -> float:
    """Resident memory of this process now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _duration_ms(utterance: Utterance) -> float:
    return utterance.duration_ms or audio_duration_ms(utterance.audio)


def stream_plan(utterances: list[Utterance], minutes: float, pause_ms: float) -> list[Utterance]:
    """The utterances, cycled, that one stream of at least `minutes` plays, each followed by a
    pause: whole utterances, so that their transcripts are the stream's reference."""
    plan, total_ms = [], 0.0
    while total_ms < minutes * 60_000:
        plan.append(utterances[len(plan) % len(utterances)])
        total_ms += _duration_ms(plan[-1]) + pause_ms
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


def utterance_transcripts(
    plan: list[Utterance], pause_ms: float, segments: list[Segment]
) -> list[str]:
    """Each planned utterance's share of a stream's transcript: the segments whose middle lies
    between the utterance's start and the next one's (a segment split at a pause inside an
    utterance stays with it)."""
    starts = np.cumsum([0.0] + [_duration_ms(u) + pause_ms for u in plan[:-1]])
    texts: list[list[str]] = [[] for _ in plan]
    for segment in segments:
        i = bisect_right(starts, (segment.start_ms + segment.end_ms) / 2) - 1
        texts[max(i, 0)].append(segment.transcript)
    return [" ".join(t for t in text if t) for text in texts]


def utterance_records(plan: list[Utterance], transcripts: list[str]) -> list[dict]:
    """A line per played utterance: its id, reference and share of the stream's transcript, and
    the word errors between them (substitutions, deletions and insertions; their sum over the
    lines can exceed the stream's, whose alignment may pair words across utterances)."""
    records = []
    for utterance, transcript in zip(plan, transcripts):
        reference = normalize_transcript(utterance.text or "")
        hypothesis = normalize_transcript(transcript)
        errors = None
        if utterance.text is not None and reference:
            out = jiwer.process_words(reference, hypothesis)
            errors = out.substitutions + out.deletions + out.insertions
        records.append(
            {
                "id": utterance.id,
                "reference": reference if utterance.text is not None else None,
                "transcript": hypothesis,
                "words": len(reference.split()),
                "errors": errors,
            }
        )
    return records


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
    plan: list[Utterance]  # the utterances the stream played, in order
    transcripts: list[str]  # each one's share of the stream's transcript


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
        plan=plan,
        transcripts=utterance_transcripts(plan, PAUSE_MS, session.segments),
    )
