"""Fixtures shared by all tests: one real Spark session with Delta, a fresh warehouse folder per
test module, and one TPC-H load per test session that modules copy instead of loading again."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone

import pytest

from resources.session import SparkSettings, delta_spark_session

TPCH_LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="session")
def spark():
    session = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False, driver_memory="8g"))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, request) -> str:
    return str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture(scope="session")
def tpch_load(spark, tmp_path_factory):
    """TPC-H scale 0.01 loaded once at TPCH_LOADED_AT: (warehouse root, LoadReport). Read-only:
    use `copy_tpch` to get a warehouse you may change."""
    from ops.tpch import load_tpch

    root = str(tmp_path_factory.mktemp("tpch-0.01"))
    return root, load_tpch(spark, root, 0.01, TPCH_LOADED_AT)


@pytest.fixture(scope="session")
def copy_tpch(tpch_load):
    """Copy the session's TPC-H sources into a warehouse folder (a Delta table's log holds
    relative paths, so a copied folder is the same table)."""

    def copy(destination: str) -> str:
        shutil.copytree(f"{tpch_load[0]}/sources", f"{destination}/sources")
        return destination

    return copy


def pytest_terminal_summary(terminalreporter):
    """Figures the tests gathered (per-query techniques and timings), shown after every run."""
    from tests.support import SUMMARIES

    for text in SUMMARIES:
        terminalreporter.write_line("")
        for line in text.splitlines():
            terminalreporter.write_line(line)
