"""What the `matches_full_recompute` check (resources.quality.compare_frames) and the tables'
great-expectations validations cost per table, in seconds and Spark jobs: over a warehouse the demo
built, each table's last epoch compared with its recompute, `--repeat` rounds after a warm-up.

    make demo ARGS="--scale 0.01 --batches 3 --tables tpch_q01,tpch_q10,returns_by_nation" WAREHOUSE=/tmp/wh
    .venv/bin/python -m bench.check_costs /tmp/wh --tables tpch_q01 tpch_q10 returns_by_nation
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from ops.tpch import TPCH_TABLES as SOURCES


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.check_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("warehouse")
    parser.add_argument("--tables", nargs="+", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args(argv)

    from assets.specs import load_specs, upstream_chain
    from epochal import Engine
    from resources.quality import GreatExpectationsResource, compare_frames
    from resources.session import SparkSettings, delta_spark_session

    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False, driver_memory="2g"))
    specs = load_specs(sources=tuple(SOURCES))
    engine = Engine(spark, arguments.warehouse)
    for source in SOURCES:
        engine.source(source, clock="logical")
    for name in arguments.tables:
        for spec in upstream_chain(specs, name):
            if spec.name not in engine.tables():
                engine.define(spec.name, spec.sql)
    tracker = spark.sparkContext.statusTracker()
    great_expectations = GreatExpectationsResource()

    def measured(action) -> tuple[float, int]:
        group = f"bench-{uuid.uuid4().hex[:8]}"
        spark.sparkContext.setJobGroup(group, "check")
        began = time.perf_counter()
        action()
        return time.perf_counter() - began, len(tracker.getJobIdsForGroup(group))

    for name in arguments.tables:
        checks = {"recompute check": lambda: compare_frames(engine.read(name), engine.recompute(name))}
        if specs[name].table_expectations:
            checks["table expectations"] = lambda: great_expectations.validate(
                engine.read(name), specs[name].table_expectations)
        for label, action in checks.items():
            figures = [measured(action) for _ in range(arguments.repeat + 1)][1:]
            print(f"{name} {label}: {statistics.median(s for s, _ in figures):.2f} s, "
                  f"{statistics.median(j for _, j in figures):.0f} Spark jobs (median of {arguments.repeat})")
    spark.stop()


if __name__ == "__main__":
    main()
