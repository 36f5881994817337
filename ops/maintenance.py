"""Maintenance jobs for the derived tables: OPTIMIZE, VACUUM within retention, and deleting a
table's state to force a rebuild. The work is in `epochal.maintenance`; these ops pass config in,
log a line per table, and report a table of what was done.

Run them when no materialization of the same tables is running (see epochal/maintenance.py).

No `from __future__ import annotations` here: Dagster reads config and resource types from the
annotations.
"""

from dagster import Config, MetadataValue, OpExecutionContext, Output, job, op
from pydantic import Field

from epochal import maintenance
from resources.spark import SparkResource
from resources.warehouse import WarehouseResource


class OptimizeConfig(Config):
    tables: list[str] = Field(default=[], description="derived tables to compact; empty: all")
    state: bool = Field(default=False, description="also OPTIMIZE their state tables, which the engine compacts "
                        "itself, sorted by key, once their appends are due (epochal.keyed.upkeep.Upkeep); "
                        "Spark's OPTIMIZE rewrites a state's every row to pack an hour's few appends")
    bookkeeping: bool = Field(default=True, description="also compact their ledgers and the remap (delta-rs)")


class VacuumConfig(Config):
    tables: list[str] = Field(default=[], description="derived tables to vacuum; empty: all")
    state: bool = Field(default=True, description="also vacuum their state tables")
    bookkeeping: bool = Field(default=False, description="also vacuum their ledgers and the remap")
    arrangements: bool = Field(default=True, description="also vacuum the arrangements (the copies of large inputs "
                               "sorted by a key; each rebuild leaves the last copy's files behind)")
    retention_hours: float = Field(
        default=maintenance.DEFAULT_RETENTION_HOURS,
        description="keep files removed within this many hours (Delta's default: 168 = 7 days); raised "
        "where the engine's next epoch still needs an older version",
    )
    allow_short_retention: bool = Field(default=False, description="permit a retention below 168 hours")
    dry_run: bool = Field(default=False, description="only count the files VACUUM would delete")


class DeleteStateConfig(Config):
    table: str = Field(description="the derived table whose state tables to delete")


def _report(results, columns: list[str]) -> Output:
    lines = ["| table | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
    lines += [f"| {r.target.label} | " + " | ".join(str(r.detail.get(c, "")) for c in columns) + " |" for r in results]
    return Output(
        [r.message for r in results],
        metadata={
            "tables": len(results),
            "seconds": round(sum(r.seconds for r in results), 2),
            "report": MetadataValue.md("\n".join(lines)),
        },
    )


@op(description="Compact the files of derived tables, their ledgers and the remap (their state too, "
    "with state: true).")
def optimize_derived_tables(context: OpExecutionContext, config: OptimizeConfig, spark: SparkResource,
                            warehouse: WarehouseResource) -> Output:
    session, root = spark.session(), warehouse.warehouse().root
    results = []
    for target in maintenance.targets(root, config.tables or None, state=config.state,
                                      bookkeeping=config.bookkeeping, spark=session):
        result = maintenance.optimize(session, target)
        context.log.info(result.message)
        results.append(result)
    return _report(results, ["files_removed", "files_added", "version"])


@op(description="VACUUM derived and state tables within retention, never deleting files the engine's "
    "next epochs read (from the ledgers).")
def vacuum_derived_tables(context: OpExecutionContext, config: VacuumConfig, spark: SparkResource,
                          warehouse: WarehouseResource) -> Output:
    session, root = spark.session(), warehouse.warehouse().root
    needed = maintenance.needed_versions(root, session)
    results = []
    for target in maintenance.targets(root, config.tables or None, state=config.state,
                                      bookkeeping=config.bookkeeping, arrangements=config.arrangements,
                                      spark=session):
        result = maintenance.vacuum(
            session, target, config.retention_hours, keep_version=needed.get(target.path),
            allow_short_retention=config.allow_short_retention, dry_run=config.dry_run,
        )
        context.log.info(result.message)
        results.append(result)
    return _report(results, ["files_deletable", "files_deleted", "retention_hours", "keep_version"])


@op(description="Delete a derived table's state tables; its next epoch with input changes rescans "
    "(reason STATE_MISSING) and rebuilds them.")
def delete_derived_state(context: OpExecutionContext, config: DeleteStateConfig, spark: SparkResource,
                         warehouse: WarehouseResource) -> Output:
    result = maintenance.delete_state(warehouse.warehouse().root, config.table, spark.session())
    context.log.info(result.message)
    return Output(result.message, metadata={
        "table": config.table,
        "deleted": MetadataValue.json(result.detail.get("deleted", [])),
        "message": MetadataValue.text(result.message),
    })


@job(name="optimize_tables", description="OPTIMIZE derived tables (and ledgers, remap; state on request).")
def optimize_tables_job():
    optimize_derived_tables()


@job(name="vacuum_tables", description="VACUUM derived tables and their state within retention.")
def vacuum_tables_job():
    vacuum_derived_tables()


@job(name="delete_table_state", description="Delete one derived table's state to force its rebuild.")
def delete_table_state_job():
    delete_derived_state()


MAINTENANCE_JOBS = [optimize_tables_job, vacuum_tables_job, delete_table_state_job]
