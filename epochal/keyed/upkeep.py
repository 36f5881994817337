"""When kept state is rewritten: a state table compacted after so many appends once their rows are
a share of its own (or after many more whatever their rows), an arrangement built again after so
many appends or appended rows. The defaults trade a rewrite's cost against
what every later read pays for the appends piling up; tests lower them through the Engine so the
rewrites run within a few epochs and are checked like every other step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Upkeep:
    compact_after: int = 8  # appends to a state table before it may be compacted (state.py)
    compact_fraction: float = 0.1  # appended rows, against the rows it was compacted to, past which it is
    compact_appends: int = 64  # appends after which it is compacted whatever their rows
    rebuild_appends: int = 64  # appended files before an arrangement is built again (each read opens every one)
    rebuild_fraction: float = 0.1  # appended rows, against the built rows, before it is built again
    rebuild_rows: int = 100_000  # appended rows below which it is never built again for their number

    def __post_init__(self):
        if self.compact_after < 1 or self.compact_appends < 1 or self.rebuild_appends < 1:
            raise ValueError(f"compact_after, compact_appends and rebuild_appends must be at least 1: {self}")
        if self.compact_fraction < 0 or self.rebuild_fraction < 0 or self.rebuild_rows < 0:
            raise ValueError(f"compact_fraction, rebuild_fraction and rebuild_rows must not be negative: {self}")
