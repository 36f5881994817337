"""What a rescan costs against a recompute-and-overwrite of the same SQL, per TPC-H table and phase.

One step at a time (parallelism 1, so no step shares the cores): each table's first run (FIRST_RUN,
the result written whole), then a rescan of a table that exists (REQUESTED: recompute, diff against
the table, rebuild the state), each beside `engine.recompute(name)` written over a scratch table.
Prints per table the three times, the rescan's phases, Spark jobs and commits.

    .venv/bin/python -m bench.rescan_costs 1 --queries 3 6 22 [--spark-reads]

This found the rescan of an existing table 4-5x a recompute (Q22 11.6 s against 2.2 s), which is
why the cost model never chose one.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scale", type=float)
    parser.add_argument("--queries", type=int, nargs="+", default=list(range(1, 23)))
    parser.add_argument("--spark-reads", action="store_true",
                        help="the rescans read every input through Spark, none as a local relation of its "
                             "rows read on the driver (engine.output_frame), to weigh those reads")
    arguments = parser.parse_args(argv)
    if arguments.spark_reads:
        import epochal.engine

        epochal.engine.written_on_driver = lambda schema: False
    from bench.__main__ import LOADED_AT, bench_engine, recompute_table_seconds, start_session, tpch_warehouse

    spark = start_session("12g")
    queries = [f"tpch_q{q:02d}" for q in arguments.queries]
    root = tpch_warehouse(spark, Path("/tmp/epochal-bench"), arguments.scale, f"rescans-{arguments.scale:g}")
    engine = bench_engine(spark, root, queries)
    engine.parallelism = 1
    until = LOADED_AT + timedelta(minutes=15)
    totals = [0.0, 0.0, 0.0]
    print(f"{'table':<10} {'first run':>9} {'rescan':>7} {'recompute':>9}  rescan phases, jobs, commits")
    for name in queries:
        first = engine.refresh([name], until=until, upstream=False)[0]
        again = engine.refresh([name], until=until, full_refresh=True, upstream=False)[0]
        recompute = recompute_table_seconds(engine, name, root)
        cost = again.detail.get("cost", {})
        phases = ", ".join(f"{k} {v:.1f}" for k, v in again.detail.get("phases", {}).items())
        first_phases = ", ".join(f"{k} {v:.1f}" for k, v in first.detail.get("phases", {}).items())
        print(f"{name:<10} {first.seconds:>9.1f} {again.seconds:>7.1f} {recompute:>9.1f}  {phases}; "
              f"{cost.get('spark_jobs')} jobs, {cost.get('delta_commits')} commits (first run: {first_phases})",
              flush=True)
        for i, value in enumerate((first.seconds, again.seconds, recompute)):
            totals[i] += value
    print(f"{'all':<10} {totals[0]:>9.1f} {totals[1]:>7.1f} {totals[2]:>9.1f}")


if __name__ == "__main__":
    main()
