"""Where an asset's refresh goes in the Dagster run (bench.dagster_run): each asset applies its
partition as its own epoch, in a process of its own, so an engine call per asset pays what one
refresh of all tables pays once. This replays the hourly job's engine calls in one process, on a
copy of the warehouse bench.dagster_run prepared, asset by asset as assets/partitions.py makes
them (`engine.epoch` for the partition, then `engine.refresh([table], upstream=False)`), and
prints per asset: the two calls' seconds, the step's own seconds and phases, and what the refresh
did to the arrangements and how long each took.

    python -m bench.partition_profile [--prepared /tmp/epochal-bench/dagster-1-2-0.001] [--tables tpch_q12 ...]

Spark and Dagster's own costs (process, session, checks) are bench.dagster_run's to measure. The
copy stands at another path and keeps the arrangements and local copies it holds (each is named by
its input's path within the warehouse), as each side of bench.dagster_run does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
SQL = REPOSITORY / "assets" / "sql"


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.partition_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepared", default="/tmp/epochal-bench/dagster-1-2-0.001",
                        help="a warehouse bench.dagster_run prepared (it is copied, not changed)")
    parser.add_argument("--tables", nargs="*", help="assets to refresh, in order (default: every asset of the run)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    from epochal import Engine
    from ops.tpch import TPCH_TABLES
    from resources.session import SparkSettings, delta_spark_session

    args = parse(argv)
    prepared = Path(args.prepared)
    run = json.loads((prepared / "bench.json").read_text())
    end = datetime.strptime(run["partition"], "%Y-%m-%d-%H:%M").replace(tzinfo=timezone.utc) + timedelta(hours=1)
    tables = args.tables or run["assets"]
    root = Path(tempfile.mkdtemp(prefix="epochal-partition-profile-"))
    began = time.perf_counter()
    for part in ("sources", "tables", "_epochal"):
        shutil.copytree(prepared / part, root / part, symlinks=True)
    print(f"copied {prepared} to {root} in {time.perf_counter() - began:.0f}s; partition ending {end.isoformat()}",
          flush=True)

    spark = delta_spark_session(SparkSettings())
    engine = Engine(spark, str(root))
    definitions = {name: (SQL / f"{name}.sql").read_text() for name in run["assets"]}
    for name in TPCH_TABLES:
        engine.source(name, clock="logical")
    engine.define_all(definitions)
    tables = [name for name in engine.tables() if name in tables]  # upstream first, as Dagster orders the steps
    try:
        for table in tables:
            began = time.perf_counter()
            engine.epoch(until=end, tables=[table])
            epoch_seconds = time.perf_counter() - began
            began = time.perf_counter()
            reports = engine.refresh([table], until=end, upstream=False)
            refresh_seconds = time.perf_counter() - began
            report = next(r for r in reports if r.table == table)
            phases = ", ".join(f"{k} {v:.2f}" for k, v in (report.detail.get("phases") or {}).items())
            arranged = "; ".join(f"{Path(path).name}.{key} {what} {seconds:.2f}s"
                                 for path, key, _, what, seconds in engine.arranged)
            print(f"{table}: epoch() {epoch_seconds:.2f}s, refresh() {refresh_seconds:.2f}s, step {report.seconds:.2f}s "
                  f"({report.technique}{': ' + report.reason if report.reason else ''}; {phases}); "
                  f"arrangements: {arranged or 'none'}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
