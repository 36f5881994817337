"""The driver's aggregate arithmetic (epochal/driver_aggregates.py) takes Spark's types and refuses
what it would not compute as Spark does. Its results are held against recomputes by the
differential suites (test_differential's group_sums, joined_agg, keyed_sum; the TPC-H batches);
these pin the edges those rarely reach."""

from __future__ import annotations

from decimal import Context, Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, DoubleType, LongType

from epochal.driver_aggregates import (_summable, _Unsupported, decimal_average, distinct_transitions, division_type,
                                       state_types, sum_type, touched_rows, use_count_changes)
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


WIDE = Context(prec=100)  # the drawn sums exactly, however many digits
ARGUMENT_TYPES = st.sampled_from([(15, 2), (12, 2), (10, 0), (38, 6), (20, 10), (5, 5), (34, 0), (38, 2)])


@st.composite
def _averaged(draw, precision: int, scale: int) -> tuple[Decimal, int]:
    """(sum, count) of `count` values of decimal(precision, scale): their mean times the count plus
    an offset of under the count, half of it included, so that quotients land on rounding edges."""
    count = draw(st.sampled_from([1, 2, 3, 7, 8, 16, 400, 10**6 + 1]) | st.integers(1, 10**9))
    mean = draw(st.integers(-(10**precision - 1), 10**precision - 1) | st.sampled_from([0, 1, -1, 10**precision - 1]))
    offset = draw(st.sampled_from([0, count // 2, -(count // 2), count - 1, 1 - count]) | st.integers(1 - count, count - 1))
    return Decimal(mean * count + offset).scaleb(-scale, context=WIDE), count


@st.composite
def _on_the_edge(draw, scale: int, division_scale: int, result_scale: int) -> tuple[Decimal, int]:
    """(sum, count) whose quotient lies just under a half at the average's scale, so close that
    the division's rounding (to `division_scale` places) lifts it onto the half: rounded twice,
    as Spark does, it goes up; rounded once it would go down."""
    step = 2 * 10 ** (result_scale - scale)
    count = 10 ** max(0, division_scale - result_scale) + draw(st.sampled_from([1, 3, 7, 9, 11, 13]))
    if count % 5 == 0 or count % 2 == 0:
        count += 2
    inverse = pow(count, -1, step) + step * draw(st.integers(0, 50))
    return Decimal((count * inverse - 1) // step).scaleb(-scale, context=WIDE), count


@settings(max_examples=12, deadline=None, derandomize=True)
@given(data=st.data(), argument=ARGUMENT_TYPES, allow_precision_loss=st.booleans())
def test_a_decimal_average_is_sparks_division_and_cast(spark, data, argument, allow_precision_loss):
    """decimal_average against the expression rules.aggregate._average has Spark evaluate, with
    either allowPrecisionLoss; where Spark raises (the quotient does not fit), the driver refuses."""
    precision, scale = argument
    summed = sum_type(DecimalType(precision, scale))
    result = DecimalType(min(38, precision + 4), min(38, scale + 4))
    _, division_scale = division_type(summed.precision, summed.scale, 20, 0, allow_precision_loss)
    pairs = data.draw(st.lists(_averaged(precision, scale), min_size=1, max_size=12))
    if result.scale - scale > 0 and division_scale > result.scale:
        pairs += data.draw(st.lists(_on_the_edge(scale, division_scale, result.scale), min_size=1, max_size=4))
    pairs = [(total, count) for total, count in pairs if total.adjusted() < summed.precision - summed.scale]
    frame = spark.createDataFrame(pairs, f"t decimal({summed.precision},{summed.scale}), n bigint")
    average = (F.col("t").cast(summed) / F.col("n").cast(DecimalType(20, 0))).cast(result)
    conf = "spark.sql.decimalOperations.allowPrecisionLoss"
    before = spark.conf.get(conf)
    spark.conf.set(conf, str(allow_precision_loss).lower())
    try:
        for (total, count), row in zip(pairs, frame.select(average.alias("a")).collect()):
            assert decimal_average(total, count, summed.precision, summed.scale, result,
                                   allow_precision_loss) == row["a"], (total, count, argument)
    except Exception as error:  # noqa: BLE001 - Spark raised for one pair (ANSI): each alone
        if "pytest" in type(error).__module__ or isinstance(error, AssertionError):
            raise
        for total, count in pairs:
            one = spark.createDataFrame([(total, count)], frame.schema).select(average.alias("a"))
            try:
                want = one.first()["a"]
            except Exception:  # noqa: BLE001
                with pytest.raises(_Unsupported):
                    decimal_average(total, count, summed.precision, summed.scale, result, allow_precision_loss)
                continue
            assert decimal_average(total, count, summed.precision, summed.scale, result, allow_precision_loss) == want
    finally:
        spark.conf.set(conf, before)


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
