"""The TPC-H source tables as observable source assets.

A source's data version is its Delta table version, read from the Delta log with delta-rs, so an
observation costs milliseconds and starts no Spark job. A table that does not exist yet observes as
version "missing" with a message saying how to create it, instead of failing the run or the code
location.
"""

from __future__ import annotations

import warnings
from datetime import datetime

from dagster import (
    BetaWarning,
    DataVersion,
    MetadataValue,
    ObserveResult,
    observable_source_asset,
)

from epochal.storage.clock import parse_logical_time
from epochal.storage.warehouse import Warehouse, is_local, local_path
from ops.tpch import TPCH_TABLES
from resources.session import storage_options_for
from resources.warehouse import WarehouseResource

MISSING = "missing"


def first_logical_time(root: str) -> datetime | None:
    """The logical time stamped on the sources' first commits (the TPC-H load), or None when the
    warehouse has no stamped sources yet or is not local (read with delta-rs, no Spark, so a code
    location can ask it while loading)."""
    import deltalake

    if not is_local(root):
        return None
    found = []
    for name in TPCH_TABLES:
        path = local_path(Warehouse(root).source_path(name))
        if not deltalake.DeltaTable.is_deltatable(path):
            continue
        first = deltalake.DeltaTable(path).history()[-1]  # newest first: the last one is version 0
        stamped = parse_logical_time(first.get("userMetadata"))
        if stamped is not None:
            found.append(stamped)
    return min(found, default=None)


def observe_delta_source(path: str) -> ObserveResult:
    import deltalake
    from deltalake.exceptions import TableNotFoundError

    try:
        table = deltalake.DeltaTable(local_path(path) if is_local(path) else path,
                                     storage_options=storage_options_for(path))
    except TableNotFoundError:
        return ObserveResult(
            data_version=DataVersion(MISSING),
            metadata={
                "status": MetadataValue.text(
                    f"no Delta table at {path}: run the load_tpch job (or `make demo`) to create "
                    f"the TPC-H sources"
                ),
                "path": MetadataValue.path(path),
            },
        )
    version = table.version()
    last = table.history(1)[0]
    logical_time = parse_logical_time(last.get("userMetadata"))
    metadata = {
        "status": MetadataValue.text("ok"),
        "path": MetadataValue.path(path),
        "delta_version": MetadataValue.int(version),
        "last_operation": MetadataValue.text(str(last.get("operation", ""))),
    }
    if logical_time is not None:
        metadata["logical_time"] = MetadataValue.text(logical_time.isoformat())
    return ObserveResult(data_version=DataVersion(str(version)), metadata=metadata)


def _source_asset(name: str):
    @observable_source_asset(
        name=name,
        group_name="sources",
        description=f"TPC-H {name}: the Delta table <warehouse>/sources/{name} (change data feed "
        f"on); its data version is the Delta version.",
    )
    def observe(context, warehouse: WarehouseResource) -> ObserveResult:
        result = observe_delta_source(warehouse.source_path(name))
        if result.data_version == DataVersion(MISSING):
            context.log.warning(result.metadata["status"].value)
        return result

    return observe


with warnings.catch_warnings():  # observable_source_asset is marked beta; it is the documented way
    warnings.simplefilter("ignore", BetaWarning)
    SOURCE_ASSETS = [_source_asset(name) for name in TPCH_TABLES]
