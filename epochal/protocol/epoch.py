"""The epoch protocol for one table (docs/architecture.md, section 3), all in this file.

1. Reclock: the caller hands a frozen remap entry (`Epoch`).
2. Decide: noop (no input changed: recorded without a Spark job), incremental, or rescan with a
   reason. A step a crash interrupted is finished first, exactly as it was started.
3. Record the step as `started` in the ledger: its epoch, technique and the input versions it reads.
4. Compute the output change from the delta rules, reading state as of the previous step's ledger
   versions; or, for a rescan, recompute in full and diff against the table (a table that does
   not exist yet, or whose schema changed, gets the full result instead, with nothing to diff).
5. Write: one commit of the change into the derived table (a MERGE or an append; for a full
   result, one overwrite that creates it), then one append per state table; each with its
   idempotent-write identity (app id, seq), so a rerun skips what a crashed run wrote. A change
   of at most `driver_rows` rows is collected and committed on the driver through delta-rs
   (storage/commits.py), its figures counted there too; a larger one is written by Spark.
6. Record the step as `committed`, with the versions written.

A crash anywhere followed by a rerun gives the state of an uninterrupted run: what step 4 reads is
fixed by what step 3 recorded, and step 5 is idempotent.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial, reduce

import pyarrow as pa
import pyarrow.compute as pc
from delta import exceptions
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from .. import faults, reasons, settings
from ..arrow_rows import lazy_frame, spark_typed
from ..changes import InputRange, consolidate, consolidate_rows, quoted, read_snapshot, rows_up_to
from ..errors import EpochError, StateInconsistent, StrictModeError
from ..graph import WEIGHT, walk
from ..keyed.state import StateMissing, StateStore
from ..metrics import Meter, metered
from ..rules.base import analysed_schema
from ..storage import commits as driver_commits
from ..storage.commits import OP
from ..storage.deltalog import DeltaLog, TableFiles
from ..storage.ledger import ABANDONED, COMMITTED, STARTED, Step
from ..storage.reclock import Epoch
from . import cost, rescan
from .context import Context
from .writes import (
    DRIVER_WRITE_TYPES,
    apply_keyed,
    apply_multiset,
    arrow_as,
    commit_tag,
    copies_in,
    keyed_source,
    multiset_source,
    replace_contents,
    replaces_state,
    version_written,
    write_identity,
    write_state,
    writer,
)

NOOP, INCREMENTAL, RESCAN = "noop", "incremental", "rescan"
CONCURRENT_RETRIES = 3


@dataclass
class Report:
    """What one epoch step did to one table."""

    table: str
    epoch: str
    technique: str
    reason: str
    frontier: dict[str, int]
    rows_read: int = 0
    rows_inserted: int = 0
    rows_deleted: int = 0
    seconds: float = 0.0
    state_rows: int = 0
    output_version: int = -1
    seq: int = 0
    epoch_end: datetime | None = None
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _report(table, step: Step, seconds: float, note: str | None = None) -> Report:
    detail = dict(step.detail)
    if note:
        detail["note"] = note
    return Report(
        table=table.name,
        epoch=step.epoch,
        technique=step.technique,
        reason=step.reason,
        frontier={name: versions["to"] for name, versions in step.inputs.items()},
        rows_read=step.rows_read,
        rows_inserted=step.rows_inserted,
        rows_deleted=step.rows_deleted,
        seconds=round(seconds, 3),
        state_rows=step.state_rows,
        output_version=step.output_version,
        seq=step.seq,
        epoch_end=step.epoch_end,
        detail=detail,
    )


def input_ranges(engine, table, last: Step | None, epoch: Epoch) -> dict[str, InputRange]:
    ranges = {}
    for name in table.compiled.inputs:
        before = last.inputs[name]["to"] if last is not None and name in last.inputs else -1
        if name in engine.sources:
            source = engine.sources[name]
            if name not in epoch.frontiers:
                raise EpochError(f"epoch {epoch.key} has no frontier for source {name!r} (internal error)")
            after = epoch.frontiers[name] - 1
            path, kind = source.path, "source"
        else:
            upstream = engine.table(name)
            applied = upstream.ledger.at_epoch(epoch.key)
            if applied is None:
                raise EpochError(
                    f"table {table.name!r} reads {name!r}, which has not applied epoch {epoch.key} yet; "
                    f"refresh {name!r} for this epoch first (engine.refresh includes upstream tables "
                    "when asked for all tables)"
                )
            after = applied.output_version
            path, kind = upstream.path, "derived"
        ranges[name] = InputRange(name, path, kind, before, max(after, before), engine.schema_of(name))
    return ranges


def _decide(table, last: Step | None, inputs: dict[str, InputRange], full_refresh: bool,
            engine=None, now: dict | None = None) -> tuple[str, str]:
    if last is None:
        return RESCAN, "FIRST_RUN"
    if last.fingerprint != table.compiled.fingerprint:
        return RESCAN, "QUERY_CHANGED"
    if full_refresh:
        return RESCAN, "REQUESTED"
    if engine is not None:
        changed = settings.difference((last.detail or {}).get("settings"), now or settings.current(engine.spark))
        if changed is not None:
            return RESCAN, f"{settings.SETTINGS_CHANGED}: {changed}"
    if not any(r.changed for r in inputs.values()):
        return NOOP, ""
    if table.compiled.plan is None:
        return RESCAN, f"NOT_INCREMENTAL: {table.compiled.blocker}"
    trigger = rescan.detect(engine, table, last, inputs) if engine is not None else None
    if trigger is not None:  # CDF_UNAVAILABLE, SOURCE_REWRITTEN, STATE_MISSING or COST
        return RESCAN, trigger.reason
    return INCREMENTAL, ""


def run(engine, table, epoch: Epoch, *, full_refresh: bool = False) -> Report:
    """Bring `table` to `epoch`, finishing an interrupted step first."""
    began = time.monotonic()
    ledger = table.ledger
    steps = ledger.steps()  # one snapshot for what is done, what is pending and the next seq
    last = ledger.last_committed(steps)
    if last is not None and last.epoch == epoch.key and not full_refresh:
        return _report(table, last, time.monotonic() - began, note="already applied; nothing done")
    if last is not None and last.epoch_end > epoch.end:
        raise EpochError(
            f"table {table.name!r} has already applied epoch {last.epoch}, later than {epoch.key}; "
            "epochs apply in order"
        )
    pending = ledger.pending(steps)
    if pending is not None:
        resumable = pending.fingerprint == table.compiled.fingerprint and not full_refresh
        if resumable and pending.epoch == epoch.key:
            return _execute(engine, table, epoch, pending, began)
        if resumable and pending.epoch_end < epoch.end:
            earlier = engine.remap.get(pending.epoch)
            _execute(engine, table, earlier, pending, time.monotonic())
            return run(engine, table, epoch, full_refresh=full_refresh)
        _abandon(table, pending, "superseded: the definition changed or a full refresh was requested")
        steps = ledger.steps()
        last = ledger.last_committed(steps)

    inputs = input_ranges(engine, table, last, epoch)
    now = settings.current(engine.spark)  # decides the step and is recorded with it
    technique, reason = _decide(table, last, inputs, full_refresh, engine, now)
    if technique == RESCAN and table.strict and reason != "FIRST_RUN":
        raise _strict_refusal(table, reason, epoch)
    step = Step(
        seq=ledger.next_seq(steps),
        status=STARTED,
        epoch=epoch.key,
        epoch_end=epoch.end,
        technique=technique,
        reason=reason,
        fingerprint=table.compiled.fingerprint,
        inputs={name: {"from": r.before, "to": r.after} for name, r in inputs.items()},
        output_version=last.output_version if last else -1,
        state_versions=dict(last.state_versions) if last else {},
        run_id=engine.run_id,
        detail={"plan": rescan.plan_signature(table.compiled.plan), "settings": now,
                **({"state": reasons.STATE_NOT_KEPT} if technique != RESCAN and last is not None and not _keeps_state(last)
                   else {})},
    )
    clock = {name: note for name, note in epoch.notes.items() if name in inputs}
    if clock:  # the remap's warnings about the sources this table reads (time going backwards)
        step.detail["clock"] = clock
    if technique == NOOP:
        step.status = COMMITTED
        _, stored = ledger.record(step)
        return _report(table, stored, time.monotonic() - began)
    written, stored = ledger.record(step)
    faults.point("after_started", table.name)
    if not written:
        if stored.epoch != epoch.key:
            raise EpochError(
                f"table {table.name!r} is being refreshed by another run (epoch {stored.epoch}); "
                "try again when it has finished"
            )
        step = stored
    return _execute(engine, table, epoch, step, began)


def _strict_refusal(table, reason: str, epoch: Epoch, done: str = "") -> StrictModeError:
    return StrictModeError(
        f"table {table.name!r} is strict and would need a rescan ({reason}) at epoch {epoch.key}; {done}"
        "refresh it with full_refresh=True to accept the rescan, or fix the cause"
    )


def _abandon(table, step: Step, why: str) -> None:
    table.ledger.record(
        Step(seq=step.seq, status=ABANDONED, epoch=step.epoch, epoch_end=step.epoch_end,
             technique=step.technique, reason=step.reason, fingerprint=step.fingerprint,
             inputs=step.inputs, detail={"why": why})
    )


def _ranges_of(engine, table, step: Step) -> dict[str, InputRange]:
    return {
        name: InputRange(
            name,
            engine.path_of(name),
            "source" if name in engine.sources else "derived",
            versions["from"],
            versions["to"],
            engine.schema_of(name),
        )
        for name, versions in step.inputs.items()
    }


def _conflicts() -> tuple[type[Exception], ...]:
    """Delta's commit-conflict exceptions: Spark's (in delta-spark's Python API the specific ones,
    ConcurrentAppendException, ProtocolChangedException, ..., do not derive from
    DeltaConcurrentModificationException, so each is named) and delta-rs's for driver commits."""
    return tuple(getattr(exceptions, name) for name in exceptions.__all__) + (CommitFailedError,)


