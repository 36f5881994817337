"""Spark Connect: a Spark Connect server started from the installed pyspark (`spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`) with Delta Lake on its classpath,
listening on 127.0.0.1 only, reached through an `sc://127.0.0.1` session. Part of
`make test-deploy`.

The engine writes with Delta's DeltaTable API (MERGE), which over Connect needs Delta's Connect
server plugin; no build of it for delta-spark 4.4.0 (io.delta:delta-connect-server_4.1_2.13) is on
Maven Central. So the test shows what works (Spark SQL and Delta reads and writes through
Connect), that the DeltaTable API does not, and that the engine refuses a Connect session at once
with an error naming the missing plugin, having written nothing.
"""

from __future__ import annotations

import os

import pytest

from resources.session import DELTA_CATALOG, DELTA_EXTENSION, delta_artifact
from tests.deploy import CONNECT_ENVIRONMENT, LOOPBACK, assert_loopback_only, free_port, server, spark_home

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """(sc:// URL, server process, log folder), stopped by its process group at the end."""
    logs = tmp_path_factory.mktemp("connect")
    port = free_port()
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", "local[2]", "--driver-memory", "3g",
        "--packages", delta_artifact(),
        "--conf", f"spark.sql.extensions={DELTA_EXTENSION}",
        "--conf", f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}",
        "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", "spark.sql.session.timeZone=UTC",
        "spark-internal",
    ]
    with server(command, logs / "server.log", port, timeout=300) as process:
        yield f"sc://{LOOPBACK}:{port}", process, logs


def test_the_connect_server_listens_on_loopback_only(connect_server):
    _, process, _ = connect_server
    assert_loopback_only(process.pid)


@pytest.fixture(scope="module")
def remote(connect_server):
    from pyspark.sql import SparkSession

    before = {name: os.environ.get(name) for name in CONNECT_ENVIRONMENT}
    session = SparkSession.builder.remote(connect_server[0]).create()
    try:
        yield session
    finally:
        session.stop()
        # PySpark marks the whole process as Spark Connect's in its environment; undo it, or every
        # later session of this process (and every process it starts) asks for a Connect URL
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_delta_reads_and_writes_work_through_connect(remote, tmp_path):
    path = str(tmp_path / "numbers")
    remote.range(5).write.format("delta").save(path)
    assert remote.read.format("delta").load(path).count() == 5
    assert remote.sql(f"SELECT count(*) AS n FROM delta.`{path}`").first()["n"] == 5


def test_the_delta_table_api_needs_the_connect_plugin(remote, tmp_path):
    from delta.tables import DeltaTable

    path = str(tmp_path / "numbers")
    remote.range(5).write.format("delta").save(path)
    with pytest.raises(Exception, match="No handler found for extension"):
        DeltaTable.forPath(remote, path).toDF().count()


def test_the_engine_refuses_a_connect_session_naming_what_is_missing(remote, tmp_path):
    from epochal import Engine
    from epochal.errors import EpochalError

    warehouse = tmp_path / "warehouse"
    with pytest.raises(EpochalError) as refused:
        Engine(remote, str(warehouse))
    message = str(refused.value)
    assert "Spark Connect" in message and "delta-connect-server" in message and "spark://" in message, message
    assert not warehouse.exists()
