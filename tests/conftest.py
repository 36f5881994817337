"""Fixtures shared by all tests: one real Spark session with Delta, a fresh warehouse folder per
test module, and one TPC-H load per test session that modules copy instead of loading again."""

from __future__ import annotations

import fcntl
import pickle
import shutil
from datetime import datetime, timezone

import pytest

from resources.session import SparkSettings, delta_spark_session
from tests.support import TEST_JAVA_OPTIONS

TPCH_LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Spark's interpreted evaluation instead of generated code: the tests' plans are many and their
# data tiny, so generating and compiling code for each new plan (Janino, then the JIT) outweighed
# running it (the test JVM's CPU over test_differential's first test fell well below what it was;
# bench/RESULTS.md). Results are the same by Spark's contract (its own suites run both modes);
# `make bench`, `make demo`, the child processes of the crash and concurrency tests and the
# deployment tests run Spark's defaults.
# TEST_JAVA_OPTIONS: see tests.support.
# The tests' own VACUUMs (a source's change files removed) list the table's files in 10,000 tasks
# by Spark's default, whose scheduling on a small machine costs far more than listing a table of a
# few files with 2 (epochal.maintenance sets it for the engine's VACUUMs; bench/RESULTS.md).
TEST_CONFS = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
              "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
              "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}


@pytest.fixture(scope="session")
def spark():
    session = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False, driver_memory="8g",
                                                extra_conf=TEST_CONFS))
    yield session
    session.stop()


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, request) -> str:
    return str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))


@pytest.fixture(scope="session")
def tpch_load(spark, tmp_path_factory, worker_id):
    """TPC-H scale 0.01 loaded once at TPCH_LOADED_AT: (warehouse root, LoadReport). Read-only:
    use `copy_tpch` to get a warehouse you may change. Under make test's workers (pytest-xdist)
    the first worker to need it loads it into their shared temporary folder and the others wait
    for it and read it there: one load per run, not one per worker (a load takes both cores)."""
    from ops.tpch import load_tpch

    if worker_id == "master":
        root = str(tmp_path_factory.mktemp("tpch-0.01"))
        return root, load_tpch(spark, root, 0.01, TPCH_LOADED_AT)
    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, beside each worker's own
    loaded = shared / "tpch-0.01.loaded"  # (root, LoadReport) of the load that finished
    with open(shared / "tpch-0.01.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not loaded.exists():  # a load that failed half way leaves its own folder behind, unused
            root = str(tmp_path_factory.mktemp("tpch-0.01"))
            loaded.write_bytes(pickle.dumps((root, load_tpch(spark, root, 0.01, TPCH_LOADED_AT))))
        return pickle.loads(loaded.read_bytes())


@pytest.fixture(scope="session")
def copy_tpch(tpch_load):
    """Copy the session's TPC-H sources into a warehouse folder (a Delta table's log holds
    relative paths, so a copied folder is the same table)."""

    def copy(destination: str) -> str:
        shutil.copytree(f"{tpch_load[0]}/sources", f"{destination}/sources")
        return destination

    return copy


def pytest_addoption(parser):
    parser.addoption("--record-file-seconds", action="store_true",
                     help="write each test file's seconds to tests/file_seconds.json (the order make test hands files out in)")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test's files, longest first, each to the first idle worker (tests/schedule.py)."""
    from tests.schedule import scheduler

    return scheduler(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands files out in this order
        from tests.schedule import longest_first

        longest_first(items)


def pytest_sessionfinish(session):
    """Under pytest-xdist (make test), a worker hands its summaries to the controller."""
    from tests.support import SUMMARIES

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["summaries"] = list(SUMMARIES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.support import SUMMARIES

    SUMMARIES.extend(getattr(node, "workeroutput", {}).get("summaries", []))


def pytest_terminal_summary(terminalreporter):
    """Figures the tests gathered (per-query techniques and timings), and where the run's time
    went per worker and test file, shown after every run."""
    from tests.support import SUMMARIES

    for text in SUMMARIES:
        terminalreporter.write_line("")
        for line in text.splitlines():
            terminalreporter.write_line(line)
    _file_seconds(terminalreporter)
    if FILE_SECONDS and terminalreporter.config.getoption("record_file_seconds"):
        from tests.schedule import RECORD, record

        per_file: dict[str, float] = {}
        for (_, path), seconds in FILE_SECONDS.items():
            per_file[path] = per_file.get(path, 0.0) + seconds
        record(per_file)
        terminalreporter.write_line(f"seconds per test file written to {RECORD}")


FILE_SECONDS: dict[tuple[str, str], float] = {}  # (worker, test file) -> seconds of setup, call and teardown


def pytest_runtest_logreport(report):
    """On the controller, each test file's seconds per xdist worker: `make test` hands whole files
    to workers (--dist loadfile), so the suite's wall time is its busiest worker's files."""
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
    key = (worker, report.nodeid.split("::", 1)[0])
    FILE_SECONDS[key] = FILE_SECONDS.get(key, 0.0) + report.duration


def _file_seconds(terminalreporter) -> None:
    if not FILE_SECONDS:
        return
    totals: dict[str, float] = {}
    for (worker, _), seconds in FILE_SECONDS.items():
        totals[worker] = totals.get(worker, 0.0) + seconds
    terminalreporter.write_line("")
    terminalreporter.write_line("seconds per worker: " + ", ".join(f"{w} {s:.0f}" for w, s in sorted(totals.items())))
    ranked = sorted(FILE_SECONDS.items(), key=lambda item: -item[1])[:15]
    terminalreporter.write_line("slowest test files: " + ", ".join(f"{f} {s:.0f} s ({w})" for (w, f), s in ranked))
