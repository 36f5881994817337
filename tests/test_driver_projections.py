"""A projection computed on the driver (epochal/driver/projections.py) must give exactly Spark's
values, of Spark's types, wherever it answers at all: random `+`, `-`, `*` and unary minus over
integer, decimal and double columns with NULLs and numeric literals, searched CASEs over them,
years of dates and substrings, held against Spark's select of the same rows; where Spark raises
(an integer overflow under ANSI), the driver refuses."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pyarrow as pa
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql.pandas.types import to_arrow_schema

from epochal.driver.projections import driver_project
from tests.support import arrow_rows

SCHEMA = "k int, l bigint, t tinyint, p decimal(12,2), d decimal(12,2), e decimal(19,6), w decimal(38,0), x double, s string"
NUMERIC = ["k", "l", "t", "p", "d", "e", "w", "x"]
ROW = st.tuples(
    st.one_of(st.none(), st.integers(-3, 3), st.just(46341)),  # k * k overflows an int
    st.one_of(st.none(), st.integers(-3, 3), st.just(3_000_000_000)),
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("-1.50"), Decimal("9999999999.99")])),
    st.one_of(st.none(), st.sampled_from([Decimal("0.10"), Decimal("1.00"), Decimal("-0.07")])),
    st.one_of(st.none(), st.sampled_from([Decimal("0.000001"), Decimal("-2.5"), Decimal("1234567890123.123456")])),
    st.one_of(st.none(), st.sampled_from([Decimal(0), Decimal(7), Decimal("9" * 38)])),
    st.one_of(st.none(), st.sampled_from([0.1, -0.0, 2.5, float("inf"), float("nan")])),
    st.sampled_from([None, "a", "é"]),
)
LITERALS = st.sampled_from(["1", "0", "2", "100", "0.05", "1.0", "2.50", "3000000000", "1e1", "'a'"])


def _expressions(leaves: st.SearchStrategy) -> st.SearchStrategy:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"-{e}"),
        ),
        max_leaves=4,
    )


EXPRESSIONS = _expressions(st.one_of(st.sampled_from(NUMERIC), LITERALS)).filter(
    lambda e: any(c in e for c in NUMERIC))  # a column somewhere: Spark folds constants its own way


def _values(column) -> list:
    """A column's values in order, NaN made equal to itself."""
    return ["NaN" if isinstance(v, float) and v != v else v for v in column.to_pylist()]


def _held_against_spark(spark, expressions, rows):
    data = spark.createDataFrame(rows, SCHEMA)
    held = arrow_rows(rows, data.schema)
    try:
        computed = data.selectExpr("k", *[f"{e} AS c{n}" for n, e in enumerate(expressions)])
        types = to_arrow_schema(computed.schema)
        spark_rows = computed.toArrow()
    except CapturedException:  # one of them raises in Spark (an overflow): each alone
        if len(expressions) > 1:
            for expression in expressions:
                _held_against_spark(spark, [expression], rows)
        else:
            assert _project(held, expressions[0], data) is None, f"Spark raises for {expressions[0]}, the driver answered"
        return
    for n, expression in enumerate(expressions):
        answer = driver_project(held, [sqlglot.parse_one(expression, read="spark")], ["c"], [types.field(n + 1).type])
        if answer is None:
            continue
        assert answer.column("c").type == types.field(n + 1).type, expression
        assert _values(answer.column("c")) == _values(spark_rows.column(f"c{n}")), expression


def _project(held: pa.Table, expression: str, data):
    try:
        spark_type = to_arrow_schema(data.selectExpr(f"{expression} AS c").schema).field(0).type
    except CapturedException:
        return None  # Spark refuses to type it
    return driver_project(held, [sqlglot.parse_one(expression, read="spark")], ["c"], [spark_type])


@settings(max_examples=8, deadline=None)
@given(expressions=st.lists(EXPRESSIONS, min_size=5, max_size=5), rows=st.lists(ROW, min_size=1, max_size=8))
def test_a_projection_on_the_driver_gives_sparks_values_and_types(spark, expressions, rows):
    _held_against_spark(spark, expressions, rows)


WIDE_OPERANDS = st.sampled_from(["w", "e", "k", "t", "(p * d)", "(p * (1 - d))", "(e * e)", "(w - k)"])
WIDE = st.tuples(WIDE_OPERANDS, st.sampled_from(["+", "-", "*"]), WIDE_OPERANDS).map(" ".join)


@settings(max_examples=4, deadline=None)
@given(expressions=st.lists(WIDE, min_size=5, max_size=5), rows=st.lists(ROW, min_size=1, max_size=8))
def test_an_outermost_operation_past_38_digits_gives_sparks_values(spark, expressions, rows):
    """Operands whose sum or product Spark types past 38 digits and fits to decimal(38, s): the
    driver answers only where Spark keeps the scale and the values fit, and then as Spark does."""
    _held_against_spark(spark, expressions, rows)


