"""Partitions of a derived table are epochs: partition [start, end) is covered by the engine's epoch
ending at `end` (the remap reclocks source time into the window). Nothing here imports Dagster; the
asset factory (assets/derived.py) turns what happens into events.

A run materializes a range of partitions (one, or a backfill's range). The range is processed as
ONE epoch span: the remap gets one entry per partition (each partition's source frontiers are
frozen), and the engine applies the whole span as one epoch ending at the last partition's end, so
a day of hourly partitions costs one incremental step, not 24. Each partition still gets its own
materialization, but the epoch's figures (rows read and written, seconds) are reported once, on
the partition where the epoch ends: the others have no table version of their own. The exception is a table's first
run (or a requested full refresh): its first partition is applied on its own, as a rescan, and the
rest of the range as one incremental span after it.

Order is enforced here: a partition covered by an epoch the table already applied is an idempotent
no-op that says so; new partitions must start where the table's last epoch ended, and a refusal
names the missing partitions and the command that backfills them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Sequence

from epochal import Engine, EpochalError
from epochal.storage.clock import utc
from epochal.storage.ledger import Step
from epochal.storage.reclock import epoch_key

ALREADY_APPLIED = "already applied; nothing done"


class PartitionOrderError(EpochalError):
    """A partition that cannot be applied now; the message names the partition to apply first."""


@dataclass(frozen=True)
class Window:
    """One partition: its key and time window."""

    key: str
    start: datetime
    end: datetime


@dataclass
class PartitionOutcome:
    """What materializing one partition found or did: the ledger step whose epoch covers it, the
    span of partitions that step applied, and whether this run applied it (`applied_now`)."""

    table: str
    window: Window
    step: Step
    previous_version: int  # the table's version before the step (-1: before its first)
    applied_now: bool
    span: tuple[str, str, int]  # first and last partition the step applied, and how many
    frontiers: dict = field(default_factory=dict)  # source -> remap frontier at the window's end
    arrangements: dict | None = None  # what the run did to the arrangements and their copies (Report.detail)

    @property
    def partition(self) -> str:
        return self.window.key

    @property
    def changed(self) -> bool:
        return self.step.output_version > self.previous_version

    @property
    def ends_epoch(self) -> bool:
        """The epoch ends where this partition ends, so the table's version after the step is the
        table as of this partition's end; a partition inside a longer epoch has no such version."""
        return utc(self.step.epoch_end) == utc(self.window.end)

    @property
    def carries_figures(self) -> bool:
        """An epoch's work (rows read and written, seconds) is reported once: by the materialization
        that applied it, on the partition where the epoch ends."""
        return self.applied_now and self.ends_epoch

    @property
    def source_versions(self) -> dict:
        """Per source, the last version committed before this partition's end (the remap's
        frontier is the first version after it)."""
        return {name: frontier - 1 for name, frontier in self.frontiers.items()}

    def span_text(self) -> str:
        first, last, count = self.span
        if count <= 1:
            return "as its own epoch"
        return f"as one epoch spanning partitions {first} .. {last} ({count} partitions)"

    def summary(self) -> str:
        """One paragraph that reads well in the UI and in the run log."""
        step = self.step
        window = f"{self.window.start:%Y-%m-%d %H:%M}–{self.window.end:%H:%M} UTC"
        if step.technique == "rescan":
            how = f"rescan ({step.reason}): recomputed in full and wrote what differs from the table (all of it for a new table)"
        elif step.technique == "noop":
            how = "noop: no input changed, so no Spark job ran and nothing was written"
        else:
            how = "incremental: applied the inputs' changes through the delta rules"
        text = f"Partition {self.partition} (window {window}) of {self.table}, applied {self.span_text()}: {how}."
        if self.ends_epoch:
            versions = ", ".join(
                f"{name} v{v['from']}→v{v['to']}" if v["from"] != v["to"] else f"{name} v{v['to']} (unchanged)"
                for name, v in sorted(step.inputs.items())
            )
            text += (
                f" Read {step.rows_read:,} change rows ({versions}); wrote +{step.rows_inserted:,} "
                f"−{step.rows_deleted:,} rows (table version {step.output_version}"
                f"{', unchanged' if not self.changed else ''}; {step.state_rows:,} state rows) in {step.seconds:.1f}s."
            )
        else:
            text += (f" The epoch's figures (rows read and written, seconds) are on partition {self.span[1]}, "
                     "where it ends; the table has no version as of this partition's end.")
        if not self.applied_now:
            written = f" at {step.written_at:%Y-%m-%d %H:%M:%S} UTC" if step.written_at else ""
            text = (f"Already applied (ledger step {step.seq}{written}); nothing done this time, so "
                    f"this materialization carries no figures. Recorded then: {text}")
        return text