def _committed(table, step: Step) -> Step | None:
    """The committed record of `step`, if a run (this one or a concurrent one) wrote it."""
    return next((s for s in reversed(table.ledger.committed()) if s.seq == step.seq), None)


def _execute(engine, table, epoch: Epoch, step: Step, began: float) -> Report:
    conflicts = _conflicts()
    for attempt in range(CONCURRENT_RETRIES + 1):
        try:
            return _compute_and_write(engine, table, epoch, step, began)
        except (StateInconsistent, StateMissing, reasons.Unreadable, reasons.Costly, reasons.NotExact) as problem:
            done = _committed(table, step)
            if done is not None:  # a concurrent run finished the step (and moved the state on)
                return _report(table, done, time.monotonic() - began, note="applied by a concurrent run")
            if step.technique != INCREMENTAL or attempt == CONCURRENT_RETRIES:
                raise
            trigger = getattr(problem, "trigger", None)
            reason = trigger.reason if trigger is not None else f"STATE_MISSING: {problem}"
            _abandon(table, step, f"found while computing the change: {reason}")
            if table.strict:
                raise _strict_refusal(table, reason, epoch, "nothing was written; ") from problem
            detail = {k: v for k, v in step.detail.items() if k != "state"}
            if isinstance(problem, reasons.Costly) and not problem.keep_state and rescan.stateful_nodes(table.compiled.plan):
                detail["state"] = reasons.STATE_NOT_KEPT  # only the output is rescanned; see _weigh
            fresh = Step(**{**step.__dict__, "seq": table.ledger.next_seq(), "technique": RESCAN, "reason": reason,
                            "detail": {**detail, **getattr(problem, "detail", {})}})
            table.ledger.record(fresh)
            step = fresh
        except conflicts as conflict:
            done = _committed(table, step) or table.ledger.at_epoch(epoch.key)
            if done is not None:
                return _report(table, done, time.monotonic() - began, note="applied by a concurrent run")
            if attempt == CONCURRENT_RETRIES:
                raise EpochError(
                    f"table {table.name!r}: epoch {epoch.key} met a concurrent writer {attempt + 1} times "
                    f"({type(conflict).__name__}); nothing is committed for it, and refreshing again "
                    "finishes it (another run may be refreshing the same table)"
                ) from conflict
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


