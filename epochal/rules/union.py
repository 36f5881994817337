"""UNION ALL: the change batch is the concatenation of the inputs' (by position)."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import WEIGHT, UnionAll
from .base import Rule, union_all


class UnionAllRule(Rule):
    operator = UnionAll
    rule = "d(R ⊎ S) = dR ⊎ dS"

    def _renamed(self, node: UnionAll, part, frame, weighted: bool):
        columns = [F.col(quoted(c)).alias(n) for c, n in zip(part.columns, node.columns)]
        return frame.select(*columns, *([F.col(WEIGHT)] if weighted else []))

    def delta(self, node: UnionAll, ctx):
        return union_all([
            self._renamed(node, part, ctx.delta(part), True) for part in node.parts if ctx.delta(part) is not None
        ])

    def snapshot(self, node: UnionAll, ctx, side):
        return union_all([self._renamed(node, part, ctx.snapshot(part, side), False) for part in node.parts])
