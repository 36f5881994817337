"""What the tests' own source changes cost (tests.support.SyntheticSource: Spark's writes, DELETE
and UPDATE of a six-row table with change data feed), per operation: seconds and Spark jobs,
median of `--repeat` rounds, in the tests' session (tests/conftest.py's confs), with and without
each candidate Delta setting. Over test_differential_sql's first test these changes were 31 s of
87 (bench.test_profile), so a setting that cuts them cuts every differential test. Measured
2026-11-26: DELETE and UPDATE 1.6 s and 7 jobs each (3 of them rebuilding the snapshot), an
append 0.35 s and 1 job; no Delta setting tried here cut them by more than noise (AQE off saves
3 jobs but ~10%). `rows()` read by Spark took 1.0 s and 5 jobs; it reads by delta-rs since.

    .venv/bin/python -m bench.source_writes [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

CANDIDATES = {
    "the tests' session": {},
    "no checksum files": {"spark.databricks.delta.writeChecksumFile.enabled": "false"},
    "no stats collection": {"spark.databricks.delta.stats.collect": "false"},
    "AQE off": {"spark.sql.adaptive.enabled": "false"},
    "no history metrics": {"spark.databricks.delta.history.metricsEnabled": "false"},
}


def _jobs(spark, group: str) -> int:
    tracker = spark.sparkContext.statusTracker()
    return len(tracker.getJobIdsForGroup(group))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.source_writes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    arguments = parser.parse_args(argv)

    from resources.session import SparkSettings, delta_spark_session
    from tests.conftest import TEST_CONFS
    from tests.support import SyntheticSource
    from tests.test_differential import A_INITIAL, A_SCHEMA

    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False, driver_memory="4g",
                                              extra_conf=TEST_CONFS))
    root = tempfile.mkdtemp(prefix="source-writes-")
    operations = {
        "create": lambda path: SyntheticSource(spark, path, A_SCHEMA, A_INITIAL),
        "insert": lambda source: source.insert([(7, "x", 1, None)]),
        "delete": lambda source: source.delete("k = 2"),
        "update": lambda source: source.update("g = 'x'", {"v": "v + 1"}),
        "rows": lambda source: source.rows(),
    }
    for label, confs in CANDIDATES.items():
        for key, value in confs.items():
            spark.conf.set(key, value)
        figures = {name: ([], []) for name in operations}
        for round_ in range(arguments.repeat + 1):  # the first round warms up
            source = None
            for name, operation in operations.items():
                group = f"bench-{uuid.uuid4().hex[:8]}"
                spark.sparkContext.setJobGroup(group, name)
                began = time.perf_counter()
                result = operation(f"{root}/{uuid.uuid4().hex[:8]}" if name == "create" else source)
                seconds = time.perf_counter() - began
                if name == "create":
                    source = result
                if round_:
                    figures[name][0].append(seconds)
                    figures[name][1].append(_jobs(spark, group))
        for key in confs:
            spark.conf.unset(key)
        print(f"{label}: " + ", ".join(
            f"{name} {statistics.median(s):.2f}s/{statistics.median(j):.0f} jobs" for name, (s, j) in figures.items()))
    spark.stop()


if __name__ == "__main__":
    main()