class Phases:
    """Seconds spent per phase of a step, reported in the step's detail. `since`: when the step
    began, so that its first phase counts what came before its work ("start": the ledger's
    records, the inputs' versions, the rescan checks, an attempt given up for a rescan)."""

    def __init__(self, since: float | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic() if since is None else since

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._last, 3)
        self._last = now


def _compute_and_write(engine, table, epoch: Epoch, step: Step, began: float) -> Report:
    done = _committed(table, step)
    if done is not None:  # a concurrent run finished this step meanwhile: nothing left to do
        return _report(table, done, time.monotonic() - began, note="applied by a concurrent run")
    meter = Meter()
    with metered(engine.spark, meter):
        return _compute_and_write_metered(engine, table, step, began, meter)


def _compute_and_write_metered(engine, table, step: Step, began: float, meter: Meter) -> Report:
    spark = engine.spark
    phases = Phases(began)
    phases.mark("start")
    inputs = _ranges_of(engine, table, step)
    # the state and output this step starts from are the previous step's, also when a concurrent
    # run commits this step while it runs
    history = [s for s in table.ledger.committed() if s.seq < step.seq]
    last = max(history, key=lambda s: s.seq, default=None)
    reads = getattr(engine, "reads", None)
    state = StateStore(spark, table.state_root, dict(last.state_versions) if last else {}, engine.storage_options,
                       reads)
    plan = table.compiled.plan
    ctx = Context(spark, plan, inputs, state, rescan=step.technique == RESCAN,
                  broadcast_rows=engine.broadcast_rows, meter=meter,
                  reads=reads) if plan is not None else None
    change = rows = None
    try:
        if step.technique == INCREMENTAL:
            rows_read = ctx.read_changes()
            phases.mark("read changes")
            faults.point("after_read_changes", table.name)
            if not ctx.changed(plan):  # every change consolidated away: nothing to write
                return _commit(table, step, engine, phases, began, meter, rows_read=rows_read)
            _weigh(engine, table, step, history, rows_read)
            # the epoch-start snapshots the delta rules read (planned here, read below) are Delta's to refuse, too
            refused = partial(reasons.refusals, f"the inputs of {table.name!r} as of this epoch's start")
            with refused():
                rows = _incremental_rows(table, ctx)
                change = _consolidated(ctx, rows)
            base, full, diff = None, None, None  # the version the step starts from: read by _base if a write needs it
        else:
            rows_read = 0
            refused = nullcontext
            change, base, full, diff = _rescan_change(engine, table, inputs, ctx, keep_state=_keeps_state(step))
        with refused():
            change = change.persist() if _made(change) else change
            if diff is not None:
                collected = Collected(diff.change, {})
            else:
                collected = _collect_small(change, state, engine.driver_rows, rows,
                                           ctx.computed_rows(rows) if ctx is not None and rows is not None else None)
            if collected is not None:
                inserted, deleted, writes = _figures_on_driver(collected, state)
            else:
                inserted, deleted, writes = _figures_and_checks(change, state)
        phases.mark("compute")
        if full is not None:
            output_version, inserted, deleted, on_driver = _replace_output(engine, table, step, full)
            meter.commits += 1
            meter.driver_commits += on_driver
        else:
            output_version = _write_output(engine, table, step, change, base, inserted, deleted, meter,
                                           collected.change if collected is not None else None,
                                           diff.current if diff is not None else None)
        phases.mark("write output")
        faults.point("after_output_merge", table.name)
        state_versions = _write_states(engine, table, step, state, writes, meter)
        phases.mark("write state")
    finally:
        if _made(change):
            change.unpersist()
        if ctx is not None:
            ctx.unpersist()
    return _commit(table, step, engine, phases, began, meter, rows_read=rows_read, inserted=inserted,
                   deleted=deleted, output_version=output_version, state_versions=state_versions)


