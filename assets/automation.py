"""Automation: per cadence, a job over the derived tables and a schedule that materializes the
newest closed window of every one of them; a daily job and schedule for the `matches_full_recompute`
checks; a sensor that watches the sources' Delta versions and observes the source assets when one
moves.

The schedules start stopped (turn them on in the UI, or set default_status): the demo applies its day
of change batches once and stops, so a schedule on the wall clock would apply one empty epoch an
hour after it; and a warehouse whose partitions were not backfilled up to now would get runs that
fail saying which partition to backfill first.
The sensor starts running: it costs a read of eight Delta logs a minute (delta-rs, no Spark).
"""

import json
from typing import Mapping

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    ScheduleDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    build_schedule_from_partitioned_job,
    define_asset_job,
    sensor,
)

from assets.checks import RECOMPUTE_CHECK
from assets.specs import CADENCES, TableSpec
from ops.tpch import TPCH_TABLES
from resources.warehouse import WarehouseResource

VERIFY_JOB = "verify_recompute"


def derived_job_name(cadence: str) -> str:
    return f"derived_{cadence}"


def recompute_check_keys(specs: Mapping[str, TableSpec]) -> list[AssetCheckKey]:
    return [AssetCheckKey(AssetKey(name), RECOMPUTE_CHECK) for name in specs]


def derived_automation(specs: Mapping[str, TableSpec]) -> tuple[list, list]:
    """(jobs, schedules) for the derived tables."""
    jobs, schedules = [], []
    recompute = AssetSelection.checks(*recompute_check_keys(specs))
    for cadence in CADENCES:
        keys = [AssetKey(s.name) for s in specs.values() if s.partitioning == cadence]
        if not keys:
            continue
        job = define_asset_job(
            derived_job_name(cadence),
            selection=AssetSelection.assets(*keys) - recompute,
            description=f"Every {cadence} derived table with its blocking checks, in dependency order; "
            "a run over a partition range applies the range as one epoch per table (a new table's "
            "first partition on its own) and records one materialization per partition.",
        )
        jobs.append(job)
        schedules.append(build_schedule_from_partitioned_job(
            job,
            name=f"{derived_job_name(cadence)}_schedule",
            description=f"Materializes the newest closed {cadence} window of every {cadence} derived table.",
            minute_of_hour=5,
            default_status=DefaultScheduleStatus.STOPPED,
        ))
    if specs:
        verify = define_asset_job(
            VERIFY_JOB, selection=recompute,
            description="Compare every derived table with a full recompute of its SQL (non-blocking checks).",
        )
        jobs.append(verify)
        schedules.append(ScheduleDefinition(
            name=f"{VERIFY_JOB}_daily", job=verify, cron_schedule="30 3 * * *", execution_timezone="UTC",
            description="Daily: every derived table against its full recompute.",
            default_status=DefaultScheduleStatus.STOPPED,
        ))
    return jobs, schedules


@sensor(
    name="source_versions",
    job_name="observe_sources",
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="Watches the sources' Delta versions (delta-rs, no Spark) and, when one moves, runs "
    "observe_sources so the source assets record their new data versions.",
)
def source_versions_sensor(context: SensorEvaluationContext, warehouse: WarehouseResource):
    from assets.sources import MISSING, observe_delta_source

    seen = json.loads(context.cursor or "{}")
    versions = {name: observe_delta_source(warehouse.source_path(name)).data_version.value for name in TPCH_TABLES}
    moved = {name: (seen.get(name), version) for name, version in versions.items()
             if seen.get(name) != version and version != MISSING}
    cursor = json.dumps(versions, sort_keys=True)
    if not moved:
        missing = sorted(name for name, version in versions.items() if version == MISSING)
        why = f"no source moved: {cursor}" if not missing else (
            f"no source moved; missing: {', '.join(missing)} (run load_tpch or `make demo`)")
        return SensorResult(skip_reason=SkipReason(why), cursor=cursor)
    context.log.info("sources moved: " + ", ".join(f"{n} {a} -> {b}" for n, (a, b) in sorted(moved.items())))
    return SensorResult(run_requests=[RunRequest(run_key=cursor, tags={"epochal/sources": cursor[:200]})],
                        cursor=cursor)
