"""Writing a step (docs/architecture.md, section 3, step 5): the change's figures and the state
merges' consistency checks, counted before anything is written (on the driver when the rows are
collected there, else in one Spark job); then one commit of the change into the table (a keyed or
multiset MERGE, an append, or the full result replacing it; on the driver through delta-rs when
change-sized, else by Spark), then one append per state table, each with its idempotent-write
identity so a rerun skips what a crashed run wrote."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .. import faults, reasons
from ..arrow_rows import column_first_values, key_kind
from ..changes import consolidate_rows, read_snapshot, rows_up_to
from ..errors import EpochError, StateInconsistent
from ..graph import WEIGHT
from ..keyed.state import StateStore
from ..metrics import Meter
from ..storage import commits as driver_commits
from ..storage.commits import OP
from ..storage.deltalog import DeltaLog, TableFiles, row_count
from ..storage.ledger import INCREMENTAL, RESCAN, Step
from .environment import Environment
from .writes import (
    apply_keyed,
    apply_multiset,
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


@dataclass
class Collected:
    """A step's change (columns and WEIGHT) and its state merges' rows, on the driver as Arrow."""

    change: pa.Table | None
    states: dict[int, pa.Table]  # id(StateWrite) -> its rows, with one `__bad<i>` flag per check


def collect_small(change: DataFrame | None, state: StateStore, limit: int,
                   unconsolidated: DataFrame | None = None, held=None) -> Collected | None:
    """Collect the change and every state merge to the driver when each has at most `limit` rows
    (one job each, where the figures job of figures_and_checks runs one per shuffle stage); None
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


def figures_on_driver(collected: Collected, state: StateStore) -> tuple[int, int, list]:
    """figures_and_checks over collected rows: the same figures and checks, no Spark job."""
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


def figures_and_checks(change: DataFrame | None, state: StateStore) -> tuple[int, int, list]:
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


def _output_target(env: Environment, table, step: Step) -> tuple[int, int, str, str]:
    """(the table's latest version, the version to look for the step's commit from, the write's
    app id and tag). A run of this step a crash interrupted may have written already (the write
    is then skipped): its commit is after the version the step started from, not necessarily the
    latest (from the start when the table was recreated since)."""
    log = DeltaLog.open(table.path, env.storage_options)
    previous = log.version if log is not None else -1
    since = step.output_version + 1 if 0 <= step.output_version <= previous else 0
    return previous, since, f"epochal/{table.name}", _tag(table, step, "output")


def write_output(env: Environment, table, step: Step, change: DataFrame | None, base: DataFrame | None, inserted: int,
                  deleted: int, meter: Meter, collected: pa.Table | None = None,
                  current: pa.Table | None = None) -> int:
    """Apply the change: keyed (incremental steps of a table with a unique key) or as a multiset;
    committed on the driver when it has at most `env.driver_rows` rows, else by Spark.
    `collected`: the change, already on the driver; `current`: the rows it applies to, when a
    rescan read them there (then `change` is None)."""
    columns = [f.name for f in table.schema.fields]
    previous, since, app, tag = _output_target(env, table, step)
    if inserted or deleted:
        keyed = table.key is not None and step.technique == INCREMENTAL
        key = [columns[i] for i in table.key] if keyed else None
        meter.commits += 1
        matched = key if keyed else columns if deleted else []
        if inserted + deleted <= env.driver_rows and \
                driver_commits.matches_as_spark([f.dataType for f in table.schema.fields if f.name in matched]):
            meter.driver_commits += 1
            target = driver_commits.open_unwritten(table.path, app, step.seq, env.storage_options)
            if target is not None:  # else a crashed run of this step wrote it
                rows = collected if collected is not None else change.toArrow()
                if keyed:
                    driver_commits.merge_keyed(target, driver_commits.keyed_rows(rows, columns, key), columns, key,
                                               app, step.seq, tag)
                elif deleted:
                    copies = _copies(env, table, step, change, base, rows, columns, current)
                    driver_commits.merge_multiset(target, driver_commits.multiset_rows(rows, columns, copies),
                                                  columns, app, step.seq, tag)
                else:
                    driver_commits.append(target, driver_commits.multiset_rows(rows, columns, None).drop_columns([OP]),
                                          app, step.seq, tag, env.storage_options)
        else:
            _write_output_with_spark(env, table, step, change, base, columns, key, deleted, app, tag)
    written = version_written(table.path, table.name, step.seq, "output", since, env.storage_options)
    return written if written is not None else max(previous, step.output_version)


def _copies(env: Environment, table, step: Step, change: DataFrame | None, base: DataFrame | None, rows: pa.Table,
            columns: list[str], current: pa.Table | None = None) -> pa.Table:
    """The copies the table holds of each row the change deletes: counted on the driver when the
    step holds the table's rows (`current`), the refresh read its version as Arrow, or a read of
    the rows sharing a column's value with a deleted row finds them, else by Spark (a scan of the
    whole table, every epoch with a delete: a filtered projection of a large input)."""
    reads = env.reads
    deleted = rows.filter(pc.less(rows.column(WEIGHT), 0))
    held = current
    if held is None and reads is not None and step.technique == INCREMENTAL and step.output_version >= 0:
        held = reads.snapshot_rows(table.path, step.output_version)
        if held is None:
            held = _sharing_a_value(reads, table.path, step.output_version, deleted, columns)
    if held is None:
        return copies_in(_base(env, table, step, base), change, columns)
    return driver_commits.copies_of(held, deleted, columns)


