"""Key-range filters (epochal/narrowing.py) read a superset of a join partner's matching rows. A
filter is built from a batch's distinct keys, sorted, and beyond MAX_RANGES distinct keys it is
ranges between sorted neighbours: the sort must be Spark's order, or a range between misordered
values misses rows (Python's sort is undefined around NaN, which Spark orders above every number)."""

from __future__ import annotations

import logging
import math
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark.sql import functions as F

from epochal import Engine
from epochal.narrowing import MAX_RANGES, distinct_values, exactly_ordered, ranges_filter
from tests.conformance import bag, stored
from tests.support import SyntheticSource, assert_matches_recompute

FLOATS = st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf]) | st.integers(-10_000, 10_000).map(lambda n: n / 4)
SETTINGS = settings(max_examples=int(os.environ.get("EPOCHAL_EXAMPLES", "3")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SETTINGS
@given(batch=st.lists(FLOATS, min_size=MAX_RANGES + 1, max_size=3 * MAX_RANGES),
       partner=st.lists(FLOATS, min_size=1, max_size=3 * MAX_RANGES))
def test_a_range_filter_keeps_every_partner_row_the_join_matches(spark, batch, partner):
    batch_frame = spark.createDataFrame([(x,) for x in batch], "x double")
    partner_frame = spark.createDataFrame([(i, y) for i, y in enumerate(partner)], "id int, y double")
    keys, _ = distinct_values(batch_frame, "x")
    kept = {row.id for row in partner_frame.where(ranges_filter("y", list(keys))).collect()}
    matched = {row.id for row in partner_frame.join(batch_frame, partner_frame.y == batch_frame.x, "left_semi").collect()}
    assert matched <= kept, f"rows the join matches, filtered out: {sorted(matched - kept)}"


@pytest.mark.long  # the Spark path, as the conformance suite's struct runs (make test-long)
def test_partners_joined_on_a_struct_are_read_whole_and_the_join_stays_exact(spark, warehouse):
    """A join on a struct column, on the Spark path: the partner is not filtered to key ranges
    (Spark makes no literal of a struct, and files keep no statistics of one), and each epoch's
    change joins it exactly (a conformance run failed with UNSUPPORTED_FEATURE.LITERAL_TYPE)."""
    root = f"{warehouse}/struct-join"
    schema = "id int, x struct<a:int,b:string>"
    t = SyntheticSource(spark, f"{root}/sources/t", schema, [(i, (i % 3, f"b{i % 2}")) for i in range(8)])
    u = SyntheticSource(spark, f"{root}/sources/u", schema, [(i, (i % 3, f"b{i % 2}")) for i in range(4)])
    engine = Engine(spark, root, cost_model=False, driver_rows=0)
    engine.source("t")
    engine.source("u")
    engine.define_all({"inner_on_x": "SELECT t.id, u.id AS uid, t.x FROM t JOIN u ON t.x = u.x",
                       "full_on_x": "SELECT t.id, u.id AS uid, u.x FROM t FULL OUTER JOIN u ON t.x = u.x"})
    engine.refresh()
    for change in range(3):
        t.insert([(100 + change, (change, "b0")), (200 + change, (-3, "B\N{GRINNING FACE}"))])
        u.delete(f"id = {change}")
        u.insert([(300 + change, (-3, "B\N{GRINNING FACE}"))])
        reports = engine.refresh()
        assert {r.technique for r in reports} == {"incremental"}, reports
        for name in ("inner_on_x", "full_on_x"):
            names = [f.name for f in engine.table(name).schema.fields]
            assert bag(stored(engine, name), names) == bag(engine.recompute(name).toArrow(), names), name


@pytest.mark.parametrize("a,b", [("decimal(15,2)", "decimal(19,6)"), ("decimal(36,2)", "decimal(38,6)"),
                                 ("int", "double"), ("bigint", "double"), ("int", "decimal(10,2)"),
                                 ("bigint", "decimal(38,0)"), ("bigint", "decimal(38,20)"), ("date", "date"),
                                 ("double", "float"), ("string", "int")])
def test_a_span_is_read_only_where_spark_compares_the_two_types_exactly(spark, a, b):
    """exactly_ordered: where Spark compares the two in a type keeping every digit of both (past
    38 digits it rounds the finer operand: DECIMAL(36,2) against DECIMAL(38,6) in DECIMAL(38,4)),
    or doubles with integers of at most 32 bits (a BIGINT rounds as a DOUBLE). The analysed plan
    shows the casts when it fails."""
    frame = spark.createDataFrame([], f"x {a}, y {b}")
    plan = frame.filter(F.col("x") < F.col("y"))._jdf.queryExecution().analyzed().toString()
    ordered = exactly_ordered(frame.schema["x"].dataType, frame.schema["y"].dataType)
    expected = {("decimal(15,2)", "decimal(19,6)"): True, ("decimal(36,2)", "decimal(38,6)"): False,
                ("int", "double"): True, ("bigint", "double"): False, ("int", "decimal(10,2)"): True,
                ("bigint", "decimal(38,0)"): True, ("bigint", "decimal(38,20)"): False, ("date", "date"): True,
                ("double", "float"): False, ("string", "int"): False}[(a, b)]
    assert ordered == expected, plan


def test_a_join_read_expected_far_larger_than_another_waits_for_it(spark, warehouse, caplog):
    """TPC-H Q5's shape: a supplier's change joins customers by nation (every customer of the
    nation) and line items by supplier (a few). With both arranged, the estimate from the
    arrangements' bounds makes the nation's read wait: the line items are read first, and the
    customers by c_custkey for those line items only. The table equals its recompute."""
    root = f"{warehouse}/outsized"
    s = SyntheticSource(spark, f"{root}/sources/s", "sk int, snk int", [(i, i % 2) for i in range(20)])
    SyntheticSource(spark, f"{root}/sources/c", "ck int, cnk int", [(i, i % 2) for i in range(20_000)])
    SyntheticSource(spark, f"{root}/sources/l", "lk int, lsk int, lck int, v int",
                    [(i, i % 20, (i * 7) % 20_000, i) for i in range(2_000)])
    engine = Engine(spark, root, cost_model=False, arrange_rows=0, driver_rows=5_000)  # c is not read whole
    for name in ("s", "c", "l"):
        engine.source(name)
    engine.define_all({"per_nation": "SELECT snk, count(*) AS n, sum(v) AS v FROM s, l, c "
                                     "WHERE l.lsk = s.sk AND l.lck = c.ck AND c.cnk = s.snk GROUP BY snk"})
    engine.refresh()
    for epoch in range(2):
        s.update(f"sk = {epoch}", {"snk": "1 - snk"})
        with caplog.at_level(logging.DEBUG, logger="epochal"):
            caplog.clear()
            reports = engine.refresh()
        assert {r.technique for r in reports} == {"incremental"}, reports
        assert_matches_recompute(engine, context=f"epoch {epoch + 1}")
        log = caplog.text
        assert "join reads waiting for smaller ones" in log and "by cnk" in log, log
        assert not re.search(r"sources/c version \d+ for \d+ values of cnk", log), log
        assert re.search(r"sources/c version \d+ for \d+ values of ck on the driver from its arrangement", log), log
