"""Writers for session output: text, JSON Lines events, SRT and WebVTT subtitles."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import TextIO

from .session import Event, Segment

FORMATS = ("text", "jsonl", "srt", "vtt")


def format_timestamp(ms: float, decimal: str) -> str:
    ms = max(0, round(ms))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    seconds, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{decimal}{ms:03d}"


class Writer:
    """Receives events as they are emitted and the closed segments at the end of a stream."""

    def __init__(self, out: TextIO):
        self.out = out

    def events(self, events: list[Event]) -> None:
        pass

    def end_stream(self, stream: str, segments: list[Segment]) -> None:
        pass


class JsonlWriter(Writer):
    def events(self, events: list[Event]) -> None:
        for event in events:
            self.out.write(json.dumps(event.to_json(), ensure_ascii=False) + "\n")
        if events:
            self.out.flush()


class TextWriter(Writer):
    """One line per closed segment (and its translation beneath), as segments close."""

    def __init__(self, out: TextIO, show_stream: bool = False):
        super().__init__(out)
        self.show_stream = show_stream
        self.words: dict[tuple[str, int, str], list[str]] = defaultdict(list)

    def events(self, events: list[Event]) -> None:
        for e in events:
            if e.type == "partial":  # a line is written once its segment is final
                continue
            key = (e.stream, e.segment, e.type)
            if e.text:
                self.words[key].append(e.text)
            if e.final:
                text = " ".join(self.words.pop(key, []))
                prefix = f"{e.stream}: " if self.show_stream else ""
                line = f"{prefix}{text}" if e.type == "transcript" else f"{prefix}  -> {text}"
                self.out.write(line + "\n")
                self.out.flush()


class SubtitleWriter(Writer):
    """SRT or WebVTT cues from final segments: transcript, and translation on a second line."""

    def __init__(self, out: TextIO, kind: str, translate: bool):
        super().__init__(out)
        self.kind, self.translate = kind, translate

    def end_stream(self, stream: str, segments: list[Segment]) -> None:
        decimal = "," if self.kind == "srt" else "."
        if self.kind == "vtt":
            self.out.write("WEBVTT\n\n")
        cues = [s for s in segments if s.transcript or s.translation]
        for number, seg in enumerate(cues, 1):
            end_ms = max(seg.end_ms, seg.start_ms + 1)
            if self.kind == "srt":
                self.out.write(f"{number}\n")
            self.out.write(
                f"{format_timestamp(seg.start_ms, decimal)} --> {format_timestamp(end_ms, decimal)}\n"
            )
            self.out.write(seg.transcript + "\n")
            if self.translate and seg.translation:
                self.out.write(seg.translation + "\n")
            self.out.write("\n")
        self.out.flush()


def make_writer(kind: str, out: TextIO, translate: bool, show_stream: bool = False) -> Writer:
    if kind == "jsonl":
        return JsonlWriter(out)
    if kind == "text":
        return TextWriter(out, show_stream)
    if kind in ("srt", "vtt"):
        return SubtitleWriter(out, kind, translate)
    raise ValueError(f"format must be one of {FORMATS}, got {kind!r}")
