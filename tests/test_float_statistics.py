"""Spark's filtered reads of the tables the engine commits on the driver, with NaN in FLOAT and
DOUBLE columns.

Spark prunes Parquet row groups (and Delta files) by their min/max statistics. Parquet's min/max of
a floating column leave NaN out (arrow's writer, under delta-rs; delta-rs's log statistics are taken
from them), while Spark orders NaN above every number: a read filtered by `x > 2` or `x = NaN`
skipped the row groups holding NaN and silently missed their rows, for a user querying a derived
table and for a table reading another. The engine's driver commits now write no statistics for
floating columns (storage/commits.writer_properties); Spark's own writer (parquet-mr) writes no
min/max for a chunk holding NaN. Found reading the stack, not by a mismatch: the test oracles read
their inputs by delta-rs, without Spark's pruning."""

from __future__ import annotations

import math
import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F

from epochal import Engine
from tests.conformance import bag, stored
from tests.support import Oracle, SyntheticSource

SCHEMA = "id int, k int, x double, f float, s struct<x: double, n: int>"
ROWS = [(1, 0, 1.0, 1.0, (1.0, 1)), (2, 0, 5.0, 5.0, (5.0, 2)), (3, 1, -1.0, -1.0, (-1.0, 3))]
# each filter as SQL, with the column it reads
FILTERS = [("x", "x > 2"), ("x", "x = double('NaN')"), ("x", "x >= double('NaN')"), ("x", "x < 0"),
           ("f", "f > 2"), ("f", "f = float('NaN')"), ("s", "s.x > 2")]
TABLES = {
    "copied": "SELECT id, k, x, f, s FROM t",
    "highest": "SELECT k, max(x) AS x, max(f) AS f, count(*) AS n FROM t GROUP BY k",
    "above": "SELECT id, x FROM copied WHERE x > 2",  # reads a table the engine committed on the driver
}


def _filtered_reads_agree(engine) -> None:
    """Each table read whole by Spark equals it as delta-rs reads it; each filter over it, read by
    Spark as a user reads it, equals the same filter over Spark's recompute of its SQL."""
    for name in TABLES:
        names = [f.name for f in engine.table(name).schema.fields]
        held = engine.spark.read.format("delta").load(engine.path_of(name))
        assert bag(held.toArrow(), names) == bag(stored(engine, name), names)
        filters = [condition for column, condition in FILTERS if column in names]
        # The recompute's rows with each filter's verdict, in one job: only the stored table's
        # reads need to be filtered by Spark, where its pruning by statistics could drop rows.
        verdicts = engine.recompute(name).select(
            *names, *[F.coalesce(F.expr(c), F.lit(False)).alias(f"_kept{i}") for i, c in enumerate(filters)]
        ).toArrow()
        for i, condition in enumerate(filters):
            got = bag(held.filter(condition).select(*names).toArrow(), names)
            want = bag(verdicts.filter(verdicts.column(f"_kept{i}")).select(names), names)
            assert got == want, f"{name} WHERE {condition}: Spark read {sorted(got.items(), key=str)}, " \
                                f"recompute {sorted(want.items(), key=str)}"


# arranged: the arrangements' driver builds and appends write through the same writer settings (make test-long)
@pytest.mark.parametrize("arranged", [pytest.param(False, id="unarranged"),
                                      pytest.param(True, id="arranged", marks=pytest.mark.long)])
def test_filtered_spark_reads_of_driver_commits_keep_nan_rows(spark, warehouse, arranged):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    source = SyntheticSource(spark, f"{root}/sources/t", SCHEMA, ROWS)
    engine = Engine(spark, root, cost_model=False, driver_rows=50_000, arrange_rows=0 if arranged else None)
    engine.source("t")
    engine.define_all(TABLES)
    engine.refresh()
    source.insert([(4, 0, math.nan, math.nan, (math.nan, 4)), (5, 1, 3.0, 3.0, (3.0, 5))])
    reports = engine.refresh()
    assert {r.table: r.technique for r in reports} == {name: "incremental" for name in TABLES}, \
        [(r.table, r.technique, r.reason) for r in reports]
    _filtered_reads_agree(engine)
    source.insert([(6, 1, math.nan, math.inf, (math.inf, 6))])
    source.delete("id = 2")
    engine.refresh()
    _filtered_reads_agree(engine)


@pytest.mark.long  # the Spark path (driver_rows=0): make test-long
def test_a_join_on_a_floating_key_finds_nan_partners_in_a_source_another_writer_wrote(spark, warehouse):
    """A source written by an arrow-based writer (delta-rs here; pandas and polars write alike)
    carries Parquet min/max without NaN. Through Spark (`driver_rows=0`), a join term's partner
    read was filtered to the change's key ranges, and Spark's pruning by those statistics dropped
    the partner rows whose key is NaN, which the recompute (no such filter) joins: the engine no
    longer narrows a read by ranges of a FLOAT or DOUBLE column (epochal/narrowing.py)."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    source = SyntheticSource(spark, f"{root}/sources/t", "id int, x double", [(1, 1.0), (2, 2.0)])
    write_deltalake(f"{root}/sources/u", pa.table({"id": pa.array([10, 11, 12], pa.int32()),
                                                   "y": pa.array([math.nan, 1.0, 7.0])}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    engine = Engine(spark, root, cost_model=False, driver_rows=0, arrange_rows=None)
    engine.source("t")
    engine.source("u")
    engine.define("joined", "SELECT t.id AS tid, u.id AS uid, x, y FROM t JOIN u ON t.x = u.y")
    engine.refresh()
    for change in (lambda: source.insert([(3, math.nan), (4, 7.0)]), lambda: source.delete("id = 3")):
        change()
        [report] = engine.refresh()
        assert report.technique == "incremental", report.reason
        names = ["tid", "uid", "x", "y"]
        assert bag(stored(engine, "joined"), names) == bag(Oracle(engine).frame("joined").toArrow(), names)
