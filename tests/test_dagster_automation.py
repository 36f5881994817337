"""The derived tables' automation, evaluated without Spark: the hourly schedule asks for the newest
closed window, and the source sensor requests an observation only when a source's Delta version
moves."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_schedule_context, build_sensor_context
from deltalake import CommitProperties, write_deltalake

from assets.automation import source_versions_sensor
from assets.specs import SpecError
from epochal.storage.clock import logical_time_metadata
from resources.warehouse import WarehouseResource
from tests.test_dagster_assets import TABLES, definitions_for, write_folder


def test_the_hourly_schedule_materializes_the_newest_closed_window(tmp_path):
    defs = definitions_for(str(tmp_path / "warehouse"), write_folder(tmp_path / "sql", TABLES))
    schedule = defs.resolve_schedule_def("derived_hourly_schedule")
    assert schedule.job_name == "derived_hourly"
    with DagsterInstance.ephemeral() as instance:
        tick = datetime(2026, 1, 2, 3, 5, tzinfo=timezone.utc)
        context = build_schedule_context(instance=instance, scheduled_execution_time=tick)
        [request] = schedule.evaluate_tick(context).run_requests
    assert request.partition_key == "2026-01-02-02:00"  # 02:00-03:00 closed at 03:00
    assert {d.name for d in defs.resolve_all_job_defs()} >= {
        "derived_hourly", "verify_recompute", "optimize_tables", "vacuum_tables", "delete_table_state"}


def test_the_source_sensor_observes_only_when_a_version_moves(tmp_path: Path):
    resources = {"warehouse": WarehouseResource(root=str(tmp_path))}
    with build_sensor_context(resources=resources) as context:
        nothing = source_versions_sensor(context)
    assert isinstance(nothing, SensorResult) and not nothing.run_requests
    assert "missing: customer, lineitem" in str(nothing.skip_reason)

    write_deltalake(str(tmp_path / "sources" / "nation"), pa.table({"key": [1]}))
    with build_sensor_context(cursor=nothing.cursor, resources=resources) as context:
        moved = source_versions_sensor(context)
    [request] = moved.run_requests
    assert '"nation": "0"' in moved.cursor

    with build_sensor_context(cursor=moved.cursor, resources=resources) as context:
        assert not source_versions_sensor(context).run_requests
    write_deltalake(str(tmp_path / "sources" / "nation"), pa.table({"key": [2]}), mode="append")
    with build_sensor_context(cursor=moved.cursor, resources=resources) as context:
        again = source_versions_sensor(context)
    assert len(again.run_requests) == 1 and '"nation": "1"' in again.cursor


def test_a_daily_table_gets_daily_partitions_a_job_and_a_schedule(tmp_path):
    files = {**TABLES, "open_by_year.yml": "partitioning: daily\n"}
    defs = definitions_for(str(tmp_path / "warehouse"), write_folder(tmp_path / "sql", files))
    graph = defs.resolve_asset_graph()
    daily = graph.get(AssetKey("open_by_year")).partitions_def
    assert daily.get_first_partition_key() == "2026-01-01"
    assert graph.get(AssetKey("open_orders")).partitions_def.get_first_partition_key() == "2026-01-01-00:00"
    assert defs.resolve_job_def("derived_daily") and defs.resolve_schedule_def("derived_daily_schedule")

    files = {**TABLES, "open_orders.yml": "partitioning: daily\n"}
    with pytest.raises(SpecError, match="open_by_year is hourly but reads open_orders, which is daily"):
        definitions_for(str(tmp_path / "warehouse"), write_folder(tmp_path / "sql2", files))


def test_partitions_start_where_the_warehouse_sources_start(tmp_path):
    """The code location reads the logical time of the sources' first commit (delta-rs, no Spark):
    partitions start at its hour, and a table a sidecar starts earlier says so on the asset."""
    root = tmp_path / "warehouse"
    loaded = datetime(2026, 3, 5, 7, 20, tzinfo=timezone.utc)
    for name, stamp in (("orders", loaded), ("nation", loaded + timedelta(hours=2))):
        write_deltalake(str(root / "sources" / name), pa.table({"key": [1]}), commit_properties=CommitProperties(
            custom_metadata={"userMetadata": logical_time_metadata(stamp)}))
    graph = definitions_for(str(root), write_folder(tmp_path / "sql", TABLES)).resolve_asset_graph()
    for name in ("open_orders", "open_by_year"):
        assert graph.get(AssetKey(name)).partitions_def.get_first_partition_key() == "2026-03-05-07:00"
        assert "sources start later" not in graph.get(AssetKey(name)).description

    earlier = "partition_start: 2026-03-05T05:00:00Z\n"
    files = {**TABLES, "open_orders.yml": earlier, "open_by_year.yml": earlier}
    graph = definitions_for(str(root), write_folder(tmp_path / "sql2", files)).resolve_asset_graph()
    for name in ("open_orders", "open_by_year"):
        assert graph.get(AssetKey(name)).partitions_def.get_first_partition_key() == "2026-03-05-05:00"
        assert ("sources start later**: the sources' first commit is stamped 2026-03-05 07:20 UTC"
                in graph.get(AssetKey(name)).description)
