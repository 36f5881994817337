"""Where one table's incremental step spends its driver time: TPC-H at a scale, the named queries'
first epoch, then epochs of the benchmark's change batches, each refresh run one table at a time
on the main thread under cProfile (wall-clock: a py4j call's time is Spark's, a delta-rs call's
is delta-rs's). Prints each step's seconds and phases, then the engine functions by cumulative
seconds over the profiled epochs (the first epoch is not profiled).

    .venv/bin/python -m bench.step_profile 0.1 6 [--epochs 3] [--unprofiled 1] [--top 40] [--callers FUNCTION] [--by-self]
        [--driver-rows N] [--no-cost-model]
        [--together]
        [--source-writer spark] [--cold]

`--cold` empties the OS page cache before each profiled step (needs root), as a step meets it
after a full recompute has read gigabytes through Spark.

Where the driver holds Python's GIL (steps beside each other wait for it): `--parallelism 2`
runs the unprofiled epochs as the benchmark does, and py-spy (`pip install py-spy`, not a
dependency) samples the threads holding the GIL from the line "first epoch" on, for as long as
the epochs take:

    .venv/bin/python -m bench.step_profile 1 $(seq 1 22) --epochs 0 --unprofiled 3 --together \
        --parallelism 2 --source-writer spark &
    py-spy record --gil --pid $! --duration 30 --format raw -o gil.txt   # once it prints "first epoch"

`--resume WAREHOUSE` profiles the next epochs of a warehouse the benchmark kept (`make bench
ARGS="... --keep"`) or an earlier profile left, with no first epoch: its change batches go on from
the last one its sources hold, so a scale-10 profile of all 22 queries, beside each other as the
benchmark runs them, does not pay the first epoch's half hour again:

    .venv/bin/python -m bench.step_profile 10 $(seq 1 22) --resume /tmp/epochal-bench/run-10-0.0001 \
        --fraction 0.0001 --epochs 1 --together --parallelism 2 --source-writer spark

EPOCHAL_JOB_NAMES=1 lists each step's Spark jobs by name. `--callers pyspark` lists which engine lines call into a library (pyspark, py4j, deltalake,
pyarrow), with the seconds spent under them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from datetime import timedelta
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.step_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("scale", type=float, help="TPC-H's scale (with --resume, the kept warehouse's)")
    parser.add_argument("queries", type=int, nargs="+")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--unprofiled", type=int, default=0,
                        help="change epochs run before the profiled ones, not profiled (the epoch that builds "
                             "arrangements, say)")
    parser.add_argument("--fraction", type=float, default=0.001)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--callers", default=None, help="a library (pyspark, py4j, deltalake, pyarrow): engine lines calling it")
    parser.add_argument("--work", default="/tmp/epochal-bench")
    parser.add_argument("--source-writer", choices=("delta-rs", "spark"), default="delta-rs",
                        help="who commits the change batches (the bench's --source-writer)")
    parser.add_argument("--parallelism", type=int, default=1,
                        help="steps at once in the unprofiled epochs (the profiled ones run one at a time)")
    parser.add_argument("--cold", action="store_true", help="empty the OS page cache before each profiled step")
    parser.add_argument("--together", action="store_true",
                        help="one refresh of every named table per epoch (one at a time, sharing the refresh's "
                             "reads as the benchmark's epochs do), not a refresh per table")
    parser.add_argument("--by-self", action="store_true",
                        help="also list every function (the libraries' too) by its own seconds: where Python "
                             "holds the GIL, and the calls that leave it (py4j, delta-rs, Arrow)")
    parser.add_argument("--driver-rows", type=int, default=None,
                        help="the engine's driver_rows: lower than a state's rows, a small scale's step takes "
                             "the path a larger scale's does (Q11's aggregate state is within the default at "
                             "scale 1 and past it at scale 10)")
    parser.add_argument("--no-cost-model", action="store_true",
                        help="Engine(cost_model=False): every step runs incrementally, to see where a step the "
                             "cost model would rescan spends its time (a large change, --fraction 0.1)")
    parser.add_argument("--dump", default=None,
                        help="also write the profile here (pstats format), to ask afterwards who calls what: "
                             "python -c \"import pstats; pstats.Stats('FILE').print_callers('open')\"")
    parser.add_argument("--resume", default=None, metavar="WAREHOUSE",
                        help="a kept warehouse (make bench --keep): no first epoch, its change batches go on")
    arguments = parser.parse_args(argv)
    if arguments.epochs < 0:
        parser.error("--epochs must be at least 0 (the profiled epochs)")

    from bench.__main__ import LOADED_AT, bench_engine, start_session, tpch_warehouse, batch_time
    from ops.changes import ChangeGenerator

    if arguments.resume and not (Path(arguments.resume) / "sources" / "lineitem" / "_delta_log").exists():
        parser.error(f"--resume {arguments.resume}: no TPC-H warehouse there (its sources/lineitem is not a Delta table)")

    spark = start_session("8g")
    names = [f"tpch_q{q:02d}" for q in arguments.queries]
    if arguments.resume:
        root = str(Path(arguments.resume).resolve())
    else:
        root = tpch_warehouse(spark, Path(arguments.work), arguments.scale, f"profile-{arguments.scale:g}")
    engine = bench_engine(spark, root, names, arguments.driver_rows)
    engine.parallelism = 1  # steps on the main thread, where cProfile sees them
    engine.cost_model = not arguments.no_cost_model
    generator = ChangeGenerator(spark, root, seed=11, fraction=arguments.fraction,
                                writer=arguments.source_writer)
    done = generator.history().last_batch
    if arguments.resume:
        print(f"resuming {root} after batch {done}", flush=True)
    else:
        began = time.perf_counter()
        engine.refresh(until=LOADED_AT + timedelta(minutes=15))
        print(f"first epoch: {time.perf_counter() - began:.1f} s", flush=True)
    profile = cProfile.Profile(time.perf_counter)
    for index in range(done + 1, done + arguments.unprofiled + arguments.epochs + 1):
        generator.apply_batch(index, batch_time(index))
        until = LOADED_AT + timedelta(hours=index)
        profiled = index > done + arguments.unprofiled
        for batch in [names] if arguments.together else [[name] for name in names]:
            if profiled and arguments.cold:
                _empty_page_cache()
            engine.parallelism = 1 if profiled else arguments.parallelism
            if profiled:
                profile.enable()
            began = time.perf_counter()
            reports = engine.refresh(batch, until=until, upstream=False)
            wall = time.perf_counter() - began
            profile.disable()
            if arguments.together:
                print(f"epoch {index}{'' if profiled else ' (not profiled)'}: {wall:.3f} s for {len(batch)} tables")
            for report in reports:
                cost = report.detail.get("cost", {})
                print(f"epoch {index}{'' if profiled else ' (not profiled)'} {report.table}: {report.technique} "
                      f"{'' if arguments.together else f'{wall:.3f} s '}(step {report.seconds:.3f} s) "
                      f"phases {report.detail.get('phases')} jobs {cost.get('spark_jobs')} "
                      f"commits {cost.get('delta_commits')}")
                for job in cost.get("spark_job_names", []):  # with EPOCHAL_JOB_NAMES=1
                    print(f"    job: {job}")
    if not arguments.epochs:
        return
    stats = pstats.Stats(profile)
    if arguments.dump:
        stats.dump_stats(arguments.dump)
    engine_rows = [(func, row) for func, row in stats.stats.items() if "/epochal/" in func[0]]
    engine_rows.sort(key=lambda item: -item[1][3])
    print(f"\nengine functions by cumulative seconds over {arguments.epochs} epochs:")
    for (file, line, function), (calls, _, _, cumulative, _) in engine_rows[:arguments.top]:
        print(f"  {cumulative:7.3f} s {calls:6d}x  {file.split('/epochal/')[-1]}:{line} {function}")
    if arguments.by_self:
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])
        print(f"\nevery function by its own seconds over {arguments.epochs} epochs:")
        for (file, line, function), (calls, _, own, cumulative, _) in rows[:arguments.top]:
            print(f"  {own:7.3f} s {calls:7d}x  {'/'.join(file.split('/')[-2:])}:{line} {function}")
    if arguments.callers:
        print(f"\nengine lines calling {arguments.callers} (seconds under the call):")
        sites = {}
        for (file, line, function), (_, _, _, _, callers) in stats.stats.items():
            if f"/{arguments.callers}/" not in file:
                continue
            for (caller_file, caller_line, caller_function), timing in callers.items():
                if "/epochal/" in caller_file:
                    key = f"{caller_file.split('/epochal/')[-1]}:{caller_function} -> {function}"
                    sites[key] = sites.get(key, 0.0) + timing[3]
        for key, seconds in sorted(sites.items(), key=lambda item: -item[1])[:arguments.top]:
            print(f"  {seconds:7.3f} s  {key}")


def _empty_page_cache() -> None:
    import os

    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("3\n")


if __name__ == "__main__":
    main()
