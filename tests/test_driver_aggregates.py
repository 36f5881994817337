"""The driver's aggregate arithmetic (epochal/driver/aggregates.py) takes Spark's types and refuses
what it would not compute as Spark does. Its results are held against recomputes by the
differential suites (test_differential's group_sums, joined_agg, keyed_sum; the TPC-H batches);
these pin the edges those rarely reach."""

from __future__ import annotations

from datetime import date
from decimal import Context, Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import DecimalType, DoubleType, LongType, StructField, StructType

from epochal.driver.aggregates import (
    _group_in_python,
    _Unsupported,
    adds_exactly,
    decimal_average,
    distinct_transitions,
    finalized_state,
    folded_groups,
    group_change,
    grouped_in_arrow,
    state_types,
    sum_type,
    touched_in_arrow,
    touched_rows,
    use_count_changes,
    weighs_exactly,
)
from epochal.graph import WEIGHT, AggCall, Aggregate, Scan
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

TYPES = ["tinyint", "smallint", "int", "bigint", "decimal(10,2)", "decimal(28,4)", "decimal(38,2)", "double", "float"]


@pytest.mark.parametrize("type_name", TYPES)
def test_the_sum_type_is_sparks(spark, type_name):
    frame = spark.createDataFrame([], f"x {type_name}")
    assert sum_type(frame.schema["x"].dataType) == frame.select(F.sum("x")).schema[0].dataType


@pytest.mark.parametrize("precision,scale", [(15, 2), (17, 10), (18, 7), (20, 10), (28, 7), (38, 6), (38, 10), (38, 18)])
def test_the_exactness_predicates_read_sparks_own_types(spark, precision, scale):
    """weighs_exactly and adds_exactly against the types Spark gives the product with a BIGINT
    weight and the sum of two sums: exact where, and only where, the scale is kept."""
    frame = spark.createDataFrame([], f"x decimal({precision},{scale}), w bigint")
    product = frame.select((F.col("x") * F.col("w")).alias("p")).schema[0].dataType
    assert weighs_exactly(DecimalType(precision, scale)) == (product.scale == scale)
    total = sum_type(DecimalType(precision, scale))
    summed = frame.select(F.sum("x").alias("s")).select((F.col("s") + F.col("s")).alias("t")).schema[0].dataType
    assert adds_exactly(total) == (summed.scale == total.scale)


WIDE = Context(prec=100)
ARGUMENT_TYPES = st.sampled_from([(15, 2), (12, 2), (10, 0), (38, 6), (20, 10), (5, 5), (34, 0), (38, 2), (38, 10),
                                  (38, 18), (30, 12)])


