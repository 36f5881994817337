"""Integrate (DBSP's integral): keeps its input as a use-count table (count per distinct row), so
a reader that needs the input as of an epoch's start or end (top-k) reads the state instead of
recomputing the input. Its change batch is the input's."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from ..changes import consolidate, null_safe_on, quoted
from ..context import NEW, OLD
from ..graph import WEIGHT, Integrate
from ..state import DELETE_FLAG
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
        """Per changed row: its use count before and after (state merge queued once)."""
        def compute():
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

    def _state(self, node: Integrate, ctx, side: str):
        if ctx.rescan:
            return ctx.snapshot(node.input, side).groupBy(*[F.col(quoted(c)) for c in node.columns]).agg(
                F.count(F.lit(1)).alias(COUNT))
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
        return _expanded(self._state(node, ctx, side), node.columns)

    def build_state(self, node: Integrate, ctx) -> None:
        ctx.state.overwrite(ctx.state_name(node), self._state(node, ctx, NEW), tuple(node.columns))
