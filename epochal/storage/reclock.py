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

import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping

import pyarrow as pa

from ..errors import EpochalError
from .clock import CommitClock, LogicalClock, utc
from .deltalog import DeltaLog
from .metastore import RecordTable, extends

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


@dataclass(frozen=True)
class _Grouped:
    """The remap's records as epochs: the records grouped (`rows`, the list `RecordTable.read`
    returned), each epoch's entry (its frontiers, notes, table ids and paths by source) and the
    epochs by key and in order."""

    rows: list[dict]
    entries: dict[str, dict]
    by_key: dict[str, Epoch]
    ordered: list[Epoch]


NOTHING_GROUPED = _Grouped([], {}, {}, [])


def _grouped(rows: list[dict], before: _Grouped) -> _Grouped:
    """`rows` as epochs. Records are only ever added, so where `rows` begins with the records
    `before` grouped (the same objects: a read that found only added files), only the records
    after them are grouped, into new entries for the epochs they touch (an Epoch handed out
    keeps its own); otherwise (a compaction re-read every record) all are."""
    if not extends(rows, before.rows):
        before = NOTHING_GROUPED
    entries, fresh = dict(before.entries), set()
    for row in rows[len(before.rows):]:
        key, source = row["epoch"], row["source"]
        if key not in fresh:
            old = entries.get(key)
            entries[key] = ({"end": row["end_time"], "kind": row["kind"], "frontiers": {}, "notes": {}, "ids": {},
                             "paths": {}} if old is None else
                            {name: dict(value) if isinstance(value, dict) else value for name, value in old.items()})
            fresh.add(key)
        entry = entries[key]
        entry["frontiers"][source] = row["frontier"]
        entry["paths"].setdefault(source, row["path"])
        if row["note"]:
            entry["notes"][source] = row["note"]
        if row.get("table_id"):
            entry["ids"][source] = row["table_id"]
    by_key = dict(before.by_key)
    for key in fresh:
        value = entries[key]
        by_key[key] = Epoch(key, utc(value["end"]), value["kind"], value["frontiers"], value["notes"], value["ids"])
    ordered = before.ordered if not fresh else [by_key[key] for key in sorted(by_key)]
    return _Grouped(rows, entries, by_key, ordered)


def _neighbours(epochs: list[Epoch], end: datetime, source: str) -> tuple[Epoch | None, int | None]:
    """Of the epochs (in order) holding a frontier of `source`: the last ending before `end`, and
    the frontier of the first ending after it. Searched from the latest epoch back, where a new
    epoch's are: a year of hourly epochs is 8,760 to pass otherwise, for each source."""
    upper = None
    for epoch in reversed(epochs):
        if epoch.end < end and source in epoch.frontiers:
            return epoch, upper
        if epoch.end > end and source in epoch.frontiers:
            upper = epoch.frontiers[source]
    return None, upper


class Remap:
    """The remap collection, shared by every table of a warehouse."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None, run_id: str | None = None):
        self.table = RecordTable(uri, REMAP_SCHEMA, ("epoch", "source"), storage_options)
        self.storage_options = storage_options
        self.run_id = run_id or uuid.uuid4().hex
        self._grouped = NOTHING_GROUPED
        self._grouping = threading.Lock()

    def _read(self) -> _Grouped:
        """The records as epochs, grouped once per version of the remap: it grows by a record per
        source every epoch and is never trimmed, and a refresh asks for its epochs several times
        (bench/ledger_reads.py, the remap)."""
        rows = self.table.read()
        with self._grouping:
            if rows is not self._grouped.rows:
                self._grouped = _grouped(rows, self._grouped)
            return self._grouped

    def epochs(self) -> list[Epoch]:
        """Every epoch recorded so far, in order."""
        return list(self._read().ordered)

    def latest(self) -> Epoch | None:
        epochs = self._read().ordered
        return epochs[-1] if epochs else None

    def get(self, key: str) -> Epoch | None:
        return self._read().by_key.get(key)

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
        grouped = self._read()
        epochs, existing = grouped.ordered, grouped.by_key.get(key)
        missing = [s for s in sources if existing is None or s.name not in existing.frontiers]
        if not missing:
            return existing
        kind = existing.kind if existing else kind
        created_at = datetime.now(timezone.utc)
        records = []
        for source in missing:
            before, upper = _neighbours(epochs, end, source.name)
            lower = before.frontiers[source.name] if before is not None else 0
            log = DeltaLog.open(source.path, self.storage_options)
            table_id = log.table_id if log is not None else None
            was = before.table_ids.get(source.name) if before is not None else None
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
        grouped = self._read()
        epoch = grouped.by_key.get(key)
        assert epoch is not None
        paths = grouped.entries[key]["paths"]
        for source in sources:
            if paths[source.name] != source.path:
                raise ReclockError(
                    f"source {source.name!r} is recorded in the remap at {paths[source.name]} but is "
                    f"declared at {source.path}; a source cannot move between epochs"
                )
        return epoch
