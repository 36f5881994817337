"""A scan's predicate applied on the driver (epochal/driver/filters.py) must keep exactly the rows
Spark's filter keeps wherever it answers at all: random predicates over integer, string, decimal,
date and boolean columns with NULLs, held against Spark's filter over the same rows; comparisons of
integers and decimals of different types and SUBSTRING of strings among them, and SUBSTRING's every
position and length over non-ASCII strings held against Spark's own substring."""

from __future__ import annotations

from collections import Counter
from datetime import date
from decimal import Decimal

import pyarrow as pa
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from epochal.driver.filters import driver_filter
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

SCHEMA = ("k int, j int, s string, d decimal(10,2), day date, b boolean, "
          "l bigint, t tinyint, e decimal(19,6), w decimal(38,0)")
HUGE, MINUS_HUGE = Decimal("9" * 38), Decimal("-" + "9" * 38)  # -HUGE rounds to 28 digits
STRINGS = [None, "", "a", "ab", "ba", "é", "a%b", "é😀a", "aé", "a\nb", "a.(b"]
ROW = st.tuples(
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.integers(-3, 3)),
    st.sampled_from(STRINGS),
    st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("-1.50"), Decimal("2.00")])),
    st.one_of(st.none(), st.sampled_from([date(1995, 1, 1), date(1996, 12, 31)])),
    st.one_of(st.none(), st.booleans()),
    st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([3000000000, -3000000000])),
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.sampled_from([Decimal("0.05"), Decimal("0.050001"), Decimal("-1.5"), Decimal("2"),
                                          Decimal("-0.000001"), Decimal("1234567890123.123456")])),
    st.one_of(st.none(), st.sampled_from([Decimal(0), Decimal(2), Decimal(-1), HUGE, MINUS_HUGE])),
)
NUMBERS = st.sampled_from(["0", "2", "-1", "2.0", "1.5", "0.05", "-1.50", "1.555", "1e1", "3000000000"])
STRING_LITERALS = st.sampled_from(["''", "'a'", "'ab'", "'é'", "'1'", "'😀'", "'é😀'"])
LITERALS = {
    "k": NUMBERS, "j": NUMBERS, "d": NUMBERS, "l": NUMBERS, "t": NUMBERS, "e": NUMBERS, "w": NUMBERS,
    "s": STRING_LITERALS,
    "day": st.sampled_from(["CAST('1995-01-01' AS DATE)", "CAST('1996-12-31' AS DATE)", "'1995-01-01'"]),
    "b": st.sampled_from(["TRUE", "FALSE"]),
}
COLUMNS = st.sampled_from(sorted(LITERALS))
NUMERIC = ["k", "j", "l", "t", "d", "e", "w"]  # int, int, bigint, tinyint, decimal(10,2), (19,6), (38,0)
OPERATORS = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])


@st.composite
def substrings(draw) -> str:
    """SUBSTRING or SUBSTR of s, positions and lengths around the ends of short strings."""
    name = draw(st.sampled_from(["SUBSTRING", "SUBSTR"]))
    pos = draw(st.integers(-5, 5))
    length = draw(st.sampled_from([None, -1, 0, 1, 2, 5]))
    return f"{name}(s, {pos})" if length is None else f"{name}(s, {pos}, {length})"


@st.composite
def new_atoms(draw) -> str:
    """A comparison of two numeric columns of any types, or a form over a SUBSTRING of s."""
    form = draw(st.sampled_from(["columns", "compare", "mirrored", "in", "not in", "like", "string columns"]))
    op = draw(OPERATORS)
    if form == "columns":
        left, right = draw(st.sampled_from(NUMERIC)), draw(st.sampled_from(NUMERIC))
        return f"{left} {op} {right}"
    slice_ = draw(substrings())
    if form == "compare":
        return f"{slice_} {op} {draw(STRING_LITERALS)}"
    if form == "mirrored":
        return f"{draw(STRING_LITERALS)} {op} {slice_}"
    if form in ("in", "not in"):
        values = ", ".join(draw(st.lists(STRING_LITERALS, min_size=1, max_size=3)))
        return f"{slice_} {'NOT ' if form == 'not in' else ''}IN ({values})"
    if form == "like":
        negated = "NOT " if draw(st.booleans()) else ""
        return f"{slice_} {negated}LIKE '{draw(st.sampled_from(['a%', '%a', '%é%', '😀', '%']))}'"
    return f"{slice_} {op} {draw(st.sampled_from(['s', slice_]))}"


@st.composite
def atoms(draw) -> str:
    column = draw(COLUMNS)
    literal = LITERALS[column]
    form = draw(st.sampled_from(["compare", "mirrored", "null", "not null", "in", "not in", "between", "columns", "like",
                                 "new"]))
    op = draw(OPERATORS)
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
    if form == "new":
        return draw(new_atoms())
    pattern = draw(st.sampled_from(["a%", "%a", "%b%", "ab", "%", "a_", "%a%b%", "a%b", "%.%(%", "%%"]))
    return f"s {'NOT ' if draw(st.booleans()) else ''}LIKE '{pattern}'"  # sqlglot: Like(negate=True)


