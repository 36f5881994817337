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
from dataclasses import dataclass
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


class _JsonText:
    """A dict field of a Step kept as the JSON text its record holds until first used. A ledger is
    never trimmed and a process reads it whole, but a step looks into a few of its records (the
    last one, the cost model's recent steps): parsing every record's JSON was most of a year's
    ledger's first read in a process (bench/RESULTS.md, a table's ledger as it grows)."""

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, step, owner=None):
        if step is None:
            return None  # the dataclass's default: __set__ makes it an empty dict
        value = step.__dict__[self.slot]
        if isinstance(value, str):
            value = json.loads(value)
            step.__dict__[self.slot] = value
        return value

    def __set__(self, step, value):
        step.__dict__[self.slot] = {} if value is None or value == "" else value

    def text(self, step) -> str:
        value = step.__dict__[self.slot]
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)

    def copy(self, step, fresh) -> None:
        """`step`'s value into `fresh`: the text as it is, a dict copied."""
        value = step.__dict__[self.slot]
        fresh.__dict__[self.slot] = value if isinstance(value, str) else dict(value)


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
    inputs: dict = _JsonText()
    output_version: int = -1
    state_versions: dict = _JsonText()
    rows_read: int = 0
    rows_inserted: int = 0
    rows_deleted: int = 0
    state_rows: int = 0
    seconds: float = 0.0
    detail: dict = _JsonText()
    written_at: datetime | None = None
    run_id: str = ""

    def to_record(self) -> dict:
        record = {name: getattr(self, name) for name in LEDGER_SCHEMA.names if name not in _JSON_FIELDS}
        for name in _JSON_FIELDS:
            record[name] = vars(Step)[name].text(self)
        record["written_at"] = self.written_at or datetime.now(timezone.utc)
        return record

    def copied(self) -> "Step":
        """A copy whose dicts can be changed without changing this step's (`Ledger.steps` hands
        out the steps it parsed once to every caller)."""
        fresh = object.__new__(Step)
        fresh.__dict__.update(self.__dict__)
        for name in _JSON_FIELDS:
            vars(Step)[name].copy(self, fresh)
        return fresh

    @staticmethod
    def from_record(record: dict) -> "Step":
        """The step of a ledger record; its JSON columns are parsed when first used (`_JsonText`)."""
        return Step(**record)


_JSON_FIELDS = ("inputs", "state_versions", "detail")


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
