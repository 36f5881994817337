"""The demo: load TPC-H, apply a day of hourly change batches, and maintain every derived table
through it, all through Dagster.

    python -m ops.demo --warehouse DIR [--scale 0.1] [--batches 24] [--seed 7] [--fraction 0.001]
                       [--tables tpch_q01,tpch_q06]

The logical clock ends now: a new warehouse's load is stamped N hours before the current hour (N =
--batches) and batch i 30 minutes + (i-1) hours after the load, so the day of batches fills the
hourly partitions that have closed by now, and the partitions (which start where the warehouse's
sources start) are exactly the demo's. Runs the `load_tpch` job, then the `apply_changes` job, then
`observe_sources`; then materializes every derived table (or those named by --tables) for the
partitions of batches 1..N as ONE run over the range (what a single-run backfill launches: one
Spark driver, every table defined once, tables in dependency order, each processing the range as
one epoch span after its first partition, with its blocking checks), then the `verify_recompute`
job (every table against a full recompute). All in this process and recorded in the Dagster
instance at $DAGSTER_HOME (default <warehouse>/.dagster), so `make ui` shows the runs, the
partitions and the checks. Prints the change batches, a per-table summary and the UI pages to open;
exits 1 when a table failed or a check did not pass. The JVM's own output (Ivy's report, Spark and
Hadoop warnings) goes to <warehouse>/logs/spark.log; it is printed only when Spark cannot start.

Re-running on an existing warehouse continues it, never doubles it: the load is skipped when the
tables are there at the same scale (another scale is an error saying what to do), and `--batches N`
means "the warehouse holds batches 1..N": only the batches not yet applied are applied, and only
as far as the clock has come (batch i needs the hour load + i h to have closed). To start over,
delete the warehouse folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timedelta, timezone

from epochal.storage.access import StorageUnreachable, check_warehouse
from epochal.storage.warehouse import Warehouse, is_local, local_path
from ops.changes import ChangeConflict, batch_table, change_history
from ops.jobs import FIRST_BATCH_AFTER_LOAD, clock_start
from ops.tpch import TpchLoadConflict, format_scale
from resources.session import storage_options_for

QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
SILENT_LOGS = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
HOUR = timedelta(hours=1)
UI_TABLE = "returns_by_nation"  # reads a derived table (tpch_q10): a lineage worth opening


class ClockConflict(RuntimeError):
    """More batches asked for than the warehouse's logical clock has hours for yet."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--warehouse", required=True, help="warehouse folder (created if missing) or s3a://bucket/path (the bucket must exist)")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor")
    parser.add_argument("--batches", type=int, default=24, help="hourly batches the warehouse "
                        "should hold when the demo ends")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--fraction", type=float, default=0.001,
                        help="share of orders (and of each dimension) changed per batch")
    parser.add_argument("--tables", default="", help="comma-separated derived tables to materialize "
                        "(default: all of assets/sql)")
    return parser.parse_args(argv)


