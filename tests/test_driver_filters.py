"""A scan's predicate applied on the driver (epochal/driver_filters.py) must keep exactly the rows
Spark's filter keeps wherever it answers at all: random predicates over integer, string, decimal,
date and boolean columns with NULLs, held against Spark's filter over the same rows."""

from __future__ import annotations

from collections import Counter
from datetime import date
from decimal import Decimal

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from epochal.driver_filters import driver_filter
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

SCHEMA = "k int, j int, s string, d decimal(10,2), day date, b boolean"
ROW = st.tuples(
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.integers(-3, 3)),
    st.sampled_from([None, "", "a", "ab", "ba", "é", "a%b"]),
    st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("-1.50"), Decimal("2.00")])),
    st.one_of(st.none(), st.sampled_from([date(1995, 1, 1), date(1996, 12, 31)])),
    st.one_of(st.none(), st.booleans()),
)
NUMBERS = st.sampled_from(["0", "2", "-1", "2.0", "1.5", "0.05", "-1.50", "1.555", "1e1", "3000000000"])
LITERALS = {
    "k": NUMBERS, "j": NUMBERS, "d": NUMBERS,
    "s": st.sampled_from(["''", "'a'", "'ab'", "'é'", "'1'"]),
    "day": st.sampled_from(["CAST('1995-01-01' AS DATE)", "CAST('1996-12-31' AS DATE)", "'1995-01-01'"]),
    "b": st.sampled_from(["TRUE", "FALSE"]),
}
COLUMNS = st.sampled_from(sorted(LITERALS))


@st.composite
def atoms(draw) -> str:
    column = draw(COLUMNS)
    literal = LITERALS[column]
    form = draw(st.sampled_from(["compare", "mirrored", "null", "not null", "in", "not in", "between", "columns", "like"]))
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
    if form == "compare":
        return f"{column} {op} {draw(literal)}"
    if form == "mirrored":
        return f"{draw(literal)} {op} {column}"
    if form in ("null", "not null"):
        return f"{column} IS {'NOT ' if form == 'not null' else ''}NULL"
    if form in ("in", "not in"):
        values = ", ".join(draw(st.lists(literal, min_size=1, max_size=3)))
        return f"{column} {'NOT ' if form == 'not in' else ''}IN ({values})"
    if form == "between":
        return f"{column} BETWEEN {draw(literal)} AND {draw(literal)}"
    if form == "columns":
        return f"k {op} j"
    pattern = draw(st.sampled_from(["a%", "%a", "%b%", "ab", "%", "a_", "%a%b%"]))
    return f"s LIKE '{pattern}'"


PREDICATES = st.recursive(
    atoms(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda p: f"NOT ({p})"),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(k, j, s, d, day, b) for k, j, s, d, day, b in
            [(1, 1, "ab", Decimal("0.05"), date(1995, 1, 1), True), (None, 2, None, None, None, None),
             (2, None, "ba", Decimal("2.00"), date(1996, 12, 31), False), (-1, -1, "", Decimal("-1.50"), None, True),
             (3, 0, "a%b", None, date(1995, 1, 1), None), (0, 0, "é", Decimal("0.05"), date(1996, 12, 31), False)]]
    return spark.createDataFrame(rows, SCHEMA)


@pytest.fixture(scope="module")
def held(frame):
    return frame.toArrow()


def _rows(table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(predicate=PREDICATES, extra=st.lists(ROW, max_size=6))
def test_a_predicate_applied_on_the_driver_keeps_what_sparks_filter_keeps(spark, frame, predicate, extra):
    data = frame.unionByName(spark.createDataFrame(extra, SCHEMA)) if extra else frame
    rows = data.toArrow()
    kept = driver_filter(rows, sqlglot.parse_one(predicate, read="spark"))
    if kept is None:
        return  # Spark's to filter
    assert _rows(kept) == _rows(data.filter(F.expr(predicate)).toArrow()), predicate


@pytest.mark.parametrize("predicate", [
    "k = 1", "1 < k", "k <> j", "d BETWEEN 0.05 AND 2", "d = 2.0", "day >= CAST('1995-01-01' AS DATE)",
    "s LIKE 'a%'", "s LIKE '%a'", "s LIKE '%b%'", "k IN (1, 2)", "NOT k IN (1, 2)", "s IS NULL",
    "b = TRUE", "(k > 0 OR s IS NULL) AND NOT (d < 0)",
])
def test_the_documented_forms_are_decided_on_the_driver(held, predicate):
    assert driver_filter(held, sqlglot.parse_one(predicate, read="spark")) is not None


@pytest.mark.parametrize("predicate", [
    "k < 1.5", "k = '1'", "day = '1995-01-01'", "d < 1.555", "k = 1e1", "s LIKE 'a_'", "s LIKE '%a%b%'",
    "k + 1 = 2", "upper(s) = 'AB'", "k = 3000000000",
])
def test_forms_that_need_sparks_casts_or_functions_are_left_to_spark(held, predicate):
    assert driver_filter(held, sqlglot.parse_one(predicate, read="spark")) is None
