"""Where a rescan's diff on the driver spends its seconds, against the recompute-and-overwrite of the
same SQL: TPC-H at a scale, each named table's first run, then one change epoch of `--fraction` of
the orders applied to the sources (the table is not refreshed over it, so the diff is that epoch's),
and then, for each table, each piece of the rescan timed alone, twice, in turns with the recompute:

- collect: the full result collected to the driver (`rows_up_to`, the limit the diff asks for);
- read: the table's current version read by delta-rs (`SharedReads.snapshot_rows`, cached per
  refresh, so read here through a fresh reader each time);
- consolidate: both as the table's Arrow types, weighted +1 and -1, consolidated (`consolidate_rows`);
- replace on driver: the collected rows written over a scratch copy by delta-rs (`commits.replace`);
- recompute: the same SQL written over a scratch table by Spark (the benchmark's recompute).

    .venv/bin/python -m bench.rescan_diff 10 --queries 10 [--fraction 0.1]

Prints one line per table and piece. The diff's rows and the table's rows say how large a share
of the table the change is.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.__main__ import alone_arguments


def _timed(action):
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alone_arguments(parser, [10])
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args(argv)

    import pyarrow as pa

    from bench.__main__ import batch_time, first_run_alone, warm
    from epochal.changes import consolidate_rows, rows_up_to
    from epochal.graph import WEIGHT
    from epochal.keyed.shared_reads import SharedReads
    from epochal.protocol.writes import arrow_as
    from epochal.storage import commits
    from epochal.storage.deltalog import DeltaLog
    from ops.changes import ChangeGenerator

    names = [f"tpch_q{q:02d}" for q in arguments.queries]
    spark, root, engine = first_run_alone(arguments.scale, arguments.queries, Path(arguments.work),
                                          f"rescan-diff-{arguments.scale:g}")
    ChangeGenerator(spark, root, seed=13, fraction=arguments.fraction, writer="spark").apply_batch(1, batch_time(1))
    sources = {source for name in names for source in engine.table(name).compiled.inputs}
    warm(spark, [engine.path_of(source) for source in sources])
    latest = {source: DeltaLog.open(engine.path_of(source)).version for source in sources}
    print(f"{'table':<9} {'round':>5} {'piece':<18} {'seconds':>8}  rows", flush=True)
    for name in names:
        table = engine.table(name)
        last = table.ledger.last_committed()
        inputs = {n: {"from": v["to"], "to": latest.get(n, v["to"])} for n, v in last.inputs.items()}
        version = DeltaLog.open(table.path).version
        schema = table.schema

        def full():
            from epochal.changes import InputRange

            ranges = {n: InputRange(n, engine.path_of(n), "source", v["from"], v["to"], engine.schema_of(n))
                      for n, v in inputs.items()}
            return engine.output_frame(table, ranges, "after")

        for round_ in range(1, arguments.rounds + 1):
            seconds, computed = _timed(lambda: rows_up_to(full(), engine.driver_rows))
            print(f"{name:<9} {round_:>5} {'collect':<18} {seconds:>8.2f}  {computed.num_rows}", flush=True)
            seconds, current = _timed(lambda: SharedReads(None, engine.driver_rows).snapshot_rows(table.path, version))
            print(f"{name:<9} {round_:>5} {'read':<18} {seconds:>8.2f}  {current.num_rows}", flush=True)

            def diff():
                new = arrow_as(computed, schema)
                old = arrow_as(current.select(schema.names), schema)
                return consolidate_rows(pa.concat_tables([
                    new.append_column(WEIGHT, pa.array([1] * new.num_rows, pa.int64())),
                    old.append_column(WEIGHT, pa.array([-1] * old.num_rows, pa.int64()))]))

            seconds, change = _timed(diff)
            print(f"{name:<9} {round_:>5} {'consolidate':<18} {seconds:>8.2f}  {change.num_rows}", flush=True)
            scratch = f"{root}/_replaced/{name}"
            seconds, _ = _timed(lambda: commits.replace(scratch, arrow_as(computed, schema), "bench", round_,
                                                        "bench", change_data_feed=True))
            print(f"{name:<9} {round_:>5} {'replace on driver':<18} {seconds:>8.2f}", flush=True)
            seconds, _ = _timed(lambda: full().write.format("delta").mode("overwrite")
                                .option("overwriteSchema", "true").save(f"{root}/_recompute/{name}"))
            print(f"{name:<9} {round_:>5} {'recompute':<18} {seconds:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
