"""Manifests: JSON Lines, one utterance per line; audio paths relative to the manifest."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


class ManifestError(ValueError):
    """A manifest the user can fix: missing, not JSON Lines, or rows without id/audio."""


@dataclass(frozen=True)
class Utterance:
    id: str
    audio: Path  # resolved against the manifest's folder
    text: str | None = None
    translation: str | None = None
    duration_ms: float | None = None
    voice: str | None = None  # the speaker, where the manifest names one


def read_manifest(path: str | Path, limit: int | None = None) -> list[Utterance]:
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest")
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                audio = Path(row["audio"])
                rows.append(
                    Utterance(
                        id=str(row["id"]),
                        audio=audio if audio.is_absolute() else path.parent / audio,
                        text=row.get("text"),
                        translation=row.get("translation"),
                        duration_ms=row.get("duration_ms"),
                        voice=None if row.get("voice") is None else str(row["voice"]),
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ManifestError(
                    f"{path}:{line_no}: expected a JSON object with id and audio ({err})"
                ) from None
            if limit is not None and len(rows) >= limit:
                break
    return rows


def read_audio_manifest(path: str | Path, limit: int | None = None) -> list[Utterance]:
    """`read_manifest` for the commands that play the audio: at least one utterance, ids that
    name one utterance each (results are kept by id), and every audio file present before any
    work starts."""
    rows = read_manifest(path, limit)
    if not rows:
        raise ManifestError(f"{path}: no utterances")
    ids = Counter(u.id for u in rows)
    if repeated := [id_ for id_, count in ids.items() if count > 1]:
        raise ManifestError(
            f"{path}: {len(repeated)} ids name several utterances, first {repeated[0]!r}"
        )
    missing = [u.audio for u in rows if not u.audio.is_file()]
    if missing:
        raise ManifestError(f"{path}: {len(missing)} audio files missing, first {missing[0]}")
    return rows
