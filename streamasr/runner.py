"""Drive a session from a source until it ends, is stopped, or Ctrl-C: output is never lost."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .session import Event, Session
from .sources import Source


def run_stream(
    session: Session,
    source: Source,
    on_events: Callable[[list[Event]], None],
    on_audio: Callable[[np.ndarray], None] | None = None,
) -> None:
    """Feed every piece of `source` to `session` (and to `on_audio` first, when given); the open
    segment is always closed and flushed."""
    source.start()
    try:
        while (piece := source.read()) is not None:
            if on_audio is not None:
                on_audio(piece)
            on_events(session.accept(piece))
    finally:
        source.stop()
        on_events(session.finish())
