"""The epoch protocol for one table (docs/architecture.md, section 3): this module decides and
records each step; change.py computes its output change, output.py writes it.

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
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import partial

from delta import exceptions
from deltalake.exceptions import CommitFailedError

from ..arrow_rows import computed_rows
from .. import faults, reasons, settings
from ..changes import InputRange
from ..errors import EpochalError, EpochError, StateInconsistent, StrictModeError
from ..keyed.state import StateMissing, StateStore
from ..metrics import Meter, metered
from ..storage.deltalog import DeltaLog, row_count
from ..storage.ledger import ABANDONED, COMMITTED, INCREMENTAL, NOOP, RESCAN, STARTED, Step
from ..storage.reclock import Epoch
from . import cost, rescan
from .change import consolidated, incremental_rows, made, rescan_change
from .context import Context
from .environment import Environment
from .output import (
    Collected,
    collect_small,
    figures_and_checks,
    figures_on_driver,
    replace_output,
    write_output,
    write_states,
)

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


def input_ranges(env: Environment, table, last: Step | None, epoch: Epoch) -> dict[str, InputRange]:
    """Per input, the versions this step reads and the identity of the table read. An input
    whose Delta table id differs from the one the last step recorded is a new table at the same
    path (deleted and created again): its versions count from 0 again, so nothing of the last
    step's range carries over (`replaced`, before -1)."""
    ranges = {}
    for name in table.compiled.inputs:
        recorded = last.inputs[name] if last is not None and name in last.inputs else {}
        before = recorded.get("to", -1)
        if name in env.sources:
            source = env.sources[name]
            if name not in epoch.frontiers:
                raise EpochError(f"epoch {epoch.key} has no frontier for source {name!r} (internal error)")
            after = epoch.frontiers[name] - 1
            path, kind = source.path, "source"
            table_id = epoch.table_ids.get(name)
        else:
            upstream = env.table(name)
            applied = upstream.ledger.at_epoch(epoch.key)
            if applied is None:
                raise EpochError(
                    f"table {table.name!r} reads {name!r}, which has not applied epoch {epoch.key} yet; "
                    f"refresh {name!r} for this epoch first (engine.refresh includes upstream tables "
                    "when asked for all tables)"
                )
            after = applied.output_version
            path, kind = upstream.path, "derived"
            log = DeltaLog.open(path, env.storage_options)
            table_id = log.table_id if log is not None else None
        was = recorded.get("id")
        replaced = was if was is not None and table_id is not None and was != table_id else None
        if replaced is not None:
            before = -1
        ranges[name] = InputRange(name, path, kind, before, max(after, before), env.schema_of(name), table_id, replaced)
    return ranges


def _recorded(r: InputRange) -> dict:
    """What the ledger keeps of an input range."""
    return {"from": r.before, "to": r.after, **({"id": r.table_id} if r.table_id is not None else {})}


def _decide(table, last: Step | None, inputs: dict[str, InputRange], full_refresh: bool,
            env: Environment | None = None, now: dict | None = None) -> tuple[str, str]:
    if last is None:
        return RESCAN, "FIRST_RUN"
    if last.fingerprint != table.compiled.fingerprint:
        return RESCAN, "QUERY_CHANGED"
    if full_refresh:
        return RESCAN, "REQUESTED"
    if env is not None:
        changed = settings.difference((last.detail or {}).get("settings"), now or settings.current(env.spark))
        if changed is not None:
            return RESCAN, f"{settings.SETTINGS_CHANGED}: {changed}"
    for r in inputs.values():
        if r.replaced is not None:
            return RESCAN, (f"{reasons.SOURCE_REWRITTEN}: {r.kind} {r.name!r} at {r.path} is a new Delta table "
                            f"(id {r.table_id}, was {r.replaced}): it was deleted and created again")
    if not any(r.changed for r in inputs.values()):
        return NOOP, ""
    if table.compiled.plan is None:
        return RESCAN, f"NOT_INCREMENTAL: {table.compiled.blocker}"
    trigger = rescan.detect(env, table, last, inputs) if env is not None else None
    if trigger is not None:  # CDF_UNAVAILABLE, SOURCE_REWRITTEN, STATE_MISSING or COST
        return RESCAN, trigger.reason
    return INCREMENTAL, ""


