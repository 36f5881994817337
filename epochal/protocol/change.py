"""A step's output change (docs/architecture.md, section 3, step 4): for an incremental step, the
plan's delta evaluated over the step's context and cast to the table's columns; for a rescan, the
SQL in full diffed with the table's current contents (on the driver when both are small), or the
full result itself where there is nothing to diff against."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ..arrow_rows import computed_rows, hold, lazy_frame, spark_typed
from ..changes import NEW, atomic, consolidate, consolidate_rows, consolidated_schema, quoted, rows_up_to
from ..errors import StateInconsistent
from ..graph import WEIGHT, from_full_state, walk
from ..rules.base import analysed_schema
from ..storage.deltalog import DeltaLog
from .context import Context
from .environment import Environment
from .writes import arrow_as, written_on_driver


def consolidated(ctx: Context, rows: DataFrame) -> DataFrame:
    """`rows` consolidated: by Spark, persisted, where they are Spark's; where they are held on
    the driver (consolidated there when collected), a frame Spark plans only if a write needs it."""
    if computed_rows(rows) is None:
        return consolidate(rows)
    schema = consolidated_schema(rows.schema) or analysed_schema(ctx, ("consolidate",), consolidate, rows.schema)
    return lazy_frame(ctx.spark, lambda: consolidate(rows).persist(), schema)


def made(frame: DataFrame | None) -> bool:
    """Whether `frame` is a Spark plan (not None, nor a frame not yet handed to Spark)."""
    return frame is not None and getattr(frame, "created", True)


def incremental_rows(table, ctx: Context) -> DataFrame:
    """The output's change rows, with the table's columns and types and WEIGHT, not yet
    consolidated (on the driver, when collected, or by `consolidate`)."""
    plan = table.compiled.plan
    root = ctx.delta(plan)
    _require_state_writes(ctx)

    def output_of(frame: DataFrame) -> DataFrame:
        return output_frame_of(frame, plan.columns, table.schema)

    held = computed_rows(root)
    types = {f.name: f.dataType for f in root.schema.fields} if held is not None else {}
    if held is not None and all(types.get(internal) == field.dataType
                                for internal, field in zip(plan.columns, table.schema.fields)):
        # computed on the driver already, in the table's types: the same rows, without a Spark plan
        schema = output_schema(plan.columns, table.schema, root.schema) or analysed_schema(
            ctx, ("output", tuple(plan.columns), table.schema.json()), output_of, root.schema)
        typed = spark_typed(held.select([*plan.columns, WEIGHT]).rename_columns(schema.names), schema)
        if typed is not None:
            return hold(lazy_frame(ctx.spark, lambda: output_of(root), schema), typed, exact=True)
    return output_of(root)


def output_frame_of(frame: DataFrame, columns, table: StructType) -> DataFrame:
    """The plan's root columns named and typed as the table's, with WEIGHT."""
    return frame.select(*_as_table_columns(columns, table), F.col(WEIGHT))


def _as_table_columns(columns, table: StructType) -> list:
    return [F.col(quoted(internal)).cast(field.dataType).alias(field.name) for internal, field in zip(columns, table.fields)]


def output_schema(columns, table: StructType, root: StructType) -> StructType | None:
    """The output's schema (incremental_rows' output_of) where each of its atomic columns is
    already of the table's type, as Spark's analysis gives it: a cast to a column's own type
    keeps its nullability; None otherwise."""
    if not atomic(table) or any(root[internal].dataType != field.dataType for internal, field in zip(columns, table.fields)):
        return None
    return StructType([StructField(field.name, field.dataType, root[internal].nullable)
                       for internal, field in zip(columns, table.fields)] + [root[WEIGHT]])


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


def rescan_change(env: Environment, table, inputs, ctx: Context | None, keep_state: bool = True,
                  replace: bool = False):
    """Recompute in full and diff against the table's current contents (whatever they are, so a
    rescan also repairs a table a crashed or abandoned step left half-written). Returns (change,
    base, full, diff). A table that does not exist yet, whose schema changes or that holds a MAP
    column gets `full` instead of a change: the whole result is written once, with nothing to diff
    against (Spark cannot group maps); so does one the step `replace`s (cost.replaces). A diff
    of a small result against a small table is computed on the driver (`diff`, change None)."""
    spark = env.spark
    columns = [f.name for f in table.schema.fields]
    full = None
    if ctx is not None and keep_state:
        ctx.build_states()
        full = _from_state(table, ctx)
    if full is None:
        full = env.output_frame(table, inputs, "after").select(*[F.col(quoted(c)) for c in columns])
    if replace:
        return None, None, full, None
    log = DeltaLog.open(table.path, env.storage_options)
    if log is None or not _same_columns(log.spark_schema(), table.schema) or \
            any("map<" in f.dataType.simpleString() for f in table.schema.fields):  # a MAP: nothing to diff by
        return None, None, full, None
    diff = _diff_on_driver(env, table, full, log.version)
    if diff is not None:
        return None, None, None, diff
    current = spark.read.format("delta").load(table.path)  # Spark's snapshot costs jobs: only for Spark's diff
    if not _same_columns(current.schema, table.schema):
        return None, None, full, None
    plus = full.withColumn(WEIGHT, F.lit(1).cast(LongType()))
    minus = current.select(*[F.col(quoted(c)) for c in columns], F.lit(-1).cast(LongType()).alias(WEIGHT))
    return consolidate(plus.unionByName(minus)), current, None, None


def _same_columns(schema: StructType, table: StructType) -> bool:
    return [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in table.fields]


def _from_state(table, ctx: Context) -> DataFrame | None:
    """A rescan that builds the state, of a table whose rows are a stateful operator's full state
    (graph.from_full_state: its top aggregate's groups, or the integrated input of its top-k):
    the result read from that state, which the state write reads too (Context.full_state),
    rather than the SQL run again beside it. The values are those an incremental step writes for
    the rows it touches; None for any other plan (its SQL is run in full)."""
    plan = table.compiled.plan
    if not from_full_state(plan):
        return None
    return ctx.snapshot(plan, NEW).select(*_as_table_columns(plan.columns, table.schema))


@dataclass
class Diff:
    """A rescan's change (columns and WEIGHT) and the table's current rows, both as Arrow in the
    table's Spark types."""

    change: pa.Table
    current: pa.Table


def _diff_on_driver(env: Environment, table, full: DataFrame, version: int) -> Diff | None:
    """The rescan's diff on the driver: the full result collected (one job, the recompute itself)
    and the table's `version` read by delta-rs, consolidated with weights +1 and -1. Spark's
    diff shuffles both and its multiset MERGE counts copies in the table again, jobs whose fixed
    costs dwarf a result of a few rows. None (Spark diffs) when the result, the table or the change
    has more than `env.driver_rows` rows, or a type is Spark's to write or to group."""
    reads = env.reads
    limit = env.driver_rows
    if reads is None or limit <= 0 or not written_on_driver(table.schema):
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