def _consolidated(ctx: Context, rows: DataFrame) -> DataFrame:
    """`rows` consolidated: by Spark, persisted, where they are Spark's; where they are held on
    the driver (consolidated there when collected), a frame Spark plans only if a write needs it."""
    if ctx.computed_rows(rows) is None:
        return consolidate(rows)
    schema = analysed_schema(ctx, ("consolidate",), consolidate, rows.schema)
    return lazy_frame(ctx.spark, lambda: consolidate(rows).persist(), schema)


def _made(frame: DataFrame | None) -> bool:
    """Whether `frame` is a Spark plan (not None, nor a frame not yet handed to Spark)."""
    return frame is not None and getattr(frame, "created", True)


def _keeps_state(step: Step) -> bool:
    return (step.detail or {}).get("state") != reasons.STATE_NOT_KEPT


def _weigh(engine, table, step: Step, history: list[Step], rows_read: int) -> None:
    """Ask the cost model (cost.py) about this incremental step, now that its change rows are
    known: its estimate goes into the step's detail, and a rescan it expects to be cheaper is
    raised as `reasons.Costly` (never for a strict table, nor when the engine's model is off).

    A rescan for COST writes the output only: building the state costs as much again, and the
    steps after it are likely rescans too. Its state is then not kept (reasons.STATE_NOT_KEPT) until a
    step is to run incrementally (the model expects that cheaper, explores, or is off): that step
    raises StateMissing instead, and is rescanned with the state. A rescan only tried (no rescan
    for cost measured yet, cost.Estimate.tries_rescan) keeps the state: if it loses, the table
    goes back to incremental steps without a rebuild."""
    kept = _keeps_state(step)
    estimate = cost.estimate(history, rows_read) \
        if getattr(engine, "cost_model", False) and not table.strict else None  # the steps come in seq order
    if estimate is not None:
        step.detail["estimate"] = estimate.as_dict()
        if estimate.favours_rescan:
            raise reasons.Costly(reasons.Trigger(reasons.COST, estimate.describe()), {"estimate": estimate.as_dict()},
                                keep_state=estimate.tries_rescan)
    if not kept:
        raise StateMissing(f"{reasons.NOT_KEPT}, which is to run incrementally"
                           + (f" ({estimate.describe(choice='staying incremental')})" if estimate is not None else ""))


