"""The demo: load TPC-H, apply a day of hourly change batches, and maintain every derived table
through it, all through Dagster.

    python -m ops.demo --warehouse DIR [--scale 0.1] [--batches 24] [--seed 7] [--fraction 0.001]
                       [--tables tpch_q01,tpch_q06]

Runs the `load_tpch` job (initial load stamped 2026-01-01T00:00Z), then the `apply_changes` job
(batch i stamped 2026-01-01T00:30Z + (i-1) h), then `observe_sources`; then materializes every
derived table (or those named by --tables) for the hourly partitions 2026-01-01-00:00 .. the
partition of the last batch as ONE run over the range (what a single-run backfill launches: one
Spark driver, every table defined once, tables in dependency order, each processing the range as
one epoch span after its first partition, with its blocking checks), then the `verify_recompute`
job (every table against a full recompute). All in this process and recorded in the Dagster instance at $DAGSTER_HOME (default
<warehouse>/.dagster), so `make ui` shows the runs, the partitions and the checks. Prints the
change batches and a per-table summary; exits 1 when a table failed or a check did not pass.

Re-running on an existing warehouse continues it, never doubles it: the load is skipped when the
tables are there at the same scale (another scale is an error saying what to do), and `--batches N`
means "the warehouse holds batches 1..N": only the batches not yet applied are applied. To start
over, delete the warehouse folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

from epochal.storage import StorageUnreachable, check_warehouse
from epochal.warehouse import Warehouse, is_local
from resources.session import storage_options_for
from ops.changes import ChangeConflict, batch_table, change_history
from ops.jobs import FIRST_BATCH_LOGICAL_TIME, LOAD_LOGICAL_TIME, parse_time
from ops.tpch import TpchLoadConflict, format_scale

QUIET_LOGS = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


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
    """The load or change conflict (or unusable object store) behind a failed run, if that is
    what failed it."""
    seen = error
    while seen is not None:
        if isinstance(seen, (TpchLoadConflict, ChangeConflict, StorageUnreachable)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def run(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from definitions import build_definitions
    from resources.spark import SparkResource
    from resources.warehouse import WarehouseResource

    started = time.monotonic()
    warehouse = Warehouse(args.warehouse)
    if is_local(warehouse.root):
        os.makedirs(warehouse.root, exist_ok=True)
    else:  # fail in seconds, before loading, when the store cannot be used
        check_warehouse(warehouse.root, storage_options_for(warehouse.root))
        os.environ["EPOCHAL_WAREHOUSE"] = warehouse.root  # the Spark session then loads hadoop-aws
    if not os.environ.get("DAGSTER_HOME"):
        if not is_local(warehouse.root):
            print("DAGSTER_HOME is not set and the warehouse is not a folder: set DAGSTER_HOME", file=sys.stderr)
            return 2
        os.environ["DAGSTER_HOME"] = os.path.join(warehouse.root, ".dagster")
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    settings = os.path.join(os.environ["DAGSTER_HOME"], "dagster.yaml")
    if not os.path.exists(settings):  # the defaults are right; the file silences a warning
        open(settings, "w").close()
    instance = DagsterInstance.get()

    spark = SparkResource()
    defs = build_definitions(warehouse=WarehouseResource(root=warehouse.root), spark=spark)
    print(f"warehouse {warehouse.root}; Dagster runs recorded in {os.environ['DAGSTER_HOME']}")

    load = defs.resolve_job_def("load_tpch").execute_in_process(
        run_config={
            **QUIET_LOGS,
            "ops": {"load_tpch_sources": {"config": {
                "scale": args.scale, "logical_time": LOAD_LOGICAL_TIME}}},
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
                    "start": FIRST_BATCH_LOGICAL_TIME,
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
    if args.batches > 0:
        ok = materialize_derived(defs, instance, args.batches, [t for t in args.tables.split(",") if t])
    print(f"\ndemo done in {time.monotonic() - started:.1f}s; `make ui` shows the runs, partitions and checks")
    return 0 if ok else 1


def materialize_derived(defs, instance, batches: int, tables: list[str]) -> bool:
    """Materialize the derived tables for the partitions holding batches 1..`batches` in one run,
    then verify them against full recomputes; print the summary. True when everything passed."""
    from dagster import AssetCheckKey, AssetKey
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from assets.automation import VERIFY_JOB, derived_job_name
    from assets.checks import RECOMPUTE_CHECK
    from ops.summary import summarize

    start = parse_time(LOAD_LOGICAL_TIME)
    first, last = (start + timedelta(hours=h) for h in (0, batches - 1))
    first_key, last_key = f"{first:%Y-%m-%d-%H:%M}", f"{last:%Y-%m-%d-%H:%M}"
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
