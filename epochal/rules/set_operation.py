"""INTERSECT and EXCEPT (DISTINCT or ALL): a row's output multiplicity depends only on its
multiplicities on both sides, so the operator is recomputed for the rows that changed."""

from __future__ import annotations

import collections

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from ..arrow_rows import key_tuples
from ..changes import quoted
from ..graph import SetOperation
from .base import Rule
from .keyed import keyed_on_driver, keyed_recompute


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
        on_driver = keyed_on_driver(ctx, sides, lambda frames: self._rows(node, frames))
        if on_driver is not None:
            return on_driver
        return keyed_recompute(ctx, sides, self._evaluate(node))

    def _rows(self, node: SetOperation, frames):
        """The operator over Arrow rows, from each distinct row's multiplicity on both sides
        (rows equal NULL-safely, as Spark's set operations compare them), as (rows, schema);
        None where the sides' types differ (Spark widens them)."""
        (left, left_schema), (right, right_schema) = frames
        if [f.dataType for f in left_schema.fields] != [f.dataType for f in right_schema.fields]:
            return None
        on_left = collections.Counter(key_tuples(left, list(node.left.columns)))
        on_right = collections.Counter(key_tuples(right, list(node.right.columns)))
        out = []
        for row, times in on_left.items():
            other = on_right.get(row, 0)
            if node.operation == "intersect":
                kept = min(times, other) if node.all else int(other > 0)
            else:
                kept = max(times - other, 0) if node.all else int(other == 0)
            out.extend([row] * kept)
        schema = StructType([StructField(name, field.dataType) for name, field in zip(node.columns, left_schema.fields)])
        columns = list(zip(*out)) if out else [[] for _ in node.columns]
        arrow = left.select(list(node.left.columns)).schema
        rows = pa.table([pa.array(list(values), type=field.type) for values, field in zip(columns, arrow)],
                        names=list(node.columns))
        return rows, schema

    def snapshot(self, node: SetOperation, ctx, side):
        return self._evaluate(node)([ctx.snapshot(node.left, side), ctx.snapshot(node.right, side)], side)
