"""`make demo`: transcribe and translate the shipped sample as a live stream, with latencies."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from .bundle import DEFAULT_MODEL_DIR, load_bundle
from .runner import run_stream
from .session import Event, Session, SessionOptions
from .sources import FileSource

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample" / "sample.flac"


def main() -> int:
    bundle = load_bundle(DEFAULT_MODEL_DIR)
    references = json.loads(SAMPLE.with_suffix(".json").read_text())["utterances"]
    source = FileSource(SAMPLE)
    print(f"model {DEFAULT_MODEL_DIR.name}: {bundle.model.num_parameters / 1e6:.1f} M parameters")
    print(
        f"sample {SAMPLE.name}: {source.duration_ms / 1000:.1f} s, voices {', '.join(r['voice'] for r in references)}"
    )
    print("streaming with 320 ms chunks, wait-k = 3, virtual clock\n")
    session = Session(
        bundle, SessionOptions(chunk_ms=320, translate=True, wait_k=3), stream=SAMPLE.name
    )

    def show(events: list[Event]) -> None:
        for e in events:
            if e.text or e.final:
                mark = "final" if e.final else "     "
                label = "en" if e.type == "transcript" else "de"
                print(f"  {e.delay_ms / 1000:6.2f} s  seg {e.segment} {label} {mark}  {e.text}")

    run_stream(session, source, show)
    print("\nsegments:")
    for seg in session.segments:
        print(
            f"  [{seg.start_ms / 1000:5.2f} - {seg.end_ms / 1000:5.2f} s] {seg.transcript}\n{'':20}-> {seg.translation}"
        )
    print("\nreferences:")
    for ref in references:
        print(f"  {ref['text']}\n  -> {ref['translation']}")
    compute = np.array(session.chunk_compute_ms)
    lags = [w.elapsed_ms - w.delay_ms for w in session.transcript_words + session.translation_words]
    print("\nlatency and speed (measured now):")
    print(f"  real-time factor {compute.sum() / source.duration_ms:.3f}  "
          f"(chunk compute p50 {np.percentile(compute, 50):.1f} ms, p99 {np.percentile(compute, 99):.1f} ms)")  # fmt: skip
    if lags:
        print(f"  computation lag of emitted words: mean {statistics.fmean(lags):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
