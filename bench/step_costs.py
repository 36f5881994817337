"""Where one incremental step's time goes: the differential tests' 13 tables over small synthetic
sources, a first epoch and then a few epochs of fixed change batches, each step's phases and
counts (Spark jobs, Delta commits and those made on the driver, change reads shared or by Spark,
input versions read, bytes scanned) printed per table, and the whole epoch's wall seconds.

    .venv/bin/python -m bench.step_costs [--epochs 3] [--driver-rows 0] [--parallelism 2] [--conf k=v]
        [--suite differential|joins|aggregates]

`--suite` picks the definitions: test_differential's (the default) or test_differential_sql's
joins and subqueries, or aggregates, sets, top-k and windows.

`--driver-rows 0` turns driver commits and shared change batches off (every read and write by
Spark), to compare the two paths in one session; `--conf` sets a Spark conf when the session
is built (e.g. `--conf spark.sql.adaptive.enabled=false`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from decimal import Decimal


def _changes(a, b, epoch: int) -> None:
    a.insert([(epoch % 5, "x", epoch, Decimal("1.25")), (None, "y", 2, None)])
    a.delete(f"k = {(epoch + 2) % 5}")
    a.update(f"g = '{'xyz'[epoch % 3]}'", {"v": "v + 1"})
    b.update(f"k = {epoch % 4}", {"name": f"'n{epoch}'"})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--driver-rows", type=int, default=None, help="Engine(driver_rows=...); default the engine's")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--conf", action="append", default=[], help="a Spark SQL conf key=value")
    parser.add_argument("--suite", choices=["differential", "joins", "aggregates"], default="differential")
    parser.add_argument("--jobs", nargs="*", default=[], metavar="TABLE",
                        help="print each Spark job of these tables' incremental steps (name, ms, stages)")
    arguments = parser.parse_args(argv)

    from epochal import Engine
    from resources.session import SparkSettings, delta_spark_session
    from tests.support import SyntheticSource
    from tests.test_differential import A_INITIAL, A_SCHEMA, B_INITIAL, B_SCHEMA, DEFINITIONS
    from tests.test_differential_sql import AGGREGATES_AND_SETS, JOINS_AND_SUBQUERIES

    definitions = {"differential": DEFINITIONS, "joins": JOINS_AND_SUBQUERIES,
                   "aggregates": AGGREGATES_AND_SETS}[arguments.suite]

    confs = dict(pair.split("=", 1) for pair in arguments.conf)
    if arguments.jobs:
        os.environ["EPOCHAL_JOB_NAMES"] = "1"
    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False, extra_conf=confs))
    root = tempfile.mkdtemp(prefix="epochal-step-costs-")
    a = SyntheticSource(spark, f"{root}/sources/a", A_SCHEMA, A_INITIAL)
    b = SyntheticSource(spark, f"{root}/sources/b", B_SCHEMA, B_INITIAL)
    options = {} if arguments.driver_rows is None else {"driver_rows": arguments.driver_rows}
    engine = Engine(spark, root, parallelism=arguments.parallelism, **options)
    engine.source("a")
    engine.source("b")
    engine.define_all(definitions)
    began = time.perf_counter()
    engine.refresh()
    print(f"first epoch: {time.perf_counter() - began:.2f} s (every table computed in full and written)", flush=True)
    walls, per_table = [], {}
    for epoch in range(1, arguments.epochs + 1):
        _changes(a, b, epoch)
        began = time.perf_counter()
        reports = engine.refresh()
        walls.append(time.perf_counter() - began)
        for report in reports:
            per_table.setdefault(report.table, []).append(report)
        print(f"epoch {epoch}: {walls[-1]:.2f} s for {len(reports)} tables", flush=True)
    keys = ("spark_jobs", "spark_job_seconds", "task_seconds", "delta_commits", "driver_commits", "change_reads", "shared_change_reads",
            "input_versions_read", "time_travel_reads", "bytes_scanned")
    print("\n| table | step s | " + " | ".join(keys) + " | phases (s) |")
    print("|---|---:|" + "---:|" * len(keys) + "---|")
    for name, reports in per_table.items():
        steps = [r for r in reports if r.technique == "incremental"]
        if not steps:
            continue
        costs = [r.detail.get("cost", {}) for r in steps]
        means = [statistics.mean(c.get(k) or 0 for c in costs) for k in keys]
        phases: dict[str, list[float]] = {}
        for r in steps:
            for phase, seconds in r.detail.get("phases", {}).items():
                phases.setdefault(phase, []).append(seconds)
        print(f"| {name} | {statistics.mean(r.seconds for r in steps):.2f} | "
              + " | ".join(f"{m:.2f}" if k.endswith("seconds") else f"{m:.0f}" for k, m in zip(keys, means)) + " | "
              + ", ".join(f"{p} {statistics.mean(v):.2f}" for p, v in phases.items()) + " |")
    for name in arguments.jobs:
        for number, report in enumerate(per_table.get(name, []), start=1):
            jobs = report.detail.get("cost", {}).get("spark_job_names", [])
            print(f"\n{name}, epoch {number} ({report.technique}, {report.seconds:.2f} s, {len(jobs)} jobs):")
            for job in jobs:
                print(f"  {job}")
    print(f"\nwhole epoch: mean {statistics.mean(walls):.2f} s over {len(walls)} epochs (parallelism "
          f"{arguments.parallelism}, driver_rows {engine.driver_rows}, confs {arguments.conf or 'none'})")


if __name__ == "__main__":
    main()
