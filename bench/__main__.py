"""`make bench`: incremental epochs against full recompute on TPC-H, in one Spark session.

For each scale factor: TPC-H is loaded (once per scale, cached under the bench folder), the chosen
queries (assets/sql/tpch_qNN.sql) are defined and built by a first epoch, then each epoch applies
one hourly change batch and measures, back to back so machine drift hits both sides alike:

- the whole incremental epoch (one `Engine.refresh` of every table, as a schedule runs it), and
  per table its step's seconds, Spark jobs, Delta commits, input versions read and bytes scanned;
- a full recompute-and-overwrite of every table's SQL over the same source versions into scratch
  Delta tables, as many at once as the engine runs steps; the report leads with the ratio of the
  two whole-epoch times;
- a noop epoch (no source changed since);
- an unread-columns epoch: its only commit updates lineitem's l_comment, which no query reads, so
  every step reading lineitem finds its change consolidated away (each step's seconds reported);
- the floor: reading the epoch's change batches of every source plus one empty Delta commit,
  through Spark and as the engine does it (on the driver, epochal.shared_reads, and a delta-rs commit).

A sweep over change fractions shows where recompute wins: one warehouse on the first scale, its
first epoch paid once, then one epoch at each fraction in turn, so the cost model decides each with
the history the fractions before it left, as a table living through a quiet week and a busy day
would. `--sweep-only` runs it without the main runs.

`--day` measures a day as a schedule lives it, on each scale: the first epoch (every table built,
its arrangements too) beside a first recompute-and-overwrite, then hourly epochs (24 unless
`--epochs` says otherwise) each beside its recompute, the engine's own periodic work (state
compactions, arrangement rebuilds) counted where it happens, and the daily maintenance at the end
(OPTIMIZE and VACUUM of the engine's tables; VACUUM of the recompute's). It reports both sides'
cumulative seconds after every epoch and the first epoch from which the incremental total stays
below the recompute's (the break-even); the noop, unread-columns and floor measurements are left
out of it.
Writes bench/results/<timestamp>-<commit>/report.md, results.json and chart.png and prints the summary.

    make bench ARGS="--scales 0.01 0.1 --epochs 3 --fraction 0.001 --queries 1 3 5"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.results_folder import results_folder

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
STEPWISE = "steps"  # `_epoch`'s bracket: each table's step between two recomputes of its SQL


def batch_time(index: int) -> datetime:
    """When change batch `index` (from 1) is committed: half past its hour, so the epoch of hour
    `index` (`LOADED_AT` + `index` hours) takes it, and a later run on the same warehouse (the
    profilers' `--resume`) goes on from the next."""
    return LOADED_AT + timedelta(hours=index - 1, minutes=30)


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--fraction", type=float, nargs="+", default=[0.001],
                        help="change fraction of orders per epoch; several: after the first epoch, `--epochs` "
                             "epochs at each in turn on the same warehouse, reported as one run per fraction "
                             "(the first epoch is paid once)")
    parser.add_argument("--same-change-rows", action="store_true",
                        help="scale the fraction down on larger scales so every scale changes as many rows per "
                             "epoch as the first (the scaling target)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs after the first (default 3; 24 with --day)")
    parser.add_argument("--queries", type=int, nargs="+", default=list(range(1, 23)))
    parser.add_argument("--sweep", type=float, nargs="*", default=[0.0001, 0.001, 0.01, 0.1],
                        help="change fractions for the sweep (empty: no sweep)")
    parser.add_argument("--no-sweep", dest="sweep", action="store_const", const=[], help="no sweep (a bare --sweep)")
    parser.add_argument("--sweep-queries", type=int, nargs="+", default=[1, 3, 5, 10, 18])
    parser.add_argument("--sweep-only", action="store_true", help="the sweep alone, no main runs")
    parser.add_argument("--sweep-epochs", type=int, default=1, metavar="N",
                        help="epochs at each sweep fraction; past 1, the sweep's target is judged on the epochs "
                             "after the first at each fraction (the first is the first time the fraction's "
                             "techniques run in the process, where the recompute has run at every fraction before)")
    parser.add_argument("--warm-sources", action="store_true",
                        help="read every source at its new version through Spark after each change batch, "
                             "untimed, so that the side timed first (the incremental epoch) does not pay alone "
                             "for the first read of the versions the batch wrote; and before each side flush the "
                             "files written to disk and collect the JVM's heap, untimed (`settle`)")
    parser.add_argument("--bracket-recompute", action="store_true",
                        help="recompute every table on both sides of each incremental epoch (the first at the "
                             "sources' new versions) and judge each step against the mean of the two; the two "
                             "recomputes' difference is reported as the measurement's noise")
    parser.add_argument("--bracket-steps", action="store_true",
                        help="with --parallelism 1: run each epoch one table at a time, each table's step refreshed "
                             "alone between two recomputes of its SQL (the first at the sources' new versions), "
                             "judged against their mean: drift over the epoch cancels per step")
    parser.add_argument("--work", default=os.environ.get("EPOCHAL_BENCH_WORK", "/tmp/epochal-bench"),
                        help="scratch folder: cached TPC-H loads and the warehouses")
    parser.add_argument("--driver-memory", default="7g",
                        help="the JVM heap; the recompute oracle shares it (local mode): 7g holds scale 10 "
                             "and keeps the driver, Python and JVM together, within 12 GB (bench/RESULTS.md)")
    parser.add_argument("--driver-rows", type=int, default=None,
                        help="Engine(driver_rows=...): 0 sends every read and write through Spark (the path "
                             "before driver commits and shared reads); default the engine's")
    parser.add_argument("--arrange-rows", type=lambda v: None if v == "none" else int(v), default=-1,
                        help="Engine(arrange_rows=...): inputs of at least this many rows read by key are arranged "
                             "(epochal/arrangements.py); 'none' never; default the engine's")
    parser.add_argument("--parallelism", type=int, default=None,
                        help="Engine(parallelism=...): steps run at once; 1 times each table's step alone, "
                             "not beside other tables' steps; default the engine's")
    parser.add_argument("--switch-interval", type=lambda v: None if v == "python" else float(v), default=-1,
                        help="Engine(switch_interval=...): Python's switch interval (seconds) while steps run "
                             "in parallel (epochal/switching.py); 'python' leaves Python's own; default the engine's")
    parser.add_argument("--day", action="store_true",
                        help="a day of hourly epochs per scale, first epoch and daily maintenance included, "
                             "reported as cumulative seconds of both sides (default 24 epochs after the first)")
    parser.add_argument("--recompute-every", type=int, default=1, metavar="N",
                        help="recompute in the first of every N epochs and the last; the epochs between take the "
                             "recompute seconds of the one before them (the report says which were measured)")
    parser.add_argument("--source-writer", choices=("delta-rs", "spark"), default="delta-rs",
                        help="who commits the change batches to the sources (ops.changes.ChangeGenerator's "
                             "writer; not timed): 'spark' as runs before 2026-11-26 did")
    parser.add_argument("--keep", action="store_true",
                        help="leave each scale's warehouse in the bench folder (its path is printed), for "
                             "`python -m bench.step_profile --resume` to profile its next epochs without a first epoch")
    parser.add_argument("--resume", default=None, metavar="WAREHOUSE",
                        help="go on with a warehouse a killed or `--keep` run left (its engine state and "
                             "sources as they are): no load, no first epoch; its change batches go on from the "
                             "last one its sources hold. One scale (the warehouse's); the warehouse is kept")
    arguments = parser.parse_args(argv)
    if arguments.bracket_steps and arguments.parallelism != 1:
        parser.error("--bracket-steps runs the tables one at a time: give --parallelism 1")
    if arguments.resume is not None:
        if not (Path(arguments.resume) / "sources" / "lineitem" / "_delta_log").exists():
            parser.error(f"--resume {arguments.resume}: no TPC-H warehouse there (sources/lineitem is not a Delta table)")
        if arguments.day or len(arguments.scales) > 1 or (arguments.sweep and not arguments.sweep_only):
            parser.error("--resume goes on with one warehouse: one --scales, no --day, and either the main run "
                         "or --sweep-only")
    return arguments


def start_session(memory: str):
    from resources.session import SparkSettings, delta_spark_session

    return delta_spark_session(SparkSettings(driver_memory=memory, shuffle_partitions=4, ui=False))


def tpch_warehouse(spark, work: Path, scale: float, name: str) -> str:
    """A fresh warehouse holding TPC-H at `scale` (the load is cached per scale)."""
    from ops.tpch import load_tpch

    base = work / f"tpch-{scale:g}"
    if not (base / "sources" / "lineitem" / "_delta_log").exists():
        shutil.rmtree(base, ignore_errors=True)
        load_tpch(spark, str(base), scale, LOADED_AT)
    root = work / name
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base / "sources", root / "sources")
    return str(root)