@pytest.mark.parametrize("expression", [
    "p * d", "p * (1 - d)", "p * (1 - d) - e * 100", "k + 1", "l * 2 - k", "t + t", "-p", "k * 0.5",
    "p - 0.05", "x * x - x", "p * (1 - d) * (1 + d)", "w + w", "w * k",
    "CASE WHEN s = 'a' OR k = 1 THEN 1 ELSE 0 END", "CASE WHEN s LIKE 'a%' THEN p * (1 - d) ELSE 0 END",
    "CASE WHEN s = 'a' THEN p ELSE 0 END", "CASE WHEN k > 1 THEN 'big' WHEN k IS NULL THEN NULL ELSE s END",
])
def test_the_documented_forms_are_computed_on_the_driver(spark, expression):
    rows = [(1, 2, 3, Decimal("0.05"), Decimal("1.00"), Decimal("2.5"), Decimal(7), 0.5, "a"), (None,) * 9]
    data = spark.createDataFrame(rows, SCHEMA)
    answer = _project(data.toArrow(), expression, data)
    assert answer is not None, expression
    assert answer.column("c").to_pylist() == data.selectExpr(f"{expression} AS c").toArrow().column("c").to_pylist()


@pytest.mark.parametrize("expression", ["k + k", "t * t", "-k", "l * l", "-w", "w + w", "w * k"])
def test_what_overflows_in_spark_is_refused(spark, expression):
    """Spark raises (ANSI) where an integer overflows, where a decimal result does not fit 38
    digits, and where it negates a decimal of more than 34 digits through Scala's BigDecimal:
    the driver leaves these to Spark."""
    rows = [(2**31 - 1, 2**62, 127, None, None, None, Decimal("9" * 38), None, None)]
    if expression == "-k":
        rows = [(-(2**31), None, None, None, None, None, None, None, None)]
    data = spark.createDataFrame(rows, SCHEMA)
    with pytest.raises(CapturedException):
        data.selectExpr(f"{expression} AS c").toArrow()
    assert _project(data.toArrow(), expression, data) is None


@pytest.mark.parametrize("expression", [
    "p / d", "p * d * e * w", "k * 1e1", "x * p", "k + x", "abs(k)", "CAST(k AS bigint)", "CASE k WHEN 1 THEN 2 END",
    "CASE WHEN k > 0 THEN p ELSE x END", "CASE WHEN x > 0 THEN k END", "1 + CASE WHEN k > 0 THEN k END", "s", "1 + 2",
])
def test_division_functions_casts_and_mixed_doubles_are_left_to_spark(spark, expression):
    rows = [(1, 2, 3, Decimal("0.05"), Decimal("1.00"), Decimal("2.5"), Decimal(7), 0.5, "a")]
    data = spark.createDataFrame(rows, SCHEMA)
    answer = _project(data.toArrow(), expression, data)
    if expression == "s":  # a column as it is: picked, not computed
        assert answer is not None and answer.column("c").to_pylist() == ["a"]
    else:
        assert answer is None, expression


PREDICATES = st.sampled_from(["k > 0", "k = 1 OR s = 'a'", "s LIKE 'a%'", "p IS NULL", "NOT (t < 1)",
                              "d BETWEEN 0 AND 1", "s IN ('a', 'b') AND k <> 2", "true", "l >= 3000000000"])
BRANCHES = st.one_of(EXPRESSIONS, st.sampled_from(["0", "1", "NULL", "2.50", "k", "p", "x", "w"]))


@st.composite
def cases(draw) -> str:
    whens = draw(st.lists(st.tuples(PREDICATES, BRANCHES), min_size=1, max_size=3))
    default = draw(st.none() | BRANCHES)
    text = " ".join(f"WHEN {p} THEN {v}" for p, v in whens)
    return f"CASE {text}{'' if default is None else f' ELSE {default}'} END"


@settings(max_examples=8, deadline=None)
@given(expressions=st.lists(cases(), min_size=5, max_size=5), rows=st.lists(ROW, min_size=1, max_size=8))
def test_a_searched_case_on_the_driver_gives_sparks_values_and_types(spark, expressions, rows):
    """Branches of integers, decimals of different scales, doubles and NULLs, which Spark casts
    to one type (or refuses to type: then so does the driver)."""
    for expression in expressions:
        data = spark.createDataFrame(rows, SCHEMA)
        try:
            data.selectExpr(f"{expression} AS c").schema
        except CapturedException:
            assert _project(arrow_rows(rows, data.schema), expression, data) is None
            continue
        _held_against_spark(spark, [expression], rows)


DATED = "dt date, s string"
DATES = st.one_of(st.none(), st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31)),
                  st.sampled_from([date(1582, 10, 4), date(1582, 10, 15), date(1900, 2, 28), date(2000, 2, 29)]))
STRINGS = st.one_of(st.none(), st.text(alphabet="ab\u00e9\U0001f600 ", max_size=5))


@settings(max_examples=10, deadline=None)
@given(rows=st.lists(st.tuples(DATES, STRINGS), min_size=1, max_size=10),
       start=st.integers(-4, 4), length=st.integers(-1, 4))
def test_years_and_substrings_on_the_driver_are_sparks(spark, rows, start, length):
    """Proleptic Gregorian years (the calendar's switch in 1582 included) and code point slices
    (characters past the BMP too), including SUBSTRING's positions from the end and lengths <= 0."""
    data = spark.createDataFrame(rows, DATED)
    held = arrow_rows(rows, data.schema)
    for expression in ["extract(year from dt)", f"substring(s, {start}, {length})", f"substr(s, {start})",
                       "CASE WHEN s LIKE '%a' THEN extract(year from dt) ELSE 0 END"]:
        computed = data.selectExpr(f"{expression} AS c")
        spark_type = to_arrow_schema(computed.schema).field(0).type
        answer = driver_project(held, [sqlglot.parse_one(expression, read="spark")], ["c"], [spark_type])
        assert answer is not None, expression
        assert answer.column("c").type == spark_type, expression
        assert answer.column("c").to_pylist() == computed.toArrow().column("c").to_pylist(), expression