def predicates(atom) -> st.SearchStrategy:
    return st.recursive(
        atom,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
            inner.map(lambda p: f"NOT ({p})"),
        ),
        max_leaves=4,
    )


FRAME_ROWS = [(1, 1, "ab", Decimal("0.05"), date(1995, 1, 1), True, 1, 1, Decimal("0.050001"), Decimal(2)),
              (None, 2, None, None, None, None, None, None, None, None),
              (2, None, "ba", Decimal("2.00"), date(1996, 12, 31), False, 3000000000, -1, Decimal(2), HUGE),
              (-1, -1, "", Decimal("-1.50"), None, True, -1, None, Decimal("-1.5"), Decimal(-1)),
              (3, 0, "a%b", None, date(1995, 1, 1), None, 2, 3, Decimal("0.05"), MINUS_HUGE),
              (0, 0, "é", Decimal("0.05"), date(1996, 12, 31), False, 0, 0, Decimal("1234567890123.123456"), None),
              (2, 2, "é😀a", Decimal("2.00"), None, None, 2, 2, Decimal("2.000001"), Decimal(0)),
              (-3, 1, "aé", Decimal("-1.50"), None, None, -3000000000, -3, Decimal("-0.000001"), Decimal(-1))]


@pytest.fixture(scope="module")
def held(spark):
    return spark.createDataFrame(FRAME_ROWS, SCHEMA).toArrow()


