"""Simultaneous translation policies: torch-free, they see a small view and say Read or Write.

wait-k (Ma et al., 2019, "STACL"): write target token i (0-based) once k + i // tokens_per_unit
source units are read; once the source has ended, write everything left. k = None is full
context: read the whole segment, then write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class PolicyView:
    units_read: int  # complete source units read in this segment
    tokens_written: int  # target tokens written in this segment
    source_finished: bool  # the segment's source has ended


@dataclass(frozen=True)
class WaitK:
    k: int | None  # None = infinity (full context)
    tokens_per_unit: int = 1

    def __post_init__(self) -> None:
        if self.k is not None and self.k < 1:
            raise ValueError(f"wait-k needs k >= 1 or None (inf), got {self.k}")
        if self.tokens_per_unit < 1:
            raise ValueError(f"tokens_per_unit must be >= 1, got {self.tokens_per_unit}")

    def units_needed(self, token_index: int) -> int | None:
        """Units that must be read before token `token_index` is written (None: all of them)."""
        if self.k is None:
            return None
        return self.k + token_index // self.tokens_per_unit

    def __call__(self, view: PolicyView) -> Action:
        if view.source_finished:
            return Action.WRITE
        needed = self.units_needed(view.tokens_written)
        return Action.WRITE if needed is not None and view.units_read >= needed else Action.READ


def parse_wait_k(text: str) -> int | None:
    """'3' -> 3, 'inf' -> None; anything else is a ValueError with the expected form."""
    if text.strip().lower() in ("inf", "infinity"):
        return None
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"wait-k must be a positive integer or 'inf', got {text!r}") from None
    if k < 1:
        raise ValueError(f"wait-k must be a positive integer or 'inf', got {text!r}")
    return k