def bench_engine(spark, root: str, queries: list[str], driver_rows: int | None = None, arrange_rows: int | None = -1,
            parallelism: int | None = None, switch_interval: float | None = -1):
    from epochal import Engine

    options = ({} if driver_rows is None else {"driver_rows": driver_rows}) | \
        ({} if arrange_rows == -1 else {"arrange_rows": arrange_rows}) | \
        ({} if parallelism is None else {"parallelism": parallelism}) | \
        ({} if switch_interval == -1 else {"switch_interval": switch_interval})
    engine = Engine(spark, root, **options)
    for source in SOURCES:
        engine.source(source, clock="logical")
    engine.define_all({q: (SQL / f"{q}.sql").read_text() for q in queries})
    return engine


def _timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def _floor(spark, root: str, before: dict[str, int]) -> float:
    """Reading every source's change batch since `before` plus one empty Delta commit."""
    from delta.tables import DeltaTable

    def work():
        for source, version in before.items():
            path = f"{root}/sources/{source}"
            latest = DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]
            if latest > version:
                (spark.read.format("delta").option("readChangeFeed", "true")
                 .option("startingVersion", version + 1).option("endingVersion", latest).load(path).count())
        spark.range(0).write.format("delta").mode("append").save(f"{root}/_floor")

    return _timed(work)[0]


def _floor_driver(spark, root: str, before: dict[str, int], driver_rows: int) -> float:
    """The floor as the engine pays it: every source's change batch read once on the driver
    (epochal.shared_reads, delta-rs; Spark reads a batch larger than `driver_rows`) plus one
    empty delta-rs commit."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from epochal.keyed.shared_reads import SharedReads

    side = f"{root}/_floor_driver"
    if not os.path.exists(side):
        write_deltalake(side, pa.table({"id": pa.array([], pa.int64())}))

    def work():
        reads = SharedReads(None, driver_rows)
        for source, version in before.items():
            path = f"{root}/sources/{source}"
            latest = DeltaTable(path).version()
            if latest > version and reads.change_rows(path, version, latest) is None:
                (spark.read.format("delta").option("readChangeFeed", "true")
                 .option("startingVersion", version + 1).option("endingVersion", latest).load(path).count())
        write_deltalake(side, pa.table({"id": pa.array([], pa.int64())}), mode="append")

    return _timed(work)[0]


def alone_arguments(parser: argparse.ArgumentParser, queries: list[int]) -> None:
    """The arguments of a tool that times tables one at a time after `first_run_alone`: the scale,
    the TPC-H queries (default `queries`) and the work folder."""
    parser.add_argument("scale", type=float)
    parser.add_argument("--queries", type=int, nargs="+", default=queries)
    parser.add_argument("--work", default="/tmp/epochal-bench")


def first_run_alone(scale: float, queries: list[int], work: Path, name: str):
    """A Spark session, a fresh TPC-H warehouse at `scale` (`name` under `work`) and an engine of
    the queries' tables after their first run, one step at a time (as bench.cost_rescans and
    bench.rescan_diff time each table alone)."""
    spark = start_session("12g")
    root = tpch_warehouse(spark, work, scale, name)
    engine = bench_engine(spark, root, [f"tpch_q{q:02d}" for q in queries])
    engine.parallelism = 1
    engine.refresh(until=LOADED_AT + timedelta(minutes=15))
    return spark, root, engine


def warm(spark, paths) -> float:
    """Read each Delta table of `paths` at its latest version through Spark (a count), outside both
    sides' timings: Delta's snapshot of a new version, its file list and the files' footers are then
    warm for both. Timed second, the recompute found them warmed by the side timed first, which paid
    for both (bench/RESULTS.md, the rescans for cost with inputs warmed). Returns the seconds it took."""
    return _timed(lambda: [spark.read.format("delta").load(path).selectExpr("count(*)").collect() for path in paths])[0]


def _pending_write_megabytes() -> float | None:
    """What the kernel still has to write to disk (Linux: Dirty and Writeback of /proc/meminfo)."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return round(sum(int(fields[k].split()[0]) for k in ("Dirty", "Writeback")) / 1024, 1)
    except (OSError, KeyError, ValueError):
        return None


def settle(spark) -> dict:
    """Give the side about to be timed the machine as the other found it, untimed: the files the
    source writer (or the side before) wrote are flushed to disk, so the kernel's writeback of them
    does not run during the first side's jobs alone (a change batch of 10% at scale 10 rewrites
    gigabytes of line items), and the JVM's heap is collected, so neither side pays for the
    other's garbage. Returns what was pending and the seconds it took."""
    pending = _pending_write_megabytes()
    seconds, _ = _timed(lambda: (os.sync(), spark.sparkContext._jvm.java.lang.System.gc()))
    return dict(pending_write_megabytes=pending, seconds=round(seconds, 3))


def _versions(spark, root: str) -> dict[str, int]:
    from delta.tables import DeltaTable

    return {s: DeltaTable.forPath(spark, f"{root}/sources/{s}").history(1).collect()[0]["version"] for s in SOURCES}


def recompute_table(engine, name: str, root: str, versions: dict[str, int] | None = None) -> dict:
    """Recompute-and-overwrite one table, its jobs in the thread's scheduler pool as the engine's
    steps run theirs (so tables recomputed at once share the cores as steps do). `seconds` times
    the write (its jobs), as the benchmark always has; `frame_seconds` the building of its frame
    before it (Delta's snapshots of the inputs at their versions, which a rescan's compute phase
    includes); `spark_jobs`, `task_seconds` and their CPU and collector's seconds the write's jobs,
    as a step's report counts its own, so a rescan's work can be told from the machine's noise.
    The SQL reads its inputs at the versions of the table's last epoch, or at `versions` (per
    source: a recompute before the epoch that reads them)."""
    from epochal.metrics import Meter, metered, scheduler_pool

    meter = Meter()
    with scheduler_pool(engine.spark, threading.current_thread().name), metered(engine.spark, meter):
        frame_seconds, frame = _timed(lambda: _recompute_frame(engine, name, versions))
        seconds, _ = _timed(lambda: frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                            .save(f"{root}/_recompute/{name}"))
    meter.count_jobs(engine.spark)
    return dict(seconds=round(seconds, 3), frame_seconds=round(frame_seconds, 3), spark_jobs=meter.jobs,
                task_seconds=meter.task_seconds, task_cpu_seconds=meter.task_cpu_seconds,
                task_gc_seconds=meter.task_gc_seconds)


def _recompute_frame(engine, name: str, versions: dict[str, int] | None):
    if versions is None:
        return engine.recompute(name)
    from epochal.changes import InputRange

    table = engine.table(name)
    derived = [n for n in table.compiled.inputs if n not in versions]
    if derived:
        raise ValueError(f"{name} reads {derived}, which are not sources: a recompute before its epoch "
                         "cannot read their new versions")
    inputs = {n: InputRange(n, engine.path_of(n), "source", versions[n], versions[n], engine.schema_of(n))
              for n in table.compiled.inputs}
    return engine.output_frame(table, inputs, "after")


def recompute_table_seconds(engine, name: str, root: str) -> float:
    return recompute_table(engine, name, root)["seconds"]


