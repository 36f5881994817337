"""Derived tables as Dagster assets, run in process against real Spark and Delta: partitions apply
in order, an out-of-order partition fails naming the missing one, re-materializing is a no-op that
says so, a range is one run with one materialization per partition, the tables equal the engine's
full recompute throughout, and a failing great-expectations check blocks the asset downstream.

The derived tables are a small folder written here (a filter over orders with expectations, and an
aggregate over that table), the sources a copy of the session's TPC-H load with one cheap commit to
orders per hour, stamped with the logical time of its hourly partition.
"""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from epochal.storage.clock import logical_time_metadata
from epochal.storage.reclock import epoch_key
from ops.confs import USER_METADATA_CONF, session_confs
from tests.conftest import TPCH_LOADED_AT
from tests.support import assert_matches_recompute

PARTITIONS = [f"2026-01-01-{hour:02d}:00" for hour in range(4)]
RANGE_START = "dagster/asset_partition_range_start"  # the tags a single-run backfill sets
RANGE_END = "dagster/asset_partition_range_end"

TABLES = {
    "open_orders.sql": """
        -- Open orders: a filter over the orders source.
        select o_orderkey, o_custkey, o_totalprice, o_orderdate
        from orders
        where o_orderstatus = 'O'
    """,
    "open_orders.yml": """
        key: [o_orderkey]
        expectations:
          - expect_column_values_to_not_be_null: {column: o_orderkey}
          - expect_column_values_to_be_between: {column: o_totalprice, min_value: 0}
    """,
    "open_by_year.sql": """
        -- Open orders per order year: an aggregate over a derived table.
        select year(o_orderdate) as order_year, count(*) as orders, sum(o_totalprice) as revenue
        from open_orders
        group by year(o_orderdate)
    """,
}

# A row-level expectation that the first epoch's rows break, and a table reading that table.
FAILING = {
    "cheap_orders.sql": """
        select o_orderkey, o_totalprice from orders where o_orderstatus = 'F'
    """,
    "cheap_orders.yml": """
        expectations:
          - type: expect_column_values_to_be_between
            kwargs: {column: o_totalprice, max_value: 100000}
            name: price_at_most_100k
    """,
    "cheap_order_count.sql": """
        select count(*) as orders from cheap_orders
    """,
}


def write_folder(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).strip() + "\n")
    return folder


def change_orders(spark, root: str, hour: int) -> None:
    """One commit to orders at hh:30 of partition `hour` (stamped with that logical time): open
    and finished orders swap status and change price, so the filter gains and loses rows."""
    path = f"{root}/sources/orders".replace("`", "``")
    stamp = logical_time_metadata(TPCH_LOADED_AT + timedelta(hours=hour, minutes=30))
    with session_confs(spark, {USER_METADATA_CONF: stamp}):
        spark.sql(
            f"""UPDATE delta.`{path}`
                SET o_orderstatus = CASE WHEN o_orderstatus = 'O' THEN 'F' ELSE 'O' END,
                    o_totalprice = o_totalprice + 1
                WHERE o_orderkey % 97 = {hour}"""
        ).collect()


def hourly_warehouse(spark, root: str, copy_tpch, hours: int = len(PARTITIONS)) -> str:
    copy_tpch(root)
    for hour in range(hours):
        change_orders(spark, root, hour)
    return root


def definitions_for(root: str, sql_folder: Path):
    from definitions import build_definitions
    from resources.warehouse import WarehouseResource

    # the model off, as in engine_for: these tests assert which technique each partition takes
    return build_definitions(warehouse=WarehouseResource(root=root), sql_folder=sql_folder, cost_model=False)


def engine_for(root: str, sql_folder: Path):
    """The engine the assets use (one per process and warehouse), with the folder's tables defined."""
    from assets.specs import load_specs
    from ops.tpch import TPCH_TABLES
    from resources.epochal import EpochalResource
    from resources.spark import SparkResource
    from resources.warehouse import WarehouseResource

    resource = EpochalResource(spark=SparkResource(), warehouse=WarehouseResource(root=root), cost_model=False)
    return resource.define(list(load_specs(sql_folder, TPCH_TABLES).values()))


def materialize(defs, instance, partition: str | None = None, last: str | None = None, **options):
    """Run the derived tables' job for one partition, or for `partition`..`last` as one run."""
    tags = {RANGE_START: partition, RANGE_END: last} if last else {}
    return defs.resolve_job_def("derived_hourly").execute_in_process(
        instance=instance, partition_key=None if last else partition, tags=tags, raise_on_error=False,
        **options,
    )


