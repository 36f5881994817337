"""INTERSECT and EXCEPT (DISTINCT or ALL): a row's output multiplicity depends only on its
multiplicities on both sides, so the operator is recomputed for the rows that changed."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import SetOperation
from .base import Rule
from .keyed import keyed_recompute


class SetOperationRule(Rule):
    operator = SetOperation
    materialize_delta = True
    rule = "affected-row recompute: op(new_L[r], new_R[r]) - op(old_L[r], old_R[r]) for changed rows r"
    state = "none"

    def _evaluate(self, node: SetOperation):
        def evaluate(frames, side):
            left, right = frames
            right = right.select(*[F.col(quoted(r)).alias(l) for r, l in zip(node.right.columns, node.left.columns)])
            if node.operation == "intersect":
                return left.intersectAll(right) if node.all else left.intersect(right)
            return left.exceptAll(right) if node.all else left.subtract(right)

        return evaluate

    def delta(self, node: SetOperation, ctx):
        sides = [(node.left, list(node.left.columns)), (node.right, list(node.right.columns))]
        return keyed_recompute(ctx, sides, self._evaluate(node))

    def snapshot(self, node: SetOperation, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.left, side), ctx.snapshot(node.right, side)], side)
