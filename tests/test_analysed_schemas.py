"""Spark's analysed schemas remembered on disk (epochal/storage/schemas.py) answer only the
question they were asked: a new process reads them instead of asking Spark, and an answer
written by other code, for another Spark or another input, is never read. The schemas an
aggregate derives instead of asking are Spark's."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    IntegralType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from epochal.changes import consolidate, consolidated_schema, empty_frame
from epochal.driver.aggregates import state_columns_of, state_types, touched_rows
from epochal.graph import WEIGHT, AggCall, Aggregate, Scan
from epochal.protocol.change import output_frame_of, output_schema
from epochal.protocol.context import Context
from epochal.rules import base
from epochal.rules.aggregate import AggregateRule, new_state, new_state_schema
from epochal.storage import schemas
from epochal.storage.schemas import AnalysedSchemas
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

INPUT = StructType([StructField("g", LongType()), StructField("x", DecimalType(15, 2))])


def _average(frame):
    return frame.groupBy("g").agg(F.avg("x").alias("a"))


def _context(spark, folder):
    return Context(spark, Scan(columns=("g", "x"), table="t"), {}, None, schemas=AnalysedSchemas(str(folder)))


def test_an_analysed_schema_is_read_by_the_next_process_not_asked_again(spark, tmp_path, monkeypatch):
    asked = []

    def counted(frame):
        asked.append(1)
        return _average(frame)

    key = ("average", "test_an_analysed_schema_is_read_by_the_next_process")
    first = base.analysed_schema(_context(spark, tmp_path), key, counted, INPUT)
    assert first == _average(spark.createDataFrame([], INPUT)).schema and len(asked) == 1
    assert first["a"].dataType == DecimalType(19, 6)
    monkeypatch.setattr(base, "_ANALYSED", {})  # a new process
    assert base.analysed_schema(_context(spark, tmp_path), key, counted, INPUT) == first
    assert len(asked) == 1  # read from disk

    other = StructType([StructField("g", LongType()), StructField("x", DecimalType(30, 2))])
    assert base.analysed_schema(_context(spark, tmp_path), key, counted, other)["a"].dataType == DecimalType(34, 6)
    assert len(asked) == 2  # another input schema is another question


def test_a_remembered_schema_is_not_read_by_other_code_or_another_spark(tmp_path, monkeypatch):
    store = AnalysedSchemas(str(tmp_path))
    answer = StructType([StructField("a", LongType())])
    store.put(("q", "4.0.1"), answer)
    assert store.get(("q", "4.0.1")) == answer
    assert store.get(("q", "3.5.0")) is None
    monkeypatch.setattr(schemas, "_FINGERPRINT", "another engine's code")
    assert store.get(("q", "4.0.1")) is None


def test_an_unreadable_remembered_schema_is_asked_again(tmp_path):
    store = AnalysedSchemas(str(tmp_path))
    store.put(("q",), StructType([StructField("a", LongType())]))
    [written] = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    with open(written, "w") as file:
        file.write('{"type": "struct", "fields": [')  # cut short
    assert store.get(("q",)) is None
    blocked = AnalysedSchemas(os.path.join(written, "not-a-folder"))
    blocked.put(("q",), StructType([]))  # cannot write: nothing raised, nothing remembered
    assert blocked.get(("q",)) is None


ARGUMENTS = [LongType(), IntegerType(), DecimalType(15, 2), DecimalType(38, 10), DecimalType(36, 4), DoubleType(),
             FloatType(), StringType(), DateType()]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "global"])
@pytest.mark.parametrize("arg_type", ARGUMENTS, ids=lambda t: t.simpleString())
def test_an_aggregate_change_schema_is_sparks_analysis(spark, arg_type, keyed):
    """The schemas of an aggregate's change and new state, derived from the types its finalize
    casts to (AggregateRule._change_schema, new_state_schema), against Spark's analysis of the
    same expressions over the touched groups' schema: types and nullability alike."""
    numeric = isinstance(arg_type, (IntegralType, DecimalType, DoubleType, FloatType))
    ordered = not isinstance(arg_type, (DoubleType, FloatType))
    aggs = [AggCall("c", "count_star"), AggCall("n", "count", "x")]
    aggs += [AggCall("s", "sum", "x"), AggCall("a", "avg", "x")] if numeric else []
    aggs += [AggCall("lo", "min", "x"), AggCall("hi", "max", "x")] if ordered else []
    keys = ("g",) if keyed else ()
    node = Aggregate(columns=(*keys, *[a.name for a in aggs]), input=Scan(columns=("g", "x"), table="t"),
                     keys=keys, aggs=tuple(aggs))
    input_schema = StructType([StructField("g", LongType()), StructField("x", arg_type)])
    ctx = Context(spark, node, {}, None)
    ctx.memo(node, "input_schema", lambda: input_schema)  # the change batch's schema
    input_types = {f.name: f.dataType for f in input_schema.fields}
    types = state_types(node, input_types)
    assert types is not None
    change = pa.table({"g": pa.array([1], pa.int64()), "x": pa.array([None], to_arrow_schema(input_schema).field("x").type),
                       WEIGHT: pa.array([1], pa.int64())})
    _, touched = touched_rows(node, change, {}, input_types, types, lambda groups: None)
    rule = AggregateRule()
    frame = empty_frame(spark, touched)
    assert rule._change_schema(node, ctx, touched) == rule._change_of(node, ctx, frame).schema
    state_columns = ["__count"] + [s for a in aggs for s in state_columns_of(a)]
    assert new_state_schema(list(keys), state_columns, touched) == new_state(frame, list(keys), state_columns).schema
    strict = StructType([StructField(f.name, f.dataType, f.name.startswith("o__")) for f in touched.fields])
    strict_frame = empty_frame(spark, strict)  # a touched schema whose new state and keys are not nullable
    assert rule._change_schema(node, ctx, strict) == rule._change_of(node, ctx, strict_frame).schema
    assert new_state_schema(list(keys), state_columns, strict) == new_state(strict_frame, list(keys), state_columns).schema