def _incremental_rows(table, ctx: Context) -> DataFrame:
    """The output's change rows, with the table's columns and types and WEIGHT, not yet
    consolidated (on the driver, when collected, or by `consolidate`)."""
    plan = table.compiled.plan
    root = ctx.delta(plan)
    _require_state_writes(ctx)

    def output_of(frame: DataFrame) -> DataFrame:
        return frame.select(*[F.col(quoted(internal)).cast(field.dataType).alias(field.name)
                              for internal, field in zip(plan.columns, table.schema.fields)], F.col(WEIGHT))

    held = ctx.computed_rows(root)
    types = {f.name: f.dataType for f in root.schema.fields} if held is not None else {}
    if held is not None and all(types.get(internal) == field.dataType
                                for internal, field in zip(plan.columns, table.schema.fields)):
        # computed on the driver already, in the table's types: the same rows, without a Spark plan
        schema = analysed_schema(ctx, ("output", tuple(plan.columns), table.schema.json()), output_of, root.schema)
        typed = spark_typed(held.select([*plan.columns, WEIGHT]).rename_columns(schema.names), schema)
        if typed is not None:
            return ctx.on_driver(lazy_frame(ctx.spark, lambda: output_of(root), schema), typed, exact=True)
    return output_of(root)


def _require_state_writes(ctx: Context) -> None:
    """Every stateful operator whose input changed must have queued its state write; one that
    did not would leave its state an epoch behind and the next epoch wrong. Refuse the step (it
    is rescanned, with the operator named) rather than commit it."""
    queued = {write.name for write in ctx.state.writes}
    for node in walk(ctx.plan):
        if ctx.rule_for(node).stateful(node) and ctx.changed(node) and ctx.state_name(node) not in queued:
            raise StateInconsistent(
                f"{type(node).__name__} ({ctx.state_name(node)}) changed but queued no state write "
                "(an engine defect: please report it with `engine.explain`)")


def _rescan_change(engine, table, inputs, ctx: Context | None, keep_state: bool = True):
    """Recompute in full and diff against the table's current contents (whatever they are, so a
    rescan also repairs a table a crashed or abandoned step left half-written). Returns (change,
    base, full, diff). A table that does not exist yet, whose schema changes or that holds a MAP
    column gets `full` instead of a change: the whole result is written once, with nothing to diff
    against (Spark cannot group maps). A diff
    of a small result against a small table is computed on the driver (`diff`, change None)."""
    spark = engine.spark
    columns = [f.name for f in table.schema.fields]
    full = engine.output_frame(table, inputs, "after").select(*[F.col(quoted(c)) for c in columns])
    if ctx is not None and keep_state:
        ctx.build_states()
    log = DeltaLog.open(table.path, engine.storage_options)
    current = spark.read.format("delta").load(table.path) if log is not None else None
    if current is None or [(f.name, f.dataType) for f in current.schema.fields] != [
            (f.name, f.dataType) for f in table.schema.fields] or \
            any("map<" in f.dataType.simpleString() for f in table.schema.fields):  # a MAP: nothing to diff by
        return None, None, full, None
    diff = _diff_on_driver(engine, table, full, log.version)
    if diff is not None:
        return None, None, None, diff
    plus = full.withColumn(WEIGHT, F.lit(1).cast(LongType()))
    minus = current.select(*[F.col(quoted(c)) for c in columns], F.lit(-1).cast(LongType()).alias(WEIGHT))
    return consolidate(plus.unionByName(minus)), current, None, None


@dataclass
class Diff:
    """A rescan's change (columns and WEIGHT) and the table's current rows, both as Arrow in the
    table's Spark types."""

    change: pa.Table
    current: pa.Table


def _diff_on_driver(engine, table, full: DataFrame, version: int) -> Diff | None:
    """The rescan's diff on the driver: the full result collected (one job, the recompute itself)
    and the table's `version` read by delta-rs, consolidated with weights +1 and -1. Spark's
    diff shuffles both and its multiset MERGE counts copies in the table again, jobs whose fixed
    costs dwarf a result of a few rows. None (Spark diffs) when the result, the table or the change
    has more than `engine.driver_rows` rows, or a type is Spark's to write or to group."""
    reads = getattr(engine, "reads", None)
    limit = engine.driver_rows
    if reads is None or limit <= 0 or not all(type(f.dataType) in DRIVER_WRITE_TYPES for f in table.schema.fields):
        return None
    current = reads.snapshot_rows(table.path, version)
    if current is None:
        return None
    computed = rows_up_to(full, limit)
    if computed is None:
        return None
    new = arrow_as(computed, table.schema)
    old = arrow_as(current.select(table.schema.names), table.schema)
    weights = [pa.array([1] * new.num_rows, pa.int64()), pa.array([-1] * old.num_rows, pa.int64())]
    change = consolidate_rows(pa.concat_tables([new.append_column(WEIGHT, weights[0]),
                                                old.append_column(WEIGHT, weights[1])]))
    if change is None or (pc.sum(pc.abs(change.column(WEIGHT))).as_py() or 0) > limit:
        return None
    return Diff(change, old)


