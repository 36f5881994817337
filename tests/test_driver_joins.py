"""A join term computed on the driver (epochal/driver/joins.py) must hold exactly the rows Spark's
join of the same frames holds wherever it answers at all: random inputs with duplicates and NULL
keys over integer, string, decimal and date columns, random equi-join conditions with extra
conjuncts, held against Spark's join of the same rows (rules/join.join_frames); semi- and
anti-joins with residual predicates against Spark's left_semi and left_anti."""

from __future__ import annotations

from collections import Counter
from datetime import date
from decimal import Decimal

import pyarrow as pa
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from epochal.arrow_rows import spark_typed
from epochal.driver.joins import join_rows, output_schema
from epochal.graph import Join, Scan
from epochal.rules.join import join_frames
from tests.support import arrow_rows

SCHEMAS = {
    0: "a_k int, a_s string, a_d decimal(10,2), __w bigint",
    1: "b_k int, b_s string, b_x decimal(10,2), b_day date",
    2: "c_k int, c_s string, c_day date, c_f double",
}
VALUES = {
    "k": st.one_of(st.none(), st.integers(0, 3)),
    "s": st.sampled_from([None, "", "a", "b", "é"]),
    "d": st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("1.00"), Decimal("-2.50")])),
    "x": st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("1.00")])),
    "day": st.one_of(st.none(), st.sampled_from([date(1995, 1, 1), date(1996, 6, 30)])),
    "f": st.one_of(st.none(), st.sampled_from([0.5, -0.0, 2.25])),
    "w": st.sampled_from([1, -1, 2]),
}


def _rows(index: int):
    names = [part.split()[0].split("_", 1)[1] for part in SCHEMAS[index].split(", ")]
    return st.lists(st.tuples(*[VALUES[name.lstrip("_")] for name in names]), max_size=8)


CONDITIONS = st.sampled_from([
    "a_k = b_k AND b_s = c_s",
    "a_k = b_k AND a_s = b_s AND b_k = c_k",
    "a_k = b_k AND b_day = c_day AND a_d < b_x",
    "a_s = b_s AND c_k = b_k AND (a_d IS NULL OR c_s <> 'a')",
    "a_k = b_k AND b_k = c_k AND a_s LIKE 'a%'",
    "a_d = b_x AND c_k = a_k",
    "a_k = b_k AND c_s = a_s AND b_day >= CAST('1996-01-01' AS DATE)",
    "a_k = b_k AND c_k = b_k AND c_f > 0",  # a float conjunct: Spark's to decide
    "a_k <=> b_k AND b_k = c_k",  # NULL-safe: Spark's
    "a_k = b_k AND a_d < b_x",  # c joined on nothing: the cross product
    "a_d > b_x AND c_k = a_k",  # a joined to b on a comparison only
])


def _join(condition: str) -> Join:
    parts = tuple(Scan(columns=tuple(f.split()[0] for f in SCHEMAS[i].split(", ") if not f.startswith("__")),
                       table=f"t{i}") for i in range(3))
    return Join(columns=tuple(c for p in parts for c in p.columns), parts=parts,
                condition=sqlglot.parse_one(condition, read="spark"))


def _held(spark, rows: list[tuple], ddl: str):
    """(Spark's frame of `rows`, the same rows in Arrow as Spark types them), the Arrow built on the
    driver: Spark's toArrow of a local relation is a job per input, the join being tested is
    the only job an example needs."""
    frame = spark.createDataFrame(rows, ddl)
    return frame, arrow_rows(rows, frame.schema)