def partition_command(table: str, first: str, last: str) -> str:
    return f"dagster asset materialize -m definitions --select {table} --partition-range {first}...{last}"


def covering_step(committed: Sequence[Step], end: datetime) -> Step | None:
    """The committed step whose epoch covers the window ending at `end`: the first epoch ending at
    or after it (the latest record of that epoch, after a full refresh)."""
    later = [s for s in committed if utc(s.epoch_end) >= utc(end)]
    if not later:
        return None
    first_end = min(utc(s.epoch_end) for s in later)
    return [s for s in committed if utc(s.epoch_end) == first_end][-1]


def _previous_version(committed: Sequence[Step], step: Step) -> int:
    earlier = [s for s in committed if s.seq < step.seq]
    return earlier[-1].output_version if earlier else -1


def _frontiers(engine: Engine, end: datetime) -> dict:
    epoch = engine.remap.get(epoch_key(end))
    return dict(sorted(epoch.frontiers.items())) if epoch else {}


def _span_of(committed: Sequence[Step], step: Step, key_of: Callable[[datetime], str],
             period: timedelta) -> tuple[str, str, int]:
    """The partitions a step's epoch covers: from the end of the epoch before it to its own end
    (a table's first epoch: its last partition only, the one it was applied for)."""
    end = utc(step.epoch_end)
    earlier = [s for s in committed if s.seq < step.seq and utc(s.epoch_end) < end]
    start = utc(earlier[-1].epoch_end) if earlier else end - period
    count = max(1, round((end - start) / period))
    return key_of(start), key_of(end - period), count


def plan(
    engine: Engine,
    table: str,
    windows: Sequence[Window],
    *,
    key_of: Callable[[datetime], str],
    period: timedelta,
    full_refresh: bool = False,
) -> tuple[list[PartitionOutcome], list[list[Window]]]:
    """Split the run's partitions (in order) into those an applied epoch already covers (outcomes
    to report) and the segments to apply: the rest as one span, or, on a table's first run or a
    full refresh, its first partition alone and then the rest as one span.

    `key_of(t)` is the key of the partition starting at `t`, `period` a partition's length.
    Raises PartitionOrderError when the new partitions do not start where the table's last epoch
    ended."""
    ledger = engine.table(table).ledger
    committed = ledger.committed()
    last = committed[-1] if committed else None
    done: list[PartitionOutcome] = []
    pending: list[Window] = []
    for window in windows:
        step = covering_step(committed, window.end)
        if step is None:
            pending.append(window)
        else:
            done.append(PartitionOutcome(table, window, step, _previous_version(committed, step), False,
                                         _span_of(committed, step, key_of, period),
                                         _frontiers(engine, window.end)))
    if full_refresh and not pending:
        final = windows[-1]
        if last is None or utc(last.epoch_end) != utc(final.end):
            latest = key_of(utc(last.epoch_end) - period) if last else "none"
            raise PartitionOrderError(
                f"{table}: a full refresh rebuilds the table at its latest partition ({latest}) or a new "
                f"one, and partition {final.key} is neither. Materialize {latest} or the next partition "
                "with full_refresh: true"
            )
        done.pop()  # redone below, as a rescan at the same epoch
        return done, [[final]]
    if not pending:
        return done, []
    first = pending[0]
    if last is not None and utc(last.epoch_end) != utc(first.start):
        last_end = utc(last.epoch_end)
        if last_end < utc(first.start):
            first_missing, last_missing = key_of(last_end), key_of(utc(first.start) - period)
            missing = first_missing if first_missing == last_missing else f"{first_missing} .. {last_missing}"
            raise PartitionOrderError(
                f"{table}: partition {first.key} cannot be applied before partition {missing}: partitions "
                f"apply in order and the last one applied is {key_of(last_end - period)}. Backfill the gap "
                f"and this partition in one run: {partition_command(table, first_missing, first.key)} (or "
                "launch a backfill of that range from the asset graph in the UI)"
            )
        raise PartitionOrderError(
            f"{table}: its latest epoch ends at {last_end.isoformat()}, inside partition {first.key} "
            f"({first.start.isoformat()} .. {first.end.isoformat()}): the table was refreshed outside "
            "these partitions. Materialize the partition after it, or rebuild the table"
        )
    if (last is None or full_refresh) and len(pending) > 1:
        return done, [pending[:1], pending[1:]]
    return done, [pending]


