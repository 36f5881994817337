"""A standalone Spark cluster: a master and one worker started from the installed pyspark
(`spark-class`), every process bound to 127.0.0.1, and the engine driven through a `spark://`
session over TPC-H at scale 0.01: three tables over a first epoch and two hourly change batches,
each epoch equal to the full recompute. Part of `make test-deploy`.
"""

from __future__ import annotations

import pytest

from tests.deploy import LOOPBACK, assert_loopback_only, free_port, run_driver, server, spark_home

pytestmark = pytest.mark.deploy


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(master URL, [master, worker] processes), stopped by their process groups at the end."""
    logs = tmp_path_factory.mktemp("standalone")
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui, worker_port, worker_ui = free_port(), free_port(), free_port(), free_port()
    master_url = f"spark://{LOOPBACK}:{port}"
    with server([spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
                 "--webui-port", str(ui)], logs / "master.log", port) as master:
        with server([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                     "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", "2",
                     "--memory", "3g", "--work-dir", str(logs / "work"), master_url],
                    logs / "worker.log", worker_port) as worker:
            yield master_url, [master, worker], logs


def test_a_standalone_cluster_maintains_tables_exactly(cluster, tmp_path):
    master_url, processes, logs = cluster
    for process in processes:
        assert_loopback_only(process.pid)
    answer = run_driver(
        ["--master", master_url, "--warehouse", str(tmp_path / "warehouse"),
         # one executor of the worker's size, started once for the whole run
         "--conf", "spark.executor.memory=2g", "--conf", "spark.executor.cores=2"],
        logs / "driver.log",
    )
    assert "error" not in answer, answer
    assert answer["mismatches"] == [], answer
    for name, techniques in answer["techniques"].items():
        assert techniques[0] == "rescan" and set(techniques[1:]) <= {"incremental", "noop"}, (name, techniques)
        assert "incremental" in techniques, (name, techniques)
