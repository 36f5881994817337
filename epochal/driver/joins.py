"""A join term computed on the driver, in Arrow, where every input of it is held there exactly.

A join term `d_i ⋈ partners` over a change-sized batch is small, and most of its inputs are on the
driver already: the change batch consolidated there, the partners read there for the batch's keys
(narrowing.py), small tables read whole once per refresh (shared_reads.py). Through Spark the term
cost a local checkpoint and the broadcast jobs AQE plans for it, about a second per join node and
step. Here it costs pyarrow's hash join, and Spark receives the result as a local relation.

Arrow decides only what it decides as Spark does: each join is on equalities of columns of the
same Spark type (integers, strings, dates, decimals, booleans; pyarrow's hash join, like Spark's
`=`, never matches NULL keys), and every other conjunct is a predicate driver/filters.py decides.
A join on no equality (a scalar subquery's one row) is the cross product, up to CROSS_ROWS. A
NULL-safe equality, floating point or timestamp keys, or a conjunct Arrow cannot decide leave the
term to Spark (None).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    DataType,
    StructField,
    StructType,
)
from sqlglot import exp

from ..arrow_rows import key_type
from ..graph import WEIGHT, Join, conjoin, join_order
from .filters import driver_filter

CROSS_ROWS = 1_000_000  # rows of a cross join (each row with a scalar subquery's) made in Arrow


def _split(applicable: list, have: dict[str, DataType], part: dict[str, DataType]):
    """The conjuncts joining `part` to the columns `have`: equality keys (left, right) of one Spark
    type and the rest, or None where an equality would not be decided as Spark decides it."""
    keys, rest = [], []
    for condition in applicable:
        if isinstance(condition, exp.NullSafeEQ):
            return None
        if isinstance(condition, exp.EQ) and isinstance(condition.left, exp.Column) \
                and isinstance(condition.right, exp.Column):
            a, b = condition.left.name, condition.right.name
            if a in part and b in have:
                a, b = b, a
            if a in have and b in part:
                if have[a] != part[b] or not key_type(have[a]):
                    return None
                keys.append((a, b))
                continue
        rest.append(condition)
    return keys, rest


def join_rows(node: Join, rows: dict[int, pa.Table], schemas: dict[int, StructType], start: int) -> pa.Table | None:
    """The term starting at input `start`, joined in join.join_order over Arrow `rows` (input j's
    rows with the Arrow types of Spark `schemas[j]`, spark_typed), as node.columns and the start's
    WEIGHT; None where Arrow may not decide it as Spark does."""
    names = [name for j in rows for name in rows[j].column_names]
    if len(names) != len(set(names)):
        return None
    have = {f.name: f.dataType for f in schemas[start].fields}
    joined = rows[start]
    try:
        for index, applicable in join_order(node, start):
            if index < 0:
                joined = driver_filter(joined, conjoin(applicable))
            else:
                part = {f.name: f.dataType for f in schemas[index].fields}
                split = _split(applicable, have, part)
                if split is None:
                    return None
                keys, rest = split
                if keys:
                    joined = joined.join(rows[index], keys=[a for a, _ in keys], right_keys=[b for _, b in keys],
                                         join_type="inner", coalesce_keys=False, use_threads=True)
                else:
                    joined = _cross(joined, rows[index])
                    if joined is None:
                        return None
                have.update(part)
                if rest:
                    joined = driver_filter(joined, conjoin(rest))
            if joined is None:
                return None
    except (pa.ArrowException, TypeError, ValueError):  # a type pyarrow's join does not take
        return None
    weight = [WEIGHT] if WEIGHT in rows[start].column_names else []
    return joined.select(list(node.columns) + weight).combine_chunks()


def _cross(left: pa.Table, right: pa.Table) -> pa.Table | None:
    """Every pair of rows (a join on no equality: typically with a scalar subquery's one row), or
    None beyond CROSS_ROWS."""
    if left.num_rows * right.num_rows > CROSS_ROWS:
        return None
    outer = left.take(pa.array(np.repeat(np.arange(left.num_rows), right.num_rows)))
    inner = right.take(pa.array(np.tile(np.arange(right.num_rows), left.num_rows)))
    return pa.Table.from_arrays([*outer.columns, *inner.columns], names=[*outer.column_names, *inner.column_names])


def output_schema(node: Join, schemas: dict[int, StructType], start: int) -> StructType:
    """The Spark schema of the term's result: each column as its input has it, and the WEIGHT."""
    fields = {f.name: f for schema in schemas.values() for f in schema.fields}
    weight = [StructField(WEIGHT, fields[WEIGHT].dataType, fields[WEIGHT].nullable)] if WEIGHT in schemas[start].names else []
    return StructType([fields[c] for c in node.columns] + weight)


def semi_join_rows(left: pa.Table, right: pa.Table, left_schema: StructType, right_schema: StructType,
                   pairs, residual, anti: bool) -> pa.Table | None:
    """LEFT SEMI (or ANTI) JOIN of `left` with `right` on `pairs` (left column = right column) and
    the `residual` predicate, in Arrow: each left row kept once (or dropped) by whether any right
    row matches it, as Spark's; None where Arrow may not decide it as Spark does. Both tables have
    their schema's Arrow types (spark_typed)."""
    left_types = {f.name: f.dataType for f in left_schema.fields}
    right_types = {f.name: f.dataType for f in right_schema.fields}
    if not pairs or set(left.column_names) & set(right.column_names) or any(
            left_types[a] != right_types[b] or not key_type(left_types[a]) for a, b in pairs):
        return None
    row = "__row"
    indexed = left.append_column(row, pa.array(range(left.num_rows), pa.int64()))
    try:
        joined = indexed.join(right, keys=[a for a, _ in pairs], right_keys=[b for _, b in pairs],
                              join_type="inner", coalesce_keys=False, use_threads=True)
        if residual is not None:
            joined = driver_filter(joined, residual)
            if joined is None:
                return None
        matched = pc.is_in(indexed.column(row), value_set=pc.unique(joined.column(row)))
        return left.filter(pc.invert(matched) if anti else matched)
    except (pa.ArrowException, TypeError, ValueError):
        return None


def outer_join_rows(left: pa.Table, right: pa.Table, left_schema: StructType, right_schema: StructType,
                    pairs, residual, side: str) -> pa.Table | None:
    """LEFT, RIGHT or FULL OUTER JOIN (`side`) of `left` with `right` on `pairs` (left column =
    right column) and the `residual` predicate, both part of ON, in Arrow as Spark's: the matching
    pairs, then once each row of a preserved side that no row matched (a NULL key matches nothing;
    matches the residual rejects are none), NULL-padded; the left's columns then the right's. None
    where Arrow may not decide it as Spark does. Both tables have their schema's Arrow types
    (spark_typed)."""
    left_types = {f.name: f.dataType for f in left_schema.fields}
    right_types = {f.name: f.dataType for f in right_schema.fields}
    rows, names = ("__left_row", "__right_row"), left.column_names + right.column_names
    if side not in ("left", "right", "full") or not pairs or len(set(names)) != len(names) \
            or set(rows) & set(names) \
            or any(left_types[a] != right_types[b] or not key_type(left_types[a]) for a, b in pairs):
        return None
    keep = (side in ("left", "full"), side in ("right", "full"))
    schema = pa.schema([f.with_nullable(f.nullable or keep[1]) for f in left.schema]
                       + [f.with_nullable(f.nullable or keep[0]) for f in right.schema])
    indexed = [table.append_column(row, pa.array(np.arange(table.num_rows), pa.int64()))
               for table, row in zip((left, right), rows)]
    try:
        joined = indexed[0].join(indexed[1], keys=[a for a, _ in pairs], right_keys=[b for _, b in pairs],
                                 join_type="inner", coalesce_keys=False, use_threads=True)
        if residual is not None:
            joined = driver_filter(joined, residual)
            if joined is None:
                return None
        parts = [joined.select(names).cast(schema)]
        for kept, table, row in zip(keep, indexed, rows):
            if kept:
                matched = pc.is_in(table.column(row), value_set=pc.unique(joined.column(row)))
                unmatched = table.filter(pc.invert(matched))
                parts.append(pa.Table.from_arrays(
                    [unmatched.column(f.name) if f.name in unmatched.column_names
                     else pa.nulls(unmatched.num_rows, f.type) for f in schema], schema=schema))
        return pa.concat_tables(parts).combine_chunks()
    except (pa.ArrowException, TypeError, ValueError):
        return None
