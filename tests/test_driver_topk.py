"""The driver's top-k (epochal/driver/topk.py) orders rows as Spark's ORDER BY ... LIMIT does,
NULL placement per key and the tie-breakers included; the differential suites (top3, TPC-H Q2)
hold its deltas against recomputes, this pins the ordering over values they rarely draw."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from epochal.driver.topk import expanded, orderable, top_rows
from epochal.graph import TopK
from epochal.rules.topk import ordering
from tests import support  # noqa: F401 - imported while the Delta JAR it reads is there (conftest summary)

SCHEMA = StructType([StructField("n", LongType()), StructField("s", StringType()), StructField("d", DecimalType(7, 2)),
                     StructField("day", DateType()), StructField("b", BooleanType())])
ROW = st.tuples(
    st.one_of(st.none(), st.integers(-3, 3)),
    st.one_of(st.none(), st.sampled_from(["", "a", "B", "ab", "é", "z\u0000"])),
    st.one_of(st.none(), st.sampled_from([Decimal("-1.50"), Decimal("0.00"), Decimal("2.25")])),
    st.one_of(st.none(), st.sampled_from([datetime.date(1999, 12, 31), datetime.date(2026, 1, 1)])),
    st.one_of(st.none(), st.booleans()),
)
ORDER = st.lists(st.tuples(st.sampled_from(SCHEMA.names), st.booleans(), st.booleans()), min_size=1, max_size=3,
                 unique_by=lambda key: key[0])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, max_size=12), order=ORDER, limit=st.integers(1, 6))
def test_the_first_rows_are_sparks(spark, rows, order, limit):
    node = TopK(columns=tuple(SCHEMA.names), input=None, order=tuple(order), limit=limit)
    expected = spark.createDataFrame(rows, SCHEMA).orderBy(*ordering(node)).limit(limit).collect()
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, row)) for row in rows], schema=to_arrow_schema(SCHEMA))
    assert top_rows(arrow, order, limit).to_pylist() == [row.asDict() for row in expected]


def test_floating_point_columns_are_left_to_spark():
    assert orderable(SCHEMA)
    assert not orderable(StructType([StructField("x", DoubleType())]))


def test_use_counts_expand_to_the_multiset():
    counts = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "__count": pa.array([2, 0, 1], pa.int64())})
    assert expanded(counts, "__count").column("k").to_pylist() == [1, 1, 3]
