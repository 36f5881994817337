"""LEFT, RIGHT and FULL OUTER JOIN (Triceps 12.8): a key's null-padded row appears and disappears
as its match count crosses zero. Maintained by affected-key recompute on the join's equality keys:
for every key whose rows changed on either side, the join of that key's rows before and after."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import OuterJoin, col, conjoin
from .base import Rule, expr
from .keyed import keyed_recompute
from sqlglot import exp


def condition(node) -> exp.Expression:
    equalities = [exp.EQ(this=col(a), expression=col(b)) for a, b in node.pairs]
    return conjoin(equalities + ([node.residual] if node.residual is not None else []))


class OuterJoinRule(Rule):
    operator = OuterJoin
    materialize_delta = True
    rule = "affected-key recompute: for keys in dL or dR, join(new_L[k], new_R[k]) - join(old_L[k], old_R[k])"
    state = "none (both sides read by Delta time travel, restricted to the affected keys)"

    def _evaluate(self, node: OuterJoin):
        on = expr(condition(node))

        def evaluate(frames, side):
            left, right = frames
            joined = left.join(right, on=on, how=node.side + "_outer" if node.side == "full" else node.side)
            return joined.select(*[F.col(quoted(c)) for c in node.columns])

        return evaluate

    def delta(self, node: OuterJoin, ctx):
        sides = [(node.left, [a for a, _ in node.pairs]), (node.right, [b for _, b in node.pairs])]
        return keyed_recompute(ctx, sides, self._evaluate(node))

    def snapshot(self, node: OuterJoin, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.left, side), ctx.snapshot(node.right, side)], side)
