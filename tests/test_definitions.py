"""The Dagster code location loads, and its source assets observe Delta versions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance
from deltalake import write_deltalake

from ops.tpch import TPCH_TABLES
from resources.session import HEAP_RETURNED, QUIET_JVM
from resources.warehouse import WarehouseResource
from tests.support import TEST_JAVA_OPTIONS

REPOSITORY = Path(__file__).resolve().parent.parent


def test_workspace_validates_with_the_dagster_cli(tmp_path):
    environment = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    (tmp_path / "dagster.yaml").write_text("")
    completed = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate",
         "-w", "dagster_workspace.yaml"],
        cwd=REPOSITORY, env=environment, capture_output=True, text=True, timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "Validation successful for code location definitions" in output


def test_definitions_hold_the_sources_and_jobs():
    from definitions import defs

    graph = defs.resolve_asset_graph()
    sources = {key for key in graph.get_all_asset_keys() if graph.get(key).group_name == "sources"}
    assert sources == {AssetKey(name) for name in TPCH_TABLES}
    assert all(graph.get(key).is_observable for key in sources)
    for job in ("load_tpch", "apply_changes", "observe_sources"):
        assert defs.resolve_job_def(job) is not None


@pytest.fixture
def small_sources(tmp_path) -> str:
    """Real Delta tables under the source names (written by delta-rs: no Spark needed), with
    nation at version 2 and lineitem missing."""
    for name in TPCH_TABLES:
        if name == "lineitem":
            continue
        path = str(tmp_path / "sources" / name)
        write_deltalake(path, pa.table({"key": [1, 2]}))
        if name == "nation":
            write_deltalake(path, pa.table({"key": [3]}), mode="append")
            write_deltalake(path, pa.table({"key": [4]}), mode="append")
    return str(tmp_path)


def test_sources_observe_their_delta_versions(small_sources):
    from definitions import build_definitions

    defs = build_definitions(warehouse=WarehouseResource(root=small_sources))
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("observe_sources").execute_in_process(instance=instance)
    assert result.success
    observed = {
        event.asset_key.to_user_string(): event.event_specific_data.asset_observation
        for event in result.all_events
        if event.event_type_value == "ASSET_OBSERVATION"
    }
    assert set(observed) == set(TPCH_TABLES)
    versions = {name: observation.data_version for name, observation in observed.items()}
    assert versions == {**{name: "0" for name in TPCH_TABLES}, "nation": "2", "lineitem": "missing"}
    assert observed["nation"].metadata["delta_version"].value == 2
    assert "load_tpch" in observed["lineitem"].metadata["status"].value


def test_spark_confs_from_the_environment_parse_and_java_options_add_up(monkeypatch):
    from resources.session import SparkStartError, confs_from_environment

    monkeypatch.setenv("EPOCHAL_SPARK_CONF", "spark.a=1; spark.driver.extraJavaOptions=-Da=b -Xss4m;;"
                                             "spark.driver.extraJavaOptions=-XX:+UseParallelGC")
    assert confs_from_environment() == {"spark.a": "1",
                                        "spark.driver.extraJavaOptions": "-Da=b -Xss4m -XX:+UseParallelGC"}
    monkeypatch.setenv("EPOCHAL_SPARK_CONF", "spark.a=1;spark.b")
    with pytest.raises(SparkStartError, match="'spark.b' is not key=value"):
        confs_from_environment()


def test_the_driver_jvm_is_started_to_return_heap_and_the_callers_options_come_after(spark):
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"{QUIET_JVM} {HEAP_RETURNED} " in options and options.endswith(TEST_JAVA_OPTIONS)
    started_with = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert set(HEAP_RETURNED.split()) <= set(started_with)
