"""Semi- and anti-joins: [NOT] EXISTS and [NOT] IN, decorrelated. A left row's presence flips
when its key's match count crosses zero; maintained by affected-key recompute on the correlation
keys. NOT IN follows SQL's three-valued logic: when the subquery holds a NULL no row passes, and
when it is empty every row passes (NULL included); a change to either property recomputes the
operator in full, since it affects every row."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..arrow_rows import exact_rows, held_exactly, hold, spark_typed
from ..changes import NEW, OLD, quoted
from ..driver.joins import semi_join_rows
from ..graph import SemiJoin
from ..narrowing import comparable, matching_keys, restricted_snapshot
from .base import Rule, expr
from .keyed import full_recompute, keyed_on_driver, keyed_recompute
from .outer_join import condition


class SemiJoinRule(Rule):
    operator = SemiJoin
    materialize_delta = True
    rule = "affected-key recompute on the correlation keys: L[k] ⋉ R[k] (new) - (old)"
    state = "none (both sides read by Delta time travel, restricted to the affected keys)"

    def explain(self, node: SemiJoin):
        if node.null_aware:
            return (self.rule + "; NOT IN: full recompute when the subquery's emptiness or NULL-holding changes",
                    self.state)
        return self.rule, self.state

    def _flags(self, node: SemiJoin, ctx, side: str) -> tuple[bool, bool]:
        """(subquery is empty, subquery holds a NULL) for NOT IN, as of `side`."""
        def compute():
            (_, value) = node.pairs[0]
            row = ctx.snapshot(node.right, side).agg(
                F.count(F.lit(1)).alias("rows"), F.count(F.when(F.col(quoted(value)).isNull(), 1)).alias("nulls")
            ).first()
            return row["rows"] == 0, row["nulls"] > 0

        return ctx.memo(node, f"flags:{side if ctx.changed(node.right) else NEW}", compute)

    def _evaluate(self, node: SemiJoin, ctx):
        on = expr(condition(node))

        def evaluate(frames, side):
            left, right = frames
            if node.null_aware:
                empty, has_null = self._flags(node, ctx, side)
                if empty:
                    return left
                if has_null:
                    return left.limit(0)
                left = left.filter(F.col(quoted(node.pairs[0][0])).isNotNull())
            joined = left.join(right, on=on, how="left_anti" if node.anti else "left_semi")
            return joined.select(*[F.col(quoted(c)) for c in node.columns])

        return evaluate

    def delta(self, node: SemiJoin, ctx):
        evaluate = self._evaluate(node, ctx)
        if node.null_aware and ctx.changed(node.right) and self._flags(node, ctx, OLD) != self._flags(node, ctx, NEW):
            return full_recompute(ctx, [node.left, node.right], evaluate)
        sides = [(node.left, [a for a, _ in node.pairs]), (node.right, [b for _, b in node.pairs])]
        if not node.null_aware and node.pairs:
            on_driver = keyed_on_driver(ctx, sides, lambda frames: self.rows(node, frames))
            if on_driver is not None:
                return on_driver
        return keyed_recompute(ctx, sides, evaluate)

    def rows(self, node: SemiJoin, frames):
        """The operator over Arrow rows (driver.joins.semi_join_rows), as (rows, schema)."""
        (left, left_schema), (right, right_schema) = frames
        rows = semi_join_rows(left, right, left_schema, right_schema, node.pairs, node.residual, node.anti)
        if rows is None:
            return None
        return rows.select(list(node.columns)), StructType([left_schema[c] for c in node.columns])

    def snapshot(self, node: SemiJoin, ctx, side):
        return self._evaluate(node, ctx)([ctx.snapshot(node.left, side), ctx.snapshot(node.right, side)], side)

    def held_snapshot(self, node: SemiJoin, ctx, side: str, column: str, keys):
        """The rows whose `column` (of the left input) is one of the keys (narrowing.restricted_snapshot):
        the left input read for them, the subquery for the left rows' correlation values (and its
        NULLs, which a NULL-safe correlation matches); None where the left input cannot be."""
        left = restricted_snapshot(ctx, node.left, side, column, keys)
        if left is None:
            return None
        right = None
        if node.pairs:
            a, b = node.pairs[0]
            right = restricted_snapshot(ctx, node.right, side, b, lambda: matching_keys(ctx, left, a, True))
            if right is not None and not comparable(left.schema[a].dataType, right.schema[b].dataType):
                right = None
        if right is None:
            right = ctx.snapshot(node.right, side)
        if not node.null_aware and node.pairs and held_exactly(left) and held_exactly(right):
            typed = [(spark_typed(exact_rows(frame), frame.schema), frame.schema) for frame in (left, right)]
            found = self.rows(node, typed) if all(rows is not None for rows, _ in typed) else None
            if found is not None:  # both sides held exactly: joined in Arrow
                rows, schema = found
                return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)
        return self._evaluate(node, ctx)([left, right], side)
