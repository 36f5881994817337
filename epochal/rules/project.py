"""Projection with deterministic expressions: applied to each change row, weights pass through.
Rows that become equal are not merged here; the next consolidation sums their weights, except
above a join whose scalar side changed (`drops_changed_scalar`), where they are merged at once."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from sqlglot import exp

from ..arrow_rows import computed_rows, hold
from ..changes import consolidate, consolidate_rows, rows_up_to
from ..graph import WEIGHT, Filter, Join, Project, columns_in, single_row
from ..narrowing import expected_rows, mark_dropped_scalars, restricted_snapshot
from .base import Rule, expr, held_through


def drops_changed_scalar(node: Project, ctx) -> bool:
    """Whether `node` projects away the value of a changed scalar subquery joined below it.

    A join with a single-row input (a scalar subquery's value, compared with a column) changes,
    when that value changes, by every partner row twice: once with the old value (weight -1) and
    once with the new (+1). Once the value is projected away the two copies are equal rows and
    cancel but for the rows whose comparison flipped (TPC-H Q22: 21,562 customers either side of
    the average balance -> the few between the old average and the new)."""
    below = node.input
    while isinstance(below, Filter):
        below = below.input
    if not isinstance(below, Join):
        return False
    kept = set().union(*(columns_in(e) for e in node.exprs))
    return any(single_row(part) and ctx.changed(part) and not kept & set(part.columns) for part in below.parts)


def consolidated(ctx, change: DataFrame) -> DataFrame:
    """`change` consolidated now: on the driver where it is held there, else by Spark and, when
    it is small, collected as a local relation, so the operators above may compute on the driver."""
    rows = computed_rows(change)
    if rows is not None:
        merged = consolidate_rows(rows)
        if merged is not None:
            return hold(ctx.reads.local(ctx.spark, merged, change.schema), merged, exact=True)
    merged = consolidate(change)
    limit = ctx.reads.driver_rows if ctx.reads is not None else 0
    if limit > 0:
        collected = rows_up_to(merged, limit)
        if collected is not None:
            return hold(ctx.reads.local(ctx.spark, collected, merged.schema), collected, exact=True)
    return ctx.materialize(merged)


class ProjectRule(Rule):
    operator = Project
    rule = "d(π R) = π dR"

    def output_columns(self, node: Project):
        return [expr(e).alias(name) for name, e in zip(node.columns, node.exprs)]

    def delta(self, node: Project, ctx):
        dropping = drops_changed_scalar(node, ctx)
        if dropping:
            mark_dropped_scalars(ctx, node, set().union(*(columns_in(e) for e in node.exprs)))
        below = ctx.delta(node.input)
        change = held_through(ctx, lambda frame: frame.select(*self.output_columns(node), F.col(WEIGHT)), below, node,
                              weighted=True)
        if change is not None and dropping:
            return consolidated(ctx, change)
        return change

    def snapshot(self, node: Project, ctx, side):
        below = ctx.snapshot(node.input, side)
        return held_through(ctx, lambda frame: frame.select(*self.output_columns(node)), below, node)

    def expected_rows(self, node: Project, ctx, side, column, keys):
        expression = dict(zip(node.columns, node.exprs)).get(column)
        return expected_rows(ctx, node.input, side, expression.name, keys) if isinstance(expression, exp.Column) else None

    def held_snapshot(self, node: Project, ctx, side, column, keys):
        """The input's rows for the keys, where `column` is an input column passed through."""
        expression = dict(zip(node.columns, node.exprs)).get(column)
        if not isinstance(expression, exp.Column):
            return None
        below = restricted_snapshot(ctx, node.input, side, expression.name, keys)
        return None if below is None else held_through(
            ctx, lambda frame: frame.select(*self.output_columns(node)), below, node)
