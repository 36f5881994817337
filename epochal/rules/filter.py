"""Filter (WHERE, HAVING): the change batch is the input's, filtered; weights pass through."""

from __future__ import annotations

from ..graph import Filter
from ..narrowing import expected_rows, restricted_snapshot
from .base import Rule, expr, held_through


class FilterRule(Rule):
    operator = Filter
    rule = "d(σ R) = σ dR"

    def delta(self, node: Filter, ctx):
        below = ctx.delta(node.input)
        return held_through(ctx, lambda frame: frame.filter(expr(node.predicate)), below, node)

    def snapshot(self, node: Filter, ctx, side):
        below = ctx.snapshot(node.input, side)
        return held_through(ctx, lambda frame: frame.filter(expr(node.predicate)), below, node)

    def held_snapshot(self, node: Filter, ctx, side, column, keys):
        below = restricted_snapshot(ctx, node.input, side, column, keys)
        return None if below is None else held_through(ctx, lambda frame: frame.filter(expr(node.predicate)), below, node)

    def expected_rows(self, node: Filter, ctx, side, column, keys):
        return expected_rows(ctx, node.input, side, column, keys)