def _rows(table) -> Counter:
    return Counter(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def _held_against_spark(spark, predicates, extra):
    """Each predicate kept on the driver against Spark's answer for the same rows, all of them
    computed by Spark in one job: a column per predicate beside the rows it judged."""
    data = spark.createDataFrame(FRAME_ROWS + extra, SCHEMA)
    judged = data.select("*", *[F.expr(p).alias(f"__keep{n}") for n, p in enumerate(predicates)]).toArrow()
    rows = judged.select(data.columns)
    for n, predicate in enumerate(predicates):
        kept = driver_filter(rows, sqlglot.parse_one(predicate, read="spark"))
        if kept is None:
            continue  # Spark's to filter
        assert _rows(kept) == _rows(rows.filter(judged.column(f"__keep{n}").fill_null(False))), predicate


# A batch of predicates per example, judged by Spark in one job: 20 x 4 predicates, as many as
# one per example over 80 examples, at a quarter of the Spark jobs.
@settings(max_examples=8, deadline=None)
@given(batch=st.lists(predicates(atoms()), min_size=4, max_size=4), extra=st.lists(ROW, max_size=6))
def test_a_predicate_applied_on_the_driver_keeps_what_sparks_filter_keeps(spark, batch, extra):
    _held_against_spark(spark, batch, extra)


@settings(max_examples=6, deadline=None)
@given(batch=st.lists(predicates(new_atoms()), min_size=4, max_size=4), extra=st.lists(ROW, max_size=6))
def test_widened_comparisons_and_substrings_keep_what_sparks_filter_keeps(spark, batch, extra):
    _held_against_spark(spark, batch, extra)


GRID_STRINGS = [None, "", "a", "ab", "abc", "é", "e\u0301x", "aé😀b", "😀😀", "héllo wörld", "日本語"]
POSITIONS = [*range(-12, 13), 2147483647, -2147483647]
LENGTHS = [None, -2147483647, -1, 0, 1, 2, 3, 11, 12, 2147483647]


def test_substring_at_every_position_and_length_is_sparks(spark):
    """Spark's substring of each string at each (pos, len): the rows `SUBSTRING(...) = v` keeps on
    the driver are exactly those whose Spark substring is v, for every v Spark gives, so each row's
    Arrow slice is Spark's (a NULL string is kept by none)."""
    calls = [(pos, length, f"SUBSTRING(s, {pos})" if length is None else f"SUBSTRING(s, {pos}, {length})")
             for pos in POSITIONS for length in LENGTHS]
    strings = spark.createDataFrame(list(enumerate(GRID_STRINGS)), "i int, s string")
    sliced = strings.selectExpr("i", *[f"{call} AS c{n}" for n, (_, _, call) in enumerate(calls)]).toArrow()
    rows = strings.toArrow()
    for n, (pos, length, call) in enumerate(calls):
        by_row = dict(zip(sliced.column("i").to_pylist(), sliced.column(f"c{n}").to_pylist()))
        for value in {v for v in by_row.values() if v is not None} | {""}:
            kept = driver_filter(rows, sqlglot.parse_one(f"{call} = '{value}'", read="spark"))
            assert kept is not None, call
            assert sorted(kept.column("i").to_pylist()) == sorted(i for i, v in by_row.items() if v == value), \
                (call, value)


@pytest.mark.parametrize("predicate", [
    "k = 1", "1 < k", "k <> j", "d BETWEEN 0.05 AND 2", "d = 2.0", "day >= CAST('1995-01-01' AS DATE)",
    "s LIKE 'a%'", "s LIKE '%a'", "s LIKE '%b%'", "s LIKE '%a%b%'", "s LIKE 'a%b'", "s NOT LIKE '%a%b%'", "k IN (1, 2)", "NOT k IN (1, 2)", "s IS NULL",
    "b = TRUE", "(k > 0 OR s IS NULL) AND NOT (d < 0)",
    "k < l", "d = e", "k <> d", "t <= e", "w > l", "w < d", "e = w", "SUBSTRING(s, 1, 2) IN ('ab', 'ba')", "SUBSTR(s, -1) = 'b'",
    "SUBSTRING(s, 0, 1) LIKE 'a%'", "SUBSTRING(s, 2) < s", "NOT SUBSTRING(s FROM 2 FOR 1) IN ('b')",
])
def test_the_documented_forms_are_decided_on_the_driver(held, predicate):
    assert driver_filter(held, sqlglot.parse_one(predicate, read="spark")) is not None


@pytest.mark.parametrize("predicate", [
    "k < 1.5", "k = '1'", "day = '1995-01-01'", "d < 1.555", "k = 1e1", "s LIKE 'a_'",
    "k + 1 = 2", "upper(s) = 'AB'", "k = 3000000000",
    "k = s", "day < k", "SUBSTRING(k, 1, 1) = '1'", "SUBSTRING(s, 1.0, 1) = 'a'",
    "SUBSTRING(s, k, 1) = 'a'", "SUBSTRING(s, 1, j) = 'a'", "SUBSTRING(s, 3000000000, 1) = 'a'",
    "SUBSTRING(s, 1, 1) = 1", "SUBSTRING(upper(s), 1, 1) = 'A'", "SUBSTRING(s, 1, 1) LIKE 'a_'",
    "SUBSTRING(s, -2147483648, 1) = 'a'",
])
def test_forms_that_need_sparks_casts_or_functions_are_left_to_spark(held, predicate):
    assert driver_filter(held, sqlglot.parse_one(predicate, read="spark")) is None


def test_substring_of_binary_is_left_to_spark():
    """Spark slices a binary by bytes, Arrow's slice counts code points."""
    rows = pa.table({"s": pa.array([b"\xc3\xa9a", None])})
    assert driver_filter(rows, sqlglot.parse_one("SUBSTRING(s, 1, 1) = 'a'", read="spark")) is None


def test_a_negative_decimal_literal_keeps_all_its_digits(spark):
    """Python negates a Decimal to its context's 28 digits; Spark's literal keeps all 30."""
    value = Decimal("-12345678901234567890123456789.1")
    data = spark.createDataFrame([(value,), (Decimal("-12345678901234567890123456788.1"),), (None,)], "x decimal(38,1)")
    for predicate in (f"x = {value}", f"x <> {value}", f"x IN ({value}, 1)"):
        kept = driver_filter(data.toArrow(), sqlglot.parse_one(predicate, read="spark"))
        assert kept is not None and _rows(kept) == _rows(data.filter(F.expr(predicate)).toArrow()), predicate


def test_decimals_whose_wider_type_is_bounded_to_38_digits_are_compared_as_spark_does(spark):
    """Past precision 38 Spark keeps the integer digits and rounds the finer operand: DECIMAL(36,2)
    against DECIMAL(38,6) (TPC-H Q11's sum against its share of the total) compares as
    DECIMAL(38,4), DECIMAL(38,0) against DECIMAL(10,2) as DECIMAL(38,0), halves rounded away from
    zero. Decided on the driver as Spark decides (every integer digit is kept, so none overflows)."""
    rows = [(Decimal("1000.25"), Decimal("1000.250001"), Decimal(3), Decimal("2.50")),
            (Decimal("7.00"), Decimal("6.999999"), Decimal(-3), Decimal("-2.50")),
            (Decimal("7.00"), Decimal("6.99994"), Decimal(2), Decimal("2.49")),
            (Decimal("-7.00"), Decimal("-7.00005"), Decimal(-2), Decimal("-2.49")),
            (None, Decimal(1), None, Decimal(1)), (Decimal("-3.10"), Decimal("-3.100000"), Decimal(0), None)]
    schema = "a decimal(36,2), b decimal(38,6), w decimal(38,0), d decimal(10,2)"
    data = spark.createDataFrame(rows, schema)
    for predicate in ("b < a", "a = b", "a <= b", "a <> b", "b > a", "w = d", "d < w", "w >= d"):
        kept = driver_filter(data.toArrow(), sqlglot.parse_one(predicate, read="spark"))
        assert kept is not None, predicate
        assert _rows(kept) == _rows(data.filter(predicate).toArrow()), predicate
