"""Semi- and anti-joins: [NOT] EXISTS and [NOT] IN, decorrelated. A left row's presence flips
when its key's match count crosses zero; maintained by affected-key recompute on the correlation
keys. NOT IN follows SQL's three-valued logic: when the subquery holds a NULL no row passes, and
when it is empty every row passes (NULL included); a change to either property recomputes the
operator in full, since it affects every row.

A semi-join on no keys whose right input always has exactly one row is the filter of a scalar
subquery (planning/optimize/filter_by_scalar.py), L ⋉_p s: d = dL ⋉_p s_new, plus, when the
scalar changed, the old left rows whose predicate flips between s_old and s_new (+1 where it now
holds, -1 where it held). Rows whose predicate holds under both values are never read past the
filter."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType
from sqlglot import exp

from ..arrow_rows import exact_rows, held_exactly, hold, spark_typed
from ..changes import NEW, OLD, empty_changes, quoted
from ..driver.joins import semi_join_rows
from ..graph import WEIGHT, SemiJoin, col, one_row
from ..narrowing import comparable, matching_keys, restricted_snapshot
from .base import Rule, expr, union_all, with_weight
from .keyed import full_recompute, keyed_on_driver, keyed_recompute
from .outer_join import condition


class SemiJoinRule(Rule):
    operator = SemiJoin
    materialize_delta = True
    rule = "affected-key recompute on the correlation keys: L[k] ⋉ R[k] (new) - (old)"
    state = "none (both sides read by Delta time travel, restricted to the affected keys)"

    def explain(self, node: SemiJoin):
        if by_scalar(node):
            return ("filter by a one-row input (a scalar subquery): dL ⋉ s_new, plus the old left rows whose "
                    "predicate flips between s_old and s_new", self.state)
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
        if by_scalar(node):
            return self._scalar_delta(node, ctx)
        evaluate = self._evaluate(node, ctx)
        if node.null_aware and ctx.changed(node.right) and self._flags(node, ctx, OLD) != self._flags(node, ctx, NEW):
            return full_recompute(ctx, [node.left, node.right], evaluate)
        sides = [(node.left, [a for a, _ in node.pairs]), (node.right, [b for _, b in node.pairs])]
        if not node.null_aware and node.pairs:
            on_driver = keyed_on_driver(ctx, sides, lambda frames: self.rows(node, frames))
            if on_driver is not None:
                return on_driver
        return keyed_recompute(ctx, sides, evaluate)

    def _scalar_delta(self, node: SemiJoin, ctx):
        terms = []
        change = ctx.delta(node.left)
        if change is not None:
            terms.append(self._filtered(node, ctx, change))
        if ctx.delta(node.right) is not None:
            terms.append(self._flips(node, ctx))
        terms = [term for term in terms if term is not None]
        if not terms:  # the filtered input did not change, nor did the scalar's value
            schema = StructType([ctx.snapshot(node.left, NEW).schema[c] for c in node.columns])
            empty = empty_changes(ctx.spark, schema)
            return hold(empty, to_arrow_schema(empty.schema).empty_table(), exact=True)
        union = union_all(terms)
        if union is not None and all(held_exactly(term) for term in terms):
            def rows():
                held = [exact_rows(term) for term in terms]
                return pa.concat_tables([part.cast(held[0].schema) for part in held])
            return hold(union, rows, exact=True)
        return union

    def _filtered(self, node: SemiJoin, ctx, change):
        """dL ⋉_p s_new: in Arrow where both are held exactly on the driver."""
        scalar = ctx.snapshot(node.right, NEW)
        if held_exactly(change) and held_exactly(scalar):
            left, right = spark_typed(exact_rows(change), change.schema), spark_typed(exact_rows(scalar), scalar.schema)
            if left is not None and right is not None:
                rows = semi_join_rows(left, right, change.schema, scalar.schema, (), node.residual, False)
                if rows is not None:
                    rows = rows.select([*node.columns, WEIGHT])
                    schema = StructType([change.schema[c] for c in (*node.columns, WEIGHT)])
                    return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)
        return (change.join(scalar, on=expr(node.residual), how="left_semi")
                .select(*with_weight(node.columns, change)))

    def _flips(self, node: SemiJoin, ctx):
        """The old left rows whose predicate differs between the old and the new scalar, weighted
        +1 where it holds now and -1 where it held (NULL counts as not holding); None when the
        scalar's row did not change."""
        old, new = ctx.snapshot(node.right, OLD), ctx.snapshot(node.right, NEW)
        if _rows(old) == _rows(new):
            return None
        names = {side: {c: f"__{side}_{c}" for c in node.right.columns} for side in (OLD, NEW)}
        both = old.select(*[F.col(quoted(c)).alias(n) for c, n in names[OLD].items()]).crossJoin(
            new.select(*[F.col(quoted(c)).alias(n) for c, n in names[NEW].items()]))

        def holds(side: str):
            renamed = node.residual.transform(
                lambda e: col(names[side][e.name]) if isinstance(e, exp.Column) and e.name in names[side] else e)
            return F.coalesce(expr(renamed), F.lit(False))

        was, now = holds(OLD), holds(NEW)
        flipped = (ctx.snapshot(node.left, OLD).crossJoin(F.broadcast(both)).filter(was != now)
                   .select(*[F.col(quoted(c)) for c in node.columns],
                           F.when(now, F.lit(1)).otherwise(F.lit(-1)).cast("long").alias(WEIGHT)))
        return hold(flipped, flipped.toArrow, exact=True)

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
        if not node.null_aware and (node.pairs or by_scalar(node)) and held_exactly(left) and held_exactly(right):
            typed = [(spark_typed(exact_rows(frame), frame.schema), frame.schema) for frame in (left, right)]
            found = self.rows(node, typed) if all(rows is not None for rows, _ in typed) else None
            if found is not None:  # both sides held exactly: joined in Arrow
                rows, schema = found
                return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)
        return self._evaluate(node, ctx)([left, right], side)


def _rows(frame) -> list:
    rows = exact_rows(frame)
    return rows.to_pylist() if rows is not None else [row.asDict() for row in frame.collect()]


def by_scalar(node: SemiJoin) -> bool:
    """The filter of a scalar subquery: a semi-join on no keys with a right input of exactly one row."""
    return not node.pairs and not node.anti and not node.null_aware and one_row(node.right)
