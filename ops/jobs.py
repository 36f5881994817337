"""Dagster jobs that are not derived tables: loading TPC-H, and the hourly change stream.

The ops only translate config into calls of `ops.tpch` and `ops.changes` and report what those did,
so the same work runs the same way from a notebook or a test without Dagster.

No `from __future__ import annotations` here: Dagster reads the ops' config and resource types
from their annotations at definition time.
"""

from datetime import datetime, timedelta, timezone

from dagster import (
    AssetSelection,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    Out,
    Output,
    define_asset_job,
    job,
    op,
)
from pydantic import Field

from assets.sources import SOURCE_ASSETS, first_logical_time
from epochal.storage.clock import utc
from ops.changes import REPORTED_TABLES, ChangeGenerator, batch_table
from ops.tpch import TPCH_TABLES, format_scale, load_tpch
from resources.spark import SparkResource
from resources.warehouse import WarehouseResource

FIRST_BATCH_AFTER_LOAD = timedelta(minutes=30)


def parse_time(text: str) -> datetime:
    return utc(datetime.fromisoformat(text))


def clock_start(batches: int = 24, now: datetime | None = None) -> datetime:
    """Where a new warehouse's logical clock starts: `batches` hours before the current hour, so
    that batch i, stamped start + 30 min + (i-1) h, falls in an hourly partition closed by now."""
    hour = utc(now or datetime.now(timezone.utc)).replace(minute=0, second=0, microsecond=0)
    return hour - timedelta(hours=batches)


def batch_time(start: datetime, index: int) -> datetime:
    """Batch i (from 1) is stamped one hour after batch i-1, starting at `start`."""
    return start + timedelta(hours=index - 1)


class LoadTpchConfig(Config):
    scale: float = Field(default=0.1, description="TPC-H scale factor (1 = about 1 GB)")
    logical_time: str | None = Field(
        default=None, description="logical time stamped on the load (ISO 8601); unset: 24 hours "
        "before the current hour, room for a day of hourly batches up to now",
    )


class ChangeBatchesConfig(Config):
    batches: int = Field(
        default=24, description="how many hourly batches to apply after the last one present"
    )
    start: str | None = Field(
        default=None,
        description="logical time of batch 1 (ISO 8601); batch i is stamped start + (i-1) hours. "
        "Unset: 30 minutes after the load's logical time",
    )
    fraction: float = Field(
        default=0.001, description="share of orders (and of each dimension) changed per batch"
    )
    seed: int = Field(default=7, description="random seed; with the same data, same batches")


@op(
    description="Generate TPC-H at the configured scale and create the eight Delta source "
    "tables (a no-op that says so when they are already there at that scale).",
    out=Out(description="ops.tpch.LoadReport"),
)
def load_tpch_sources(
    context: OpExecutionContext,
    config: LoadTpchConfig,
    spark: SparkResource,
    warehouse: WarehouseResource,
) -> Output:
    logical_time = parse_time(config.logical_time) if config.logical_time else clock_start()
    report = load_tpch(spark.session(), warehouse.warehouse().root, config.scale, logical_time)
    context.log.info(report.message)
    lines = ["| table | rows | files | Delta version |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {t.name} | {'' if t.rows is None else t.rows} | {t.files} | {t.version} |"
        for t in report.tables.values()
    ]
    return Output(
        report,
        metadata={
            "skipped": report.skipped,
            "message": MetadataValue.text(report.message),
            "scale": MetadataValue.text(format_scale(report.scale)),
            "logical_time": MetadataValue.text(report.logical_time.isoformat()),
            "rows": sum(t.rows or 0 for t in report.tables.values()),
            "tables": MetadataValue.md("\n".join(lines)),
            "seconds": round(report.seconds, 2),
        },
    )


@op(
    description="Apply hourly change batches (new, deleted and updated orders and line items, "
    "dimension updates) after the last batch present, one MERGE per table per batch.",
    out=Out(description="list of ops.changes.BatchReport"),
)
def apply_change_batches(
    context: OpExecutionContext,
    config: ChangeBatchesConfig,
    spark: SparkResource,
    warehouse: WarehouseResource,
) -> Output:
    generator = ChangeGenerator(
        spark.session(), warehouse.warehouse().root, seed=config.seed, fraction=config.fraction
    )
    first = generator.history().last_batch + 1
    if config.start:
        start = parse_time(config.start)
    else:
        loaded = first_logical_time(warehouse.warehouse().root)
        if loaded is None:
            raise Failure(description="the sources carry no logical time of their load to count batches from "
                          "(or the warehouse is not local): set `start`")
        start = loaded + FIRST_BATCH_AFTER_LOAD
    reports = []
    for index in range(first, first + config.batches):
        report = generator.apply_batch(index, batch_time(start, index))
        reports.append(report)
        counts = "; ".join(
            "{} +{} -{} ~{}".format(name, *report.counts(name)) for name in REPORTED_TABLES
        )
        context.log.info(
            f"batch {index} at {report.logical_time.isoformat()} in {report.seconds:.1f}s: {counts}"
        )
    totals = {
        name: [sum(r.counts(name)[i] for r in reports) for i in range(3)] for name in TPCH_TABLES
    }
    return Output(
        reports,
        metadata={
            "batches_applied": len(reports),
            "first_batch": first if reports else 0,
            "last_batch": first + len(reports) - 1,
            "per_batch": MetadataValue.md(batch_table(reports, markdown=True) if reports else ""),
            **{
                f"{name}_inserted_deleted_updated": MetadataValue.text(
                    "{} / {} / {}".format(*totals[name])
                )
                for name in REPORTED_TABLES
            },
            "seconds": round(sum(r.seconds for r in reports), 2),
        },
    )


@job(name="load_tpch", description="Load TPC-H into <warehouse>/sources as Delta tables.")
def load_tpch_job():
    load_tpch_sources()


@job(
    name="apply_changes",
    description="Apply N hourly change batches to the TPC-H sources (continues after the last).",
)
def apply_changes_job():
    apply_change_batches()


observe_sources_job = define_asset_job(
    "observe_sources",
    selection=AssetSelection.assets(*(asset.key for asset in SOURCE_ASSETS)),
    description="Observe the source tables' Delta versions (delta-rs, no Spark).",
)

JOBS = [load_tpch_job, apply_changes_job, observe_sources_job]
