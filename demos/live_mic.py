"""Live captions from the default microphone with the public API: what `streamasr live` does.

python demos/live_mic.py            # Ctrl-C to stop; the open segment is flushed
"""

from streamasr.bundle import load_bundle
from streamasr.runner import run_stream
from streamasr.session import Session, SessionOptions
from streamasr.sources import MicSource


def main() -> None:
    bundle = load_bundle()  # the shipped models/base
    session = Session(bundle, SessionOptions(chunk_ms=320, translate=True, wait_k=3), clock="wall")
    source = MicSource(device=None)  # a name or index picks another input device

    def show(events):
        for e in events:
            if e.text:
                print(f"[{e.delay_ms / 1000:6.2f}s] {e.type:11s} {e.text}", flush=True)
            if e.final:
                print(
                    f"[{e.delay_ms / 1000:6.2f}s] {e.type} of segment {e.segment} is final",
                    flush=True,
                )

    try:
        run_stream(session, source, show)  # closes and flushes the open segment on Ctrl-C
    except KeyboardInterrupt:
        pass
    print(f"dropped pieces: {source.dropped_pieces}, device overflows: {source.device_overflows}")


if __name__ == "__main__":
    main()