def _recompute_all(engine, names: list[str], root: str,
                   versions: dict[str, int] | None = None) -> tuple[float, dict[str, float], dict[str, dict]]:
    """Recompute-and-overwrite every table, as many at a time as the engine runs steps (each
    table's SQL over the same source versions its epoch read, or `versions`): the whole wall time,
    each's seconds, and the rest of each's `recompute_table` (without its seconds, given second)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, engine.parallelism)) as pool:
        seconds, each = _timed(lambda: dict(zip(names, pool.map(lambda n: recompute_table(engine, n, root, versions),
                                                                 names))))
    return seconds, {name: e["seconds"] for name, e in each.items()}, \
        {name: {k: v for k, v in e.items() if k != "seconds"} for name, e in each.items()}


UNREAD_COLUMN = ("lineitem", "l_comment", "l_orderkey")  # no TPC-H query reads l_comment


def _unread_columns_epoch(engine, spark, root: str, names: list[str], at, rows: int) -> dict:
    """An epoch whose only source commit updates a column no table reads (`rows` line items'
    l_comment, as many as the batch changed): every step reading lineitem reads the change and
    finds it consolidated away. Returns the epoch's seconds and each step's."""
    from epochal.storage.clock import logical_time_metadata
    from ops.confs import USER_METADATA_CONF, session_confs

    table, column, key = UNREAD_COLUMN
    path = f"{root}/sources/{table}"
    highest = spark.read.format("delta").load(path).agg({key: "max"}).first()[0]
    with session_confs(spark, {USER_METADATA_CONF: logical_time_metadata(at)}):
        spark.sql(f"UPDATE delta.`{path}` SET {column} = concat({column}, '.') "
                  f"WHERE {key} > {highest} - {max(1, rows // 4)}")
    seconds, reports = _timed(lambda: engine.refresh(names, until=at + timedelta(minutes=5), upstream=False))
    steps = {r.table: round(r.seconds, 3) for r in reports if r.technique != "noop"}
    return dict(seconds=round(seconds, 3), steps=steps)


def _epoch(engine, spark, root: str, generator, index: int, queries: list[str], extras: bool = True,
           last_recompute: dict | None = None, warm_sources: bool = False, bracket: bool = False) -> dict:
    """One change batch; then the whole incremental epoch over every table (one refresh, as a
    schedule runs it), the recompute-and-overwrite of every table, and with `extras` a noop epoch,
    an unread-columns epoch and the floor. With `last_recompute` (an earlier epoch of this run)
    the recompute is not run: its seconds, whole and per table, are that epoch's, and the epoch
    says so (`recompute_measured_at`). With `warm_sources` both sides are given the same start:
    every source is read at its new version before both (`warm`), and the machine is settled
    before each (`settle`). With `bracket` every table is recomputed on both sides of the
    incremental epoch (the first at the sources' new versions) and judged against the mean of the
    two: what drifts over the epoch (the page cache, the JVM's heap, the machine's other load)
    cancels to first order, and the two recomputes' difference, same SQL and same versions, is
    the measurement's own noise (`recompute_before_seconds`, `recompute_after_seconds`). With
    `bracket` STEPWISE the brackets are each step's instead (`_steps_bracketed`)."""
    before = _versions(spark, root)
    batch = generator.apply_batch(index, batch_time(index))
    warmed = warm(spark, [f"{root}/sources/{s}" for s in SOURCES]) if warm_sources else None
    until = LOADED_AT + timedelta(hours=index)
    floor = _floor(spark, root, before) if extras else None
    floor_driver = _floor_driver(spark, root, before, engine.driver_rows) if extras else None
    names = [n for n in engine.tables() if n in queries]
    settled = {}
    bracketed = None
    stepwise = bracket == STEPWISE and last_recompute is None
    if bracket and not stepwise and last_recompute is None:
        if warm_sources:
            settled["recompute before"] = settle(spark)
        bracketed = _recompute_all(engine, names, root, _versions(spark, root))
    if warm_sources:
        settled["incremental"] = settle(spark)
    _reset_peaks(spark)
    counters = machine_counters()
    if stepwise:
        incremental, reports, sides, recompute_costs, done, served_counts = _steps_bracketed(engine, names, root, until)
    else:
        incremental, reports = _timed(lambda: engine.refresh(names, until=until, upstream=False))
        done, served_counts = engine.arranged, engine.arranged_reads
    machine = machine_since(counters)
    incremental_peak = _peak_gigabytes(spark)
    arranged = [dict(input=Path(path).name, key=key, version=version, what=what, seconds=round(seconds, 3))
                for path, key, version, what, seconds in done]
    served = [dict(input=Path(path).name, key=key, **counts) for (path, key), counts in served_counts.items()]
    copies = next((r.detail["arrangements"]["copies"] for r in reports if "arrangements" in r.detail), {})
    if stepwise:  # the two sides ran interleaved: one peak, one sum of the tables' means
        recompute_peak = incremental_peak
        recomputes = {name: statistics.mean(pair) for name, pair in sides.items()}
        recompute, measured_at = sum(recomputes.values()), index
        brackets = dict(recompute_before_seconds=round(sum(p[0] for p in sides.values()), 3),
                        recompute_after_seconds=round(sum(p[1] for p in sides.values()), 3))
    elif last_recompute is None:
        if warm_sources:
            settled["recompute"] = settle(spark)
        _reset_peaks(spark)
        recompute, recomputes, recompute_costs = _recompute_all(engine, names, root)
        recompute_peak = _peak_gigabytes(spark)
        measured_at = index
        brackets = (dict(recompute_before_seconds=round(bracketed[0], 3), recompute_after_seconds=round(recompute, 3))
                    if bracketed else {})
        sides = {}
        if bracketed:
            sides = {name: (bracketed[1][name], recomputes[name]) for name in names}
            recompute = (bracketed[0] + recompute) / 2
            recomputes = {name: statistics.mean(pair) for name, pair in sides.items()}
    else:
        recompute, recompute_peak = last_recompute["recompute_seconds"], last_recompute["peak_gigabytes"]["recompute"]
        recomputes = {name: t["recompute_seconds"] for name, t in last_recompute["tables"].items()}
        recompute_costs = {name: t.get("recompute_cost") for name, t in last_recompute["tables"].items()}
        measured_at = last_recompute["recompute_measured_at"]
        brackets, sides = {}, {}
    noop, unread = None, {}
    if extras:
        noop, _ = _timed(lambda: engine.refresh(names, until=until + timedelta(minutes=10), upstream=False))
        unread = _unread_columns_epoch(engine, spark, root, names, until + timedelta(minutes=20),
                                       sum(batch.counts("lineitem")) or 1000)
    tables = {}
    for report in reports:
        tables[report.table] = dict(
            technique=report.technique, reason=report.reason, incremental_seconds=report.seconds,
            recompute_seconds=round(recomputes[report.table], 3), recompute_cost=recompute_costs[report.table],
            **(dict(recompute_before_seconds=round(sides[report.table][0], 3),
                    recompute_after_seconds=round(sides[report.table][1], 3)) if report.table in sides else {}),
            rows_read=report.rows_read, rows_inserted=report.rows_inserted, rows_deleted=report.rows_deleted,
            phases=report.detail.get("phases", {}), cost=report.detail.get("cost", {}),
            estimate=report.detail.get("estimate"), replaced=report.detail.get("replaced"),
            gave_up=report.detail.get("gave_up"), copying_seconds=report.detail.get("copying"),
        )
    changed = {t: batch.counts(t) for t in SOURCES}
    return dict(index=index, floor_seconds=_rounded(floor), floor_driver_seconds=_rounded(floor_driver),
                incremental_seconds=round(incremental, 3), recompute_seconds=round(recompute, 3),
                recompute_measured_at=measured_at, **brackets,
                **({"bracketed": "step" if stepwise else "epoch"} if brackets else {}),
                noop_seconds=_rounded(noop), unread_columns=unread,
                sources_warmed_seconds=_rounded(warmed), settled=settled, source_changes=changed, arranged=arranged,
                arranged_reads=served, copies=copies, incremental_machine=machine,
                peak_gigabytes=dict(incremental=incremental_peak, recompute=recompute_peak), tables=tables)


def _steps_bracketed(engine, names: list[str], root: str, until) -> tuple:
    """The incremental epoch one table at a time, each table's step (`engine.refresh([table])`)
    between two recompute-and-overwrites of its SQL, the first at the sources' new versions, the
    second at the versions the step read: each step is judged against recomputes a step's length
    away, not an epoch's, so what drifts over an epoch (the machine's other load, the page cache)
    moves both sides alike. The incremental seconds are the refreshes' summed, each paying its own
    epoch lookup and arrangement upkeep (one refresh of every table pays them once). Returns those
    seconds, the reports, each table's (before, after) recompute seconds and its recompute's costs,
    and the refreshes' arrangements done and reads served."""
    versions = _versions(engine.spark, root)
    incremental, reports, sides, costs, done, served = 0.0, [], {}, {}, [], {}
    for name in names:
        before = recompute_table(engine, name, root, versions)
        seconds, [report] = _timed(lambda: engine.refresh([name], until=until, upstream=False))
        after = recompute_table(engine, name, root)
        incremental += seconds
        reports.append(report)
        sides[name] = (before["seconds"], after["seconds"])
        costs[name] = {k: v for k, v in after.items() if k != "seconds"}
        done.extend(engine.arranged)
        for pair, counts in engine.arranged_reads.items():
            held = served.setdefault(pair, {})
            for key, value in counts.items():
                held[key] = held.get(key, 0) + value
    return incremental, reports, sides, costs, done, served


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _daily_maintenance(spark, root: str, names: list[str]) -> dict:
    """The day's maintenance as an operator schedules it (ops/maintenance.py's jobs at their
    defaults): OPTIMIZE of the derived tables and their bookkeeping (their state is the engine's to
    compact), then VACUUM of them, their state and the arrangements within Delta's default
    retention; on the recompute's side VACUUM of its tables (an overwrite leaves every earlier
    version's files behind; OPTIMIZE would find nothing).
    `breakdown`: per side and action, the targets, those left undone for nothing to do
    (maintenance.nothing_to_compact, nothing_to_vacuum) and their seconds."""
    from epochal import maintenance
    from epochal.maintenance import DeltaTarget

    results = {"incremental": [], "recompute": []}

    def engine_side():
        for target in maintenance.targets(root, names, state=False, bookkeeping=True, spark=spark):
            results["incremental"].append(maintenance.optimize(spark, target))
        needed = maintenance.needed_versions(root, spark)
        for target in maintenance.targets(root, names, state=True, bookkeeping=True, arrangements=True, spark=spark):
            results["incremental"].append(maintenance.vacuum(spark, target, keep_version=needed.get(target.path)))

    def recompute_side():
        for name in names:
            results["recompute"].append(maintenance.vacuum(spark, DeltaTarget(name, "derived", f"{root}/_recompute/{name}")))

    engine_seconds, _ = _timed(engine_side)
    recompute_seconds, _ = _timed(recompute_side)
    breakdown = {}
    for side, done in results.items():
        for result in done:
            row = breakdown.setdefault(f"{side} {result.action} {result.target.kind}",
                                       dict(targets=0, nothing_to_do=0, seconds=0.0))
            row["targets"] += 1
            row["nothing_to_do"] += bool(result.detail.get("nothing_to_do"))
            row["seconds"] = round(row["seconds"] + result.seconds, 3)
    return dict(incremental_seconds=round(engine_seconds, 3), recompute_seconds=round(recompute_seconds, 3),
                breakdown=breakdown)


def _maintenance_parts(daily: dict) -> str:
    """The daily maintenance's seconds per side, action and kind of table, and how many of those
    tables had nothing to do (no Spark job run for them)."""
    parts = [f"{name} {row['seconds']:.1f} s ({row['targets']} tables, {row['nothing_to_do']} with nothing to do)"
             for name, row in sorted((daily.get("breakdown") or {}).items())]
    return " Maintenance by part: " + "; ".join(parts) + "." if parts else ""


def _upkeep_done(root: str) -> dict[str, int]:
    from tests.support import upkeep_done

    compactions, rebuilds = upkeep_done(root)
    return dict(state_compactions=compactions, arrangement_rebuilds=rebuilds)


def _driver_pids(spark) -> dict[str, int | None]:
    """The driver's processes: Python, and Spark's JVM (which `local[*]` runs the executors in)."""
    process = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return dict(python=os.getpid(), jvm=process.pid if process is not None else None)


def machine_counters() -> dict[str, float]:
    """The machine's CPU seconds waiting on I/O and stolen by its host (/proc/stat, all CPUs) and
    this process's major page faults (/proc/self/stat): an epoch far slower than its neighbours
    for the same work shows by them whether the local copies' mapped pages were read from disk
    again or the host took the CPUs; {} where /proc does not tell."""
    try:
        with open("/proc/stat") as stat:
            cpu = stat.readline().split()
        with open("/proc/self/stat") as own:
            fields = own.read().rpartition(")")[2].split()
        hertz = os.sysconf("SC_CLK_TCK")
        return dict(iowait_seconds=int(cpu[5]) / hertz, steal_seconds=int(cpu[8]) / hertz,
                    python_major_faults=int(fields[9]))
    except (OSError, ValueError, IndexError):
        return {}


def machine_since(before: dict[str, float]) -> dict[str, float]:
    """What `machine_counters` grew by since `before`."""
    now = machine_counters()
    return {name: round(now[name] - before[name], 2) for name in before if name in now}


def _reset_peaks(spark) -> None:
    """Start the driver's peak resident memory over from what it holds now (Linux: clear_refs 5),
    so that a phase's peak is its own (and includes what the processes held going into it). The
    pages Python's allocators kept from what the bench did before (drawing a change batch of 10%
    of scale 10's orders peaks at 3.5 GB) are given back first: they are the bench's, not the
    engine's, and a process that ran nothing but the engine would not hold them."""
    from epochal.memory import give_back_freed_memory

    global _sampler
    give_back_freed_memory()
    for pid in _driver_pids(spark).values():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as refs:
                refs.write("5")
        except (OSError, TypeError):
            pass
    if _sampler is not None:
        _sampler.stop()
    _sampler = _TogetherSampler([pid for pid in _driver_pids(spark).values() if pid is not None])


def _status_kilobytes(pid: int, field: str) -> int | None:
    return status_fields(pid, (field,))[0]


def status_fields(pid: int, fields: tuple[str, ...]) -> list[int | None]:
    """`fields` of /proc/<pid>/status in kilobytes, read in one pass; None where one is missing."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in fields:
                    found[name] = int(value.split()[0])
    except (OSError, ValueError, IndexError, TypeError):
        pass
    return [found.get(field) for field in fields]


class _TogetherSampler:
    """The driver's resident memory, Python's and the JVM's at the same moment, sampled every
    INTERVAL seconds from `_reset_peaks` to `_peak_gigabytes`: each process's own peak (VmHWM)
    comes at its own moment, so their sum only bounds the driver's peak from above. Also the peak
    of their anonymous memory (RssAnon) summed at one moment: the resident set counts the pages of
    files a process maps, the local copies' among them, which the kernel can drop and read again."""

    INTERVAL = 0.2

    def __init__(self, pids: list[int]):
        self.pids, self.peak, self.peak_anonymous = pids, 0, 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-memory", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stopped.wait(self.INTERVAL):
            read = [status_fields(pid, ("VmRSS", "RssAnon")) for pid in self.pids]
            sizes, anonymous = [each[0] for each in read], [each[1] for each in read]
            if None not in sizes:
                self.peak = max(self.peak, sum(sizes))
            if None not in anonymous:
                self.peak_anonymous = max(self.peak_anonymous, sum(anonymous))

    def stop(self) -> tuple[float | None, float | None]:
        """The peaks of the resident sets and of their anonymous memory, each summed at one moment, in GiB."""
        self._stopped.set()
        self._thread.join()
        return tuple(round(peak / (1 << 20), 2) if peak else None for peak in (self.peak, self.peak_anonymous))


_sampler: _TogetherSampler | None = None


def _peak_gigabytes(spark) -> dict[str, float | None]:
    """The driver's peak resident memory since the last _reset_peaks (Linux VmHWM), per process,
    and `together`: the highest sum of both sampled at one moment (`_TogetherSampler`)."""
    global _sampler

    def peak(pid) -> float | None:
        kilobytes = _status_kilobytes(pid, "VmHWM")
        return None if kilobytes is None else round(kilobytes / (1 << 20), 2)

    together, anonymous = _sampler.stop() if _sampler is not None else (None, None)
    _sampler = None
    return {name: peak(pid) for name, pid in _driver_pids(spark).items()} | {"together": together,
                                                                            "together_anonymous": anonymous}


def _highest(peaks: list[dict]) -> dict[str, float | None]:
    """Per process, the highest of several phases' peaks."""
    return {name: max((p[name] for p in peaks if p.get(name) is not None), default=None)
            for name in ("python", "jvm", "together", "together_anonymous")}


def _together(each: dict) -> tuple[float | None, bool]:
    """A phase's driver peak, Python and JVM together, and whether it was sampled at one moment
    (`_TogetherSampler`); else the sum of each process's own peak, which bounds it from above
    (results written before the sampler)."""
    if each.get("together") is not None:
        return each["together"], True
    if None in (each.get("python"), each.get("jvm")):
        return None, False
    return each["python"] + each["jvm"], False


def _driver_target(label: str, peaks: dict | None) -> list[str]:
    found = [_together(each) for each in (peaks or {}).values() if isinstance(each, dict)]
    found = [(value, sampled) for value, sampled in found if value is not None]
    if not found:
        return []
    value, sampled = max(found)
    how = "sampled at one moment" if sampled else "each process's own peak summed, an upper bound"
    return [f"- Driver within 12 GiB, Python and JVM together, {label}: peak {value:.2f} GiB "
            f"({value * (1 << 30) / 1e9:.2f} GB; {how}): {_met(value <= 12)}."]


def _first_epoch(engine, reports) -> dict:
    """Where the first epoch's time went: each table's step (its technique and phases; steps run
    `parallelism` at a time, so their sum exceeds the wall time) and each arrangement built after
    them (one after another, inside the wall time)."""
    tables = {r.table: dict(technique=r.technique, seconds=round(r.seconds, 3),
                            phases=r.detail.get("phases", {})) for r in reports}
    arranged = [dict(input=Path(path).name, key=key, what=what, seconds=round(seconds, 3))
                for path, key, _, what, seconds in engine.arranged]
    return dict(tables=tables, arranged=arranged, parallelism=engine.parallelism)


def run_scale(spark, work: Path, scale: float, fractions: list[float], epochs: int, queries: list[str],
              driver_rows: int | None = None, source_writer: str = "delta-rs", arrange_rows: int | None = -1,
              parallelism: int | None = None, day: bool = False, switch_interval: float | None = -1,
              keep: bool = False, resume: str | None = None, recompute_every: int = 1,
              warm_sources: bool = False, bracket: bool = False, progress=None) -> list[dict]:
    """One warehouse at `scale`: its first epoch, then `epochs` epochs at each of `fractions` in
    turn; one run per fraction (each carries the shared first epoch's figures). `keep` leaves the
    warehouse in place; `resume` goes on with a warehouse left by an earlier run (no first epoch).
    `recompute_every` N: the recompute runs in the first of every N epochs and the last, the epochs
    between taking the seconds of the one before them (a day at scale 10 recomputed every hour
    takes over two hours here, nine tenths of it the recomputes). `warm_sources`, `bracket`: see `_epoch`.
    `progress`, when given, is called with the epochs measured so far after each one, so that a
    run that dies (a full disk, say) keeps them."""
    from ops.changes import ChangeGenerator

    root = str(Path(resume).resolve()) if resume else tpch_warehouse(spark, work, scale, f"run-{scale:g}-{fractions[0]:g}")
    engine = bench_engine(spark, root, queries, driver_rows, arrange_rows, parallelism, switch_interval)
    first, first_epoch, first_peak, index = None, None, None, 0
    if resume:
        index = ChangeGenerator(spark, root).history().last_batch
        print(f"  scale {scale:g}: resuming {root} after batch {index}", flush=True)
    else:
        _reset_peaks(spark)
        first, first_reports = _timed(lambda: engine.refresh(until=LOADED_AT + timedelta(minutes=15)))
        first_peak = _peak_gigabytes(spark)
        first_epoch = _first_epoch(engine, first_reports)
        print(f"  scale {scale:g} first epoch {first:.1f}s{_first_epoch_parts(dict(first_epoch=first_epoch))}", flush=True)
    names = [n for n in engine.tables() if n in queries]
    first_recompute = _recompute_all(engine, names, root)[0] if day else None
    runs = []
    for fraction in fractions:
        generator = ChangeGenerator(spark, root, seed=11, fraction=fraction, writer=source_writer)
        results = []
        for number in range(epochs):
            index += 1
            sampled = number % recompute_every != 0 and number != epochs - 1
            results.append(_epoch(engine, spark, root, generator, index, queries, extras=not day,
                                  last_recompute=results[-1] if sampled else None, warm_sources=warm_sources,
                                  bracket=bracket))
            epoch = results[-1]
            print(f"  scale {scale:g} fraction {fraction:g} epoch {index}: whole epoch incremental "
                  f"{epoch['incremental_seconds']:.1f}s, recompute {epoch['recompute_seconds']:.1f}s "
                  f"({epoch['recompute_seconds'] / epoch['incremental_seconds']:.2f}x); disk free "
                  f"{shutil.disk_usage(work).free / 2**30:.0f} GiB; settled {epoch['settled']}; copies {epoch['copies']}; arranged: " + ", ".join(
                      f"{a['input']}.{a['key']} {a['what']} {a['seconds']:.1f}s" for a in epoch["arranged"]) + "; " + ", ".join(
                f"{n} {t['incremental_seconds']:.1f}s/{t['recompute_seconds']:.1f}s {_technique(t)}"
                for n, t in epoch["tables"].items()), flush=True)
            if progress is not None:
                progress(dict(scale=scale, fraction=fraction, first_epoch_seconds=_rounded(first), epochs=results))
        runs.append(dict(scale=scale, fraction=fraction, first_epoch_seconds=_rounded(first), first_epoch=first_epoch,
                         resumed=resume,
                         epochs=results,
                         first_recompute_seconds=_rounded(first_recompute), daily=None,
                         peak_gigabytes={**({"first epoch": first_peak} if first_peak else {}),
                                         "incremental epochs": _highest([e["peak_gigabytes"]["incremental"]
                                                                         for e in results]),
                                         "recomputes (the oracle)": _highest([e["peak_gigabytes"]["recompute"]
                                                                              for e in results])}))
    if day:
        daily = _daily_maintenance(spark, root, names) | _upkeep_done(root)
        runs[-1]["daily"] = daily
        print(f"  scale {scale:g} daily maintenance: incremental {daily['incremental_seconds']:.1f}s, recompute "
              f"{daily['recompute_seconds']:.1f}s; upkeep {daily['state_compactions']} state compactions, "
              f"{daily['arrangement_rebuilds']} arrangement rebuilds", flush=True)
    if keep or resume:
        print(f"  scale {scale:g}: warehouse kept at {root} (python -m bench.step_profile --resume {root} ...)", flush=True)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return runs


def _technique(table: dict) -> str:
    """A table's technique in an epoch's progress line: incremental, or the rescan's reason code,
    whether it replaced the table's contents, and whether an incremental step was given up for it
    past its budget (cost.budget)."""
    if table["technique"] != "rescan":
        return table["technique"]
    code = table["reason"].split(":")[0]
    return f"rescan {code}" + (" replaced" if table.get("replaced") else "") + _given_up(table)


def _given_up(table: dict) -> str:
    """The incremental step given up past its budget before a table's rescan, if one was."""
    gave_up = table.get("gave_up")
    return " after {rows} rows given up at {seconds:.1f} s".format(**gave_up) if gave_up else ""


def summarize(run: dict) -> list[dict]:
    """Per table: techniques, mean step and recompute seconds, speedup, and the step's costs."""
    rows = []
    names = sorted({n for e in run["epochs"] for n in e["tables"]})
    for name in names:
        entries = [e["tables"][name] for e in run["epochs"] if name in e["tables"]]
        # the step's seconds, whichever technique it took (a rescan for COST included): what the epoch paid
        incremental = [t["incremental_seconds"] for t in entries if t["technique"] != "noop"]
        recompute = [t["recompute_seconds"] for t in entries]
        mean_incremental = statistics.mean(incremental) if incremental else None

        def cost(key):
            values = [t.get("cost", {}).get(key) for t in entries]
            values = [v for v in values if v is not None]
            return statistics.mean(values) if values else None

        rows.append(dict(
            table=name, techniques="".join(t["technique"][0].upper() for t in entries),
            incremental=mean_incremental, recompute=statistics.mean(recompute),
            speedup=(statistics.mean(recompute) / mean_incremental) if mean_incremental else None,
            rows_read=statistics.mean(t["rows_read"] for t in entries),
            jobs=cost("spark_jobs"), job_seconds=cost("spark_job_seconds"), task_seconds=cost("task_seconds"),
            commits=cost("delta_commits"), driver_commits=cost("driver_commits"),
            versions=cost("input_versions_read"), time_travel=cost("time_travel_reads"),
            restricted=cost("restricted_version_reads"),
            megabytes=(cost("bytes_scanned") or 0) / 1e6 if cost("bytes_scanned") is not None else None,
        ))
    return rows


def choices(run: dict) -> tuple[int, int, int]:
    """How often the cost model's choice was the faster technique: (right, steps, rescans for
    COST). An incremental step is right when it beat the recompute-and-overwrite of the same epoch;
    a COST rescan when the recompute beat the table's incremental steps of the run (their mean; the
    model's own estimate when the table never ran incrementally). Steps before the model has
    history to go on (its estimate absent) are counted too: staying incremental was its choice."""
    right = steps = costly = 0
    for epoch in run["epochs"]:
        for name, t in epoch["tables"].items():
            if t["technique"] == "noop":
                continue
            steps += 1
            if t["technique"] == "incremental":
                right += t["incremental_seconds"] <= t["recompute_seconds"]
                continue
            if not str(t.get("reason", "")).startswith("COST"):
                continue
            costly += 1
            seen = [e["tables"][name]["incremental_seconds"] for e in run["epochs"]
                    if e["tables"].get(name, {}).get("technique") == "incremental"]
            reference = statistics.mean(seen) if seen else (t.get("estimate") or {}).get("incremental", 0.0)
            right += t["recompute_seconds"] <= reference
    return right, steps, costly


def settled(run: dict) -> dict:
    """`run` with the epochs the sweep's target is judged on: past the first when there are several.
    The first epoch at a fraction is the first time its techniques (a rescan's collection and diff,
    say) run in the process, where the recompute has run at every fraction before it; a process
    that runs the fraction's technique every hour has paid that once."""
    return run | dict(epochs=run["epochs"][1:]) if len(run["epochs"]) > 1 else run


def whole_epochs(run: dict) -> tuple[float, float, float]:
    """Mean seconds of the whole incremental epoch and of recomputing every table, and their ratio."""
    incremental = statistics.mean(e["incremental_seconds"] for e in run["epochs"])
    recompute = statistics.mean(e["recompute_seconds"] for e in run["epochs"])
    return incremental, recompute, recompute / incremental


def day(run: dict) -> dict | None:
    """A day run's cumulative seconds of both sides after the first epoch and after each epoch
    (the daily maintenance added to the last), and the break-even: the first epoch from which the
    incremental total stays below the recompute's (None if it never does)."""
    if run.get("first_recompute_seconds") is None:
        return None
    incremental, recompute = [run["first_epoch_seconds"]], [run["first_recompute_seconds"]]
    for epoch in run["epochs"]:
        incremental.append(incremental[-1] + epoch["incremental_seconds"])
        recompute.append(recompute[-1] + epoch["recompute_seconds"])
    daily = run.get("daily") or {}
    incremental[-1] += daily.get("incremental_seconds", 0.0)
    recompute[-1] += daily.get("recompute_seconds", 0.0)
    ahead = [i < r for i, r in zip(incremental, recompute)]
    behind = [n for n, a in enumerate(ahead) if not a]
    even = None if behind and behind[-1] == len(ahead) - 1 else (behind[-1] + 1 if behind else 0)
    return dict(incremental=incremental, recompute=recompute, break_even=even,
                ratio=recompute[-1] / incremental[-1] if incremental[-1] else None)


def _day_lines(run: dict) -> list[str]:
    totals = day(run)
    if totals is None:
        return []
    daily = run.get("daily") or {}
    even = totals["break_even"]
    lines = [f"**A day: {len(run['epochs']) + 1} epochs (the first included) and the daily maintenance: incremental "
             f"{totals['incremental'][-1]:.1f} s, recompute-and-overwrite {totals['recompute'][-1]:.1f} s: "
             f"{totals['ratio']:.2f}x** cumulative; the incremental total stays below the recompute's "
             + ("from the first epoch on." if even == 0 else f"from epoch {even} on." if even is not None else
                "at no epoch of the day.") + f" First epoch {run['first_epoch_seconds']} s against a first recompute of "
             f"{run['first_recompute_seconds']} s. Daily maintenance: {_format(daily.get('incremental_seconds'))} s "
             f"(OPTIMIZE and VACUUM of the engine's tables) against {_format(daily.get('recompute_seconds'))} s (VACUUM "
             f"of the recompute's); the engine's own upkeep within the epochs: {daily.get('state_compactions', '-')} "
             f"state compactions, {daily.get('arrangement_rebuilds', '-')} arrangement rebuilds." + _maintenance_parts(daily),
             "",
             "| epoch | incremental s | recompute s | cumulative incremental s | cumulative recompute s |",
             "|---:|---:|---:|---:|---:|",
             f"| first | {run['first_epoch_seconds']:.1f} | {run['first_recompute_seconds']:.1f} | "
             f"{totals['incremental'][0]:.1f} | {totals['recompute'][0]:.1f} |"]
    measured = [e["index"] for e in run["epochs"] if e.get("recompute_measured_at", e["index"]) == e["index"]]
    if len(measured) < len(run["epochs"]):
        lines[0] = lines[0].replace("** cumulative", "** cumulative (the recompute run in epochs " + ", ".join(
            map(str, measured)) + "; each epoch between takes the seconds of the one before it, in parentheses)", 1)
    for number, epoch in enumerate(run["epochs"], start=1):
        recompute = f"{epoch['recompute_seconds']:.1f}"
        if epoch["index"] not in measured:
            recompute = f"({recompute})"
        lines.append(f"| {epoch['index']} | {epoch['incremental_seconds']:.1f} | {recompute} | "
                     f"{totals['incremental'][number]:.1f} | {totals['recompute'][number]:.1f} |")
    return lines + ["(the last row's totals include the daily maintenance)", ""]


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _unread_line(run: dict) -> list[str]:
    epochs = [e["unread_columns"] for e in run["epochs"] if e.get("unread_columns", {}).get("steps")]
    if not epochs:
        return []
    steps = [s for e in epochs for s in e["steps"].values()]
    return [f"Unread columns (an epoch whose only commit updates lineitem's l_comment, which no query "
            f"reads): {len(epochs[0]['steps'])} steps read the change and find it consolidated away; step "
            f"mean {statistics.mean(steps):.2f} s, max {max(steps):.2f} s; whole epoch mean "
            f"{statistics.mean(e['seconds'] for e in epochs):.2f} s.", ""]


def _choices_line(run: dict) -> list[str]:
    right, steps, costly = choices(run)
    if not steps:
        return []
    return [f"Cost model: {costly} of {steps} steps rescanned for COST; the technique taken was the faster one "
            f"in {right} of {steps} ({right / steps:.0%}; a step is compared with the recompute-and-overwrite of "
            "the same epoch, a COST rescan with the table's incremental steps of the run).", ""]


def _format(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _peak_line(run: dict) -> list[str]:
    peak = run.get("peak_gigabytes")
    if not peak:
        return []
    if "python" in peak:  # results written before peaks were taken per phase
        return [f"Driver peak resident memory after this scale (VmHWM): Python {_format(peak.get('python'))} GiB, "
                f"Spark's JVM {_format(peak.get('jvm'))} GiB.", ""]
    lines = ["Driver peak resident memory per phase (VmHWM, started over at each phase, so it includes what "
             "the processes held going into it; together: their sum sampled at one moment, or where marked the "
             "sum of the two peaks, an upper bound; anonymous: the peak of their anonymous memory summed at one "
             "moment, without the pages of mapped files such as the local copies, which the kernel can drop):", "",
             "| phase | Python GiB | Spark's JVM GiB | together GiB | anonymous GiB |", "|---|---:|---:|---:|---:|"]
    for phase, each in peak.items():
        together, sampled = _together(each)
        lines.append(f"| {phase} | {_format(each.get('python'))} | {_format(each.get('jvm'))} | {_format(together)}"
                     f"{'' if sampled or together is None else ' (summed)'} | "
                     f"{_format(each.get('together_anonymous'))} |")
    return lines + [""]


def _arranged_line(run: dict) -> list[str]:
    """What the epochs spent arranging inputs (built by Spark, advanced by appends), inside the
    whole-epoch figure above."""
    done = [(e["index"], a) for e in run["epochs"] for a in e.get("arranged", [])]
    if not done:
        return []
    built = [f"epoch {i}: {a['input']}.{a['key']} {a['what']} ({a['seconds']:.1f} s)"
             for i, a in done if a["what"].startswith("built")]
    by_spark = [f"epoch {i}: {a['input']}.{a['key']} {a['what']} ({a['seconds']:.1f} s)"
                for i, a in done if a["what"].startswith("appended: through Spark")]
    appended = [a["seconds"] for _, a in done if a["what"].startswith("appended")]
    parts = built + by_spark + ([f"{len(appended)} appends of change feeds, at most {max(appended):.2f} s"]
                                if appended else [])
    lines = [f"Arrangements (inside the whole epoch): {', '.join(parts) or 'all current'}.", ""]
    copies = [(e["index"], e.get("copies") or {}) for e in run["epochs"]]
    if any(counts for _, counts in copies):
        lines += ["Local copies made, dropped for their disk budget (made again when next read), failed and not made "
                  "for want of disk, per epoch: " + "; ".join(
                      f"epoch {i}: " + ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) for i, counts in copies
                      if counts) + ".", ""]
    served = [(e["index"], r) for e in run["epochs"] for r in e.get("arranged_reads", [])]
    if served:
        lines += ["Reads served by arrangements (per epoch and input, all tables' steps together):", "",
                  "| epoch | input.key | reads | keys | files | of them local copies | Parquet row groups | rows read | "
                  "change feed rows |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {i} | {r['input']}.{r['key']} | {r['reads']} | {r['keys']} | {r['files']} | "
                  f"{r.get('copied_files', '')} | {r['row_groups']} | {r['rows']} | {r['feed_rows']} |" for i, r in served]
        lines.append("")
    return lines


def _first_epoch_parts(run: dict) -> str:
    """The first epoch's steps (summed) and arrangement builds, where the run recorded them."""
    first = run.get("first_epoch")
    if not first:
        return ""
    slowest = sorted(first["tables"].items(), key=lambda item: -item[1]["seconds"])[:3]
    steps = sum(t["seconds"] for t in first["tables"].values())
    arranging = sum(a["seconds"] for a in first["arranged"])
    return (f" (steps {steps:.1f} s summed, {first['parallelism']} at a time; "
            f"slowest " + ", ".join(f"{n} {t['seconds']:.1f} s" for n, t in slowest)
            + f"; arrangements built after them {arranging:.1f} s: "
            + (", ".join(f"{a['input']}.{a['key']} {a['seconds']:.1f} s" for a in first["arranged"]) or "none") + ")")


def _arrange_rows(value: int | None) -> str:
    return "default" if value == -1 else "none" if value is None else f"{value:,}"


ORDERS_AT_SCALE_1 = 1_500_000
TOLERATED_SWEEP = 1.10  # the sweep's target: the chosen technique at most 10% slower than the recompute


def _met(ok: bool | None) -> str:
    return "not measured" if ok is None else "met" if ok else "**not met**"


def _targets_lines(runs: list[dict], sweep: list[dict]) -> list[str]:
    """The acceptance targets this run speaks to, each with its figure (what it cannot measure is
    named with the command that does)."""
    lines = ["## Targets", ""]
    for run in runs:
        scale, fraction = run["scale"], run["fraction"]
        changed = round(fraction * ORDERS_AT_SCALE_1 * scale)
        totals = day(run)
        if totals is not None:
            lines.append(f"- A day at scale {scale:g} ({len(run['epochs']) + 1} epochs, the first and the daily "
                         f"maintenance included): {totals['ratio']:.2f}x cumulative against at least 5x: "
                         f"{_met(totals['ratio'] >= 5)}.")
            continue
        incremental, recompute, ratio = whole_epochs(run)
        target = 10.0 if scale < 10 or abs(fraction - 0.001) < 1e-12 else 30.0
        lines.append(f"- Whole epoch at scale {scale:g}, {changed:,} changed orders per epoch ({fraction * 100:g}%), "
                     f"{len(summarize(run))} tables: {ratio:.2f}x ({incremental:.1f} s against {recompute:.1f} s) "
                     f"against at least {target:g}x: {_met(ratio >= target)}.")
        if scale < 10:
            slow = [(r["table"], r["speedup"]) for r in summarize(run) if r["speedup"] is not None and r["speedup"] < 3]
            lines.append(f"- Every table at least 3x its own recompute at scale {scale:g}: {_met(not slow)}"
                         + (f" (under it: {', '.join(f'{t} {x:.2f}x' for t, x in slow)})." if slow else "."))
        lines += _driver_target(f"at scale {scale:g}", run.get("peak_gigabytes"))
    for run in sweep:
        lines += _driver_target(f"in the sweep at scale {run['scale']:g}, {run['fraction'] * 100:g}%",
                                run.get("peak_gigabytes"))
    if sweep:
        worst = max(((r["incremental"] / r["recompute"], run["fraction"], r["table"]) for run in sweep
                     for r in summarize(settled(run)) if r["incremental"] and r["recompute"]), default=None)
        judged = (" (judged on the epochs after the first at each fraction)"
                  if any(len(run["epochs"]) > 1 for run in sweep) else "")
        if worst is not None:
            lines.append(f"- Sweep at scale {sweep[0]['scale']:g}: the chosen technique at most 10% slower than the "
                         f"recompute at every fraction{judged}: worst {worst[0]:.2f}x the recompute ({worst[2]} at "
                         f"{worst[1] * 100:g}%){_bracket_words(sweep)}: {_met(worst[0] <= TOLERATED_SWEEP)}.")
    lines += ["- A rescan at most 1.2x a recompute-and-overwrite of the same SQL: not measured by this command "
              "(`python -m bench.cost_rescans 1`).",
              "- The Dagster run of one hourly partition at least 3x its recomputing twin: not measured by this "
              "command (`python -m bench.dagster_run --scale 1`).", ""]
    return lines


def bracket_noise(sweep: list[dict]) -> dict | None:
    """For a sweep whose recomputes were bracketed (`_epoch`), over the judged epochs and per
    table: the worst step against the recompute after the epoch alone (the judge of runs without
    brackets), and the worst ratio between a table's two recomputes, each summed over the epochs
    (the same SQL over the same versions: what the machine alone moves a timing by)."""
    after, spread = [], []
    for run in sweep:
        epochs = settled(run)["epochs"]
        names = sorted({n for e in epochs for n, t in e["tables"].items() if "recompute_before_seconds" in t})
        for name in names:
            entries = [e["tables"][name] for e in epochs if "recompute_before_seconds" in e["tables"].get(name, {})]
            step = sum(t["incremental_seconds"] for t in entries)
            first = sum(t["recompute_before_seconds"] for t in entries)
            second = sum(t["recompute_after_seconds"] for t in entries)
            if step and first and second:
                after.append((step / second, run["fraction"], name))
                spread.append((max(first, second) / min(first, second), run["fraction"], name))
    if not spread:
        return None
    return dict(after_only=max(after), spread=max(spread),
                spread_over_tolerance=sum(1 for s in spread if s[0] > TOLERATED_SWEEP), tables=len(spread))


def _bracket_words(sweep: list[dict]) -> str:
    noise = bracket_noise(sweep)
    if noise is None:
        return ""
    (after, af, at), (spread, sf, st) = noise["after_only"], noise["spread"]
    stepwise = any(e.get("bracketed") == "step" for run in sweep for e in run["epochs"])
    return (f", each step against the mean of a recompute before and after "
            f"{'it (the tables refreshed one at a time)' if stepwise else 'its epoch'}; against the recompute after "
            f"alone, as runs without brackets judged, worst {after:.2f}x ({at} at {af * 100:g}%); the noise: a "
            f"table's two recomputes, same SQL and versions, differ by up to {spread:.2f}x ({st} at {sf * 100:g}%), "
            f"past {TOLERATED_SWEEP:g}x for {noise['spread_over_tolerance']} of {noise['tables']} tables")


def _pair(table: dict, key: str) -> str:
    return f"{_format((table.get('cost') or {}).get(key))} / {_format((table.get('recompute_cost') or {}).get(key))}"


def _sides(table: dict) -> str:
    if "recompute_before_seconds" not in table:
        return ""
    return f"{_format(table['recompute_before_seconds'])} / {_format(table['recompute_after_seconds'])}"


def _switch_interval(value) -> str:
    return "default" if value == -1 else "Python's" if value is None else f"{value:g} s"


def report_markdown(arguments, runs: list[dict], sweep: list[dict], started: str) -> str:
    lines = [f"# epochal benchmark, {started}", "",
             f"Arguments: scales {arguments.scales}, fraction {arguments.fraction}"
             f"{' (same change rows on every scale)' if getattr(arguments, 'same_change_rows', False) else ''}, "
             f"epochs {arguments.epochs}, driver_rows {arguments.driver_rows if arguments.driver_rows is not None else 'default'}, "
             f"arrange_rows {_arrange_rows(getattr(arguments, 'arrange_rows', -1))}, "
             f"parallelism {getattr(arguments, 'parallelism', None) or 'default'}, "
             f"switch interval {_switch_interval(getattr(arguments, 'switch_interval', -1))}, "
             f"queries {'none (--sweep-only)' if getattr(arguments, 'sweep_only', False) else arguments.queries}, "
             f"sweep {getattr(arguments, 'sweep', [])} of queries {getattr(arguments, 'sweep_queries', [])}, source writer {getattr(arguments, 'source_writer', 'spark')}. One Spark session, local[*] on {os.cpu_count()} cores; per table and "
             "epoch the incremental epoch and a full recompute-and-overwrite run back to back.", "",
             *_targets_lines(runs, sweep)]
    for run in runs:
        rows = summarize(run)
        incremental, recompute, ratio = whole_epochs(run)
        lines += [f"## Scale {run['scale']:g}, {run['fraction'] * 100:g}% of orders changed per epoch", "",
                  f"**Whole epoch: incremental {incremental:.1f} s, recompute-and-overwrite {recompute:.1f} s: "
                  f"{ratio:.2f}x** (mean of {len(run['epochs'])} epochs; >1 means incremental is faster).", "",
                  *_day_lines(run),
                  *_peak_line(run),
                  (f"Resumed from {run['resumed']}: no first epoch in this run. " if run.get("resumed") else
                   f"First epoch (all tables, rescan): {run['first_epoch_seconds']} s{_first_epoch_parts(run)}. ") + "Noop epoch: mean "
                  f"{_format(_mean(e['noop_seconds'] for e in run['epochs']))} s. Floor (read the change "
                  f"batches + one empty commit): mean {_format(_mean(e['floor_seconds'] for e in run['epochs']))} s "
                  f"through Spark, {_format(_mean(e.get('floor_driver_seconds') for e in run['epochs']))} s as the "
                  "engine reads them (on the driver, shared by the epoch's steps).", "",
                  *_unread_line(run),
                  *_choices_line(run),
                  *_arranged_line(run),
                  "Per table (a step's seconds overlap with other tables' steps: the epoch runs "
                  "`parallelism` steps at once; recomputes run as many at once). Jobs, commits (on the driver), "
                  "input versions read (time-travel reads through Spark / reads of some keys' rows on the "
                  "driver) and MB scanned are per step; "
                  "job s: from each job's submission to its end, summed (a step far above it waits outside "
                  "Spark's jobs: planning, Python, commits); task s: its tasks' run time.", "",
                  "| table | techniques | step s | recompute s | speedup | jobs | job s | task s | commits (driver) "
                  "| versions (Spark / keys) | MB scanned | rows read |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['table']} | {r['techniques']} | {_format(r['incremental'])} | {_format(r['recompute'])} | "
                         f"{_format(r['speedup'], 1)} | {_format(r['jobs'], 0)} | {_format(r['job_seconds'])} | "
                         f"{_format(r['task_seconds'])} | {_format(r['commits'], 0)} "
                         f"({_format(r['driver_commits'], 0)}) | {_format(r['versions'], 0)} ({_format(r['time_travel'], 0)} / "
                         f"{_format(r.get('restricted'), 0)}) "
                         f"| {_format(r['megabytes'], 1)} | {r['rows_read']:.0f} |")
        lines.append("")
    if sweep:
        epochs = len(sweep[0]["epochs"])
        lines += [f"## Sweep over change fractions (scale {sweep[0]['scale']:g}, one warehouse, {epochs} epoch"
                  f"{'s' if epochs > 1 else ''} at each "
                  + (f"fraction in turn, resumed from {sweep[0]['resumed']})" if sweep[0].get("resumed") else
                     f"fraction in turn after a first epoch of {sweep[0]['first_epoch_seconds']} s)"), "",
                  "| fraction | epoch | whole epoch s | recompute s | recompute before / after s | speedup "
                  "| sources warmed s | written, flushed first MB |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for run in sweep:
            for e in run["epochs"]:
                lines.append(f"| {run['fraction'] * 100:g}% | {e['index']} | {e['incremental_seconds']:.1f} | "
                             f"{e['recompute_seconds']:.1f} | {_sides(e)} | "
                             f"{e['recompute_seconds'] / e['incremental_seconds']:.2f} | "
                             f"{_format(e.get('sources_warmed_seconds'))} | "
                             f"{_format(e.get('settled', {}).get('incremental', {}).get('pending_write_megabytes'), 1)} |")
        lines += ["", "| fraction | epoch | table | technique | step s | recompute s | recompute before / after s "
                      "| speedup | step / recompute tasks s | step / recompute tasks' CPU s | recompute frame s "
                      "(untimed) |",
                  "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for run in sweep:
            for e in run["epochs"]:
                for name, t in sorted(e["tables"].items()):
                    speedup = t["recompute_seconds"] / t["incremental_seconds"] if t["incremental_seconds"] else None
                    reason = (f" ({str(t['reason']).split(':')[0]})" if t.get("reason") else "") + _given_up(t)
                    lines.append(f"| {run['fraction'] * 100:g}% | {e['index']} | {name} | {t['technique']}{reason} | "
                                 f"{_format(t['incremental_seconds'])} | {_format(t['recompute_seconds'])} | "
                                 f"{_sides(t)} | {_format(speedup, 1)} | {_pair(t, 'task_seconds')} | "
                                 f"{_pair(t, 'task_cpu_seconds')} | "
                                 f"{_format((t.get('recompute_cost') or {}).get('frame_seconds'))} |")
        lines.append("")
    return "\n".join(lines)


def _chart_scales(axis, runs: list[dict]) -> None:
    """Seconds against scale: the whole epoch incremental and recomputed (means over the epochs),
    and each table's incremental step."""
    runs = sorted(runs, key=lambda run: run["scale"])
    scale = [run["scale"] for run in runs]
    for key, label, style in (("incremental_seconds", "whole epoch, incremental", "o-"),
                              ("recompute_seconds", "whole epoch, recompute and overwrite", "s--")):
        axis.plot(scale, [statistics.mean(e[key] for e in run["epochs"]) for run in runs], style, linewidth=2,
                  label=label)
    for name in sorted({n for run in runs for e in run["epochs"] for n in e["tables"]}):
        axis.plot(scale, [statistics.mean(e["tables"][name]["incremental_seconds"] for e in run["epochs"]
                                          if name in e["tables"]) for run in runs], ":", linewidth=0.8,
                  label=f"{name.replace('tpch_', '')} step")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("TPC-H scale")
    axis.set_ylabel("seconds")
    axis.set_title("seconds per epoch against scale")
    axis.legend(fontsize=6)


def chart(runs: list[dict], sweep: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = len({run["scale"] for run in runs}) > 1
    panels = 1 + scales + bool(sweep)
    figure, axes = plt.subplots(1, panels, figsize=(7 * panels, 5), squeeze=False)
    left, right = axes[0][0], (axes[0][-1] if sweep else None)
    if scales:
        _chart_scales(axes[0][1], runs)
    for run in runs:
        rows = [r for r in summarize(run) if r["speedup"]]
        left.plot([r["table"].replace("tpch_", "") for r in rows], [r["speedup"] for r in rows], "o-",
                  label=f"scale {run['scale']:g}")
    left.axhline(1, color="grey", linewidth=0.8)
    left.set_yscale("log")
    left.set_ylabel("recompute s / incremental s")
    left.set_title("speedup per query")
    left.tick_params(axis="x", rotation=90)
    left.legend()
    if sweep:
        tables = sorted({r["table"] for run in sweep for r in summarize(run)})
        for name in tables:
            points = [(run["fraction"], r) for run in sweep for r in summarize(run) if r["table"] == name]
            right.plot([f * 100 for f, _ in points], [r["incremental"] or float("nan") for _, r in points], "o-", label=f"{name} incremental")
            right.plot([f * 100 for f, _ in points], [r["recompute"] for _, r in points], "x--", label=f"{name} recompute")
        right.set_xscale("log")
        right.set_xlabel("% of orders changed per epoch")
        right.set_ylabel("seconds")
        right.set_title("seconds vs change fraction")
        right.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_report(out: Path, text: str, runs: list[dict], sweep: list[dict]) -> None:
    """report.md and chart.png under `out`; the report printed."""
    (out / "report.md").write_text(text)
    chart(runs, sweep, out / "chart.png")
    print(text)
    print(f"written to {out}")


def main(argv=None) -> None:
    arguments = _arguments(argv)
    work = Path(arguments.work)
    work.mkdir(parents=True, exist_ok=True)
    spark = start_session(arguments.driver_memory)
    out = results_folder()
    started = out.name
    runs, sweep = [], []

    def save(in_progress: dict | None = None):
        (out / "results.json").write_text(json.dumps(dict(arguments=vars(arguments), runs=runs, sweep=sweep,
                                                          **({"in_progress": in_progress} if in_progress else {})),
                                                     indent=1))

    queries = [f"tpch_q{n:02d}" for n in arguments.queries]
    arguments.epochs = arguments.epochs or (24 if arguments.day else 3)
    if arguments.day and len(arguments.fraction) > 1:
        raise SystemExit("make bench: --day takes one --fraction (a day is one change stream)")
    bracket = STEPWISE if arguments.bracket_steps else arguments.bracket_recompute
    for scale in [] if arguments.sweep_only else arguments.scales:
        fractions = [f * (arguments.scales[0] / scale if arguments.same_change_rows else 1) for f in arguments.fraction]
        runs.extend(run_scale(spark, work, scale, fractions, arguments.epochs, queries, arguments.driver_rows,
                              arguments.source_writer, arguments.arrange_rows, arguments.parallelism, arguments.day,
                              switch_interval=arguments.switch_interval, keep=arguments.keep, resume=arguments.resume,
                              recompute_every=arguments.recompute_every, warm_sources=arguments.warm_sources,
                              bracket=bracket, progress=save))
        save()
    sweep_queries = [f"tpch_q{n:02d}" for n in arguments.sweep_queries]
    if arguments.sweep:
        sweep.extend(run_scale(spark, work, arguments.scales[0], arguments.sweep, arguments.sweep_epochs, sweep_queries,
                               arguments.driver_rows, arguments.source_writer, arguments.arrange_rows,
                               arguments.parallelism, switch_interval=arguments.switch_interval, keep=arguments.keep,
                               resume=arguments.resume, warm_sources=arguments.warm_sources,
                               bracket=bracket, progress=save))
        save()
    write_report(out, report_markdown(arguments, runs, sweep, started), runs, sweep)


if __name__ == "__main__":
    main()
