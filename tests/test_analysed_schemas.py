"""Spark's analysed schemas remembered on disk (epochal/storage/schemas.py) answer only the
question they were asked: a new process reads them instead of asking Spark, and an answer
written by other code, for another Spark or another input, is never read."""

from __future__ import annotations

import os

from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, LongType, StructField, StructType

from epochal.graph import Scan
from epochal.protocol.context import Context
from epochal.rules import base
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