@st.composite
def _groups(draw, precision: int, scale: int) -> list[list[Decimal]]:
    """Groups of values of decimal(precision, scale), near its largest, smallest and zero, and
    sizes whose averages do not end (3, 7) or end just past the average's scale."""
    unit = Decimal(1).scaleb(-scale, context=WIDE)
    largest = 10 ** precision - 1
    value = (st.integers(-largest, largest) | st.sampled_from([0, 1, -1, largest, -largest, largest // 3])).map(
        lambda n: WIDE.multiply(Decimal(n), unit))
    return draw(st.lists(st.lists(value, min_size=1, max_size=9), min_size=1, max_size=6))


@settings(max_examples=10, deadline=None)
@given(data=st.data(), argument=ARGUMENT_TYPES)
def test_a_decimal_average_is_sparks_average(spark, data, argument):
    """decimal_average of a group's sum and count against Spark's own AVG of the group's rows
    (ANSI off, so a sum or an average past its type is NULL there; the driver refuses those)."""
    precision, scale = argument
    groups = data.draw(_groups(precision, scale))
    rows = [(g, v) for g, values in enumerate(groups) for v in values]
    frame = spark.createDataFrame(rows, f"g int, v decimal({precision},{scale})")
    result = DecimalType(min(38, precision + 4), min(38, scale + 4))
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        want = {r["g"]: (r["a"], r["s"]) for r in frame.groupBy("g").agg(F.avg("v").alias("a"), F.sum("v").alias("s"))
                .collect()}
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)
    for g, values in enumerate(groups):
        average, total = want[g]
        if total is None:  # the sum is past its type: the driver's _fit refuses it before averaging
            continue
        if average is None:
            with pytest.raises(_Unsupported):
                decimal_average(total, len(values), result)
        else:
            assert decimal_average(total, len(values), result) == average, (values, argument)


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


FINALIZED_TYPES = ["bigint", "int", "double", "decimal(15,2)", "decimal(38,6)", "decimal(30,12)"]


@settings(max_examples=6, deadline=None)
@given(type_name=st.sampled_from(FINALIZED_TYPES),
       groups=st.lists(st.lists(st.none() | st.integers(-10 ** 6, 10 ** 6), min_size=1, max_size=5),
                       min_size=1, max_size=5))
def test_an_aggregate_snapshot_finalized_on_the_driver_is_sparks(spark, type_name, groups):
    """finalized_state over a state built from Spark's own partial results (COUNT(*), SUM, COUNT,
    MIN, MAX per group; a group of NULLs alone has no sum) against Spark's COUNT(*), COUNT, SUM,
    AVG, MIN, MAX of the same rows: an aggregate read as a snapshot (a scalar subquery, a view
    joined) is finalized in Arrow."""
    rows = [(g, None if v is None else v / 7 if type_name == "double" else v)
            for g, values in enumerate(groups) for v in values]
    frame = spark.createDataFrame(rows, f"g bigint, x {type_name}") if type_name in ("bigint", "int", "double") else \
        spark.createDataFrame([(g, None if v is None else Decimal(v).scaleb(-2)) for g, v in rows],
                              f"g bigint, x decimal(15,2)").select("g", F.col("x").cast(type_name).alias("x"))
    node = _node(AggCall("c", "count_star"), AggCall("n", "count", "x"), AggCall("s", "sum", "x"),
                 AggCall("a", "avg", "x"), AggCall("lo", "min", "x"), AggCall("hi", "max", "x"))
    expected = frame.groupBy("g").agg(F.count("*").alias("c"), F.count("x").alias("n"), F.sum("x").alias("s"),
                                      F.avg("x").alias("a"), F.min("x").alias("lo"), F.max("x").alias("hi"))
    state = frame.groupBy("g").agg(F.count("*").alias("__count"), F.sum("x").alias("s__s"),
                                   F.count("x").alias("s__n"), F.sum("x").alias("a__s"), F.count("x").alias("a__n"),
                                   F.count("x").alias("n__n"), F.min("x").alias("lo__m"), F.max("x").alias("hi__m"))
    state_rows = pa.Table.from_pylist([r.asDict() for r in state.collect()], schema=to_arrow_schema(state.schema))
    found = finalized_state(node, state_rows, expected.schema)
    assert found is not None and found.schema == to_arrow_schema(expected.schema)
    by_group = lambda table: sorted(table.to_pylist(), key=lambda r: r["g"])  # noqa: E731
    want = by_group(pa.Table.from_pylist([r.asDict() for r in expected.collect()], schema=found.schema))
    got = by_group(found)
    if type_name == "double":  # SUM of doubles in another order: compare to the suite's tolerance
        for g, w in zip(got, want):
            for name in ("s", "a"):
                if w[name] is None:
                    assert g[name] is None
                else:
                    assert g[name] == pytest.approx(w[name], rel=1e-12, abs=1e-12)
                g[name] = w[name]
    assert got == want


COUNTED_KEYS = {"int": (pa.int32(), st.integers(-3, 3)), "string": (pa.string(), st.sampled_from(["", "a", "é"])),
                "date": (pa.date32(), st.dates(min_value=date(1969, 12, 31), max_value=date(1970, 1, 2))),
                "decimal": (pa.decimal128(10, 2), st.sampled_from([Decimal("0.00"), Decimal("-1.50")])),
                "boolean": (pa.bool_(), st.booleans())}


FOLDED_VALUES = {
    "bigint": (pa.int64(), st.integers(-(2 ** 40), 2 ** 40)),
    "int": (pa.int32(), st.integers(-9, 9)),
    "decimal(15,2)": (pa.decimal128(15, 2), st.decimals(min_value=-10 ** 6, max_value=10 ** 6, places=2)),
    "decimal(38,10)": (pa.decimal128(38, 10), st.sampled_from([Decimal("1E+20"), Decimal("-0.0000000001"),
                                                                 Decimal("12345678.9"), Decimal(0)])),
    "string": (pa.string(), st.sampled_from(["", "a", "é", "b"])),
    "date": (pa.date32(), st.dates(min_value=date(1969, 12, 31), max_value=date(1970, 1, 2))),
    "double": (pa.float64(), st.floats(-1e6, 1e6)),
}
SUMMABLE = ("bigint", "int", "decimal(15,2)", "decimal(38,10)", "double")


@settings(max_examples=40, deadline=None)
@given(data=st.data(), kinds=st.lists(st.sampled_from(sorted(COUNTED_KEYS)), max_size=2, unique=True),
       value=st.sampled_from(sorted(FOLDED_VALUES)))
def test_changes_grouped_in_arrow_are_the_row_loops(data, kinds, value):
    """group_change grouped by Arrow against the loop over the rows it stands in for: COUNT(*),
    COUNT, SUM, AVG, MIN and MAX; NULL keys one group, NULL values not counted, weights of either
    sign, no keys at all; a decimal sum that could pass 2**62 in int64 (its largest digits times the
    heaviest weight times the rows) and a SUM of doubles are the loop's."""
    keys = [f"g{i}" for i in range(len(kinds))]
    arrow_type, values = FOLDED_VALUES[value]
    rows = data.draw(st.lists(st.tuples(*[st.none() | COUNTED_KEYS[k][1] for k in kinds], st.none() | values,
                                        st.sampled_from([1, -1, 2, -3])), min_size=1, max_size=30))
    change = pa.table({**{key: pa.array([r[i] for r in rows], COUNTED_KEYS[k][0]) for i, (key, k) in
                          enumerate(zip(keys, kinds))},
                       "x": pa.array([r[-2] for r in rows], arrow_type),
                       WEIGHT: pa.array([r[-1] for r in rows], pa.int64())})
    aggs = [AggCall("c", "count_star"), AggCall("n", "count", "x"), AggCall("d", "count", "x", distinct=True)]
    aggs += [AggCall("lo", "min", "x"), AggCall("hi", "max", "x")] if value != "double" else []
    aggs += [AggCall("s", "sum", "x"), AggCall("a", "avg", "x")] if value in SUMMABLE else []
    node = Aggregate(columns=(*keys, *[a.name for a in aggs]), input=Scan(columns=(*keys, "x"), table="t"),
                     keys=tuple(keys), aggs=tuple(aggs))
    looped = _group_in_python(node, change)
    assert group_change(node, change) == looped
    digits = [abs(r[-2]).scaleb(10) for r in rows if value == "decimal(38,10)" and r[-2] is not None]
    heaviest = max(abs(r[-1]) for r in rows)
    wide = max(digits, default=0) * heaviest * len(rows) >= 2 ** 62
    if value == "double" or wide:
        assert grouped_in_arrow(node, change) is None
    else:
        assert folded_groups(node, grouped_in_arrow(node, change)) == looped


TOUCHED_VALUES = {"bigint": (LongType(), st.integers(-(2 ** 40), 2 ** 40)),
                  "decimal(15,2)": (DecimalType(15, 2), st.decimals(min_value=-10 ** 6, max_value=10 ** 6, places=2)),
                  "decimal(6,2)": (DecimalType(6, 2), st.decimals(min_value=-9999, max_value=9999, places=2))}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), value=st.sampled_from(sorted(TOUCHED_VALUES)), global_=st.booleans(),
       extremes=st.booleans())
