"""The `matches_full_recompute` check's comparison (resources.quality.compare_frames) against a
reference computed in Python: two random multisets of rows with duplicates, NULLs, NaN, -0.0
and DOUBLE values that drift by less than the tolerance, in real Spark frames. The counts of rows
too many and missing, the sides' row counts and the samples must be the reference's."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resources.quality import RELATIVE_TOLERANCE, compare_frames
from tests.support import local_frame

SCHEMA = "k int, `a name` string, x double"
DOUBLES = st.sampled_from([None, 0.0, -0.0, 1.5, 1e6, float("nan"), float("inf")])
ROW = st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.sampled_from([None, "", "é", "b"]), DOUBLES)
DRIFT = 1 + RELATIVE_TOLERANCE / 10


def _key(value):
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0  # -0.0 groups with 0.0
    return value


def reference(actual: list[tuple], expected: list[tuple]) -> tuple[int, int]:
    """(rows too many, rows missing): exact multiset difference, then leftovers paired when their
    DOUBLE differs by at most the relative tolerance."""
    left = Counter(tuple(map(_key, r)) for r in actual)
    right = Counter(tuple(map(_key, r)) for r in expected)
    extra, missing = list((left - right).elements()), list((right - left).elements())
    unmatched = 0
    for row in extra:
        match = next((m for m in missing if m[:2] == row[:2] and _close(row[2], m[2])), None)
        if match is None:
            unmatched += 1
        else:
            missing.remove(match)
    return unmatched, len(missing)


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if a == "NaN" or b == "NaN":
        return a == b
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)


@st.composite
def frames(draw):
    """A table and its recompute: the recompute's rows, some dropped, some added, some DOUBLEs
    drifted within the tolerance."""
    expected = draw(st.lists(ROW, max_size=8))
    actual = []
    for row in expected:
        fate = draw(st.sampled_from(["keep", "keep", "drop", "double", "drift"]))
        if fate == "keep":
            actual.append(row)
        elif fate == "double":
            actual += [row, row]
        elif fate == "drift" and isinstance(row[2], float) and math.isfinite(row[2]):
            actual.append((row[0], row[1], row[2] * DRIFT))
    actual += draw(st.lists(ROW, max_size=3))
    return actual, expected


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=frames())
def test_the_recompute_comparison_counts_what_python_counts(spark, pair):
    actual, expected = pair
    schema = spark.createDataFrame([], SCHEMA).schema
    comparison = compare_frames(local_frame(spark, actual, schema), local_frame(spark, expected, schema))
    extra, missing = reference(actual, expected)
    assert (comparison.rows, comparison.expected_rows) == (len(actual), len(expected))
    assert (comparison.extra, comparison.missing) == (extra, missing), (actual, expected)
    assert comparison.equal == (extra == missing == 0)
    assert len(comparison.sample_extra) == min(extra, 10) and len(comparison.sample_missing) == min(missing, 10)
    assert comparison.approximate_columns == ["x"]


def test_without_doubles_every_difference_counts_even_past_the_limit(spark):
    schema = spark.createDataFrame([], "k int, g string").schema
    actual = [(k % 4, "a") for k in range(30)] + [(None, None)] * 3
    expected = [(k % 4, "a") for k in range(25)] + [(9, "b")]
    comparison = compare_frames(local_frame(spark, actual, schema), local_frame(spark, expected, schema), limit=2)
    assert (comparison.rows, comparison.expected_rows, comparison.extra, comparison.missing) == (33, 26, 8, 1)
    extra = Counter(actual) - Counter(expected)
    assert len(comparison.sample_extra) == 3 and not Counter(comparison.sample_extra) - extra  # limit + 1 fetched
    assert comparison.sample_missing == [(9, "b")]