def apply_segment(
    engine: Engine,
    table: str,
    segment: Sequence[Window],
    *,
    full_refresh: bool = False,
) -> list[PartitionOutcome]:
    """Apply consecutive partitions as one epoch ending at the last one's end, after writing the
    remap entry of every partition in order (each partition's frontiers frozen). Derived inputs
    must have applied an epoch ending there too."""
    end = segment[-1].end
    key = epoch_key(end)
    first, last = segment[0].key, segment[-1].key
    for upstream in engine.table(table).compiled.inputs:
        if upstream in engine.sources:
            continue
        if engine.table(upstream).ledger.at_epoch(key) is None:
            steps = engine.table(upstream).ledger.committed()
            covered = covering_step(steps, end)
            if covered is not None:
                raise PartitionOrderError(
                    f"{table} reads {upstream}, which applied partition {last} inside a longer epoch "
                    f"(ending {utc(covered.epoch_end).isoformat()}), so it has no version as of the end of "
                    f"{last}. Materialize {table} over the same range as {upstream} did "
                    f"(e.g. --select {upstream},{table} in one run)"
                )
            raise PartitionOrderError(
                f"{table} reads {upstream}, which has not applied partition {last}: materialize "
                f"{upstream} first ({partition_command(upstream, first, last)}), or both in one run "
                f"(--select {upstream},{table})"
            )
    for window in segment:  # the remap keeps one entry per partition, written in order
        engine.epoch(until=window.end, tables=[table])
    reports = engine.refresh([table], until=end, upstream=False, full_refresh=full_refresh)
    arrangements = next((r.detail.get("arrangements") for r in reports if r.table == table), None)
    committed = engine.table(table).ledger.committed()
    step = engine.table(table).ledger.at_epoch(key)
    if step is None:  # the engine always records a committed step; guard against a silent miss
        raise EpochalError(f"{table}: partitions {first} .. {last} ran but the ledger has no committed step")
    previous = _previous_version(committed, step)
    span = (first, last, len(segment))
    return [PartitionOutcome(table, window, step, previous, True, span, _frontiers(engine, window.end),
                             arrangements=arrangements)
            for window in segment]


def inserted_rows(engine: Engine, outcome: PartitionOutcome):
    """The rows the outcome's epoch inserted into the table (its change data feed between the
    previous step's version and this one's), as the table's columns; None when it wrote nothing.
    Read on the driver when small (Engine.inserted): the checks of a refresh done on the driver
    then start no Spark Delta read."""
    if not outcome.changed:
        return None
    return engine.inserted(outcome.table, outcome.previous_version + 1, outcome.step.output_version, local=True)


def row_count(engine: Engine, table: str, version: int) -> int | None:
    """Rows in the table at `version`, from the Delta log's file statistics (no Spark job)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    if version < 0:
        return 0
    try:
        return DeltaTable(engine.table(table).path, version=version, storage_options=engine.storage_options).count()
    except (DeltaError, TableNotFoundError, OSError):
        return None