@dataclass
class Collected:
    """A step's change (columns and WEIGHT) and its state merges' rows, on the driver as Arrow."""

    change: pa.Table | None
    states: dict[int, pa.Table]  # id(StateWrite) -> its rows, with one `__bad<i>` flag per check


def _collect_small(change: DataFrame | None, state: StateStore, limit: int,
                   unconsolidated: DataFrame | None = None, held=None) -> Collected | None:
    """Collect the change and every state merge to the driver when each has at most `limit` rows
    (one job each, where the figures job of _figures_and_checks runs one per shuffle stage); None
    when any is larger, for Spark to count and write. `unconsolidated`: the change's rows before
    `consolidate`, collected and consolidated on the driver instead (no shuffle, so one job
    where Spark's aggregate runs one per stage); the consolidated `change` where Arrow cannot
    group a column as Spark does. `held`: the unconsolidated rows, computed on the driver already."""
    if limit <= 0:
        return None
    rows = None
    if unconsolidated is not None:
        raw = held if held is not None else rows_up_to(unconsolidated, limit)
        rows = consolidate_rows(raw) if raw is not None and raw.num_rows <= limit else None
    if rows is None and change is not None:
        rows = rows_up_to(change, limit)
        if rows is None:
            return None
    states = {}
    for write in state.writes:
        if write.mode != "merge":
            continue
        if write.held is not None:
            if write.held.num_rows > limit:
                return None
            states[id(write)] = write.held
            continue
        flagged = write.frame.select("*", *[F.expr(check[1]).alias(f"__bad{i}")
                                            for i, check in enumerate(write.checks)])
        collected = rows_up_to(flagged, limit)
        if collected is None:
            return None
        states[id(write)] = collected
    return Collected(rows, states)


def _figures_on_driver(collected: Collected, state: StateStore) -> tuple[int, int, list]:
    """_figures_and_checks over collected rows: the same figures and checks, no Spark job."""
    for write in state.writes:
        rows = collected.states.get(id(write))
        if rows is None:
            continue
        for i, check in enumerate(write.checks):
            if pc.any(pc.fill_null(rows.column(f"__bad{i}"), False)).as_py():
                raise _failed(check)
        write.rows = rows.num_rows
        write.arrow = rows.drop_columns([f"__bad{i}" for i in range(len(write.checks))])
    kept = [write for write in state.writes if write.mode != "merge" or write.rows]
    if collected.change is None:
        return 0, 0, kept
    weight = collected.change.column(WEIGHT)
    inserted = pc.sum(pc.if_else(pc.greater(weight, 0), weight, 0)).as_py() or 0
    deleted = -(pc.sum(pc.if_else(pc.less(weight, 0), weight, 0)).as_py() or 0)
    return int(inserted), int(deleted), kept


def _failed(check: tuple) -> Exception:
    """The error of a failed state check: (problem, condition) is a state inconsistency,
    (problem, condition, code) a refusal with the rescan reason `code` (reasons.NOT_EXACT)."""
    if len(check) > 2:
        return reasons.NotExact(reasons.Trigger(check[2], check[0]))
    return StateInconsistent(check[0])


def _figures_and_checks(change: DataFrame | None, state: StateStore) -> tuple[int, int, list]:
    """One Spark job for the change's inserted and deleted row counts and every queued state
    merge's row count and consistency checks. The checks run before anything is written, so an
    inconsistency leaves nothing half-written; merges with no rows are dropped. Without a change
    (the output is replaced) the output's figures come from its write."""
    weight = F.col(WEIGHT)
    parts = [] if change is None else [change.agg(
        F.sum(F.when(weight > 0, weight).otherwise(0)).alias("inserted"),
        F.sum(F.when(weight < 0, -weight).otherwise(0)).alias("deleted"),
    )]
    merges = [write for write in state.writes if write.mode == "merge"]
    for n, write in enumerate(merges):
        parts.append(write.frame.agg(
            F.count(F.lit(1)).alias(f"rows{n}"),
            *[F.sum(F.when(F.expr(check[1]), 1).otherwise(0)).alias(f"bad{n}_{i}")
              for i, check in enumerate(write.checks)],
        ))
    if not parts:
        return 0, 0, list(state.writes)
    figures = reduce(lambda a, b: a.crossJoin(b), parts).first().asDict()
    for n, write in enumerate(merges):
        for i, check in enumerate(write.checks):
            if figures[f"bad{n}_{i}"]:
                raise _failed(check)
    for n, write in enumerate(merges):
        write.rows = int(figures[f"rows{n}"])
    empty = {id(write) for write in merges if not write.rows}
    kept = [write for write in state.writes if id(write) not in empty]
    return int(figures.get("inserted") or 0), int(figures.get("deleted") or 0), kept


