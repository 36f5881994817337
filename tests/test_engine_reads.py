"""`Engine.read` and `Engine.inserted` with `local=True` (the Dagster checks' reads): a small
table is read by delta-rs into a local relation, and must hold exactly the rows Spark's Delta
reader gives, type by type; a table past `driver_rows` is read by Spark."""

from __future__ import annotations

import os
import uuid
from datetime import date, datetime
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal import Engine
from epochal.arrow_rows import LocalFrame
from tests.support import SyntheticSource, as_multiset

SCHEMA = ("k INT, d DECIMAL(38,10), s STRING, day DATE, at TIMESTAMP, x DOUBLE, b BOOLEAN, "
          "raw BINARY, n BIGINT")
SQL = "SELECT k, d, s, day, at, x, b, raw, n FROM a WHERE k >= 0"
EXAMPLES = int(os.environ.get("EPOCHAL_EXAMPLES", "2"))


def nullable(values):
    return st.none() | values


ROW = st.tuples(
    st.integers(-3, 40),
    nullable(st.decimals(min_value=Decimal("-1e27"), max_value=Decimal("1e27"), places=10, allow_nan=False)),
    nullable(st.text(max_size=6)),
    nullable(st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31))),
    nullable(st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1))),
    nullable(st.floats(allow_nan=True, allow_infinity=True, width=64)),
    nullable(st.booleans()),
    nullable(st.binary(max_size=5)),
    nullable(st.integers(-2**63, 2**63 - 1)),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(ROW, min_size=1, max_size=12), added=st.lists(ROW, max_size=8),
       dropped=st.integers(-3, 40))
def test_local_reads_hold_what_spark_reads(spark, warehouse, first, added, dropped):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, first)
    engine = Engine(spark, root)
    engine.source("a", f"{root}/sources/a")
    engine.define("t", SQL)
    engine.refresh()
    before = engine.table("t").ledger.last_committed().output_version
    a.insert(added)
    a.delete(f"k = {dropped}")
    a.update("k % 2 = 0", {"s": "concat(s, 'é')", "n": "n DIV 2"})
    engine.refresh()
    after = engine.table("t").ledger.last_committed().output_version

    local = engine.read("t", local=True)
    assert isinstance(local, LocalFrame)
    assert as_multiset(local) == as_multiset(engine.read("t"))
    if after > before:
        inserted = engine.inserted("t", before + 1, after, local=True)
        assert isinstance(inserted, LocalFrame)
        assert inserted.schema == engine.table("t").schema
        assert as_multiset(inserted) == as_multiset(engine.inserted("t", before + 1, after))


def test_a_table_past_driver_rows_is_read_by_spark(spark, warehouse):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    rows = [(k, None, "v", None, None, 1.0, True, None, k) for k in range(10)]
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, rows)
    engine = Engine(spark, root)
    engine.source("a", f"{root}/sources/a")
    engine.define("t", SQL)
    engine.refresh()
    a.insert([(k, None, "w", None, None, 2.0, False, None, k) for k in range(10, 20)])
    engine.refresh()
    engine.driver_rows = 4
    version = engine.table("t").ledger.last_committed().output_version
    for frame in (engine.read("t", local=True), engine.inserted("t", version, version, local=True)):
        assert not isinstance(frame, LocalFrame)
    assert engine.read("t", local=True).count() == 20
    assert engine.inserted("t", version, version, local=True).count() == 10
