"""Affected-key recompute, shared by the operators whose output for a key depends only on their
inputs' rows with that key (outer joins and semi-joins by their equality keys, window functions by
their partition, INTERSECT and EXCEPT by the whole row).

    d(op) = op(new restricted to K) - op(old restricted to K),  K = keys present in any input's d

Restriction is a null-safe semi-join, so NULL keys (which never match in a join) are recomputed
like any other key: the null-padded rows of an outer join appear and disappear correctly.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ..arrow_rows import column_first_values, exact_rows, first_of_each_key, held_exactly, hold, key_codes, key_type, spark_typed
from ..changes import NEW, OLD, consolidate, null_safe_on, quoted
from ..graph import WEIGHT, Node
from ..narrowing import distinct_values, restricted_snapshot
from .base import union_all

Sides = list[tuple[Node, list[str]]]
log = logging.getLogger("epochal")


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
    """The affected keys' values of their first column (narrowing.distinct_values), once per step."""
    return ctx.memo(ctx.plan, ("affected_keys", id(keys)), lambda: distinct_values(keys, "__k0"))


def restricted_side(ctx, node: Node, side: str, keys: DataFrame, columns: list[str]) -> DataFrame:
    """`node` as of `side` restricted to the affected keys: where narrowing.restricted_snapshot can,
    only the rows of the first key column's values are read (on the driver, shared), instead of a
    full scan per side and version."""
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


def keyed_on_driver(ctx, sides: Sides, evaluate_rows) -> DataFrame | None:
    """keyed_recompute on the driver, where every input's change is held there exactly and so are
    its rows of the affected keys (narrowing.restricted_snapshot, or a small input whole):
    `evaluate_rows([(rows, schema), ...])` computes the operator over Spark-typed Arrow rows as
    (rows, schema), or None. Keys match NULL-safely, as restrict_to's do. None where any part is
    Spark's (logged at debug, with what was not held)."""
    def refused(why: str) -> None:
        log.debug("affected-key recompute over %s by Spark: %s",
                  ", ".join(node.describe() for node, _ in sides), why)

    if ctx.reads is None:
        return None
    changes: list[tuple[pa.Table, list[str]]] = []  # per changed input, its distinct affected keys
    for node, columns in sides:
        change = ctx.delta(node)
        if change is None:
            continue
        types = {f.name: f.dataType for f in change.schema.fields}
        if not columns or not all(key_type(types[c]) for c in columns):
            return refused(f"keys {columns} of a type Arrow does not match as Spark does")
        if not held_exactly(change):
            return refused(f"the change of {node.describe()} is not held exactly on the driver")
        rows = exact_rows(change).select(columns)
        changes.append((rows.take(pa.array(first_of_each_key(rows, columns), pa.int64())), columns))
    values = column_first_values(*(keys.column(columns[0]) for keys, columns in changes))
    if values is None:
        return refused("key values that do not sort")
    out, schema = [], None
    for side, weight in ((NEW, 1), (OLD, -1)):
        frames = []
        for node, columns in sides:
            frame = restricted_snapshot(ctx, node, side, columns[0], values)
            if frame is None:
                frame = ctx.snapshot(node, side)  # a small input is held whole
            if not held_exactly(frame):
                return refused(f"{node.describe()} as of {side} is not held exactly on the driver")
            rows = spark_typed(exact_rows(frame), frame.schema)
            if rows is None:
                return refused(f"{node.describe()} as of {side}: columns missing in its rows")
            codes = key_codes((rows, columns), *changes)
            frames.append((rows.filter(pa.array(np.isin(codes[0], np.concatenate(codes[1:])))), frame.schema))
        result = evaluate_rows(frames)
        if result is None:
            return refused("Arrow does not decide the operator as Spark does")
        rows, schema = result
        out.append(rows.append_column(WEIGHT, pa.array([weight] * rows.num_rows, pa.int64())))
    schema = StructType(list(schema.fields) + [StructField(WEIGHT, LongType())])
    rows = pa.concat_tables([out[0], out[1].cast(out[0].schema)]).combine_chunks()
    return hold(ctx.reads.local(ctx.spark, rows, schema), rows, exact=True)
