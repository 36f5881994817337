"""The demo as a user runs it (`python -m ops.demo`, what `make demo` runs: its own process and
Spark driver) at a small scale over two tables (tpch_q10, a join under an aggregate, and
returns_by_nation, which reads it: all 23 take an hour on a busy 2-core machine), then read back
through Dagster's API the way the UI shows it:

- it starts quietly: the JVM's output goes to the warehouse's log, not the terminal;
- the partitions are the demo's: every derived table has exactly the demo's batches' partitions
  materialized, and its partitions (as `make ui` builds them) start with the first of them;
- partitions applied as one epoch carry the epoch's figures exactly once, equal to the ledger's;
- a partition's row count, where it has one, is the table's row count as of that partition's end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance
from dagster._core.instance.ref import InstanceRef

from epochal.storage.clock import utc
from epochal.storage.ledger import Ledger
from epochal.storage.warehouse import Warehouse
from tests.support import child_environment

pytestmark = pytest.mark.long  # make test-long (CI runs it after make test)

REPOSITORY = Path(__file__).resolve().parent.parent
BATCHES = 3  # the first partition is a table's first epoch; 2 and 3 are applied as one epoch
TABLES = ("tpch_q10", "returns_by_nation")
FIGURES = ("rows_read", "rows_inserted", "rows_deleted", "state_rows", "seconds", "input_versions", "phases")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(warehouse, terminal output, partition keys of the demo's batches, Dagster instance)."""
    root = str(tmp_path_factory.mktemp("demo") / "warehouse")
    # no JARs recorded by an earlier session (resources.session.resolved_jars): Ivy resolves, as
    # on a machine's first run, and its report must go to the log, not the terminal
    environment = child_environment(PYTHONPATH=str(REPOSITORY), PYTHONUNBUFFERED="1",
                                    EPOCHAL_DRIVER_MEMORY=os.environ.get("EPOCHAL_DRIVER_MEMORY", "2g"),
                                    XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")))
    environment.pop("DAGSTER_HOME", None)  # the demo's default: <warehouse>/.dagster
    completed = subprocess.run(
        [sys.executable, "-m", "ops.demo", "--warehouse", root, "--scale", "0.01", "--batches", str(BATCHES),
         "--tables", ",".join(TABLES)],
        cwd=REPOSITORY, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=3600,
    )
    assert completed.returncode == 0, completed.stdout[-5000:]
    first = partition_start(re.search(r"hourly partitions from (\S+)", completed.stdout).group(1))
    assert first + timedelta(hours=BATCHES) <= datetime.now(timezone.utc) < first + timedelta(hours=BATCHES + 2)
    keys = [f"{first + timedelta(hours=h):%Y-%m-%d-%H:%M}" for h in range(BATCHES)]
    with DagsterInstance.from_ref(InstanceRef.from_dir(os.path.join(root, ".dagster"))) as instance:
        yield root, completed.stdout, keys, instance


def partition_start(key: str) -> datetime:
    return datetime.strptime(key, "%Y-%m-%d-%H:%M").replace(tzinfo=timezone.utc)


def derived_tables() -> list[str]:
    return list(TABLES)


def partition_metadata(instance, table: str) -> dict[str, dict]:
    """partition -> metadata values of its latest materialization."""
    records = instance.fetch_materializations(AssetKey(table), limit=1000).records
    found: dict[str, dict] = {}
    for record in sorted(records, key=lambda r: r.storage_id):
        partition = record.event_log_entry.dagster_event.partition
        found[partition] = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    return found


def test_the_demo_prints_fewer_than_10_lines_before_its_first_batch(demo):
    root, output, _, _ = demo
    lines = output.splitlines()
    first_batch = next(i for i, line in enumerate(lines) if " - batch 1 at " in line)
    assert first_batch < 10, "\n".join(lines[:first_batch + 1])
    assert not any("Ivy" in line or "WARN" in line for line in lines), [l for l in lines if "Ivy" in l or "WARN" in l]
    log = Path(root, "logs", "spark.log").read_text()
    assert ":: resolution report ::" in log  # Ivy's report went to the log instead
    assert "/assets/returns_by_nation?view=partitions" in output


def test_every_table_has_exactly_the_demo_partitions(demo):
    from definitions import build_definitions
    from resources.warehouse import WarehouseResource

    root, _, keys, instance = demo
    graph = build_definitions(warehouse=WarehouseResource(root=root)).resolve_asset_graph()
    for table in derived_tables():
        assert instance.get_materialized_partitions(AssetKey(table)) == set(keys), table
        partitions = graph.get(AssetKey(table)).partitions_def.get_partition_keys()
        # what the UI lists: the demo's partitions first, then at most the hours closed since it ended
        assert partitions[:BATCHES] == keys, (table, partitions[:5])  # nothing missing before them
        closed_since = (datetime.now(timezone.utc) - partition_start(keys[-1])) // timedelta(hours=1) - 1
        assert len(partitions) - BATCHES <= closed_since, (table, partitions[BATCHES:])


def test_partitions_applied_as_one_epoch_carry_its_figures_once(demo):
    root, _, keys, instance = demo
    merged = 0
    for table in derived_tables():
        by_step: dict[int, list[str]] = defaultdict(list)
        metadata = partition_metadata(instance, table)
        for partition, values in metadata.items():
            by_step[values["ledger_seq"]].append(partition)
        steps = {s.seq: s for s in Ledger(Warehouse(root).engine_path("tables", table, "ledger")).committed()}
        for seq, partitions in by_step.items():
            step = steps[seq]
            carriers = [p for p in partitions if set(FIGURES) <= set(metadata[p])]
            assert len(carriers) == 1, (table, seq, partitions)
            [carrier] = carriers
            last = max(partitions)
            assert carrier == last, (table, seq)  # the partition the epoch ends with
            figures = metadata[carrier]
            assert (figures["rows_read"], figures["rows_inserted"], figures["rows_deleted"]) == (
                step.rows_read, step.rows_inserted, step.rows_deleted), (table, seq)
            assert figures["seconds"] == pytest.approx(step.seconds)
            for partition in partitions:
                if partition != carrier:
                    assert not set(FIGURES) & set(metadata[partition]), (table, partition)
                    assert metadata[partition]["figures_on"] == f"partition {carrier}, where the epoch ends"
            merged += len(partitions) > 1
        assert sum(metadata[p].get("rows_inserted", 0) for p in keys) == sum(s.rows_inserted for s in steps.values())
    assert merged == len(derived_tables()), "every table applies partitions 2.. as one epoch in the demo"


def test_the_run_is_tagged_with_its_partitions(demo):
    root, _, keys, instance = demo
    [run] = [r for r in instance.get_runs() if r.job_name == "derived_hourly"]
    assert run.tags["epochal/partitions"] == f"{keys[0]}...{keys[-1]}"


def test_a_partitions_row_count_is_the_table_as_of_its_end(demo, spark):
    root, _, keys, instance = demo
    counted = 0
    for table in derived_tables():
        metadata = partition_metadata(instance, table)
        steps = Ledger(Warehouse(root).engine_path("tables", table, "ledger")).committed()
        ends = {utc(s.epoch_end): s for s in steps}
        path = Warehouse(root).table_path(table)
        for partition in keys:
            end = partition_start(partition) + timedelta(hours=1)
            values = metadata[partition]
            if end not in ends:  # inside a longer epoch: the table has no version as of its end
                assert "dagster/row_count" not in values and "output_version" not in values, (table, partition)
                continue
            version = ends[end].output_version
            rows = spark.read.format("delta").option("versionAsOf", version).load(path).count()
            assert values["dagster/row_count"] == rows, (table, partition, version)
            counted += 1
    # the first partition (its own epoch, a rescan) and the last (where the merged epoch ends)
    assert counted == 2 * len(derived_tables())