def _tag(table, step: Step, what: str) -> str:
    return commit_tag(table.name, step.seq, step.epoch, what)


def _output_target(engine, table, step: Step) -> tuple[int, int, str, str]:
    """(the table's latest version, the version to look for the step's commit from, the write's
    app id and tag). A run of this step a crash interrupted may have written already (the write
    is then skipped): its commit is after the version the step started from, not necessarily the
    latest (from the start when the table was recreated since)."""
    log = DeltaLog.open(table.path, engine.storage_options)
    previous = log.version if log is not None else -1
    since = step.output_version + 1 if 0 <= step.output_version <= previous else 0
    return previous, since, f"epochal/{table.name}", _tag(table, step, "output")


def _write_output(engine, table, step: Step, change: DataFrame | None, base: DataFrame | None, inserted: int,
                  deleted: int, meter: Meter, collected: pa.Table | None = None,
                  current: pa.Table | None = None) -> int:
    """Apply the change: keyed (incremental steps of a table with a unique key) or as a multiset;
    committed on the driver when it has at most `engine.driver_rows` rows, else by Spark.
    `collected`: the change, already on the driver; `current`: the rows it applies to, when a
    rescan read them there (then `change` is None)."""
    columns = [f.name for f in table.schema.fields]
    previous, since, app, tag = _output_target(engine, table, step)
    if inserted or deleted:
        keyed = table.key is not None and step.technique == INCREMENTAL
        key = [columns[i] for i in table.key] if keyed else None
        meter.commits += 1
        if inserted + deleted <= engine.driver_rows:
            meter.driver_commits += 1
            target = driver_commits.open_unwritten(table.path, app, step.seq, engine.storage_options)
            if target is not None:  # else a crashed run of this step wrote it
                rows = collected if collected is not None else change.toArrow()
                if keyed:
                    driver_commits.merge_keyed(target, driver_commits.keyed_rows(rows, columns, key), columns, key,
                                               app, step.seq, tag)
                elif deleted:
                    copies = _copies(engine, table, step, change, base, rows, columns, current)
                    driver_commits.merge_multiset(target, driver_commits.multiset_rows(rows, columns, copies),
                                                  columns, app, step.seq, tag)
                else:
                    driver_commits.append(target, driver_commits.multiset_rows(rows, columns, {}).drop_columns([OP]),
                                          app, step.seq, tag, engine.storage_options)
        else:
            _write_output_with_spark(engine, table, step, change, base, columns, key, deleted, app, tag)
    written = version_written(table.path, table.name, step.seq, "output", since, engine.storage_options)
    return written if written is not None else max(previous, step.output_version)


def _copies(engine, table, step: Step, change: DataFrame | None, base: DataFrame | None, rows: pa.Table,
            columns: list[str], current: pa.Table | None = None) -> dict[tuple, int]:
    """The copies the table holds of each row the change deletes: counted on the driver when the
    step holds the table's rows (`current`) or the refresh read its version as Arrow, else by Spark."""
    reads = getattr(engine, "reads", None)
    held = current if current is not None else reads.snapshot_rows(table.path, step.output_version) \
        if reads is not None and step.technique == INCREMENTAL and step.output_version >= 0 else None
    if held is None:
        return copies_in(_base(engine, table, step, base), change, columns)
    return driver_commits.copies_of(held, rows.filter(pc.less(rows.column(WEIGHT), 0)), columns)


def _base(engine, table, step: Step, base: DataFrame | None) -> DataFrame:
    """The rows the change applies to: `base` (a rescan's read of the table), else the version an
    incremental step starts from, shared by the refresh when small. Only a multiset change with
    deletes reads it, so keyed steps and inserts never do."""
    if base is not None:
        return base
    reads = getattr(engine, "reads", None)
    shared = reads.snapshot(engine.spark, table.path, step.output_version, table.schema) \
        if reads is not None and step.output_version >= 0 else None
    return shared if shared is not None else read_snapshot(engine.spark, table.path, step.output_version,
                                                           table.schema)