def materializations(result) -> dict[tuple[str, str], dict]:
    """(table, partition) -> metadata values, for every materialization the run recorded."""
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        key = (materialization.asset_key.to_user_string(), materialization.partition)
        assert key not in found, f"two materializations of {key}"
        found[key] = {name: value.value for name, value in materialization.metadata.items()}
    return found


def failure_messages(result) -> dict[str, str]:
    return {event.step_key: event.event_specific_data.error.message for event in result.get_step_failure_events()}


@pytest.fixture(scope="module")
def setup(spark, warehouse, copy_tpch, tmp_path_factory):
    root = hourly_warehouse(spark, warehouse, copy_tpch)
    folder = write_folder(tmp_path_factory.mktemp("sql"), TABLES)
    with DagsterInstance.ephemeral() as instance:
        yield root, folder, definitions_for(root, folder), instance, engine_for(root, folder)


def test_partitions_apply_in_order_and_equal_the_recompute(setup):
    root, _, defs, instance, engine = setup
    first = materialize(defs, instance, PARTITIONS[0])
    assert first.success, failure_messages(first)
    events = materializations(first)
    assert set(events) == {("open_orders", PARTITIONS[0]), ("open_by_year", PARTITIONS[0])}
    assert {(m["technique"], m["reason"]) for m in events.values()} == {("rescan", "FIRST_RUN")}
    assert_matches_recompute(engine, ["open_orders", "open_by_year"], f"after {PARTITIONS[0]}")

    second = materialize(defs, instance, PARTITIONS[1])
    assert second.success, failure_messages(second)
    events = materializations(second)
    assert {(table, m["technique"]) for (table, _), m in events.items()} == {
        ("open_orders", "incremental"), ("open_by_year", "incremental")}
    assert_matches_recompute(engine, ["open_orders", "open_by_year"], f"after {PARTITIONS[1]}")

    metadata = events[("open_orders", PARTITIONS[1])]
    step = engine.table("open_orders").ledger.at_epoch(epoch_key(TPCH_LOADED_AT + timedelta(hours=2)))
    assert metadata["outcome"] == "applied"
    assert metadata["epoch"] == step.epoch
    assert metadata["output_version"] == step.output_version == 1  # version 0: the first epoch's write
    assert metadata["source_versions_at_end"] == {"orders": step.inputs["orders"]["to"]}
    assert metadata["figures_on"].startswith("this partition")
    assert metadata["rows_inserted"] == step.rows_inserted > 0 and metadata["rows_deleted"] == step.rows_deleted > 0
    assert metadata["rows_read"] > 0 and metadata["seconds"] >= 0 and "state_rows" in metadata
    assert metadata["dagster/row_count"] == engine.read("open_orders").count()
    assert [c.name for c in metadata["dagster/column_schema"].columns] == [
        "o_orderkey", "o_custkey", "o_totalprice", "o_orderdate"]
    assert {column: [(d.asset_key.to_user_string(), d.column_name) for d in deps] for column, deps in
            metadata["dagster/column_lineage"].deps_by_column.items()} == {
        c: [("orders", c)] for c in ("o_orderkey", "o_custkey", "o_totalprice", "o_orderdate")}
    by_year = events[("open_by_year", PARTITIONS[1])]["dagster/column_lineage"].deps_by_column
    assert {c: [(d.asset_key.to_user_string(), d.column_name) for d in deps] for c, deps in by_year.items()} == {
        "order_year": [("open_orders", "o_orderdate")], "revenue": [("open_orders", "o_totalprice")]}
    assert metadata["summary"].startswith(f"Partition {PARTITIONS[1]} (window 2026-01-01 01:00–02:00 UTC) "
                                          "of open_orders, applied as its own epoch: incremental")
    assert metadata["epoch_span"] == f"{PARTITIONS[1]} .. {PARTITIONS[1]} (1 partition)"
    checks = {(c.asset_key.to_user_string(), c.check_name): c for c in second.get_asset_check_evaluations()}
    assert set(checks) == {("open_orders", "o_orderkey_not_null"), ("open_orders", "o_totalprice_between"),
                           ("open_orders", "key_is_unique")}
    assert all(check.passed for check in checks.values()), checks
    assert checks[("open_orders", "o_totalprice_between")].metadata["rows_validated"].value == step.rows_inserted


def test_an_applied_partition_materializes_again_as_a_noop(setup):
    root, _, defs, instance, engine = setup
    before = {name: engine.table(name).ledger.steps() for name in ("open_orders", "open_by_year")}
    again = materialize(defs, instance, PARTITIONS[1])
    assert again.success, failure_messages(again)
    events = materializations(again)
    assert set(events) == {("open_orders", PARTITIONS[1]), ("open_by_year", PARTITIONS[1])}
    for metadata in events.values():
        assert metadata["outcome"] == "already applied; nothing done"
        assert metadata["summary"].startswith("Already applied (ledger step 2")
        assert metadata["output_version"] == 1
        assert "rows_read" not in metadata and "seconds" not in metadata  # reported when applied
        assert metadata["figures_on"].startswith(f"partition {PARTITIONS[1]}, in the materialization that applied")
    assert {name: engine.table(name).ledger.steps() for name in before} == before
    assert_matches_recompute(engine, ["open_orders", "open_by_year"], "after materializing a partition twice")


