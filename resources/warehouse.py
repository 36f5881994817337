"""The warehouse root as a Dagster resource."""

from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from epochal.storage.warehouse import Warehouse

REPOSITORY = Path(__file__).resolve().parent.parent


def default_root() -> str:
    return os.environ.get("EPOCHAL_WAREHOUSE") or str(REPOSITORY / "warehouse")


class WarehouseResource(ConfigurableResource):
    root: str | None = Field(
        default=None,
        description="folder or URI of the warehouse; unset: $EPOCHAL_WAREHOUSE, else "
        "<repository>/warehouse",
    )

    def warehouse(self) -> Warehouse:
        """Resolved when a run uses it, so the environment of the run decides the default."""
        return Warehouse(self.root or default_root())

    def source_path(self, name: str) -> str:
        return self.warehouse().source_path(name)
