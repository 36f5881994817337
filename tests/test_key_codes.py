"""Key tuples matched by Arrow (arrow_rows.key_codes and the masks and positions built on it)
against the Python tuples they replace: NULL equals NULL, one key kind read in different Arrow
types (delta-rs's string views and decimals of another precision beside Spark's) still matches,
different kinds never do. And the state's latest row per key (keyed.state.latest_table) against
the loop over its rows."""

from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.arrow_rows import (column_first_values, first_of_each_key, first_values, key_codes, key_tuples, keys_in,
                                positions_of)
from epochal.keyed.state import latest_rows, latest_table
from epochal.narrowing import values_on_driver

VALUE = st.none() | st.integers(0, 3)
KINDS = {
    "integer": ([pa.int32(), pa.int64()], lambda v: v),
    "string": ([pa.string(), pa.large_string(), pa.string_view()], str),
    "decimal": ([pa.decimal128(10, 2), pa.decimal128(18, 2), pa.decimal128(12, 3)], Decimal),
    "boolean": ([pa.bool_()], lambda v: v % 2 == 0),
}


@st.composite
def keyed_tables(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3))
    tables = []
    for _ in range(2):
        rows = draw(st.lists(st.tuples(*[VALUE] * len(kinds)), max_size=20))
        columns = {}
        for i, kind in enumerate(kinds):
            types, convert = KINDS[kind]
            columns[f"k{i}"] = pa.array([None if row[i] is None else convert(row[i]) for row in rows],
                                        draw(st.sampled_from(types)))
        tables.append(pa.table(columns) if rows else pa.table(columns).slice(0, 0))
    return tables, [f"k{i}" for i in range(len(kinds))]


@settings(max_examples=200, deadline=None)
@given(keyed=keyed_tables())
def test_key_codes_match_exactly_where_the_tuples_do(keyed):
    (left, right), columns = keyed
    codes_left, codes_right = key_codes((left, columns), (right, columns))
    tuples_left, tuples_right = key_tuples(left, columns), key_tuples(right, columns)
    for code, key in zip(codes_left, tuples_left):
        assert [code == other for other in codes_right] == [key == other for other in tuples_right]
    assert list(keys_in(left, columns, right, columns)) == [key in set(tuples_right) for key in tuples_left]
    seen, firsts = set(), []
    for i, key in enumerate(tuples_left):
        if key not in seen:
            seen.add(key)
            firsts.append(i)
    assert list(first_of_each_key(left, columns)) == firsts
    plain = left.cast(pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type)
                                 for f in left.schema]))  # Arrow takes no string views
    unique = plain.take(pa.array(firsts, pa.int64()))
    at = {key: i for i, key in enumerate(key_tuples(unique, columns))}
    assert positions_of(right, columns, unique, columns).to_pylist() == [at.get(key) for key in tuples_right]
    assert column_first_values(left.column(columns[0]), right.column(columns[0])) == first_values(tuples_left + tuples_right)


def test_floating_keys_match_as_spark_compares_them():
    """NaN equals NaN and -0.0 equals 0.0 (Spark normalizes both where it groups and joins)."""
    left = pa.table({"k": pa.array([float("nan"), -0.0, 1.5, None])})
    right = pa.table({"k": pa.array([0.0, float("nan"), None], pa.float64())})
    assert list(keys_in(left, ["k"], right, ["k"])) == [True, True, False, True]
    assert list(first_of_each_key(pa.table({"k": [0.0, -0.0, float("nan"), float("nan")]}), ["k"])) == [0, 2]


def test_keys_of_different_kinds_never_match():
    numbers, strings = pa.table({"k": pa.array([1, 2, None])}), pa.table({"k": pa.array(["1", "2", None])})
    assert list(keys_in(numbers, ["k"], strings, ["k"])) == [False, False, True]
    floats, names = pa.table({"k": pa.array([float("nan"), 1.0])}), pa.table({"k": pa.array(["NaN", "nan"])})
    assert list(keys_in(floats, ["k"], names, ["k"])) == [False, False]
    assert list(keys_in(floats, ["k"], floats, ["k"])) == [True, True]


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(VALUE, st.integers(0, 5), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1)), max_size=25),
       wanted=st.lists(st.tuples(VALUE), max_size=4))
def test_latest_state_rows_are_the_loops(rows, wanted):
    """Per key the row of the highest seq (the first of equal ones), unless it is a deletion."""
    data = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "__seq": pa.array([r[1] for r in rows], pa.int64()),
                     "__deleted": pa.array([r[2] for r in rows], pa.bool_()), "v": pa.array([r[3] for r in rows], pa.int64())})
    best = {}
    for k, seq, deleted, v in rows:
        if k not in best or seq > best[k][0]:
            best[k] = (seq, deleted, v)
    expected = {(k,): {"k": k, "v": v} for k, (_, deleted, v) in best.items() if not deleted}
    latest = latest_table(data, ["k"], "__seq", "__deleted")
    assert {(row["k"],): row for row in latest.to_pylist()} == expected
    assert latest_rows(data, ["k"], wanted, "__seq", "__deleted") == {key: expected[key] for key in wanted if key in expected}


def test_string_views_keep_their_nulls():
    """Arrow's unique gives a string view's NULL as "" (pyarrow 26); delta-rs reads strings as views."""
    rows = pa.table({"k": pa.array([None, "x", None, ""], pa.string_view())})
    assert column_first_values(rows.column("k")) == (("", "x"), True)
    assert values_on_driver(rows, "k") == (["", "x"], True)
    assert values_on_driver(rows.slice(1, 1), "k") == (["x"], False)


def test_latest_state_row_of_a_global_aggregate():
    """No keys: the one group's latest row (the wanted key is the empty tuple)."""
    data = pa.table({"__seq": pa.array([1, 2], pa.int64()), "__deleted": [False, False], "v": pa.array([5, 7], pa.int64())})
    assert latest_rows(data, [], [()], "__seq", "__deleted") == {(): {"v": 7}}