def test_touched_groups_in_arrow_are_the_loops(data, value, global_, extremes):
    """touched_in_arrow against touched_rows over the same change and state: groups new and
    held, NULL keys and values, weights of both signs, sums near their type's precision (a
    DECIMAL(6,2) sums as DECIMAL(16,2)), a state whose sum overflowed before; where the loop
    refuses (None) or a MIN/MAX needs recomputing, so does the columnar path."""
    spark_type, values = TOUCHED_VALUES[value]
    keys = () if global_ else ("g",)
    aggs = [AggCall("c", "count_star"), AggCall("n", "count", "x"), AggCall("s", "sum", "x"), AggCall("a", "avg", "x")]
    aggs += [AggCall("lo", "min", "x"), AggCall("hi", "max", "x")] if extremes else []
    node = Aggregate(columns=(*keys, *[a.name for a in aggs]), input=Scan(columns=("g", "x"), table="t"),
                     keys=keys, aggs=tuple(aggs))
    input_types = {"g": LongType(), "x": spark_type}
    types = state_types(node, input_types)
    group = st.none() | st.integers(0, 4)
    rows = data.draw(st.lists(st.tuples(group, st.none() | values, st.sampled_from([1, 1, -1, 2])), min_size=1, max_size=25))
    arrow_x = to_arrow_schema(StructType([StructField("x", spark_type)])).field("x").type
    change = pa.table({"g": pa.array([r[0] for r in rows], pa.int64()), "x": pa.array([r[1] for r in rows], arrow_x),
                       WEIGHT: pa.array([r[2] for r in rows], pa.int64())})
    held_groups = data.draw(st.lists(group, unique=True, max_size=5)) if keys else data.draw(st.sampled_from([[], [None]]))
    state_fields = [StructField("g", LongType())] * bool(keys) + [StructField("__count", LongType())] + \
        [StructField(name, t) for name, t in types.items()]
    state_rows = []
    for g in held_groups:
        total = data.draw(st.none() | values)
        count = data.draw(st.integers(0, 3))
        state = {"__count": count + data.draw(st.integers(0, 2)), "s__s": total, "s__n": count, "a__s": total,
                 "a__n": count, "n__n": count, "lo__m": data.draw(st.none() | values), "hi__m": data.draw(st.none() | values)}
        state_rows.append({**({"g": g} if keys else {}), **{k: v for k, v in state.items() if k in types or k == "__count"}})
    state_schema = to_arrow_schema(StructType(state_fields))
    state_table = pa.Table.from_pylist(state_rows, schema=state_schema)
    old = {((r["g"],) if keys else ()): {k: v for k, v in r.items() if k != "g"} for r in state_rows}
    looped = touched_rows(node, change, old, input_types, types, lambda groups: None)
    columnar = touched_in_arrow(node, grouped_in_arrow(node, change), lambda wanted: state_table, input_types, types)
    deleted_extreme = extremes and any(r[1] is not None and r[2] < 0 for r in rows)
    if looped is None or deleted_extreme:
        assert columnar is None
        return
    assert columnar is not None
    assert columnar[1] == looped[1]
    by_key = lambda table: sorted(table.to_pylist(), key=lambda r: (r.get("g") is None, r.get("g") or 0))  # noqa: E731
    assert by_key(columnar[0]) == by_key(looped[0])
