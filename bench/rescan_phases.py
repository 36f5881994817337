"""Where a rescan's compute goes against a recompute-and-overwrite of the same SQL: each table's
full result over the input versions of its last epoch, computed the ways the two sides compute it,
interleaved, in one process, on a warehouse a benchmark left (its tables refreshed at least once).

- `frame`: the recompute's frame built and analysed, no job run (Delta's snapshots of the inputs
  at their versions; the benchmark's recompute builds it before its timing starts, a rescan's
  compute phase includes it);
- `recompute`: the benchmark's recompute-and-overwrite (inputs read by Spark at their versions,
  the result written over a scratch Delta table), the frame's building included;
- `spark+collect`: the same frame collected to the driver (no write);
- `spark+limit`: the same frame under the limit a rescan collects it with (`changes.rows_up_to`);
- `local+limit`: the rescan's own frame (`engine.output_frame` with the refresh's shared reads:
  inputs of at most `driver_rows` rows as local relations of delta-rs reads) under that limit,
  with a fresh `SharedReads`, so each repetition pays its delta-rs reads as a one-table refresh does;
- `local reads`: those delta-rs reads alone (the inputs that would be local relations);
- `replace`: the rescan's own frame written as a step that replaces its table writes it
  (`writes.replace_contents` with the change data feed), the table having held few rows: the
  frame cached while collected, at most `driver_rows` rows committed by delta-rs, more written
  by Spark from the cache; `replace by spark`: Spark's write straight away, as for a table
  holding more rows than that. `--replace-rows` sets the limit they write with.

    .venv/bin/python -m bench.rescan_phases /tmp/epochal-bench/cost-rescans-1 --queries 8 14 22 10 19 1
    .venv/bin/python -m bench.rescan_phases --scale 0.1 --local-rows 5000 10000 25000

Each variant runs `--repeat` times in turn (the first repetition warms the process); the table
prints the median of the others, as wall seconds and the tasks' CPU seconds (the work: a rescan
slower than its recompute by the machine's noise shows in the first only). `--variants` runs only
the named ones:

    .venv/bin/python -m bench.rescan_phases /tmp/epochal-bench/run-10-0.1 --queries 1 5 13 --repeat 3 \
        --variants recompute spark+limit local+limit

With `--at-once N`, N tables run each variant at once, in threads (as the benchmark runs N steps,
and N recomputes, beside each other), each timed alone:

    .venv/bin/python -m bench.rescan_phases --scale 0.1 --queries 3 9 20 12 --at-once 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from bench.refreshed import add_arguments, last_inputs, open_warehouse, timed_work


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--at-once", type=int, default=1, help="tables running each variant at once")
    parser.add_argument("--variants", nargs="+", help="only these variants (by name, e.g. recompute spark+limit)")
    parser.add_argument("--replace-rows", type=int, default=None,
                        help="the driver_rows the replace variants write with (default: the engine's): below the "
                             "result's rows, they time a replace past the limit")
    parser.add_argument("--local-rows", type=int, nargs="*", default=[10_000, 50_000],
                        help="also the rescan's frame with local relations only for inputs of at most this many rows")
    arguments = parser.parse_args(argv)

    from epochal.changes import rows_up_to
    from epochal.engine import output_frame
    from epochal.keyed.shared_reads import SharedReads
    from epochal.protocol.writes import replace_contents, written_on_driver

    spark, engine, root, names = open_warehouse(arguments, "rescan-phases")
    limit = engine.driver_rows
    steps = itertools.count(int(time.time()))  # past any step number an earlier run wrote there
    replace_rows = limit if arguments.replace_rows is None else arguments.replace_rows

    def shared(rows=None):
        return SharedReads(engine.storage_options, engine.driver_rows if rows is None else rows)

    def variants(name):
        table, inputs = engine.table(name), last_inputs(engine, name)
        scratch = f"{root}/_rescan_phases/{name}"

        def recompute():
            output_frame(spark, table, inputs, "after").write.format("delta").mode("overwrite") \
                .option("overwriteSchema", "true").save(scratch)

        def replaced(driver_rows: int, expected_rows: int | None):
            """The rescan's frame written as a replace writes it (writes.replace_contents), under a
            new step number each time (a replace skips a step number it already wrote)."""
            def run():
                replace_contents(output_frame(spark, table, inputs, "after", shared()), f"{scratch}-replaced",
                                 "bench/rescan-phases", next(steps), "bench", engine.storage_options, driver_rows,
                                 change_data_feed=True, expected_rows=expected_rows)
            return run

        def local_reads():
            reads = shared()
            for found in inputs.values():
                if found.schema is not None and written_on_driver(found.schema):
                    reads.snapshot_rows(found.path, found.after)

        return {
            "frame": lambda: output_frame(spark, table, inputs, "after"),
            "recompute": recompute,
            "spark+collect": lambda: output_frame(spark, table, inputs, "after").toArrow(),
            "spark+limit": lambda: rows_up_to(output_frame(spark, table, inputs, "after"), limit),
            "local+limit": lambda: rows_up_to(output_frame(spark, table, inputs, "after", shared()), limit),
            "local reads": local_reads,
            "replace": replaced(replace_rows, 0),
            "replace by spark": replaced(replace_rows, replace_rows + 1),
            **{f"local<={rows // 1000}k": (lambda rows=rows: rows_up_to(
                output_frame(spark, table, inputs, "after", shared(rows)), limit)) for rows in arguments.local_rows},
        }

    kinds = [k for k in variants(names[0]) if not arguments.variants or k in arguments.variants]

    print(f"{'table':<10}" + "".join(f"{k:>24}" for k in kinds) + "   (wall s / tasks' CPU s)", flush=True)
    totals = {k: [0.0, 0.0] for k in kinds}
    with ThreadPoolExecutor(arguments.at_once) as pool:
        for start in range(0, len(names), arguments.at_once):
            together = names[start:start + arguments.at_once]
            runs = {name: variants(name) for name in together}
            seconds = {name: {k: [] for k in kinds} for name in together}
            for _ in range(arguments.repeat):
                for kind in kinds:
                    took = pool.map(lambda name: timed_work(spark, runs[name][kind]), together)
                    for name, elapsed in zip(together, took):
                        seconds[name][kind].append(elapsed)
            for name in together:
                medians = {k: [statistics.median(x[i] for x in (v[1:] or v)) for i in (0, 1)]
                           for k, v in seconds[name].items()}
                for k in kinds:
                    totals[k] = [totals[k][0] + medians[k][0], totals[k][1] + medians[k][1]]
                print(f"{name:<10}" + "".join(f"{medians[k][0]:>15.2f} /{medians[k][1]:>7.1f}" for k in kinds),
                      flush=True)
    print(f"{'all':<10}" + "".join(f"{totals[k][0]:>15.2f} /{totals[k][1]:>7.1f}" for k in kinds))

if __name__ == "__main__":
    main()
