"""Filter (WHERE, HAVING): the change batch is the input's, filtered; weights pass through."""

from __future__ import annotations

from ..graph import Filter
from .base import Rule, expr


class FilterRule(Rule):
    operator = Filter
    rule = "d(σ R) = σ dR"

    def delta(self, node: Filter, ctx):
        return ctx.delta(node.input).filter(expr(node.predicate))

    def snapshot(self, node: Filter, ctx, side):
        return ctx.snapshot(node.input, side).filter(expr(node.predicate))
