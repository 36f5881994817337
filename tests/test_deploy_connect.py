"""Spark Connect: a Spark Connect server started from the installed pyspark
(`resources.session.connect_server_command`: `spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer` with Delta Lake's JAR, SQL extension and
catalog), listening on 127.0.0.1 only, stopped by its process group at the end. Part of
`make test-deploy`.

The engine runs through an `sc://` session as it runs through a local one: its MERGEs, OPTIMIZE
and deletes are Spark SQL (`MERGE INTO delta.`path``), which the server's Delta SQL extension runs
(Delta's DeltaTable API would need Delta's Connect plugin, not published for delta-spark 4.4.0);
what stays in the client (Arrow, delta-rs commits, the ledger) reads and writes the same local
warehouse as the server. Checked here: TPC-H tables over a first epoch and two hourly batches
through the deployment driver, the TPC-H incremental test and a differential test run by pytest
with SPARK_REMOTE set (each epoch equal to the full recompute), and that an unreachable server
fails within 30 s naming its URL.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from resources.session import connect_server_command
from tests.deploy import LOOPBACK, REPO, assert_loopback_only, free_port, loopback_env, run_driver, server, tail

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """(sc:// URL, server process, log folder), stopped by its process group at the end."""
    logs = tmp_path_factory.mktemp("connect")
    port = free_port()
    command = connect_server_command(port, host=LOOPBACK, master="local[2]", driver_memory="4g",
                                     extra_conf={"spark.sql.shuffle.partitions": "2"})
    # the server's Python workers (a UDF on Spark's path) run this interpreter, as a local session's do
    env = loopback_env(PYSPARK_PYTHON=sys.executable)
    with server(command, logs / "server.log", port, env=env, timeout=300) as process:
        yield f"sc://{LOOPBACK}:{port}", process, logs


def test_the_connect_server_listens_on_loopback_only(connect_server):
    _, process, _ = connect_server
    assert_loopback_only(process.pid)


def test_the_engine_maintains_tpch_tables_exactly_through_connect(connect_server, tmp_path):
    url, _, logs = connect_server
    answer = run_driver(["--master", url, "--warehouse", str(tmp_path / "warehouse"),
                         "--tables", "tpch_q01,tpch_q10,returns_by_nation"],
                        logs / "driver.log")
    assert "error" not in answer, answer
    assert answer["mismatches"] == [], answer
    for name, techniques in answer["techniques"].items():
        assert techniques[0] == "rescan" and set(techniques[1:]) <= {"incremental", "noop"}, (name, techniques)
        assert "incremental" in techniques, (name, techniques)


def _pytest_through_connect(url: str, log, *args: str) -> None:
    """Run pytest on `args` in a child process whose session is a Connect client of `url`."""
    env = loopback_env(SPARK_REMOTE=url, EPOCHAL_EXAMPLES="2")
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *args],
                              stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), timeout=1800)
    assert done.returncode == 0, tail(log, 80)


def test_the_tpch_incremental_test_passes_through_connect(connect_server, tmp_path):
    url, _, logs = connect_server
    _pytest_through_connect(url, logs / "tpch_incremental.log", "tests/test_tpch_incremental.py")


def test_a_differential_test_passes_through_connect(connect_server):
    url, _, logs = connect_server
    _pytest_through_connect(url, logs / "differential.log",
                            "tests/test_differential.py::test_random_changes_match_recompute_after_every_epoch")


def test_an_unreachable_server_fails_fast_naming_its_url():
    from resources.session import SparkSettings, SparkStartError, delta_spark_session

    url = f"sc://{LOOPBACK}:{free_port()}"  # nothing listens there
    began = time.monotonic()
    with pytest.raises(SparkStartError) as failed:
        delta_spark_session(SparkSettings(remote=url))
    assert time.monotonic() - began < 30
    assert url in str(failed.value)
