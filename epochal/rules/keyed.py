"""Affected-key recompute, shared by the operators whose output for a key depends only on their
inputs' rows with that key (outer joins and semi-joins by their equality keys, window functions by
their partition, INTERSECT and EXCEPT by the whole row).

    d(op) = op(new restricted to K) - op(old restricted to K),  K = keys present in any input's d

Restriction is a null-safe semi-join, so NULL keys (which never match in a join) are recomputed
like any other key: the null-padded rows of an outer join appear and disappear correctly.
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from ..changes import consolidate, null_safe_on, quoted
from ..context import NEW, OLD
from ..graph import WEIGHT, Node
from .base import union_all

Sides = list[tuple[Node, list[str]]]


def affected_keys(ctx, sides: Sides) -> DataFrame | None:
    frames = [
        ctx.delta(node).select(*[F.col(quoted(k)).alias(f"__k{i}") for i, k in enumerate(keys)])
        for node, keys in sides
        if ctx.delta(node) is not None
    ]
    if not frames:
        return None
    return ctx.materialize(union_all(frames).distinct())


def restrict_to(frame: DataFrame, keys: DataFrame, columns: list[str]) -> DataFrame:
    if not columns:
        return frame
    return frame.join(keys, null_safe_on(frame, keys, [(c, f"__k{i}") for i, c in enumerate(columns)]), "left_semi")


def weighted(frame: DataFrame, weight: int) -> DataFrame:
    return frame.select(*[F.col(quoted(c)) for c in frame.columns], F.lit(weight).cast(LongType()).alias(WEIGHT))


def _first_keys(ctx, keys: DataFrame) -> tuple[tuple, bool] | None:
    """The affected keys' values of their first column (restrict.distinct_values), once per step."""
    from .restrict import distinct_values

    return ctx.memo(ctx.plan, ("affected_keys", id(keys)), lambda: distinct_values(keys, "__k0"))


def restricted_side(ctx, node: Node, side: str, keys: DataFrame, columns: list[str]) -> DataFrame:
    """`node` as of `side` restricted to the affected keys: where restrict.restricted_snapshot can,
    only the rows of the first key column's values are read (on the driver, shared), instead of a
    full scan per side and version."""
    from .restrict import restricted_snapshot

    frame = restricted_snapshot(ctx, node, side, columns[0], lambda: _first_keys(ctx, keys)) if columns else None
    return restrict_to(frame if frame is not None else ctx.snapshot(node, side), keys, columns)


def keyed_recompute(ctx, sides: Sides, evaluate: Callable[[list[DataFrame], str], DataFrame]) -> DataFrame | None:
    """`evaluate(frames, side)` computes the operator over its inputs' frames (old or new)."""
    keys = affected_keys(ctx, sides)
    if keys is None:
        return None
    old = evaluate([restricted_side(ctx, node, OLD, keys, cols) for node, cols in sides], OLD)
    new = evaluate([restricted_side(ctx, node, NEW, keys, cols) for node, cols in sides], NEW)
    return consolidate(weighted(new, 1).unionByName(weighted(old, -1)))


def full_recompute(ctx, inputs: list[Node], evaluate) -> DataFrame:
    old = evaluate([ctx.snapshot(node, OLD) for node in inputs], OLD)
    new = evaluate([ctx.snapshot(node, NEW) for node in inputs], NEW)
    return consolidate(weighted(new, 1).unionByName(weighted(old, -1)))
