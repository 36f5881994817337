"""Reclocking: the durable remap from source versions (FromTime) to epochs (IntoTime), after
Materialize's reclocking (docs/architecture.md, section 7).

For epoch `e` and source `s` the frontier R(e, s) is the first version of `s` not included in `e`;
`e` covers versions [R(e-1, s), R(e, s)). A time-window epoch ending at `end` has
R(e, s) = 1 + max{v : ts(v) < end}, an on-demand epoch the latest version + 1. A frontier is
written once, the first time anyone needs it, and never changes (frozen), so re-running an epoch
reads exactly the same versions; frontiers are monotone in the epoch order, so every source commit
lands in exactly one epoch. Epochs are identified and ordered by their end time.

Each record keeps the source's Delta table id: a table created again at the same path counts its
versions from 0 again, so its frontier starts again from 0 (docs/architecture.md, section 7).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping

import pyarrow as pa

from ..errors import EpochalError
from .clock import CommitClock, LogicalClock, utc
from .deltalog import DeltaLog
from .metastore import RecordTable

UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

REMAP_SCHEMA = pa.schema(
    [
        ("epoch", pa.string()),
        ("end_time", pa.timestamp("us", tz="UTC")),
        ("kind", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("frontier", pa.int64()),
        ("note", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
        ("table_id", pa.string()),  # Delta's metaData.id of the source when the frontier was set
    ]
)


class ReclockError(EpochalError, RuntimeError):
    """An epoch that cannot be created (a window not closed yet, or out of order)."""


def epoch_key(end: datetime) -> str:
    """Sortable text identity of the epoch ending at `end`."""
    return utc(end).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def txn_version(end: datetime) -> int:
    """Microseconds since 1970 of the epoch's end: monotone in the epoch order."""
    delta = utc(end) - UNIX_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True)
class Source:
    name: str
    path: str
    clock: CommitClock | LogicalClock


@dataclass(frozen=True)
class Epoch:
    key: str
    end: datetime
    kind: str  # "window" | "on_demand"
    frontiers: Mapping[str, int] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)
    table_ids: Mapping[str, str] = field(default_factory=dict)  # per source, where recorded

    @property
    def ordinal(self) -> int:
        return txn_version(self.end)

    def __str__(self) -> str:
        return self.key


def frontier_for_window(log: DeltaLog | None, clock, end: datetime, lower: int, upper: int | None):
    """R = 1 + the last version whose (non-decreasing) source time is before `end`, kept within
    [lower, upper] so the remap stays monotone. Returns (frontier, note)."""
    if log is None:
        return lower, ""
    note = ""
    running: datetime | None = None
    frontier = lower
    for commit in log.commits(max(lower - 1, 0)):
        ts = clock.time_of(commit.as_dict())
        if running is not None and ts < running:
            note = (
                f"source time went backwards at version {commit.version} "
                f"({ts.isoformat()} < {running.isoformat()}); it was given its predecessor's time"
            )
            ts = running
        running = ts
        if commit.version >= lower and ts < end:
            frontier = commit.version + 1
    if upper is not None and frontier > upper:
        frontier = upper
        note = (note + "; " if note else "") + "late commits held back to keep the remap monotone"
    return frontier, note


