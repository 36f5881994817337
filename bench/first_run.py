"""Where a table's first run goes against a recompute-and-overwrite of the same SQL: for each table
of a warehouse a benchmark left (its tables refreshed at least once), over the input versions of
its last step, one table at a time in one process:

- `recompute`: the benchmark's recompute-and-overwrite (the SQL over the inputs read by Spark at
  their versions, the result written over a scratch Delta table), which is also how a first run
  writes its output (`replace_output`);
- `build`: queuing the full state of every stateful operator (`Context.build_states`, what a
  first run does in its compute phase; work done here is eager, the rest is in the writes);
- one column per state table the first run writes: that state's frame written over a scratch
  Delta table, with its rows;
- `first run`: the engine's own first run of the same SQL (defined again under a new name, so
  nothing is diffed), with its phases: its output and every state, as a first epoch writes them.

    .venv/bin/python -m bench.first_run --scale 1 --queries 1 18 19
    .venv/bin/python -m bench.first_run /tmp/epochal-bench/cost-rescans-1 --queries 18

Each table runs `--repeat` times (the first warms the process); the median of the others is
printed. The states' seconds summed against the recompute say how much of a first run is
computing the inputs again for each operator's state.
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from bench.__main__ import SQL
from bench.refreshed import add_arguments, last_inputs, open_warehouse, seconds_of


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--repeat", type=int, default=2)
    arguments = parser.parse_args(argv)

    from deltalake import DeltaTable

    from epochal.engine import output_frame
    from epochal.keyed.state import StateStore
    from epochal.protocol.context import Context

    spark, engine, root, names = open_warehouse(arguments, "first-run")

    total = {"recompute": 0.0, "build": 0.0, "states": 0.0, "first run": 0.0}
    for name in names:
        table, inputs = engine.table(name), last_inputs(engine, name)
        scratch = f"{root}/_first_run/{name}"
        seconds: dict[str, list[float]] = {}
        rows: dict[str, int] = {}
        phases: list[dict] = []
        for _ in range(arguments.repeat):
            again = f"{name}_first_run_{uuid.uuid4().hex[:6]}"
            engine.define(again, (SQL / f"{name}.sql").read_text())
            [report] = engine.refresh([again])
            seconds.setdefault("first run", []).append(report.seconds)
            phases.append(report.detail.get("phases") or {})
            seconds.setdefault("recompute", []).append(seconds_of(lambda: output_frame(
                spark, table, inputs, "after").write.format("delta").mode("overwrite")
                .option("overwriteSchema", "true").save(f"{scratch}/output")))
            state = StateStore(spark, f"{scratch}/unused", {}, engine.storage_options)
            ctx = Context(spark, table.compiled.plan, inputs, state, rescan=True,
                          broadcast_rows=engine.broadcast_rows, schemas=engine.schemas)
            seconds.setdefault("build", []).append(seconds_of(ctx.build_states))
            for write in state.writes:
                path = f"{scratch}/state/{write.name}"
                seconds.setdefault(write.name, []).append(seconds_of(
                    lambda: write.frame.write.format("delta").mode("overwrite")
                    .option("overwriteSchema", "true").save(path)))
                rows[write.name] = DeltaTable(path).count()
            ctx.unpersist()
        medians = {k: statistics.median(v[1:] or v) for k, v in seconds.items()}
        states = {k: v for k, v in medians.items() if k not in ("recompute", "build", "first run")}
        for part in ("recompute", "build", "first run"):
            total[part] += medians[part]
        total["states"] += sum(states.values())
        last = phases[-1]
        print(f"{name}: recompute {medians['recompute']:.2f} s, first run {medians['first run']:.2f} s "
              f"({medians['first run'] / medians['recompute']:.2f}x; last: output {last.get('write output', 0):.2f} s, "
              f"state {last.get('write state', 0):.2f} s), build {medians['build']:.2f} s, states "
              f"{sum(states.values()):.2f} s ({sum(states.values()) / medians['recompute']:.2f}x): "
              + ", ".join(f"{k} {v:.2f} s ({rows[k]:,} rows)" for k, v in states.items()), flush=True)
    print(f"all: recompute {total['recompute']:.2f} s, first run {total['first run']:.2f} s "
          f"({total['first run'] / max(total['recompute'], 1e-9):.2f}x), build {total['build']:.2f} s, "
          f"states {total['states']:.2f} s ({total['states'] / max(total['recompute'], 1e-9):.2f}x)")


if __name__ == "__main__":
    main()
