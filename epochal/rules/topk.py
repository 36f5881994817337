"""ORDER BY ... LIMIT k (top-k). The input is maintained incrementally (an aggregate's state, or
an Integrate node's use counts), and the first k rows are re-derived from it as of the epoch's
start and end: d = topk(new) - topk(old). Ties are broken by every column ascending, so the result
is deterministic (the recompute appends the same tie-breakers to the ORDER BY)."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ..arrow_rows import exact_rows, held_exactly, hold, spark_typed
from ..changes import NEW, OLD, consolidate, quoted
from ..driver.topk import orderable, top_rows, weighted_difference
from ..graph import WEIGHT, TopK
from .base import Rule
from .keyed import weighted


def ordering(node: TopK) -> list:
    keys = []
    for column, descending, nulls_first in node.order:
        c = F.col(quoted(column))
        if descending:
            keys.append(c.desc_nulls_first() if nulls_first else c.desc_nulls_last())
        else:
            keys.append(c.asc_nulls_first() if nulls_first else c.asc_nulls_last())
    return keys + [F.col(quoted(c)).asc_nulls_first() for c in node.columns]


class TopKRule(Rule):
    operator = TopK
    materialize_delta = True
    rule = "topk(new input) - topk(old input), both read from the maintained input"
    state = "none beyond the input's"

    def _top(self, node: TopK, frame):
        return frame.orderBy(*ordering(node)).limit(node.limit)

    def delta(self, node: TopK, ctx):
        new_input, old_input = ctx.snapshot(node.input, NEW), ctx.snapshot(node.input, OLD)
        on_driver = self._delta_on_driver(node, ctx, new_input, old_input)
        if on_driver is not None:
            return on_driver
        new, old = self._top(node, new_input), self._top(node, old_input)
        return consolidate(weighted(new, 1).unionByName(weighted(old, -1)))

    def _delta_on_driver(self, node: TopK, ctx, new_input, old_input):
        """The delta sorted in Arrow where both sides of the input are held exactly on the
        driver and Arrow orders every column as Spark does; None where it is Spark's."""
        if ctx.reads is None or not orderable(new_input.schema) or \
                not (held_exactly(new_input) and held_exactly(old_input)):
            return None
        new_rows, old_rows = exact_rows(new_input), exact_rows(old_input)
        columns = list(node.columns)
        new_rows = spark_typed(new_rows.rename_columns(new_input.columns), new_input.schema)
        old_rows = spark_typed(old_rows.rename_columns(old_input.columns), new_input.schema)
        if new_rows is None or old_rows is None:
            return None
        change = weighted_difference(top_rows(new_rows.select(columns), list(node.order), node.limit),
                                     top_rows(old_rows.select(columns), list(node.order), node.limit))
        schema = StructType([new_input.schema[c] for c in columns] + [StructField(WEIGHT, LongType())])
        return hold(ctx.reads.local(ctx.spark, change, schema), change, exact=True)

    def snapshot(self, node: TopK, ctx, side):
        return self._top(node, ctx.snapshot(node.input, side))
