"""LEFT, RIGHT and FULL OUTER JOIN (Triceps 12.8): a key's null-padded row appears and disappears
as its match count crosses zero. Maintained by affected-key recompute on the join's equality keys:
for every key whose rows changed on either side, the join of that key's rows before and after.
Where those rows are held on the driver (keyed.keyed_on_driver), Arrow joins them
(driver.joins.outer_join_rows); Spark otherwise."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType
from sqlglot import exp

from ..changes import quoted
from ..driver.joins import outer_join_rows
from ..graph import OuterJoin, col, conjoin
from .base import Rule, expr
from .keyed import keyed_on_driver, keyed_recompute


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
        on_driver = keyed_on_driver(ctx, sides, lambda frames: self._rows(node, frames))
        if on_driver is not None:
            return on_driver
        return keyed_recompute(ctx, sides, self._evaluate(node))

    def _rows(self, node: OuterJoin, frames):
        """The operator over Arrow rows (driver.joins.outer_join_rows), as (rows, schema): the
        columns _evaluate selects, those of a NULL-padded side nullable."""
        (left, left_schema), (right, right_schema) = frames
        rows = outer_join_rows(left, right, left_schema, right_schema, node.pairs, node.residual, node.side)
        if rows is None:
            return None
        padded = ((left_schema.names if node.side != "left" else [])
                  + (right_schema.names if node.side != "right" else []))
        fields = {f.name: f for f in left_schema.fields + right_schema.fields}
        schema = StructType([StructField(c, fields[c].dataType, fields[c].nullable or c in padded)
                             for c in node.columns])
        return rows.select(list(node.columns)), schema

    def snapshot(self, node: OuterJoin, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.left, side), ctx.snapshot(node.right, side)], side)
