"""The synthetic sources' writer (tests/reliability.py, delta-rs) must record exact change feeds:
the crash, concurrency and soak runs compare the engine with a recompute, and a change feed that
disagrees with the table's own versions would show up there as an engine mismatch. (delta-rs's
UPDATE records wrong images for duplicate rows; the soak met it at epoch 48.) No Spark here:
delta-rs reads the feed back, the same files Spark reads."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
from deltalake import DeltaTable

from tests.reliability import create_sources, random_batch, source_path

INSERTED = ("insert", "update_postimage")


def _rows(table) -> Counter:
    data = pa.table(table)
    names = [n for n in data.column_names if not n.startswith("_")]
    return Counter(tuple(row[n] for n in names) for row in data.to_pylist())


def feed_problems(path: str) -> list[str]:
    """Versions whose change feed differs from the difference of the table's versions around it."""
    problems = []
    latest = DeltaTable(path).version()
    for version in range(1, latest + 1):
        expected = _rows(DeltaTable(path, version=version).to_pyarrow_table())
        expected.subtract(_rows(DeltaTable(path, version=version - 1).to_pyarrow_table()))
        feed = pa.table(DeltaTable(path).load_cdf(starting_version=version, ending_version=version).read_all())
        recorded = Counter()
        for row in feed.to_pylist():
            key = tuple(row[n] for n in feed.column_names if not n.startswith("_"))
            recorded[key] += 1 if row["_change_type"] in INSERTED else -1
        if +expected != +recorded or -expected != -recorded:
            problems.append(f"{path} version {version}: versions differ by {dict(+expected)} / -{dict(-expected)}, "
                            f"the feed records {dict(+recorded)} / -{dict(-recorded)}")
    return problems


def test_random_batches_record_exact_change_feeds(tmp_path):
    root = str(tmp_path)
    create_sources(root)
    rng = random.Random(7)
    for _ in range(40):
        random_batch(root, rng, commits=3)
    problems = feed_problems(source_path(root, "a")) + feed_problems(source_path(root, "b"))
    assert not problems, "\n".join(problems)
