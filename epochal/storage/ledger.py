"""The ledger: per derived table, one record per epoch step.

A step is first recorded as `started` (its epoch, technique and the input versions it reads), then
as `committed` with the versions it wrote. A `started` step with no `committed` record is a step a
crash interrupted: the next run finishes exactly that step before anything else, which is safe
because the step's computation is determined by what `started` recorded and every write carries a
Delta idempotent-write identity (app id, `seq`). Downstream tables read an upstream at the output
version its ledger records for the same epoch.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa

from .metastore import RecordTable, extends

LEDGER_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("status", pa.string()),
        ("epoch", pa.string()),
        ("epoch_end", pa.timestamp("us", tz="UTC")),
        ("technique", pa.string()),
        ("reason", pa.string()),
        ("fingerprint", pa.string()),
        ("inputs", pa.string()),
        ("output_version", pa.int64()),
        ("state_versions", pa.string()),
        ("rows_read", pa.int64()),
        ("rows_inserted", pa.int64()),
        ("rows_deleted", pa.int64()),
        ("state_rows", pa.int64()),
        ("seconds", pa.float64()),
        ("detail", pa.string()),
        ("written_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
    ]
)

STARTED, COMMITTED, ABANDONED = "started", "committed", "abandoned"
NOOP, INCREMENTAL, RESCAN = "noop", "incremental", "rescan"  # a step's technique


@dataclass
class Step:
    """One ledger record. `inputs` maps each input to {"from": v, "to": v}: the versions read as
    the epoch's start and end (for sources, frontier - 1; -1 means before the table existed)."""

    seq: int
    status: str
    epoch: str
    epoch_end: datetime
    technique: str
    reason: str = ""
    fingerprint: str = ""
    inputs: dict = field(default_factory=dict)
    output_version: int = -1
    state_versions: dict = field(default_factory=dict)
    rows_read: int = 0
    rows_inserted: int = 0
    rows_deleted: int = 0
    state_rows: int = 0
    seconds: float = 0.0
    detail: dict = field(default_factory=dict)
    written_at: datetime | None = None
    run_id: str = ""

    def to_record(self) -> dict:
        record = {name: getattr(self, name) for name in LEDGER_SCHEMA.names}
        for name in ("inputs", "state_versions", "detail"):
            record[name] = json.dumps(record[name], sort_keys=True, default=str)
        record["written_at"] = self.written_at or datetime.now(timezone.utc)
        return record

    def copied(self) -> "Step":
        """A copy whose dicts can be changed without changing this step's (`Ledger.steps` hands
        out the steps it parsed once to every caller)."""
        fresh = object.__new__(Step)
        fresh.__dict__.update(self.__dict__)
        fresh.inputs, fresh.state_versions, fresh.detail = dict(self.inputs), dict(self.state_versions), dict(self.detail)
        return fresh

    @staticmethod
    def from_record(record: dict) -> "Step":
        values = dict(record)
        for name in ("inputs", "state_versions", "detail"):
            values[name] = json.loads(values[name] or "{}")
        return Step(**values)


class Ledger:
    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.table = RecordTable(uri, LEDGER_SCHEMA, ("seq", "status"), storage_options)
        self._parsed: tuple[list[dict], list[Step]] = ([], [])  # the records read last, their steps in order
        self._parsing = threading.Lock()

    def steps(self) -> list[Step]:
        """Every record as a Step, in order. The ledger is never trimmed, and a step reads it
        several times: records are parsed once, a read that only added records to the last one
        (every record write) parses just those (bench/ledger_reads.py). The steps are shared by
        every caller, as they are: change a `Step.copied()` (copying them all on each call costs a
        long ledger most of what parsing once saves; bench/RESULTS.md)."""
        records = self.table.read()
        with self._parsing:
            seen, ordered = self._parsed
            if not extends(records, seen):
                seen, ordered = [], []
            if len(records) > len(seen):
                ordered = sorted(ordered + [Step.from_record(row) for row in records[len(seen):]],
                                 key=lambda step: (step.seq, step.status != STARTED))
                self._parsed = (records, ordered)
        return list(ordered)

    # Each query below reads the ledger, or takes `steps` (one `steps()` read) so that several
    # questions are answered from one snapshot: deciding a step's seq from one snapshot and what
    # is pending from another lets two runs start the same epoch under two seqs.
    def committed(self, steps: list[Step] | None = None) -> list[Step]:
        return [step for step in (self.steps() if steps is None else steps) if step.status == COMMITTED]

    def last_committed(self, steps: list[Step] | None = None) -> Step | None:
        committed = self.committed(steps)
        return committed[-1] if committed else None

    def pending(self, steps: list[Step] | None = None) -> Step | None:
        """The started step that has neither committed nor been abandoned, if any."""
        by_seq: dict[int, dict[str, Step]] = {}
        for step in self.steps() if steps is None else steps:
            by_seq.setdefault(step.seq, {})[step.status] = step
        for seq in sorted(by_seq, reverse=True):
            statuses = by_seq[seq]
            if STARTED in statuses and COMMITTED not in statuses and ABANDONED not in statuses:
                return statuses[STARTED]
        return None

    def at_epoch(self, epoch: str) -> Step | None:
        return next((step for step in reversed(self.committed()) if step.epoch == epoch), None)

    def next_seq(self, steps: list[Step] | None = None) -> int:
        steps = self.steps() if steps is None else steps
        return (max(step.seq for step in steps) + 1) if steps else 1

    def record(self, step: Step) -> tuple[bool, Step]:
        """Write `step` unless a record with its (seq, status) exists; returns (written, stored)."""
        [(written, stored)] = self.table.insert_if_absent([step.to_record()])
        return written, Step.from_record(stored) if not written else step
