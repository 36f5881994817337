"""Why join terms and aggregates of TPC-H queries are still computed by Spark: one change epoch at
a small scale with the engine's debug log on, printing each join term that is not joined on the
driver and the inputs it did not hold exactly (rules/join.py logs them).

    .venv/bin/python -m bench.held_terms 0.05 5 9 21
    .venv/bin/python -m bench.held_terms 1 all --together   # one refresh of all 22, as an epoch runs

`--together` refreshes the tables in one refresh, as the epoch of `make bench` does (shared reads
across tables; the lines of parallel steps interleave).
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from pathlib import Path


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    together = "--together" in argv
    argv = [a for a in argv if a != "--together"]
    numbers = range(1, 23) if argv[1:] == ["all"] else [int(q) for q in argv[1:]]
    scale, queries = float(argv[0]), [f"tpch_q{q:02d}" for q in numbers]
    from bench.__main__ import LOADED_AT, bench_engine, start_session, tpch_warehouse
    from ops.changes import ChangeGenerator

    spark = start_session("4g")
    root = tpch_warehouse(spark, Path("/tmp/epochal-bench"), scale, f"held-{scale:g}" + ("-all" if together else ""))
    engine = bench_engine(spark, root, queries)
    engine.refresh(until=LOADED_AT + timedelta(minutes=15))
    ChangeGenerator(spark, root, seed=11, fraction=0.001).apply_batch(1, LOADED_AT + timedelta(minutes=30))
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(lambda record: "by Spark" in record.getMessage() or "on the driver" in record.getMessage())
    logger = logging.getLogger("epochal")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    if together:
        for report in engine.refresh(queries, until=LOADED_AT + timedelta(hours=1), upstream=False):
            print(f"== {report.table}: {report.technique} {report.seconds:.2f} s, "
                  f"{report.detail.get('cost', {}).get('spark_jobs')} jobs")
        return
    for query in queries:  # one at a time, so each table's lines come together
        print(f"-- {query}", flush=True)
        report, = engine.refresh([query], until=LOADED_AT + timedelta(hours=1), upstream=False)
        print(f"== {report.table}: {report.technique} {report.seconds:.2f} s, "
              f"{report.detail.get('cost', {}).get('spark_jobs')} jobs")


if __name__ == "__main__":
    main()