def test_a_partition_after_a_gap_fails_naming_the_missing_partition(setup):
    root, _, defs, instance, engine = setup
    before = engine.table("open_orders").ledger.steps()
    skipped = materialize(defs, instance, PARTITIONS[3])
    assert not skipped.success
    message = failure_messages(skipped)["open_orders"]
    assert f"partition {PARTITIONS[3]} cannot be applied before partition {PARTITIONS[2]}" in message
    assert (f"dagster asset materialize -m definitions --select open_orders --partition-range "
            f"{PARTITIONS[2]}...{PARTITIONS[3]}") in message
    assert not materializations(skipped)
    assert engine.table("open_orders").ledger.steps() == before


def test_a_range_is_one_run_with_one_materialization_per_partition(setup):
    """The range is processed as one epoch span: one run, one engine step, one remap entry and one
    materialization per partition."""
    root, _, defs, instance, engine = setup
    runs_before = len(instance.get_runs())
    span = materialize(defs, instance, PARTITIONS[2], PARTITIONS[3])
    assert span.success, failure_messages(span)
    assert len(instance.get_runs()) == runs_before + 1
    events = materializations(span)
    assert sorted(events) == sorted((table, partition) for table in ("open_orders", "open_by_year")
                                    for partition in PARTITIONS[2:])
    assert {m["technique"] for m in events.values()} == {"incremental"}
    assert {m["epoch_span"] for m in events.values()} == {f"{PARTITIONS[2]} .. {PARTITIONS[3]} (2 partitions)"}
    assert_matches_recompute(engine, ["open_orders", "open_by_year"], f"after {PARTITIONS[2]}..{PARTITIONS[3]}")
    for table in ("open_orders", "open_by_year"):
        steps = engine.table(table).ledger.committed()
        assert [step.epoch for step in steps] == [epoch_key(TPCH_LOADED_AT + timedelta(hours=h)) for h in (1, 2, 4)]
        # the epoch's figures once, on the partition it ends with; the other has no version of its own
        inside, last = (events[(table, p)] for p in PARTITIONS[2:])
        assert last["output_version"] == 2 and last["ledger_seq"] == steps[-1].seq
        assert (last["rows_inserted"], last["rows_deleted"]) == (steps[-1].rows_inserted, steps[-1].rows_deleted)
        assert last["dagster/row_count"] == engine.read(table).count()
        assert not {"output_version", "dagster/row_count", "rows_read", "rows_inserted", "seconds"} & set(inside)
        assert inside["figures_on"] == f"partition {PARTITIONS[3]}, where the epoch ends"
    remap = {epoch.key: epoch for epoch in engine.remap.epochs()}
    for partition, hour in zip(PARTITIONS[2:], (3, 4)):
        # orders version v was committed at (v-1):30, so the window ending at hh:00 ends before v=hh+1
        assert remap[epoch_key(TPCH_LOADED_AT + timedelta(hours=hour))].frontiers["orders"] == hour + 1
        assert events[("open_orders", partition)]["source_versions_at_end"] == {"orders": hour}
    checks = {c.check_name: c for c in span.get_asset_check_evaluations() if c.asset_key == AssetKey("open_orders")}
    assert set(checks) == {"o_orderkey_not_null", "o_totalprice_between", "key_is_unique"}
    assert all(check.passed for check in checks.values()), checks
    rows = checks["o_totalprice_between"].metadata
    assert (rows["partitions_validated"].value, rows["epochs_validated"].value) == (2, 1)
    assert rows["rows_validated"].value == events[("open_orders", PARTITIONS[3])]["rows_inserted"]

    inside = materialize(defs, instance, PARTITIONS[2])  # a partition inside the span: applied
    assert inside.success, failure_messages(inside)
    assert {m["outcome"] for m in materializations(inside).values()} == {"already applied; nothing done"}
    assert [s.epoch for s in engine.table("open_orders").ledger.committed()][-1] == epoch_key(
        TPCH_LOADED_AT + timedelta(hours=4))


