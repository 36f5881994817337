"""Integrate (DBSP's integral): keeps its input as a use-count table (count per distinct row), so
a reader that needs the input as of an epoch's start or end (top-k) reads the state instead of
recomputing the input. Its change batch is the input's.

Where the change is held exactly on the driver and the use counts are small enough for delta-rs
to read there whole, the counts advance in Arrow and the snapshots are local relations noted as
held exactly, so a top-k above sorts them on the driver (driver/topk.py) without a Spark job."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from ..arrow_rows import column_first_values, computed_rows, exact_rows, hold, keys_in, positions_of, spark_typed
from ..changes import NEW, OLD, consolidate, consolidate_rows, null_safe_on, quoted
from ..driver.topk import expanded, orderable
from ..graph import WEIGHT, Integrate
from ..keyed.state import DELETE_FLAG
from .base import Rule

COUNT = "__count"


def _expanded(state, columns):
    return state.select(
        *[F.col(quoted(c)) for c in columns], F.explode(F.sequence(F.lit(1), F.col(COUNT))).alias("__copy")
    ).drop("__copy")


class IntegrateRule(Rule):
    operator = Integrate
    rule = "d passes through; state += d"
    state = "use count per distinct input row"

    def stateful(self, node: Integrate) -> bool:
        return True

    def delta(self, node: Integrate, ctx):
        return ctx.delta(node.input)

    def _counts(self, node: Integrate, ctx):
        """Per changed row: its use count after the change (state merge queued once)."""
        def compute():
            on_driver = self._counts_on_driver(node, ctx)
            if on_driver is not None:
                return on_driver
            columns = list(node.columns)
            change = consolidate(ctx.delta(node.input))
            old = ctx.state.read(ctx.state_name(node), columns, restrict=change)
            old = old.select(*[F.col(quoted(c)).alias("o__" + c) for c in columns], F.col(COUNT).alias("o__count"))
            joined = change.join(old, null_safe_on(change, old, [(c, "o__" + c) for c in columns]), "left")
            counts = joined.select(
                *[F.col(quoted(c)) for c in columns],
                (F.coalesce(F.col("o__count"), F.lit(0).cast(LongType())) + F.col(WEIGHT)).alias(COUNT),
            )
            counts = ctx.materialize(counts)
            ctx.state.merge(
                ctx.state_name(node),
                counts.select(*[F.col(quoted(c)) for c in columns], F.col(COUNT), (F.col(COUNT) <= 0).alias(DELETE_FLAG)),
                tuple(columns),
                checks=[(f"a use count below zero in {ctx.state_name(node)}", f"`{COUNT}` < 0")],
            )
            return counts

        return ctx.memo(node, "counts", compute)

    def _schema(self, node: Integrate, ctx) -> StructType | None:
        change = ctx.delta(node.input) if ctx.changed(node) else None
        schema = change.schema if change is not None else ctx.snapshot(node.input, NEW).schema
        by_name = {f.name: f for f in schema.fields}
        fields = [by_name.get(c) for c in node.columns]
        return StructType(fields) if all(fields) and orderable(StructType(fields)) else None

    def _counts_on_driver(self, node: Integrate, ctx):
        """_counts in Arrow, where the change is held exactly on the driver and so are the use
        counts of its rows (read by delta-rs); None where they are Spark's."""
        if ctx.reads is None:
            return None
        change = ctx.delta(node.input)
        rows = exact_rows(change)
        schema = self._schema(node, ctx)
        if rows is None or schema is None:
            return None
        columns = list(node.columns)
        rows = spark_typed(rows.rename_columns(list(change.columns)), StructType(
            list(schema.fields) + [StructField(WEIGHT, LongType())]))
        rows = consolidate_rows(rows) if rows is not None else None
        if rows is None:
            return None
        old = ctx.state.latest_table_of_keys(ctx.state_name(node), columns,
                                             column_first_values(rows.column(columns[0])) if columns else None)
        if old is None:
            return None
        names = {c.lower(): c for c in old.column_names}
        index = positions_of(rows, columns, old, [names[c.lower()] for c in columns])
        before = pc.fill_null(old.column(names[COUNT.lower()]).cast(pa.int64()).take(index), 0)
        after = pc.add(before, rows.column(WEIGHT))
        counts = rows.drop_columns([WEIGHT]).append_column(COUNT, after)
        held = counts.append_column(DELETE_FLAG, pc.less_equal(after, 0)).append_column("__bad0", pc.less(after, 0))
        typed = StructType(list(schema.fields) + [StructField(COUNT, LongType())])
        ctx.state.merge(
            ctx.state_name(node),
            ctx.reads.local(ctx.spark, held.drop_columns(["__bad0"]),
                            StructType(typed.fields + [StructField(DELETE_FLAG, BooleanType())])),
            tuple(columns),
            checks=[(f"a use count below zero in {ctx.state_name(node)}", f"`{COUNT}` < 0")],
            held=held,
        )
        return hold(ctx.reads.local(ctx.spark, counts, typed), counts, exact=True)

    def _held_state(self, node: Integrate, ctx, side: str):
        """_state on the driver: the use counts read whole by delta-rs (and advanced by this
        epoch's counts for `side` NEW) as a local relation held exactly; None where Spark's."""
        if ctx.rescan or ctx.reads is None:
            return None
        schema = self._schema(node, ctx)
        if schema is None:
            return None
        fresh = None
        if side == NEW and ctx.changed(node):
            fresh = computed_rows(self._counts(node, ctx))
            if fresh is None:
                return None
        columns = list(node.columns)
        typed = StructType(list(schema.fields) + [StructField(COUNT, LongType())])
        state = ctx.state.latest_table_on_driver(ctx.state_name(node), columns)
        state = spark_typed(state, typed) if state is not None else None
        if state is None:
            return None
        if fresh is not None:
            state = state.filter(pa.array(~keys_in(state, columns, fresh, columns)))
            state = pa.concat_tables([state, fresh.filter(pc.greater(fresh.column(COUNT), 0)).cast(state.schema)])
        rows = expanded(state.combine_chunks(), COUNT)
        return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)

    def _state(self, node: Integrate, ctx, side: str):
        if ctx.rescan:
            return ctx.full_state(node, side, lambda: ctx.snapshot(node.input, side).groupBy(
                *[F.col(quoted(c)) for c in node.columns]).agg(F.count(F.lit(1)).alias(COUNT)))
        old = ctx.state.read(ctx.state_name(node), list(node.columns))
        if side == OLD or not ctx.changed(node):
            return old
        counts = self._counts(node, ctx)
        columns = list(node.columns)
        touched = counts.select(*[F.col(quoted(c)).alias("t__" + c) for c in columns])
        kept = old.join(touched, null_safe_on(old, touched, [(c, "t__" + c) for c in columns]), "left_anti")
        return kept.unionByName(counts.filter(F.col(COUNT) > 0))

    def snapshot(self, node: Integrate, ctx, side):
        if ctx.changed(node) and not ctx.rescan:
            self._counts(node, ctx)  # the state must advance even if only snapshots are read
        held = self._held_state(node, ctx, side)
        if held is not None:
            return held
        return _expanded(self._state(node, ctx, side), node.columns)

    def build_state(self, node: Integrate, ctx) -> None:
        ctx.state.overwrite(ctx.state_name(node), self._state(node, ctx, NEW), tuple(node.columns))