def _write_output_with_spark(engine, table, step: Step, change: DataFrame, base: DataFrame | None, columns: list[str],
                             key: list[str] | None, deleted: int, app: str, tag: str) -> None:
    spark = engine.spark
    identity = write_identity(spark, app, step.seq, tag)
    if key is not None:
        apply_keyed(spark, table.path, keyed_source(change, columns, key), columns, key, identity)
        return
    source, persisted = multiset_source(change, columns, _base(engine, table, step, base) if deleted else None)
    try:
        apply_multiset(spark, table.path, source, columns, identity,
                       lambda frame: writer(frame, app, step.seq, tag), has_deletes=deleted > 0)
    finally:
        for frame in persisted:
            frame.unpersist()


def _replace_output(engine, table, step: Step, full: DataFrame) -> tuple[int, int, int, bool]:
    """Write the full result as the table's whole contents: its first commit (created with the
    change data feed on; Delta makes every column nullable) or an overwrite when its schema
    changed; on the driver when small (writes.replace). Returns the version written, the rows it
    inserted and deleted, and whether it was committed on the driver."""
    _, since, app, tag = _output_target(engine, table, step)
    on_driver = replace_contents(full, table.path, app, step.seq, tag, engine.storage_options, engine.driver_rows,
                        change_data_feed=True)
    written = version_written(table.path, table.name, step.seq, "output", since, engine.storage_options)
    if written is None:
        raise EpochError(f"table {table.name!r}: the write of step {step.seq} is not in the table's history "
                         "(an engine defect: please report it)")
    if on_driver:
        inserted = _row_count(table.path, written, engine.storage_options)
    else:
        commit = TableFiles(table.path, engine.storage_options).commit(written)
        inserted = int(commit.metrics.get("numOutputRows", 0)) if commit is not None else 0
    return written, inserted, _row_count(table.path, written - 1, engine.storage_options), on_driver


def _write_states(engine, table, step: Step, state: StateStore, writes: list, meter: Meter) -> dict[str, int]:
    versions = {} if step.technique == RESCAN else dict(state.versions)
    for write in writes:
        path = state.path(write.name)
        log = DeltaLog.open(path, engine.storage_options)
        # as for the output: an interrupted run of this step may have written this state table
        # already, after the version the previous step recorded
        recorded = state.versions.get(write.name)
        since = recorded + 1 if recorded is not None and log is not None and log.version >= recorded else 0
        app, tag = f"epochal/{table.name}/{write.name}", _tag(table, step, write.name)
        copied = bool(write.keys) and engine.arrangements is not None and replaces_state(state, write)
        if write_state(engine.spark, state, write, step.seq, app, tag, engine.driver_rows):
            meter.driver_commits += 1
        elif copied:
            # too large for the driver, so later epochs read it by key: copy it now, not in their reads
            engine.arrangements.copy_table(path, write.keys[0])
        meter.commits += 1
        found = version_written(path, table.name, step.seq, write.name, since, engine.storage_options)
        latest = log.version if log is not None else -1
        versions[write.name] = found if found is not None else state.versions.get(write.name, latest)
        faults.point("after_state_merge", table.name)
    return versions


def _commit(table, step: Step, engine, phases: Phases, began: float, meter: Meter | None = None, *, rows_read: int = 0, inserted: int = 0,
            deleted: int = 0, output_version: int | None = None, state_versions: dict | None = None) -> Report:
    state_versions = dict(step.state_versions) if state_versions is None else state_versions
    if meter is not None:
        meter.count_jobs(engine.spark)
    state_rows = sum(_row_count(f"{table.state_root}/{name}", version, engine.storage_options)
                     for name, version in state_versions.items())
    phases.mark("figures")  # the step's Spark jobs counted, its state's rows read
    committed = Step(**{
        **step.__dict__,
        "status": COMMITTED,
        "output_version": step.output_version if output_version is None else output_version,
        "state_versions": state_versions,
        "rows_read": rows_read,
        "rows_inserted": inserted,
        "rows_deleted": deleted,
        "state_rows": state_rows,
        "seconds": round(time.monotonic() - began, 3),
        "detail": {**step.detail, "phases": phases.seconds,
                   **({"cost": meter.as_dict()} if meter is not None else {})},
        "written_at": None,
        "run_id": engine.run_id,
    })
    faults.point("before_commit", table.name)
    _, stored = table.ledger.record(committed)
    return _report(table, stored, time.monotonic() - began)


def _row_count(path: str, version: int, storage_options=None) -> int:
    """Rows in a state table at a version, from Delta's file statistics (no Spark job)."""
    if version < 0:
        return 0
    try:
        return DeltaTable(path, version=version, storage_options=storage_options).count()
    except (DeltaError, TableNotFoundError):
        return 0
