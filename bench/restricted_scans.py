"""What key-restricted co-generator scans buy, measured with Spark's own scan metrics.

TPC-H at scale 0.1 (orders and lineitem range-partitioned on the order key in 8+ files), TPC-H
Q5 and a chain of three derived tables, maintained by two engines over the same sources: one with
every optimizer pass, one without `restrict_cogenerators`. Each hourly change batch is applied
once; both engines then run the same epoch, and the scan nodes of the SQL executions each ran
(Spark's SQLAppStatusStore: "number of files read", "number of output rows") are summed per source,
split into change-feed reads and snapshot (co-generator) reads. Both engines' tables are checked
against the full recompute. Prints `explain` of Q5 and of the chain's tables first.

    .venv/bin/python -m bench.restricted_scans [--scale 0.1] [--batches 3] [--warehouse DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
CHAIN = {
    "recent_lines": "SELECT o_orderkey, o_custkey, o_orderdate, l_linenumber, "
                    "l_extendedprice * (1 - l_discount) AS revenue "
                    "FROM orders JOIN lineitem ON l_orderkey = o_orderkey WHERE o_orderdate >= DATE '1997-01-01'",
    "customer_revenue": "SELECT o_custkey, count(*) AS line_count, sum(revenue) AS revenue "
                        "FROM recent_lines GROUP BY o_custkey",
    "revenue_bands": "SELECT CAST(revenue / 100000 AS INT) AS band, count(*) AS customers "
                     "FROM customer_revenue GROUP BY CAST(revenue / 100000 AS INT)",
}
CHANGE_INDEXES = ("TahoeChangeFileIndex", "CdcAddFileIndex", "TahoeRemoveFileIndex")


def _store(spark):
    return spark._jsparkSession.sharedState().statusStore()


def last_execution(spark) -> int:
    executions = _store(spark).executionsList()
    return max([executions.apply(i).executionId() for i in range(executions.size())] or [-1])


def scans_since(spark, after: int) -> list[tuple[str, dict]]:
    """(plan node description, metrics) of every file scan in SQL executions after `after`."""
    store = _store(spark)
    executions = store.executionsList()
    found = []
    for i in range(executions.size()):
        execution_id = executions.apply(i).executionId()
        if execution_id <= after:
            continue
        values = store.executionMetrics(execution_id)
        nodes = store.planGraph(execution_id).allNodes()
        for k in range(nodes.size()):
            node = nodes.apply(k)
            if not node.name().startswith("Scan parquet"):
                continue
            metrics = {}
            for m in range(node.metrics().size()):
                metric = node.metrics().apply(m)
                value = values.get(metric.accumulatorId())
                metrics[metric.name()] = value.get() if value.isDefined() else None
            found.append((node.desc(), metrics))
    return found


def _number(text) -> int:
    return int(re.sub(r"[^0-9]", "", text or "0") or 0)


def summarize(scans, root: str) -> dict[str, dict[str, int]]:
    """Per input table (source or derived): files and rows read by change-feed reads and by
    snapshot reads. `root` is the folder holding both engines' warehouses."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for description, metrics in scans:
        match = re.search(re.escape(root) + r"/\w+/(?:sources|tables)/(\w+)", description)
        if match is None:
            continue
        kind = "change" if any(index in description for index in CHANGE_INDEXES) else "snapshot"
        totals[match.group(1)][f"{kind}_files"] += _number(metrics.get("number of files read"))
        totals[match.group(1)][f"{kind}_rows"] += _number(metrics.get("number of output rows"))
    return totals


def engine_for(spark, root: str, sources_root: str, passes=None):
    from epochal import Engine

    engine = Engine(spark, root, passes=passes, parallelism=1)
    for source in SOURCES:
        engine.source(source, path=f"{sources_root}/sources/{source}", clock="logical")
    engine.define_all({"tpch_q05": (SQL / "tpch_q05.sql").read_text(), **CHAIN})
    return engine


def main(argv=None) -> None:
    from epochal.planning.optimize import PASSES
    from ops.changes import ChangeGenerator
    from ops.tpch import load_tpch
    from resources.session import SparkSettings, delta_spark_session
    from tests.support import multiset_diff

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--warehouse", default=None, help="folder to use (default: a temporary one, removed)")
    args = parser.parse_args(argv)

    # scan descriptions name the table folder; Spark cuts them at 100 characters by default
    spark = delta_spark_session(SparkSettings(shuffle_partitions=4, ui=False,
                                              extra_conf={"spark.sql.maxMetadataStringLength": "1000"}))
    spark.sparkContext.setLogLevel("ERROR")
    base = args.warehouse or tempfile.mkdtemp(prefix="epochal-restrict-")
    try:
        sources_root = f"{base}/restricted"
        started = time.monotonic()
        load_tpch(spark, sources_root, args.scale, LOADED_AT)
        print(f"TPC-H scale {args.scale} loaded in {time.monotonic() - started:.0f} s")
        without = tuple(p.__name__ for p in PASSES if p.__name__ != "restrict_cogenerators")
        engines = {"restricted": engine_for(spark, sources_root, sources_root),
                   "unrestricted": engine_for(spark, f"{base}/unrestricted", sources_root, without)}
        for name in ("tpch_q05", *CHAIN):
            print("\n" + "=" * 100 + "\n" + engines["restricted"].explain(name))
        for engine in engines.values():
            engine.refresh(until=LOADED_AT + timedelta(minutes=15))
        generator = ChangeGenerator(spark, sources_root, seed=11, fraction=args.fraction)
        print("\nrows and files read per incremental epoch (Spark scan metrics), per source: "
              "change-feed reads | snapshot (co-generator) reads")
        problems = []
        for index in range(1, args.batches + 1):
            generator.apply_batch(index, LOADED_AT + timedelta(hours=index - 1, minutes=30))
            for label, engine in engines.items():
                mark, began = last_execution(spark), time.monotonic()
                reports = engine.refresh(until=LOADED_AT + timedelta(hours=index))
                seconds = time.monotonic() - began
                totals = summarize(scans_since(spark, mark), base)
                techniques = ", ".join(f"{r.table} {r.technique}" for r in reports)
                print(f"\nbatch {index}, {label}: {seconds:.1f} s ({techniques})")
                for source in sorted(totals):
                    t = totals[source]
                    print(f"  {source:9} change {t['change_files']:3} files {t['change_rows']:8} rows | "
                          f"snapshot {t['snapshot_files']:3} files {t['snapshot_rows']:8} rows")
                print(f"  {'all':9} snapshot rows read: {sum(t['snapshot_rows'] for t in totals.values())}, "
                      f"snapshot files read: {sum(t['snapshot_files'] for t in totals.values())}")
                problems += [p for p in (multiset_diff(engine, n) for n in engine.tables()) if p]
        print("\nresults equal the full recompute" if not problems else "\n".join(problems))
    finally:
        if args.warehouse is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
