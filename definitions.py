"""The Dagster code location: source assets, the TPC-H and change-stream jobs, and resources.

`dagster dev -w dagster_workspace.yaml` (or `make ui`) loads `defs`; the demo builds the same
definitions for a chosen warehouse with `build_definitions`.
"""

from __future__ import annotations

from dagster import Definitions

from assets import ALL_ASSETS
from ops.jobs import JOBS
from resources.spark import SparkResource
from resources.warehouse import WarehouseResource


def build_definitions(
    warehouse: WarehouseResource | None = None, spark: SparkResource | None = None
) -> Definitions:
    return Definitions(
        assets=ALL_ASSETS,
        jobs=JOBS,
        resources={
            "spark": spark or SparkResource(),
            "warehouse": warehouse or WarehouseResource(),
        },
    )


defs = build_definitions()
