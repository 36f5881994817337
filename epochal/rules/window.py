"""Window functions with PARTITION BY: a partition's results depend only on its rows, so the
partitions a change touches are recomputed from `new` (and their old results retracted)."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import Window, sql
from .base import Rule
from .keyed import keyed_recompute


class WindowRule(Rule):
    operator = Window
    materialize_delta = True
    rule = "affected-partition recompute: window(new[p]) - window(old[p]) for touched partitions p"
    state = "none"

    def _evaluate(self, node: Window):
        names = node.columns[len(node.input.columns):]

        def evaluate(frames, side):
            (frame,) = frames
            return frame.select(
                *[F.col(quoted(c)) for c in node.input.columns],
                *[F.expr(sql(function)).alias(name) for function, name in zip(node.functions, names)],
            )

        return evaluate

    def delta(self, node: Window, ctx):
        return keyed_recompute(ctx, [(node.input, list(node.partition))], self._evaluate(node))

    def snapshot(self, node: Window, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.input, side)], side)
