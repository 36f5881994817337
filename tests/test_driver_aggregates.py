"""The driver's aggregate arithmetic (epochal/driver_aggregates.py) takes Spark's types and refuses
what it would not compute as Spark does. Its results are held against recomputes by the
differential suites (test_differential's group_sums, joined_agg, keyed_sum; the TPC-H batches);
these pin the edges those rarely reach."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, DoubleType, LongType

from epochal.driver_aggregates import (_summable, distinct_transitions, state_types, sum_type, touched_rows,
                                       use_count_changes)
from epochal.graph import WEIGHT, AggCall, Aggregate, Scan
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

TYPES = ["tinyint", "smallint", "int", "bigint", "decimal(10,2)", "decimal(28,4)", "decimal(38,2)", "double", "float"]


@pytest.mark.parametrize("type_name", TYPES)
def test_the_sum_type_is_sparks(spark, type_name):
    frame = spark.createDataFrame([], f"x {type_name}")
    assert sum_type(frame.schema["x"].dataType) == frame.select(F.sum("x")).schema[0].dataType


def test_a_decimal_whose_product_with_the_weight_loses_scale_is_left_to_spark():
    assert _summable(DecimalType(15, 2)) and _summable(DecimalType(38, 6))
    assert not _summable(DecimalType(20, 10))  # DECIMAL(20,10) * DECIMAL(20,0) rounds to 7 places


def _node(*aggs: AggCall) -> Aggregate:
    scan = Scan(columns=("g", "x"), table="t")
    return Aggregate(columns=("g", *[a.name for a in aggs]), input=scan, keys=("g",), aggs=tuple(aggs))


def test_a_sum_past_its_type_is_left_to_spark():
    node = _node(AggCall("s", "sum", "x"))
    input_types = {"g": LongType(), "x": DecimalType(2, 0)}
    types = state_types(node, input_types)
    assert types["s__s"] == DecimalType(12, 0)
    change = pa.table({"g": pa.array([1], pa.int64()), "x": pa.array([Decimal("99")], pa.decimal128(2, 0)),
                       WEIGHT: pa.array([1], pa.int64())})
    within = {(1,): {"__count": 1, "s__s": Decimal("1"), "s__n": 1}}
    past = {(1,): {"__count": 1, "s__s": Decimal("999999999999"), "s__n": 1}}
    found = touched_rows(node, change, within, input_types, types, lambda groups: None)
    assert found is not None and found[0].column("n__s__s").to_pylist() == [Decimal("100")]
    assert touched_rows(node, change, past, input_types, types, lambda groups: None) is None


def test_a_min_a_delete_touched_is_recomputed_from_the_input_or_left_to_spark():
    node = _node(AggCall("m", "min", "x"))
    input_types = {"g": LongType(), "x": LongType()}
    types = state_types(node, input_types)
    change = pa.table({"g": pa.array([1, 1], pa.int64()), "x": pa.array([3, 5], pa.int64()),
                       WEIGHT: pa.array([-1, 1], pa.int64())})
    old = {(1,): {"__count": 2, "m__m": 3}}
    assert touched_rows(node, change, old, input_types, types, lambda groups: None) is None
    rows = pa.table({"g": pa.array([1, 1, 2], pa.int64()), "x": pa.array([5, 4, 0], pa.int64())})
    found = touched_rows(node, change, old, input_types, types, lambda groups: rows)
    assert found is not None and found[0].column("n__m__m").to_pylist() == [4]
    assert found[0].column("n____count").to_pylist() == [2]


def test_count_distinct_follows_its_use_counts_across_zero():
    node = _node(AggCall("d", "count", "x", distinct=True))
    input_types = {"g": LongType(), "x": LongType()}
    types = state_types(node, input_types)
    assert types == {"d__n": LongType()}
    # group 1: x=7 goes 2 -> 0 (one value fewer), x=8 appears (one more), x=9 stays held (2 -> 1);
    # group 2: a NULL x counts no value, x=5 appears and leaves in the same batch (no transition)
    change = pa.table({"g": pa.array([1, 1, 1, 1, 2, 2, 2], pa.int64()),
                       "x": pa.array([7, 7, 8, 9, None, 5, 5], pa.int64()),
                       WEIGHT: pa.array([-1, -1, 1, -1, 1, 1, -1], pa.int64())})
    counted = use_count_changes(["g"], "x", change)
    assert counted == {(1, 7): -2, (1, 8): 1, (1, 9): -1}
    old_counts = {(1, 7): {"__count": 2}, (1, 9): {"__count": 2}}
    after, per_group = distinct_transitions(counted, old_counts, "__count")
    assert after == {(1, 7): 0, (1, 8): 1, (1, 9): 1} and per_group == {(1,): 0}
    old = {(1,): {"__count": 5, "d__n": 2}, (2,): {"__count": 1, "d__n": 1}}
    found = touched_rows(node, change, old, input_types, types, lambda groups: None, {"d": per_group})
    assert found is not None
    rows = {g: (n, before) for g, n, before in zip(*[found[0].column(c).to_pylist() for c in ("g", "n__d__n", "o__d__n")])}
    assert rows == {1: (2, 2), 2: (1, 1)}
    assert distinct_transitions({(3, 1): 1, (3, 2): -1}, {(3, 2): {"__count": 1}}, "__count")[1] == {(3,): 0}
    assert distinct_transitions({(3, 1): 2}, {}, "__count")[1] == {(3,): 1}


def test_count_distinct_of_a_floating_point_value_is_left_to_spark():
    node = _node(AggCall("d", "count", "x", distinct=True))
    assert state_types(node, {"g": LongType(), "x": DoubleType()}) is None
