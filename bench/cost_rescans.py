"""What a rescan the cost model chooses costs against a recompute-and-overwrite of the same SQL over
the same source versions: TPC-H at a scale, every named table's first run, then epochs of the
benchmark's change batches, each step run alone (parallelism 1) and followed by the recompute of its
table written over a scratch table; before both, each input is read once through Spark at its new
version, untimed, so the side timed second does not find it warmed by the first (`bench.__main__.warm`).

The first change epoch is small (`--small`, 0.1% of orders), so each table has an incremental step
in its history; the epochs after it are large (`--large`, 10%), so the model estimates the
incremental step far above a rescan. Its first rescan for COST is tried (it keeps the state, in
case it loses); the ones after it write the output only (docs/architecture.md, section 6, and
epochal/protocol/cost.py). Those are the rescans a user meets when a table's change is too large, and
the table below compares them, step by step, with the recompute of the same epoch.

    .venv/bin/python -m bench.cost_rescans 1 [--queries 3 16 22] [--large-epochs 3]

Prints each step (technique, reason, whether the state was kept, its seconds and phases beside the
recompute's) and, last, the rescans for COST that kept no state: their seconds against the
recomputes', per table and in all, and the target (a rescan at most 1.2x a recompute) met or not.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

from bench.__main__ import alone_arguments


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    alone_arguments(parser, list(range(1, 23)))
    parser.add_argument("--small", type=float, default=0.001, help="the first change epoch's fraction of orders")
    parser.add_argument("--large", type=float, default=0.1, help="the later epochs' fraction of orders")
    parser.add_argument("--large-epochs", type=int, default=3)
    arguments = parser.parse_args(argv)

    from bench.__main__ import LOADED_AT, batch_time, first_run_alone, recompute_table_seconds, warm
    from epochal import reasons
    from ops.changes import ChangeGenerator

    names = [f"tpch_q{q:02d}" for q in arguments.queries]
    spark, root, engine = first_run_alone(arguments.scale, arguments.queries, Path(arguments.work),
                                          f"cost-rescans-{arguments.scale:g}")
    generators = [ChangeGenerator(spark, root, seed=11, fraction=arguments.small, writer="spark")] + \
        [ChangeGenerator(spark, root, seed=13, fraction=arguments.large, writer="spark")] * arguments.large_epochs
    measured: dict[str, list[tuple[float, float]]] = {}
    print(f"{'epoch':>5} {'table':<9} {'technique':<11} {'state':<5} {'step s':>7} {'recompute s':>11} {'ratio':>6}  "
          "reason; phases", flush=True)
    for index, generator in enumerate(generators, start=1):
        generator.apply_batch(index, batch_time(index))
        until = LOADED_AT + timedelta(hours=index)
        for name in names:
            warmed = warm(spark, [engine.path_of(source) for source in engine.table(name).compiled.inputs])
            [report] = engine.refresh([name], until=until, upstream=False)
            recompute = recompute_table_seconds(engine, name, root)
            kept = (report.detail or {}).get("state") != reasons.STATE_NOT_KEPT
            phases = ", ".join(f"{k} {v:.2f}" for k, v in (report.detail.get("phases") or {}).items())
            estimate = report.detail.get("estimate")
            if estimate:
                phases += (f"; estimate {estimate['incremental']:.1f} s incremental for {estimate['rows']} rows "
                           f"against {estimate['rescan']:.1f} s rescan{' (unread)' if estimate.get('unread') else ''}")
            print(f"{index:>5} {name:<9} {report.technique:<11} {'kept' if kept else 'not':<5} {report.seconds:>7.2f} "
                  f"{recompute:>11.2f} {report.seconds / recompute:>6.2f}  {(report.reason or '')[:60]}; {phases}; "
                  f"inputs warmed {warmed:.2f}", flush=True)
            if report.technique == "rescan" and (report.reason or "").startswith(reasons.COST) and not kept:
                measured.setdefault(name, []).append((report.seconds, recompute))
    print("\nrescans for COST that kept no state, against the recompute of the same epoch:")
    total = [0.0, 0.0]
    for name in names:
        pairs = measured.get(name)
        if not pairs:
            print(f"  {name}: none (the model kept the table incremental, or only tried a rescan)")
            continue
        rescan, recompute = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        total[0] += rescan
        total[1] += recompute
        print(f"  {name}: {len(pairs)} rescans, {rescan:.2f} s against {recompute:.2f} s: {rescan / recompute:.2f}x")
    if total[1]:
        ratio = total[0] / total[1]
        print(f"  all: {total[0]:.2f} s against {total[1]:.2f} s: {ratio:.2f}x")
        print(f"\ntarget: a rescan at most 1.2x a recompute-and-overwrite of the same SQL: {ratio:.2f}x in all, "
              f"{'met' if ratio <= 1.2 else 'NOT MET'}")


if __name__ == "__main__":
    main()
