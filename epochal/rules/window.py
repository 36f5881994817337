"""Window functions with PARTITION BY: a partition's results depend only on its rows, so the
partitions a change touches are recomputed from `new` (and their old results retracted). Where
the touched partitions' rows are held on the driver, Spark evaluates the functions over them as a
local relation instead of over the inputs' plans."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import Window, sql
from .base import Rule
from .keyed import keyed_on_driver, keyed_recompute


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
        sides = [(node.input, list(node.partition))]
        if node.partition:
            on_driver = keyed_on_driver(ctx, sides, lambda frames: self._rows(node, ctx, frames))
            if on_driver is not None:
                return on_driver
        return keyed_recompute(ctx, sides, self._evaluate(node))

    def _rows(self, node: Window, ctx, frames):
        """The window functions over the touched partitions' rows held on the driver, evaluated
        by Spark over them as a local relation (one job a side, where the plan over the inputs
        took a dozen), collected as (rows, schema)."""
        ((rows, schema),) = frames
        result = self._evaluate(node)([ctx.reads.local(ctx.spark, rows, schema)], None)
        return result.toArrow(), result.schema

    def snapshot(self, node: Window, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.input, side)], side)