def test_full_refresh_rescans_at_the_latest_partition(setup):
    root, _, defs, instance, engine = setup
    refreshed = materialize(defs, instance, PARTITIONS[3], asset_selection=[AssetKey("open_orders")],
                            run_config={"ops": {"open_orders": {"config": {"full_refresh": True}}}})
    assert refreshed.success, failure_messages(refreshed)
    metadata = materializations(refreshed)[("open_orders", PARTITIONS[3])]
    assert (metadata["outcome"], metadata["technique"], metadata["reason"]) == ("applied", "rescan", "REQUESTED")
    steps = engine.table("open_orders").ledger.committed()
    assert [s.epoch for s in steps[-2:]] == [epoch_key(TPCH_LOADED_AT + timedelta(hours=4))] * 2
    assert_matches_recompute(engine, ["open_orders", "open_by_year"], "after a full refresh")


def test_a_failing_expectation_blocks_the_downstream_asset(setup, tmp_path):
    """A range whose first partition inserts rows that break a row-level expectation: the range
    stops after that partition, the check fails naming the expectation and the unexpected count,
    and the table reading it is not run."""
    root, _, _, instance, _ = setup
    folder = write_folder(tmp_path / "failing", FAILING)
    result = materialize(definitions_for(root, folder), instance, PARTITIONS[0], PARTITIONS[1])
    assert not result.success
    engine = engine_for(root, folder)
    unexpected = engine.read("cheap_orders").filter("o_totalprice > 100000").count()
    assert unexpected > 0

    [check] = [c for c in result.get_asset_check_evaluations() if c.asset_key == AssetKey("cheap_orders")]
    assert (check.check_name, check.passed) == ("price_at_most_100k", False)
    assert check.metadata["expectation"].value == "expect_column_values_to_be_between"
    assert check.metadata["unexpected_count"].value == unexpected
    assert check.metadata["unexpected_by_partition"].value == {PARTITIONS[0]: unexpected}
    assert check.description.startswith(f"expect_column_values_to_be_between: {unexpected} unexpected row(s)")

    message = failure_messages(result)["cheap_orders"]
    assert f"blocking check price_at_most_100k failed on the rows partition {PARTITIONS[0]} inserted" in message
    assert f"partitions {PARTITIONS[1]} .. {PARTITIONS[1]} were not applied" in message
    assert set(materializations(result)) == {("cheap_orders", PARTITIONS[0])}
    assert [s.epoch for s in engine.table("cheap_orders").ledger.committed()] == [
        epoch_key(TPCH_LOADED_AT + timedelta(hours=1))]
    # Dagster abandons the step of a failed step's dependant: it never starts.
    assert not [event for event in result.all_events if event.step_key == "cheap_order_count" and event.is_step_start]
    assert engine.table("cheap_order_count").ledger.steps() == []


def test_maintenance_jobs_compact_vacuum_and_delete_state(setup):
    """OPTIMIZE and VACUUM (a dry run within the 7-day retention) leave the tables as they are;
    deleting a table's state removes its state tables and nothing else."""
    root, _, defs, instance, engine = setup
    before = engine.read("open_by_year").collect()
    optimized = defs.resolve_job_def("optimize_tables").execute_in_process(instance=instance, run_config={
        "ops": {"optimize_derived_tables": {"config": {"tables": ["open_by_year"]}}}})
    assert optimized.success
    labels = [line.split(":")[0] for line in optimized.output_for_node("optimize_derived_tables")]
    assert labels[0] == "open_by_year" and "open_by_year ledger" in labels and "(all tables) remap" in labels
    assert not any(label.startswith("open_by_year/") for label in labels)  # state: the engine's to compact
    with_state = defs.resolve_job_def("optimize_tables").execute_in_process(instance=instance, run_config={
        "ops": {"optimize_derived_tables": {"config": {"tables": ["open_by_year"], "state": True}}}})
    assert any(line.startswith("open_by_year/") for line in with_state.output_for_node("optimize_derived_tables"))

    vacuumed = defs.resolve_job_def("vacuum_tables").execute_in_process(instance=instance, run_config={
        "ops": {"vacuum_derived_tables": {"config": {"tables": ["open_by_year"], "state": False, "dry_run": True}}}})
    assert vacuumed.success
    [line] = vacuumed.output_for_node("vacuum_derived_tables")
    assert line.startswith("open_by_year: would delete ") and "older than 168h" in line
    assert sorted(engine.read("open_by_year").collect()) == sorted(before)

    state = Path(root) / "_epochal" / "tables" / "open_by_year" / "state"
    assert state.is_dir()
    deleted = defs.resolve_job_def("delete_table_state").execute_in_process(instance=instance, run_config={
        "ops": {"delete_derived_state": {"config": {"table": "open_by_year"}}}})
    assert deleted.success
    assert not state.exists() and (Path(root) / "tables" / "open_by_year").is_dir()
    assert "rescans the table (reason STATE_MISSING)" in deleted.output_for_node("delete_derived_state")
