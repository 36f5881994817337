"""What building an arrangement costs, phase by phase: TPC-H lineitem at a scale (the bench's cached
load), arranged by l_orderkey (the sources' own order) and l_suppkey (random across files) with
the read columns of the seven benchmark queries, through `Arrangements.build`, beside the parts
it is made of, each timed alone: a scan of those columns (Spark's noop writer), the same scan
range-partitioned and sorted by the key (noop), and the build by Spark (which adds the Delta
write in row groups of ROW_GROUP rows) and, up to DRIVER_BUILD_ROWS rows, on the driver.

    .venv/bin/python -m bench.arrangement_builds 1 [--keys l_orderkey l_suppkey]

Prints seconds and Spark jobs per phase and key.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

COLUMNS = ["l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice", "l_discount",
           "l_returnflag", "l_linestatus", "l_shipdate", "l_commitdate", "l_receiptdate"]


def _timed(spark, label: str, action) -> None:
    group = f"phase-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, label)
    began = time.perf_counter()
    action()
    seconds = time.perf_counter() - began
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    print(f"  {label:<40} {seconds:7.1f} s  {jobs:3d} jobs", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.arrangement_builds", description=__doc__.split("\n\n")[0])
    parser.add_argument("scale", type=float)
    parser.add_argument("--keys", nargs="+", default=["l_orderkey", "l_suppkey"])
    parser.add_argument("--work", default="/tmp/epochal-bench")
    arguments = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from bench.__main__ import start_session, tpch_warehouse
    from epochal.keyed.arrangements import DRIVER_BUILD_ROWS, ROWS_PER_FILE, Arrangements

    spark = start_session("12g")
    base = Path(arguments.work) / f"tpch-{arguments.scale:g}"
    if not (base / "sources" / "lineitem" / "_delta_log").exists():  # the bench's cached load, read only here
        shutil.rmtree(tpch_warehouse(spark, Path(arguments.work), arguments.scale, "builds"), ignore_errors=True)
    source = str(base / "sources" / "lineitem")
    frame = spark.read.format("delta").load(source).select(*COLUMNS)
    rows = frame.count()
    parts = max(1, -(-rows // ROWS_PER_FILE))
    print(f"lineitem at scale {arguments.scale:g}: {rows:,} rows, {parts} range partitions", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="arrangement-builds-"))
    try:
        _timed(spark, "scan (noop write)", lambda: frame.write.format("noop").mode("overwrite").save())
        for key in arguments.keys:
            print(f"by {key}:", flush=True)
            _timed(spark, "range-partition + sort (noop write)", lambda: frame.repartitionByRange(parts, F.col(key))
                   .sortWithinPartitions(key).write.format("noop").mode("overwrite").save())
            by_spark = Arrangements(str(scratch / "by_spark"), driver_build_rows=0)
            _timed(spark, "Arrangements.build by Spark", lambda: by_spark.build(spark, source, 0, key, COLUMNS))
            if rows <= DRIVER_BUILD_ROWS:
                on_driver = Arrangements(str(scratch / "on_driver"))
                _timed(spark, "Arrangements.build on the driver", lambda: on_driver.build(spark, source, 0, key, COLUMNS))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