ATOMIC = [LongType(), IntegerType(), DecimalType(38, 10), DoubleType(), StringType(), DateType(), BooleanType(),
          TimestampType()]


@pytest.mark.parametrize("nullable", [True, False], ids=["nullable", "not-nullable"])
def test_the_output_and_consolidated_schemas_are_sparks_analysis(spark, nullable):
    """output_schema and consolidated_schema, derived, against Spark's analysis of the output's
    select and of consolidate over the same rows; a nested column is left to Spark's analysis."""
    root = StructType([StructField(f"c{i}", t, nullable or i % 2 == 0) for i, t in enumerate(ATOMIC)] +
                      [StructField(WEIGHT, LongType(), nullable)])
    table = StructType([StructField(f"out{i}", t, True) for i, t in enumerate(ATOMIC)])
    columns = [f"c{i}" for i in range(len(ATOMIC))]
    frame = empty_frame(spark, root)
    assert output_schema(columns, table, root) == output_frame_of(frame, columns, table).schema
    assert consolidated_schema(root) == consolidate(frame).schema
    nested = StructType([StructField("s", StructType([StructField("a", LongType())])), root[WEIGHT]])
    assert consolidated_schema(nested) is None
    assert output_schema(["s"], StructType([nested["s"]]), nested) is None
    assert output_schema(columns, StructType([StructField("out0", IntegerType())] + table.fields[1:]), root) is None


@pytest.mark.parametrize("arg_type", [LongType(), DecimalType(15, 2), DecimalType(38, 10), DoubleType(), StringType()],
                         ids=lambda t: t.simpleString())
def test_an_aggregate_snapshot_schema_is_sparks_analysis(spark, arg_type):
    """_visible_schema over a state's own columns (an aggregate read whole as a partner) against
    Spark's analysis of _finalize over the same schema, nullable columns and not."""
    numeric = not isinstance(arg_type, StringType)
    aggs = [AggCall("c", "count_star"), AggCall("n", "count", "x")]
    aggs += [AggCall("s", "sum", "x"), AggCall("a", "avg", "x")] if numeric else []
    aggs += [AggCall("lo", "min", "x")] if not isinstance(arg_type, DoubleType) else []
    node = Aggregate(columns=("g", *[a.name for a in aggs]), input=Scan(columns=("g", "x"), table="t"),
                     keys=("g",), aggs=tuple(aggs))
    ctx = Context(spark, node, {}, None)
    ctx.memo(node, "input_schema", lambda: StructType([StructField("g", LongType()), StructField("x", arg_type)]))
    types = {"__count": LongType(), **state_types(node, {"g": LongType(), "x": arg_type})}
    rule = AggregateRule()
    for nullable in (True, False):
        state = StructType([StructField("g", LongType(), nullable)] +
                           [StructField(name, t, nullable) for name, t in types.items()])
        finalized = empty_frame(spark, state).select(F.col("g"), *rule._finalize(node, ctx, ""))
        assert rule._visible_schema(node, ctx, state, ("",)) == finalized.schema
