"""What building an arrangement costs, phase by phase: TPC-H lineitem at a scale (the bench's cached
load), arranged by l_orderkey (the sources' own order) and l_suppkey (random across files) with
the read columns of the seven benchmark queries (`--columns all`: of all 22, as a warehouse of
every TPC-H table arranges it), through `Arrangements.build`, beside the parts it is made of, each
timed alone: a scan of those columns (Spark's noop writer), the same scan range-partitioned and
sorted by the key (noop), the build by Spark (which adds the Delta write in row groups of
ROW_GROUP rows), the local copies of its files the engine makes after it and, up to
DRIVER_BUILD_ROWS rows, the build on the driver.

    .venv/bin/python -m bench.arrangement_builds 1 [--keys l_orderkey l_suppkey] [--columns all]

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
EVERY_QUERY = COLUMNS + ["l_tax", "l_shipinstruct", "l_shipmode"]  # all lineitem columns TPC-H's 22 queries read


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
    parser.add_argument("--columns", choices=["seven", "all"], default="seven",
                        help="the columns the seven benchmark queries read, or all 22 queries")
    parser.add_argument("--work", default="/tmp/epochal-bench")
    arguments = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from bench.__main__ import start_session, tpch_warehouse
    from epochal.keyed.arrangements import DRIVER_BUILD_ROWS, ROWS_PER_FILE, Arrangements
    from epochal.keyed.keyed_files import KeyedFiles
    from epochal.keyed.local_copies import LocalCopies

    spark = start_session("12g")
    base = Path(arguments.work) / f"tpch-{arguments.scale:g}"
    if not (base / "sources" / "lineitem" / "_delta_log").exists():  # the bench's cached load, read only here
        shutil.rmtree(tpch_warehouse(spark, Path(arguments.work), arguments.scale, "builds"), ignore_errors=True)
    source = str(base / "sources" / "lineitem")
    columns = EVERY_QUERY if arguments.columns == "all" else COLUMNS
    frame = spark.read.format("delta").load(source).select(*columns)
    rows = frame.count()
    parts = max(1, -(-rows // ROWS_PER_FILE))
    print(f"lineitem at scale {arguments.scale:g}: {rows:,} rows, {len(columns)} columns, {parts} range partitions",
          flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="arrangement-builds-"))
    try:
        _timed(spark, "scan (noop write)", lambda: frame.write.format("noop").mode("overwrite").save())
        for key in arguments.keys:
            print(f"by {key}:", flush=True)
            _timed(spark, "range-partition + sort (noop write)", lambda: frame.repartitionByRange(parts, F.col(key))
                   .sortWithinPartitions(key).write.format("noop").mode("overwrite").save())
            by_spark = Arrangements(str(scratch / "by_spark"), driver_build_rows=0)
            _timed(spark, "Arrangements.build by Spark", lambda: by_spark.build(spark, source, 0, key, columns))
            copies = KeyedFiles(copies=LocalCopies(str(scratch / "copies")))
            _timed(spark, "its local copies", lambda: copies.copy_table(by_spark.path(source, key), key))
            if rows <= DRIVER_BUILD_ROWS:
                on_driver = Arrangements(str(scratch / "on_driver"))
                _timed(spark, "Arrangements.build on the driver", lambda: on_driver.build(spark, source, 0, key, columns))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