KEYS_READ_EXACTLY = frozenset({"integer", "string", "date", "decimal"})


def _sharing_a_value(reads, path: str, version: int, deleted: pa.Table, columns: list[str]) -> pa.Table | None:
    """The table's rows as of `version` whose first column of a kind a read by key filters
    exactly (an integer, string, date or decimal) equals that column of a deleted row, with every
    column: a superset of each deleted row's copies. None where there is no such column, the rows
    are too many for the driver (the reads' `key_rows`), or the read holds fewer columns (a plan
    of the refresh reads the table, and the read keeps its columns only)."""
    column = next((c for c in columns if key_kind(deleted.schema.field(c).type) in KEYS_READ_EXACTLY), None)
    first = column_first_values(deleted.column(column)) if column is not None else None
    if first is None:
        return None
    found = reads.keys_rows(path, version, column, *first, copies=False)
    return found if found is not None and set(columns) <= set(found.column_names) else None


def _base(env: Environment, table, step: Step, base: DataFrame | None) -> DataFrame:
    """The rows the change applies to: `base` (a rescan's read of the table), else the version an
    incremental step starts from, shared by the refresh when small. Only a multiset change with
    deletes reads it, so keyed steps and inserts never do."""
    if base is not None:
        return base
    reads = env.reads
    shared = reads.snapshot(env.spark, table.path, step.output_version, table.schema) \
        if reads is not None and step.output_version >= 0 else None
    return shared if shared is not None else read_snapshot(env.spark, table.path, step.output_version,
                                                           table.schema)


def _write_output_with_spark(env: Environment, table, step: Step, change: DataFrame, base: DataFrame | None, columns: list[str],
                             key: list[str] | None, deleted: int, app: str, tag: str) -> None:
    spark = env.spark
    identity = write_identity(spark, app, step.seq, tag)
    if key is not None:
        apply_keyed(spark, table.path, keyed_source(change, columns, key), columns, key, identity)
        return
    source, persisted = multiset_source(change, columns, _base(env, table, step, base) if deleted else None)
    try:
        apply_multiset(spark, table.path, source, columns, identity,
                       lambda frame: writer(frame, app, step.seq, tag), has_deletes=deleted > 0)
    finally:
        for frame in persisted:
            frame.unpersist()


def replace_output(env: Environment, table, step: Step, full: DataFrame) -> tuple[int, int, int, bool]:
    """Write the full result as the table's whole contents: its first commit (created with the
    change data feed on; Delta makes every column nullable) or an overwrite when its schema
    changed; on the driver when small (writes.replace). Returns the version written, the rows it
    inserted and deleted, and whether it was committed on the driver."""
    previous, since, app, tag = _output_target(env, table, step)
    on_driver = replace_contents(full, table.path, app, step.seq, tag, env.storage_options, env.driver_rows,
                                 change_data_feed=True,
                                 expected_rows=row_count(table.path, previous, env.storage_options))
    written = version_written(table.path, table.name, step.seq, "output", since, env.storage_options)
    if written is None:
        raise EpochError(f"table {table.name!r}: the write of step {step.seq} is not in the table's history "
                         "(an engine defect: please report it)")
    if on_driver:
        inserted = row_count(table.path, written, env.storage_options)
    else:
        commit = TableFiles(table.path, env.storage_options).commit(written)
        inserted = int(commit.metrics.get("numOutputRows", 0)) if commit is not None else 0
    return written, inserted, row_count(table.path, written - 1, env.storage_options), on_driver


def write_states(env: Environment, table, step: Step, state: StateStore, writes: list, meter: Meter) -> dict[str, int]:
    versions = {} if step.technique == RESCAN else dict(state.versions)
    for write in writes:
        path = state.path(write.name)
        log = DeltaLog.open(path, env.storage_options)
        # as for the output: an interrupted run of this step may have written this state table
        # already, after the version the previous step recorded
        recorded = state.versions.get(write.name)
        since = recorded + 1 if recorded is not None and log is not None and log.version >= recorded else 0
        app, tag = f"epochal/{table.name}/{write.name}", _tag(table, step, write.name)
        copied = bool(write.keys) and env.keyed_files is not None and replaces_state(state, write)
        if write_state(env.spark, state, write, step.seq, app, tag, env.driver_rows):
            meter.driver_commits += 1
        elif copied:
            # too large for the driver, so later epochs read it by key: copy it now, not in their reads
            env.keyed_files.copy_table(path, write.keys[0])
        meter.commits += 1
        found = version_written(path, table.name, step.seq, write.name, since, env.storage_options)
        latest = log.version if log is not None else -1
        versions[write.name] = found if found is not None else state.versions.get(write.name, latest)
        faults.point("after_state_merge", table.name)
    return versions
