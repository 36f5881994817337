"""UNION ALL: the change batch is the concatenation of the inputs' (by position)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F

from ..arrow_rows import computed_rows, hold
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
        changed = [part for part in node.parts if ctx.delta(part) is not None]
        change = union_all([self._renamed(node, part, ctx.delta(part), True) for part in changed])
        if change is None:
            return None
        return self._held(node, ctx, changed, change)

    def _held(self, node: UnionAll, ctx, changed: list, change):
        """Note the concatenation as held exactly on the driver where every part's change is and
        all parts have the same types (Spark would widen unlike ones); else Spark's."""
        rows, schemas = [], set()
        for part in changed:
            held = computed_rows(ctx.delta(part))
            frame = ctx.delta(part)
            if held is None or held.column_names != [*part.columns, WEIGHT] or frame.columns != held.column_names:
                return change
            schemas.add(tuple(f.dataType for f in frame.schema.fields))
            rows.append(held.rename_columns([*node.columns, WEIGHT]))
        if len(schemas) != 1:
            return change
        try:
            joined = pa.concat_tables([rows[0], *[r.cast(rows[0].schema) for r in rows[1:]]]).combine_chunks()
        except (pa.ArrowException, TypeError, ValueError):
            return change
        return hold(change, joined, exact=True)

    def snapshot(self, node: UnionAll, ctx, side):
        return union_all([self._renamed(node, part, ctx.snapshot(part, side), False) for part in node.parts])
