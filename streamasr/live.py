"""The live terminal view: growing transcript and translation, latency and overflow figures."""

from __future__ import annotations

import statistics
from collections import defaultdict

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from .session import Event
from .sources import Source


class LiveView:
    """Final segments in plain text, the open segment's words dimmed, a status line below."""

    def __init__(self, source: Source, translate: bool, max_segments: int = 8):
        self.source, self.translate, self.max_segments = source, translate, max_segments
        self.words: dict[tuple[int, str], list[str]] = defaultdict(list)
        self.partial: dict[int, str] = {}  # tentative words after a segment's committed ones
        self.closed: dict[tuple[int, str], bool] = {}
        self.lags_ms: list[float] = []
        self.audio_ms = 0.0
        self.live = Live(self.render(), refresh_per_second=8, transient=False)

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.update(self.render())
        self.live.__exit__(*exc)

    def events(self, events: list[Event]) -> None:
        for e in events:
            if e.type == "partial":
                self.partial[e.segment] = e.text
                continue
            if e.text:
                self.words[(e.segment, e.type)].append(e.text)
            if e.type == "transcript":
                self.partial.pop(e.segment, None)  # a partial follows the words it extends
            if e.final:
                self.closed[(e.segment, e.type)] = True
            self.lags_ms.append(e.elapsed_ms - e.delay_ms)
            self.audio_ms = max(self.audio_ms, e.delay_ms)
        self.live.update(self.render())

    def _panel(self, kind: str, title: str) -> Panel:
        text = Text()
        shown = {seg for seg, k in self.words if k == kind}
        if kind == "transcript":
            shown |= {seg for seg, words in self.partial.items() if words}
        segments = sorted(shown)[-self.max_segments :]
        for seg in segments:
            final = self.closed.get((seg, kind), False)
            text.append(" ".join(self.words[(seg, kind)]), style="bold" if final else "dim")
            if kind == "transcript" and self.partial.get(seg):
                text.append(" " + self.partial[seg], style="dim italic")
            text.append("\n")
        return Panel(text, title=title)

    def render(self) -> Group:
        lag = statistics.median(self.lags_ms[-50:]) if self.lags_ms else 0.0
        status = Text(
            f"audio {self.audio_ms / 1000:6.1f} s   compute lag p50 {lag:6.0f} ms   "
            f"dropped pieces {self.source.dropped_pieces}   device overflows {self.source.device_overflows}",
            style="cyan",
        )
        parts = [self._panel("transcript", "English")]
        if self.translate:
            parts.append(self._panel("translation", "Deutsch"))
        return Group(*parts, status)
