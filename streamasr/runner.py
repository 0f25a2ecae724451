"""Drive a session from a source until it ends, is stopped, or Ctrl-C: output is never lost."""

from __future__ import annotations

from collections.abc import Callable

from .session import Event, Session
from .sources import Source


def run_stream(session: Session, source: Source, on_events: Callable[[list[Event]], None]) -> None:
    """Feed every piece of `source` to `session`; the open segment is always closed and flushed."""
    source.start()
    try:
        while (piece := source.read()) is not None:
            on_events(session.accept(piece))
    finally:
        source.stop()
        on_events(session.finish())
