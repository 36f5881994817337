"""Projection with deterministic expressions: applied to each change row, weights pass through.
Rows that become equal are not merged here; the next consolidation sums their weights."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..graph import WEIGHT, Project
from .base import Rule, expr, held_through


class ProjectRule(Rule):
    operator = Project
    rule = "d(π R) = π dR"

    def _columns(self, node: Project):
        return [expr(e).alias(name) for name, e in zip(node.columns, node.exprs)]

    def delta(self, node: Project, ctx):
        below = ctx.delta(node.input)
        return held_through(ctx, lambda frame: frame.select(*self._columns(node), F.col(WEIGHT)), below, node,
                            weighted=True)

    def snapshot(self, node: Project, ctx, side):
        below = ctx.snapshot(node.input, side)
        return held_through(ctx, lambda frame: frame.select(*self._columns(node)), below, node)