def run(env: Environment, table, epoch: Epoch, *, full_refresh: bool = False) -> Report:
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
            return _execute(env, table, epoch, pending, began)
        if resumable and pending.epoch_end < epoch.end:
            earlier = env.remap.get(pending.epoch)
            _execute(env, table, earlier, pending, time.monotonic())
            return run(env, table, epoch, full_refresh=full_refresh)
        _abandon(table, pending, "superseded: the definition changed or a full refresh was requested")
        steps = ledger.steps()
        last = ledger.last_committed(steps)

    inputs = input_ranges(env, table, last, epoch)
    for r in inputs.values():
        if r.replaced is not None and env.arrangements is not None:  # they hold the old table's rows
            env.arrangements.forget(r.path)
    now = env.settings if env.settings is not None else settings.current(env.spark)  # decides the step; recorded
    technique, reason = _decide(table, last, inputs, full_refresh, env, now)
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
        inputs={name: _recorded(r) for name, r in inputs.items()},
        output_version=last.output_version if last else -1,
        state_versions=dict(last.state_versions) if last else {},
        run_id=env.run_id,
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
    return _execute(env, table, epoch, step, began)


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


def _ranges_of(env: Environment, table, step: Step) -> dict[str, InputRange]:
    return {
        name: InputRange(
            name,
            env.path_of(name),
            "source" if name in env.sources else "derived",
            versions["from"],
            versions["to"],
            env.schema_of(name),
            versions.get("id"),
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


def _execute(env: Environment, table, epoch: Epoch, step: Step, began: float) -> Report:
    """Compute and write the step; an error that is not the engine's own (Spark's, raised by the
    table's SQL, say) gets a note naming the table, the epoch and what happens next, and keeps
    its type."""
    step = step.copied()  # its detail is written below; the ledger's own steps are shared
    try:
        return _execute_with_retries(env, table, epoch, step, began)
    except EpochalError:
        raise
    except Exception as error:
        error.add_note(f"epochal: raised while applying epoch {epoch.key} to table {table.name!r} "
                       f"({step.technique}); the step is not recorded as done. A refresh retries the same "
                       "epoch over the same rows: if the table's SQL fails on them, change the SQL, or fix the "
                       "rows at the source and refresh with full_refresh=True")
        raise


def _execute_with_retries(env: Environment, table, epoch: Epoch, step: Step, began: float) -> Report:
    conflicts = _conflicts()
    for attempt in range(CONCURRENT_RETRIES + 1):
        try:
            return _compute_and_write(env, table, epoch, step, began)
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
            fresh = replace(step, seq=table.ledger.next_seq(), technique=RESCAN, reason=reason,
                            detail={**detail, **getattr(problem, "detail", {})})
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


def _compute_and_write(env: Environment, table, epoch: Epoch, step: Step, began: float) -> Report:
    done = _committed(table, step)
    if done is not None:  # a concurrent run finished this step meanwhile: nothing left to do
        return _report(table, done, time.monotonic() - began, note="applied by a concurrent run")
    meter = Meter()
    with metered(env.spark, meter):
        return _compute_and_write_metered(env, table, step, began, meter)


def _compute_and_write_metered(env: Environment, table, step: Step, began: float, meter: Meter) -> Report:
    spark = env.spark
    phases = Phases(began)
    phases.mark("start")
    inputs = _ranges_of(env, table, step)
    # the state and output this step starts from are the previous step's, also when a concurrent
    # run commits this step while it runs
    history = [s for s in table.ledger.committed() if s.seq < step.seq]
    last = max(history, key=lambda s: s.seq, default=None)
    reads = env.reads
    state = StateStore(spark, table.state_root, dict(last.state_versions) if last else {}, env.storage_options,
                       reads, upkeep=env.upkeep)
    plan = table.compiled.plan
    ctx = Context(spark, plan, inputs, state, rescan=step.technique == RESCAN,
                  broadcast_rows=env.broadcast_rows, meter=meter,
                  reads=reads, schemas=env.schemas) if plan is not None else None
    change = rows = None
    try:
        if step.technique == INCREMENTAL:
            _weigh_unread(env, table, step, history, inputs)
            rows_read = ctx.read_changes()
            phases.mark("read changes")
            faults.point("after_read_changes", table.name)
            if not ctx.changed(plan):  # every change consolidated away: nothing to write
                return _commit(table, step, env, phases, began, meter, rows_read=rows_read)
            step.detail["spark_changes"] = sorted(set(ctx.spark_changes))
            budget = _weigh(env, table, step, history, rows_read)
            if budget is not None:
                ctx.budget(began + budget, partial(_over_budget, table, rows_read, budget, began, ctx,
                                                      step.detail.get("estimate") or {}))
            # the epoch-start snapshots the delta rules read (planned here, read below) are Delta's to refuse, too
            refused = partial(reasons.refusals, f"the inputs of {table.name!r} as of this epoch's start")
            with refused():
                rows = incremental_rows(table, ctx)
                change = consolidated(ctx, rows)
            base, full, diff = None, None, None  # the version the step starts from: read by _base if a write needs it
        else:
            rows_read = 0
            refused = nullcontext
            replacing = cost.replaces(history) and not env.readers(table.name)
            if replacing:
                step.detail["replaced"] = "the table's last rescans changed a large share of its rows (cost.replaces)"
            change, base, full, diff = rescan_change(env, table, inputs, ctx, keep_state=_keeps_state(step),
                                                     replace=replacing)
        with refused():
            change = change.persist() if made(change) else change
            if diff is not None:
                collected = Collected(diff.change, {})
            else:
                collected = collect_small(change, state, env.driver_rows, rows,
                                           computed_rows(rows) if ctx is not None and rows is not None else None)
            if collected is not None:
                inserted, deleted, writes = figures_on_driver(collected, state)
            else:
                inserted, deleted, writes = figures_and_checks(change, state)
        phases.mark("compute")
        if full is not None:
            output_version, inserted, deleted, on_driver = replace_output(env, table, step, full)
            meter.commits += 1
            meter.driver_commits += on_driver
        else:
            output_version = write_output(env, table, step, change, base, inserted, deleted, meter,
                                           collected.change if collected is not None else None,
                                           diff.current if diff is not None else None)
        if step.technique == RESCAN and full is None:
            step.detail["changed_share"] = _changed_share(env, table, output_version, inserted, deleted)
        phases.mark("write output")
        faults.point("after_output_merge", table.name)
        state_versions = write_states(env, table, step, state, writes, meter)
        phases.mark("write state")
    finally:
        if made(change):
            change.unpersist()
        if ctx is not None:
            ctx.unpersist()
    copying = ctx.copying_seconds if ctx is not None else 0.0
    if copying:
        step.detail["copying"] = round(copying, 3)  # within its phases' seconds (cost.budget)
    return _commit(table, step, env, phases, began, meter, rows_read=rows_read, inserted=inserted,
                   deleted=deleted, output_version=output_version, state_versions=state_versions)


def _changed_share(env: Environment, table, version: int, inserted: int, deleted: int) -> float:
    """A diff's rows against the rows of the two versions it diffed: what share of a replace's
    change (every row deleted and inserted) it carried (cost.replaces)."""
    after = row_count(table.path, version, env.storage_options)
    both = 2 * after - inserted + deleted
    return round((inserted + deleted) / both, 4) if both > 0 else 0.0


def _keeps_state(step: Step) -> bool:
    return (step.detail or {}).get("state") != reasons.STATE_NOT_KEPT


def _weigh_unread(env: Environment, table, step: Step, history: list[Step], inputs: dict[str, InputRange]) -> None:
    """The cost model before the step reads its change batches (cost.py, "Before reading"): the
    rows its inputs' commits logged go into the step's detail (later steps' shares), and a rescan
    the rows expected of them make far cheaper is raised as `reasons.Costly` unread."""
    if not env.cost_model or table.strict:
        return
    by_input = rescan.logged_rows_by_input(env, inputs)
    if by_input is None:  # a commit without metrics: weighed once read
        return
    logged = sum(by_input.values())
    step.detail["logged_rows"] = logged
    recent = cost.shares(history, cost.changed_inputs(step))
    expected = cost.expected_rows(recent, logged)
    spark_path = env.reads is None or not all(env.reads.holds_range(inputs[name].path, rows)
                                              for name, rows in by_input.items())
    estimate = cost.estimate(history, logged if expected is None else expected, spark_path, env.driver_rows, read=False)
    if expected is None and (estimate is None or estimate.path_measured):  # no share says how many rows reach the plan
        estimate = None
    margin = cost.unread_margin(recent) if estimate is None or estimate.path_measured else cost.MARGIN
    if cost.favours_rescan_unread(estimate, margin):
        raise reasons.Costly(
            reasons.Trigger(reasons.COST, f"not read: the inputs' commits logged {logged} changed rows, "
                                          + (f"{expected} expected to reach the plan (the share of its recent steps"
                                             if expected is not None else "no step has measured how many reach the "
                                             "plan (as many assumed") + f", past "
                                          f"the estimates' margin of {margin:.2f} before reading); "
                                          + estimate.describe()),
            {"estimate": {**estimate.as_dict(), "logged_rows": logged, "unread": True,
                          "unread_margin": round(margin, 3)}},
            keep_state=estimate.tries_rescan)


def _weigh(env: Environment, table, step: Step, history: list[Step], rows_read: int) -> float | None:
    """Ask the cost model (cost.py) about this incremental step, now that its change rows and
    their path (`spark_changes` in its detail) are known: its estimate goes into the step's
    detail, and a rescan it expects to be cheaper is
    raised as `reasons.Costly` (never for a strict table, nor when the engine's model is off).
    Returns the seconds the step may run before it gives up (cost.budget), or None.

    A rescan for COST writes the output only: building the state costs as much again, and the
    steps after it are likely rescans too. Its state is then not kept (reasons.STATE_NOT_KEPT) until a
    step is to run incrementally (the model expects that cheaper, explores, or is off): that step
    raises StateMissing instead, and is rescanned with the state. A rescan only tried (no rescan
    for cost measured yet, cost.Estimate.tries_rescan) keeps the state: if it loses, the table
    goes back to incremental steps without a rebuild."""
    kept = _keeps_state(step)
    weighed = env.cost_model and not table.strict
    spark_path = bool(step.detail.get("spark_changes"))
    estimate = cost.estimate(history, rows_read, spark_path, env.driver_rows) if weighed else None  # steps in seq order
    if estimate is not None:
        step.detail["estimate"] = estimate.as_dict()
        if estimate.favours_rescan:
            raise reasons.Costly(reasons.Trigger(reasons.COST, estimate.describe()), {"estimate": estimate.as_dict()},
                                keep_state=estimate.tries_rescan)
    if not kept:
        raise StateMissing(f"{reasons.NOT_KEPT}, which is to run incrementally"
                           + (f" ({estimate.describe(choice='staying incremental')})" if estimate is not None else ""))
    return cost.budget(history, rows_read, estimate, spark_path) if weighed else None


def _over_budget(table, rows: int, budget: float, began: float, ctx: Context, estimate: dict) -> reasons.Costly:
    """The rescan for cost that an incremental step past its budget (cost.budget) gives up for: its
    rows and seconds so far, without those it spent making local copies, are recorded (`gave_up`),
    a floor for the estimates after it."""
    copying = ctx.copying_seconds
    spent = round(time.monotonic() - began - copying, 3)
    return reasons.Costly(
        reasons.Trigger(reasons.COST, f"an incremental step of {rows} change rows on the driver was given up after "
                                      f"{spent:.1f} s" + (f" (and {copying:.1f} s making local copies)" if copying else "")
                                      + f", past its budget of {budget:.1f} s (what giving it up is expected to "
                                      f"cost: a rescan, and the state's rebuild); table {table.name!r} is rescanned "
                                      "instead"),
        {"estimate": {**estimate, "rows": rows},
         "gave_up": {"rows": rows, "seconds": spent, "budget": round(budget, 3), "copying": round(copying, 3)}})


def _commit(table, step: Step, env: Environment, phases: Phases, began: float, meter: Meter | None = None, *, rows_read: int = 0, inserted: int = 0,
            deleted: int = 0, output_version: int | None = None, state_versions: dict | None = None) -> Report:
    state_versions = dict(step.state_versions) if state_versions is None else state_versions
    if meter is not None:
        meter.count_jobs(env.spark)
    state_rows = sum(row_count(f"{table.state_root}/{name}", version, env.storage_options)
                     for name, version in state_versions.items())
    phases.mark("figures")  # the step's Spark jobs counted, its state's rows read
    committed = replace(
        step,
        status=COMMITTED,
        output_version=step.output_version if output_version is None else output_version,
        state_versions=state_versions,
        rows_read=rows_read,
        rows_inserted=inserted,
        rows_deleted=deleted,
        state_rows=state_rows,
        seconds=round(time.monotonic() - began, 3),
        detail={**step.detail, "phases": phases.seconds, **({"cost": meter.as_dict()} if meter is not None else {})},
        written_at=None,
        run_id=env.run_id,
    )
    faults.point("before_commit", table.name)
    _, stored = table.ledger.record(committed)
    return _report(table, stored, time.monotonic() - began)


