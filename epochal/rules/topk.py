"""ORDER BY ... LIMIT k (top-k). The input is maintained incrementally (an aggregate's state, or
an Integrate node's use counts), and the first k rows are re-derived from it as of the epoch's
start and end: d = topk(new) - topk(old). Ties are broken by every column ascending, so the result
is deterministic (the recompute appends the same tie-breakers to the ORDER BY)."""

from __future__ import annotations

from pyspark.sql import functions as F

from ..changes import quoted
from ..context import NEW, OLD
from ..graph import TopK
from .base import Rule
from .keyed import weighted
from ..changes import consolidate


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
        new = self._top(node, ctx.snapshot(node.input, NEW))
        old = self._top(node, ctx.snapshot(node.input, OLD))
        return consolidate(weighted(new, 1).unionByName(weighted(old, -1)))

    def snapshot(self, node: TopK, ctx, side):
        return self._top(node, ctx.snapshot(node.input, side))
