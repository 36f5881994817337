"""Wide decimals, as finance tables hold them: SUM and AVG of DECIMAL(38,10) and DECIMAL(38,18)
(a Python Decimal lands in Spark as the latter) over epochs of a few hundred inserted, deleted
and updated rows, on the driver's path and on Spark's. A change's weight is a sign, not a
product: DECIMAL(38,s) times a BIGINT weight would need 59 digits, and Spark, capping it at 38,
cuts the scale to 6 and rounds every changed value before it is summed.

`make test` runs each path with one of the two scales, drawn; `make conformance` runs both scales
on both paths."""

from __future__ import annotations

import os
import random
import uuid
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from epochal import Engine
from tests.support import Oracle, SyntheticSource, stored_rows

SQL = "SELECT k, sum(amount) AS total, avg(amount) AS mean, count(amount) AS n, min(amount) AS low, " \
      "max(amount) AS high FROM t GROUP BY k"
GLOBAL_SQL = "SELECT sum(amount) AS total, avg(amount) AS mean FROM t"


def _amount(rng: random.Random, scale: int) -> Decimal:
    integral = rng.randrange(10 ** 10)
    fraction = rng.randrange(10 ** scale)
    sign = -1 if rng.random() < 0.3 else 1
    return sign * (Decimal(integral) + Decimal(fraction).scaleb(-scale))


def _exactly(engine, name: str) -> None:
    got, want = stored_rows(engine, name), Oracle(engine).rows(name)
    assert got == want, f"{name}: too many {sorted((got - want).items(), key=str)[:3]}; " \
                        f"missing {sorted((want - got).items(), key=str)[:3]}"


SCALES = [10, 18] if os.environ.get("EPOCHAL_CONFORMANCE_ROUNDS") else [None]  # None: drawn
# the Spark path (many more jobs per epoch) runs in make test-long
PATHS = ["driver", pytest.param("spark", marks=pytest.mark.long)]


@pytest.mark.parametrize("fixed_scale", SCALES)
@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=1, deadline=None, phases=[Phase.generate],  # a seed does not shrink
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1), drawn_scale=st.sampled_from([10, 18]))
def test_wide_decimal_sums_and_averages_are_exact_after_every_epoch(spark, warehouse, fixed_scale, path, seed,
                                                                     drawn_scale):
    scale = fixed_scale or drawn_scale
    rng = random.Random(seed)
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    schema = f"id int, k int, amount decimal(38,{scale})"
    rows = [(i, rng.randrange(8), _amount(rng, scale)) for i in range(400)]
    source = SyntheticSource(spark, f"{root}/sources/t", schema, rows)
    engine = Engine(spark, root, cost_model=False, driver_rows=50_000 if path == "driver" else 0,
                    arrange_rows=None)
    engine.source("t")
    engine.define_all({"by_k": SQL, "overall": GLOBAL_SQL})
    engine.refresh()
    next_id = len(rows)
    for _ in range(2):
        inserted = [(next_id + i, rng.randrange(8), _amount(rng, scale)) for i in range(150)]
        inserted += inserted[:3]  # duplicate rows: a weight of 2 in the consolidated change
        next_id += 150
        source.insert(inserted)
        source.delete(f"id % 7 = {rng.randrange(7)}")
        source.update(f"id % 11 = {rng.randrange(11)}", {"amount": f"amount + {_amount(rng, scale)}"})
        reports = engine.refresh()
        assert {r.technique for r in reports} == {"incremental"}, [(r.table, r.technique, r.reason) for r in reports]
        _exactly(engine, "by_k")
        _exactly(engine, "overall")


@pytest.mark.parametrize("path", PATHS)
def test_a_sum_past_its_type_refuses_the_step_and_the_table_is_recomputed(spark, warehouse, path):
    """Spark's SUM of DECIMAL(38,0) past 38 digits is NULL (ANSI off): the state then no longer
    holds the sum, so every step that would add to it is refused (NOT_EXACT) before anything is
    written, and the table is recomputed, exact, until the sum is back within its type."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    big = Decimal(9 * 10 ** 37)
    source = SyntheticSource(spark, f"{root}/sources/t", "id int, k int, amount decimal(38,0)",
                             [(i, 0, big) for i in range(3)] + [(10, 1, Decimal(5))])
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        engine = Engine(spark, root, cost_model=False, driver_rows=50_000 if path == "driver" else 0,
                        arrange_rows=None)
        engine.source("t")
        engine.define("by_k", "SELECT k, sum(amount) AS total, count(*) AS n FROM t GROUP BY k")
        engine.refresh()
        _exactly(engine, "by_k")  # group 0's sum is NULL, as Spark's own
        source.insert([(11, 0, Decimal(1)), (12, 1, Decimal(2))])
        [report] = engine.refresh()
        assert (report.technique, report.reason.split(":")[0]) == ("rescan", "NOT_EXACT"), report.reason
        assert "went past its type decimal(38,0)" in report.reason
        _exactly(engine, "by_k")
        source.delete("id IN (0, 1)")  # group 0 is back within its type
        [report] = engine.refresh()
        assert (report.technique, report.reason.split(":")[0]) == ("rescan", "NOT_EXACT"), report.reason
        _exactly(engine, "by_k")
        source.insert([(13, 0, Decimal(7))])
        [report] = engine.refresh()
        assert report.technique == "incremental", report.reason
        _exactly(engine, "by_k")
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)
