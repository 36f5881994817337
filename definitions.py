"""The Dagster code location: source and derived-table assets with their checks, the jobs and
schedules around them, and the resources.

`dagster dev -w dagster_workspace.yaml` (or `make ui`) loads `defs`: the warehouse is
$EPOCHAL_WAREHOUSE (default <repository>/warehouse), the derived tables are the SQL files of
$EPOCHAL_SQL_FOLDER (default assets/sql). Partitions start where the warehouse's sources start
(the logical time of their first commit), so the partitions a user sees are those the data fills. The demo and the tests build the same definitions for a
chosen warehouse or SQL folder with `build_definitions`.

Runs execute in process: one Spark driver per run, shared by every step (a process per step would
start a JVM and define the tables again for each one).
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import Definitions, in_process_executor

from assets import SOURCE_ASSETS, derived_definitions
from assets.automation import source_versions_sensor
from assets.sources import first_logical_time
from assets.specs import SQL_FOLDER
from ops.jobs import JOBS
from ops.maintenance import MAINTENANCE_JOBS
from resources.epochal import EpochalResource
from resources.quality import GreatExpectationsResource
from resources.spark import SparkResource
from resources.warehouse import WarehouseResource


def build_definitions(
    warehouse: WarehouseResource | None = None,
    spark: SparkResource | None = None,
    sql_folder: Path | str = SQL_FOLDER,
    cost_model: bool = True,
) -> Definitions:
    warehouse = warehouse or WarehouseResource()
    spark = spark or SparkResource()
    root = warehouse.warehouse().root
    derived = derived_definitions(sql_folder, explain_root=root, sources_start=first_logical_time(root))
    return Definitions(
        assets=[*SOURCE_ASSETS, *derived.assets],
        asset_checks=derived.checks,
        jobs=[*JOBS, *MAINTENANCE_JOBS, *derived.jobs],
        schedules=derived.schedules,
        sensors=[source_versions_sensor],
        resources={
            "spark": spark,
            "warehouse": warehouse,
            "epochal": EpochalResource(spark=spark, warehouse=warehouse, cost_model=cost_model),
            "great_expectations": GreatExpectationsResource(),
        },
        executor=in_process_executor,
    )


def default_sql_folder() -> str:
    """The derived tables' folder: $EPOCHAL_SQL_FOLDER, else assets/sql."""
    return os.environ.get("EPOCHAL_SQL_FOLDER") or str(SQL_FOLDER)


defs = build_definitions(sql_folder=default_sql_folder())
