"""The Dagster code location from the outside: `dagster dev` serves the lineage the SQL files
declare (asked over GraphQL), and `dagster asset materialize --partition-range` applies a range of
partitions from the command line, in its own process with its own Spark driver."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlglot
from dagster import AssetKey, DagsterInstance
from dagster._core.instance.ref import InstanceRef
from sqlglot import exp

from ops.tpch import TPCH_TABLES
from tests.support import assert_matches_recompute, child_environment
from tests.test_dagster_assets import PARTITIONS, TABLES, change_orders, engine_for, write_folder

pytestmark = pytest.mark.long  # make test-long (CI runs it after make test)

REPOSITORY = Path(__file__).resolve().parent.parent
DAGSTER = str(Path(sys.executable).parent / "dagster")
STARTUP_SECONDS = 600
LINEAGE_QUERY = "{ assetNodes { assetKey { path } dependencyKeys { path } } }"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dagster_home(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dagster.yaml").write_text("")  # the defaults; the file silences a warning
    return str(folder)


def graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(url, data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def sql_dependencies(folder: Path) -> dict[str, set[str]]:
    """Each SQL file's table -> the tables its query reads (sqlglot, CTE names left out): what the
    lineage must show, found independently of the asset factory."""
    found = {}
    for path in sorted(folder.glob("*.sql")):
        tree = sqlglot.parse_one(path.read_text(), read="spark")
        ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        found[path.stem] = {t.name.lower() for t in tree.find_all(exp.Table) if t.name.lower() not in ctes}
    return found


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    """`dagster dev -w dagster_workspace.yaml` on a free loopback port, in its own process group,
    with the repository's SQL folder and an empty warehouse; yields its GraphQL URL."""
    folder = tmp_path_factory.mktemp("dagster-dev")
    port = free_port()
    environment = child_environment(DAGSTER_HOME=dagster_home(folder / "home"),
                                    EPOCHAL_WAREHOUSE=str(folder / "warehouse"), PYTHONPATH=str(REPOSITORY))
    environment.pop("EPOCHAL_SQL_FOLDER", None)
    log = open(folder / "dagster-dev.log", "w")
    process = subprocess.Popen(
        [DAGSTER, "dev", "-w", "dagster_workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPOSITORY, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        # Three processes each load the code location; on CI's two cores, beside a worker running
        # the crash matrix's Spark drivers, that has taken past three minutes.
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, (folder / "dagster-dev.log").read_text()[-3000:]
            try:
                if graphql(url, LINEAGE_QUERY).get("data", {}).get("assetNodes"):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            assert time.monotonic() < deadline, f"dagster dev did not serve the assets within {STARTUP_SECONDS} s:\n" + (
                folder / "dagster-dev.log").read_text()[-3000:]
            time.sleep(1)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # dagster dev may outlive SIGTERM: then kill the group
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        log.close()


def test_dagster_dev_serves_the_lineage_of_the_sql_files(dagster_dev):
    nodes = graphql(dagster_dev, LINEAGE_QUERY)["data"]["assetNodes"]
    lineage = {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]} for n in nodes}
    expected = sql_dependencies(REPOSITORY / "assets" / "sql")
    assert set(lineage) == set(TPCH_TABLES) | set(expected)
    for source in TPCH_TABLES:
        assert lineage[source] == set(), source
    for table, reads in expected.items():
        # Besides the tables its SQL reads, a derived table depends on its own previous partition.
        assert lineage[table] == reads | {table}, table
    assert any(reads - set(TPCH_TABLES) for reads in expected.values()), "no derived table reads a derived table"


@pytest.fixture(scope="module")
def cli_warehouse(spark, warehouse, copy_tpch, tmp_path_factory):
    copy_tpch(warehouse)
    for hour in range(2):
        change_orders(spark, warehouse, hour)
    return warehouse, write_folder(tmp_path_factory.mktemp("sql"), TABLES)


def test_the_cli_materializes_a_partition_range(cli_warehouse, tmp_path):
    root, folder = cli_warehouse
    home = dagster_home(tmp_path / "home")
    environment = child_environment(DAGSTER_HOME=home, EPOCHAL_WAREHOUSE=root, EPOCHAL_SQL_FOLDER=str(folder),
                                    EPOCHAL_DRIVER_MEMORY="1g", PYTHONPATH=str(REPOSITORY))
    completed = subprocess.run(
        [DAGSTER, "asset", "materialize", "-m", "definitions", "--select", "open_orders",
         "--partition-range", f"{PARTITIONS[0]}...{PARTITIONS[1]}"],
        cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=600,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-5000:]

    with DagsterInstance.from_ref(InstanceRef.from_dir(home)) as instance:
        [run] = instance.get_runs()
        assert run.is_success
        records = instance.fetch_materializations(AssetKey("open_orders"), limit=10).records
    techniques = {r.event_log_entry.dagster_event.partition:
                  r.asset_materialization.metadata["technique"].value for r in records}
    assert techniques == {PARTITIONS[0]: "rescan", PARTITIONS[1]: "incremental"}
    assert {r.run_id for r in records} == {run.run_id}

    engine = engine_for(root, folder)
    assert len(engine.table("open_orders").ledger.committed()) == 2
    assert_matches_recompute(engine, ["open_orders"], "after the command line's range")