def _bag(table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


@settings(max_examples=8, deadline=None)
@given(condition=CONDITIONS, start=st.sampled_from([0, 1, 2]), a=_rows(0), b=_rows(1), c=_rows(2))
def test_a_join_term_on_the_driver_holds_what_sparks_join_holds(spark, condition, start, a, b, c):
    node = _join(condition)
    held = {i: _held(spark, rows, SCHEMAS[i]) for i, rows in enumerate((a, b, c))}
    frames, arrows = {i: f for i, (f, _) in held.items()}, {i: t for i, (_, t) in held.items()}
    if start != 0:  # only the term's start carries the weight
        frames[0], arrows[0] = frames[0].drop("__w"), arrows[0].drop_columns(["__w"])
        frames[start] = frames[start].withColumn("__w", F.lit(2).cast("bigint"))
        arrows[start] = arrows[start].append_column("__w", pa.array([2] * arrows[start].num_rows, pa.int64()))
    schemas = {i: frame.schema for i, frame in frames.items()}
    rows = join_rows(node, {i: spark_typed(arrows[i], schemas[i]) for i in frames}, schemas, start)
    if rows is None:
        assert "<=>" in condition or "c_f" in condition, f"refused {condition}"
        return
    expected = join_frames(node, frames, start).toArrow()
    assert rows.column_names == expected.column_names
    assert _bag(rows) == _bag(expected), condition
    assert output_schema(node, schemas, start).names == expected.column_names


SEMI_CONDITIONS = st.sampled_from([
    ([("a_k", "b_k")], None),
    ([("a_k", "b_k"), ("a_s", "b_s")], None),
    ([("a_k", "b_k")], "a_s <> b_s"),
    ([("a_d", "b_x")], "b_day >= CAST('1996-01-01' AS DATE) OR a_s IS NULL"),
    ([("a_k", "b_k")], "a_d < b_x"),
])


@settings(max_examples=10, deadline=None)
@given(condition=SEMI_CONDITIONS, anti=st.booleans(), a=_rows(0), b=_rows(1))
def test_a_semi_or_anti_join_on_the_driver_keeps_what_sparks_keeps(spark, condition, anti, a, b):
    from epochal.driver.joins import semi_join_rows

    pairs, residual = condition
    (left, left_rows), (right, right_rows) = _held(spark, a, SCHEMAS[0]), _held(spark, b, SCHEMAS[1])
    on = " AND ".join([f"{x} = {y}" for x, y in pairs] + ([f"({residual})"] if residual else []))
    expected = left.join(right, on=F.expr(on), how="left_anti" if anti else "left_semi").toArrow()
    rows = semi_join_rows(spark_typed(left_rows, left.schema), spark_typed(right_rows, right.schema),
                          left.schema, right.schema, pairs,
                          sqlglot.parse_one(residual, read="spark") if residual else None, anti)
    assert rows is not None, on
    assert _bag(rows) == _bag(expected), on


OUTER_CONDITIONS = st.sampled_from([
    ([("a_k", "b_k")], None),
    ([("a_k", "b_k"), ("a_s", "b_s")], None),
    ([("a_k", "b_k")], "a_s <> b_s"),
    ([("a_d", "b_x")], "b_day >= CAST('1996-01-01' AS DATE) OR a_s IS NULL"),
    ([("a_k", "b_k")], "a_d < b_x AND b_s LIKE 'a%'"),
    ([("a_s", "b_s")], "a_k IS NULL OR b_k > 1"),
])


@settings(max_examples=8, deadline=None)
@given(condition=OUTER_CONDITIONS, side=st.sampled_from(["left", "right", "full"]), a=_rows(0), b=_rows(1))
def test_an_outer_join_on_the_driver_holds_what_sparks_holds(spark, condition, side, a, b):
    """NULL keys match nothing, a residual is part of ON (a row whose matches it rejects is kept,
    padded), duplicates multiply."""
    from epochal.driver.joins import outer_join_rows

    pairs, residual = condition
    (left, left_rows), (right, right_rows) = _held(spark, a, SCHEMAS[0]), _held(spark, b, SCHEMAS[1])
    on = " AND ".join([f"{x} = {y}" for x, y in pairs] + ([f"({residual})"] if residual else []))
    expected = left.join(right, on=F.expr(on), how=side).toArrow()
    rows = outer_join_rows(spark_typed(left_rows, left.schema), spark_typed(right_rows, right.schema),
                           left.schema, right.schema, pairs,
                           sqlglot.parse_one(residual, read="spark") if residual else None, side)
    assert rows is not None, on
    assert rows.column_names == expected.column_names == left.columns + right.columns
    assert _bag(rows) == _bag(expected), (side, on)
