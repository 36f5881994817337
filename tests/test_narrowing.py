"""Key-range filters (epochal/narrowing.py) read a superset of a join partner's matching rows. A
filter is built from a batch's distinct keys, sorted, and beyond MAX_RANGES distinct keys it is
ranges between sorted neighbours: the sort must be Spark's order, or a range between misordered
values misses rows (Python's sort is undefined around NaN, which Spark orders above every number)."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.narrowing import MAX_RANGES, distinct_values, ranges_filter

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