def _user_error(error: BaseException) -> BaseException | None:
    """The load, change or clock conflict (or unusable object store) behind a failed run, if that
    is what failed it."""
    seen = error
    while seen is not None:
        if isinstance(seen, (TpchLoadConflict, ChangeConflict, ClockConflict, StorageUnreachable)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def demo_clock(loaded_at: datetime | None, batches: int, now: datetime | None = None) -> datetime:
    """The logical time of the load: the warehouse's own, or for a new one `batches` hours before
    the current hour. Raises ClockConflict when batch `batches` would fall in an hour not closed
    yet (its partition would not exist)."""
    now = now or datetime.now(timezone.utc)
    start = loaded_at or clock_start(batches, now)
    closed = int((now - start) // HOUR)
    if batches > closed:
        raise ClockConflict(
            f"this warehouse's logical clock started at {start:%Y-%m-%d %H:%M} UTC (its load), so it holds "
            f"room for {closed} hourly batches by now, not {batches}: batch i falls in the hour "
            f"load + (i-1) h, which must have closed. Ask for --batches {closed} or fewer, wait, or delete "
            "the warehouse folder to start a new day ending now"
        )
    return start


def run(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from assets.sources import first_logical_time
    from definitions import build_definitions
    from resources.session import connect_url
    from resources.spark import SparkResource
    from resources.warehouse import WarehouseResource

    started = time.monotonic()
    warehouse = Warehouse(args.warehouse)
    if is_local(warehouse.root):
        os.makedirs(warehouse.root, exist_ok=True)
    else:  # fail in seconds, before loading, when the store cannot be used
        check_warehouse(warehouse.root, storage_options_for(warehouse.root))
        os.environ["EPOCHAL_WAREHOUSE"] = warehouse.root  # the Spark session then loads hadoop-aws
    start = demo_clock(first_logical_time(warehouse.root), args.batches)
    if not os.environ.get("DAGSTER_HOME"):
        if not is_local(warehouse.root):
            print("DAGSTER_HOME is not set and the warehouse is not a folder: set DAGSTER_HOME", file=sys.stderr)
            return 2
        os.environ["DAGSTER_HOME"] = os.path.join(warehouse.root, ".dagster")
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    settings = os.path.join(os.environ["DAGSTER_HOME"], "dagster.yaml")
    if not os.path.exists(settings):  # a throwaway instance of the demo's own: no usage statistics
        with open(settings, "w") as file:
            file.write("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.get()

    log_file = os.path.join(local_path(warehouse.root), "logs", "spark.log")
    spark = SparkResource(log_file=log_file)
    resources = {"warehouse": WarehouseResource(root=warehouse.root), "spark": spark}
    defs = build_definitions(**resources)
    remote = connect_url(spark.settings())
    spark_output = f"Spark: the Connect server at {remote}" if remote else f"Spark's own output in {log_file}"
    print(f"warehouse {warehouse.root}; Dagster runs in {os.environ['DAGSTER_HOME']}; {spark_output}")
    print(f"logical clock: load at {start:%Y-%m-%d %H:%M} UTC, batch i at load + 30 min + (i-1) h, "
          f"hourly partitions from {start:%Y-%m-%d-%H:%M}")

    load = defs.resolve_job_def("load_tpch").execute_in_process(
        run_config={
            **SILENT_LOGS,
            "ops": {"load_tpch_sources": {"config": {
                "scale": args.scale, "logical_time": start.isoformat()}}},
        },
        instance=instance,
    )
    load_report = load.output_for_node("load_tpch_sources")
    print(f"load ({load_report.seconds:.1f}s): {load_report.message}")

    present = change_history(spark.session(), warehouse.root).last_batch
    missing = max(0, args.batches - present)
    if present:
        print(f"the warehouse already holds batches 1..{present}; "
              + (f"applying {present + 1}..{args.batches}" if missing else "nothing to apply"))
    reports = []
    if missing:
        changes = defs.resolve_job_def("apply_changes").execute_in_process(
            run_config={
                **QUIET_LOGS,
                "ops": {"apply_change_batches": {"config": {
                    "batches": missing,
                    "start": (start + FIRST_BATCH_AFTER_LOAD).isoformat(),
                    "fraction": args.fraction,
                    "seed": args.seed,
                }}},
            },
            instance=instance,
        )
        reports = changes.output_for_node("apply_change_batches")

    defs.resolve_job_def("observe_sources").execute_in_process(
        run_config=QUIET_LOGS, instance=instance
    )

    if reports:
        print(f"\nchange batches (rows +inserted -deleted ~updated), seed {args.seed}, "
              f"fraction {args.fraction}, TPC-H scale {format_scale(args.scale)}:")
        print(batch_table(reports))
        print(f"{len(reports)} batches in {sum(r.seconds for r in reports):.1f}s")

    ok = True
    tables = [t for t in args.tables.split(",") if t]
    if args.batches > 0:
        # built again now that the sources exist: the partitions start where they start
        defs = build_definitions(**resources)
        ok = materialize_derived(defs, instance, start, args.batches, tables)
    print(f"\ndemo done in {time.monotonic() - started:.1f}s")
    if args.batches > 0:
        print(ui_links(warehouse.root, start, args.batches, tables))
    return 0 if ok else 1


def ui_links(root: str, start: datetime, batches: int, tables: list[str]) -> str:
    """The pages of the Dagster UI a newcomer should open after the demo."""
    from resources.warehouse import default_root

    table = UI_TABLE if not tables or UI_TABLE in tables else tables[0]
    ui = f"http://127.0.0.1:{os.environ.get('PORT', '3000')}"
    command = "make ui" if os.path.abspath(root) == os.path.abspath(default_root()) else f"make ui WAREHOUSE={root}"
    first, last = partition_key(start), partition_key(start + (batches - 1) * HOUR)
    return "\n".join([
        f"see it in the Dagster UI: `{command}`, then open",
        f"  {table} and the tables it reads:  {ui}/assets/{table}?view=lineage&lineageScope=upstream&lineageDepth=2",
        f"  its partitions {first} .. {last}:  {ui}/assets/{table}?view=partitions",
        f"  the runs, with their partition ranges:  {ui}/runs",
    ])


def partition_key(start: datetime) -> str:
    return f"{start:%Y-%m-%d-%H:%M}"


def materialize_derived(defs, instance, start: datetime, batches: int, tables: list[str]) -> bool:
    """Materialize the derived tables for the partitions holding batches 1..`batches` in one run,
    then verify them against full recomputes; print the summary. True when everything passed."""
    from dagster import AssetCheckKey, AssetKey
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from assets.automation import VERIFY_JOB, derived_job_name
    from assets.checks import RECOMPUTE_CHECK
    from ops.summary import summarize

    first_key, last_key = partition_key(start), partition_key(start + (batches - 1) * HOUR)
    job = defs.resolve_job_def(derived_job_name("hourly"))
    selection = [AssetKey(t) for t in tables] or None
    names = tables or sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys)
    print(f"\nmaterializing {len(names)} derived tables for partitions {first_key} .. {last_key} "
          f"({batches} hourly epochs) in one run")
    began = time.monotonic()
    result = job.execute_in_process(
        run_config=QUIET_LOGS, instance=instance, raise_on_error=False, asset_selection=selection,
        tags={ASSET_PARTITION_RANGE_START_TAG: first_key, ASSET_PARTITION_RANGE_END_TAG: last_key},
    )
    run_seconds = time.monotonic() - began
    began = time.monotonic()
    verify = defs.resolve_job_def(VERIFY_JOB)
    if tables:
        verify = verify.get_subset(asset_selection=set(), asset_check_selection={
            AssetCheckKey(AssetKey(n), RECOMPUTE_CHECK) for n in names})
    verified = verify.execute_in_process(run_config=QUIET_LOGS, instance=instance, raise_on_error=False)
    verify_seconds = time.monotonic() - began
    text, ok = summarize(result, verified, names, batches)
    print(text)
    print(f"materialization run {result.run_id[:8]}: {run_seconds:.1f}s; verify run "
          f"{verified.run_id[:8]}: {verify_seconds:.1f}s")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except Exception as error:
        cause = _user_error(error)
        if cause is None:
            raise
        print(f"\ndemo stopped: {cause}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
