"""Whether a table's step costs more inside the engine's refresh than the same SQL run alone: one
change committed to a warehouse a benchmark left (`--fraction` of orders and of line items
updated in place, by key, in the hour after the warehouse's last batch or in `--hour`: a stopped
run may leave its sources between two of the benchmark's batches), then per table, in one process
and in turn:

- `recompute`: the recompute-and-overwrite of the table's SQL at the sources' new versions (as the
  benchmark times it), before the step and after it;
- `step`: the table refreshed alone (`engine.refresh([table])`), whatever technique the model picks
  (at 10% a rescan for cost), its report's seconds and its tasks' CPU seconds;
- `frame`: the rescan's own frame (the refresh's local relations, under the rescan's limit,
  `changes.rows_up_to`) over the same versions, after the step.

Each as wall seconds / tasks' CPU seconds. A step dearer than both its recomputes and its frame
alone costs the refresh's own work; dearer only in the sweep, the sweep's context.

    .venv/bin/python -m bench.rescan_in_refresh /tmp/epochal-bench/run-10-0.1 --queries 6 14 4 15 10 --fraction 0.1
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from deltalake import DeltaTable

from bench.__main__ import LOADED_AT, batch_time
from bench.refreshed import add_arguments, last_inputs, open_warehouse, timed_work


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--fraction", type=float, default=0.1, help="the change batch's share of orders")
    parser.add_argument("--hour", type=int, default=None,
                        help="the hour the change is committed in (default: the one after the warehouse's last "
                             "batch; give a later one to run again on a warehouse this tool changed)")
    arguments = parser.parse_args(argv)
    if not arguments.warehouse:
        parser.error("name a warehouse a benchmark left (--keep, or a stopped run's)")

    from epochal.changes import InputRange, rows_up_to
    from epochal.engine import output_frame
    from epochal.keyed.shared_reads import SharedReads
    from epochal.storage.clock import logical_time_metadata
    from ops.changes import ChangeGenerator
    from ops.confs import USER_METADATA_CONF, session_confs

    spark, engine, root, names = open_warehouse(arguments, "rescan-in-refresh")
    index = arguments.hour or ChangeGenerator(spark, root).history().last_batch + 1
    every = max(2, round(1 / arguments.fraction))
    with session_confs(spark, {USER_METADATA_CONF: logical_time_metadata(batch_time(index))}):
        spark.sql(f"UPDATE delta.`{root}/sources/orders` SET o_totalprice = o_totalprice + 1 "
                  f"WHERE o_orderkey % {every} = {index % every}")
        spark.sql(f"UPDATE delta.`{root}/sources/lineitem` SET l_quantity = l_quantity + 1, "
                  f"l_extendedprice = l_extendedprice + 1 WHERE l_orderkey % {every} = {index % every}")
    until = LOADED_AT + timedelta(hours=index)
    print(f"hour {index}: 1 in {every} orders and their line items updated", flush=True)

    def newest(name: str) -> dict:
        """The table's inputs from its last step's versions to the sources' newest."""
        return {n: InputRange(n, r.path, r.kind, r.after, DeltaTable(r.path).version(), r.schema)
                for n, r in last_inputs(engine, name).items()}

    print(f"{'table':<10}{'recompute':>16}{'step':>16}{'recompute':>16}{'frame':>16}   technique "
          "(wall s / tasks' CPU s)", flush=True)
    for name in names:
        table = engine.table(name)
        scratch = f"{root}/_rescan_in_refresh/{name}"

        def recompute(inputs):
            output_frame(spark, table, inputs, "after").write.format("delta").mode("overwrite") \
                .option("overwriteSchema", "true").save(scratch)

        inputs = newest(name)
        before = timed_work(spark, lambda: recompute(inputs))
        [report] = engine.refresh([name], until=until, upstream=False)
        step = report.seconds, (report.detail.get("cost") or {}).get("task_cpu_seconds", 0.0)
        inputs = last_inputs(engine, name)
        after = timed_work(spark, lambda: recompute(inputs))
        frame = timed_work(spark, lambda: rows_up_to(output_frame(spark, table, inputs, "after",
                                                      SharedReads(engine.storage_options, engine.driver_rows)),
                                         engine.driver_rows))
        print(f"{name:<10}" + "".join(f"{w:>8.2f} /{c:>6.1f}" for w, c in (before, step, after, frame))
              + f"   {report.technique} {report.detail.get('phases')}", flush=True)


if __name__ == "__main__":
    main()