class Remap:
    """The remap collection, shared by every table of a warehouse."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None, run_id: str | None = None):
        self.table = RecordTable(uri, REMAP_SCHEMA, ("epoch", "source"), storage_options)
        self.storage_options = storage_options
        self.run_id = run_id or uuid.uuid4().hex

    def epochs(self) -> list[Epoch]:
        """Every epoch recorded so far, in order."""
        grouped: dict[str, dict] = {}
        for row in self.table.read():
            entry = grouped.setdefault(
                row["epoch"],
                {"end": row["end_time"], "kind": row["kind"], "frontiers": {}, "notes": {}, "ids": {}},
            )
            entry["frontiers"][row["source"]] = row["frontier"]
            if row["note"]:
                entry["notes"][row["source"]] = row["note"]
            if row.get("table_id"):
                entry["ids"][row["source"]] = row["table_id"]
        return [
            Epoch(key, utc(value["end"]), value["kind"], value["frontiers"], value["notes"], value["ids"])
            for key, value in sorted(grouped.items())
        ]

    def latest(self) -> Epoch | None:
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    def get(self, key: str) -> Epoch | None:
        return next((epoch for epoch in self.epochs() if epoch.key == key), None)

    def window(self, end: datetime, sources: list[Source], now: datetime | None = None) -> Epoch:
        """The epoch ending at `end`, with frontiers for `sources` (created where missing)."""
        end = utc(end)
        now = utc(now or datetime.now(timezone.utc))
        if end > now and any(isinstance(source.clock, CommitClock) for source in sources):
            raise ReclockError(
                f"the window ending {epoch_key(end)} has not closed yet (now {epoch_key(now)}); "
                "a window is processed only after it has closed"
            )
        return self._ensure(end, "window", sources)

    def on_demand(self, sources: list[Source], now: datetime | None = None) -> Epoch:
        """A new epoch ending now, covering every source's latest version."""
        end = utc(now or datetime.now(timezone.utc))
        latest = self.latest()
        if latest is not None and end <= latest.end:
            raise ReclockError(
                f"an on-demand epoch must end after the latest epoch {latest.key}, but the clock "
                f"says {epoch_key(end)}: epochs at logical times in the future (refresh(until=...)) "
                "cannot be followed by on-demand epochs; continue with refresh(until=...)"
            )
        return self._ensure(end, "on_demand", sources)

    def _ensure(self, end: datetime, kind: str, sources: list[Source]) -> Epoch:
        key = epoch_key(end)
        epochs = self.epochs()
        existing = next((epoch for epoch in epochs if epoch.key == key), None)
        missing = [s for s in sources if existing is None or s.name not in existing.frontiers]
        if not missing:
            return existing
        kind = existing.kind if existing else kind
        created_at = datetime.now(timezone.utc)
        records = []
        for source in missing:
            earlier = [e for e in epochs if e.end < end and source.name in e.frontiers]
            after = [e.frontiers[source.name] for e in epochs if e.end > end and source.name in e.frontiers]
            lower = earlier[-1].frontiers[source.name] if earlier else 0
            upper = after[0] if after else None
            log = DeltaLog.open(source.path, self.storage_options)
            table_id = log.table_id if log is not None else None
            was = earlier[-1].table_ids.get(source.name) if earlier else None
            recreated = was is not None and table_id is not None and table_id != was
            if recreated:  # a new table at the path: its versions count from 0 again
                lower, upper = 0, None
            if kind == "on_demand" and upper is None:
                frontier, note = max(lower, (log.version + 1) if log else 0), ""
            else:
                frontier, note = frontier_for_window(log, source.clock, end, lower, upper)
            if recreated:
                note = (f"a new Delta table (id {table_id}, was {was}): its frontier starts again at version 0"
                        + (f"; {note}" if note else ""))
            records.append(
                {
                    "epoch": key,
                    "end_time": end,
                    "kind": kind,
                    "source": source.name,
                    "path": source.path,
                    "frontier": frontier,
                    "note": note,
                    "created_at": created_at,
                    "run_id": self.run_id,
                    "table_id": table_id,
                }
            )
        self.table.insert_if_absent(records)
        epoch = self.get(key)
        assert epoch is not None
        for source in sources:
            stored = next(
                row for row in self.table.read() if row["epoch"] == key and row["source"] == source.name
            )
            if stored["path"] != source.path:
                raise ReclockError(
                    f"source {source.name!r} is recorded in the remap at {stored['path']} but is "
                    f"declared at {source.path}; a source cannot move between epochs"
                )
        return epoch
