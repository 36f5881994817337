"""The synthetic sources' writer (tests/reliability.py, delta-rs) must record exact change feeds:
the crash, concurrency and soak runs compare the engine with a recompute, and a change feed that
disagrees with the table's own versions would show up there as an engine mismatch. (delta-rs's
UPDATE records wrong images for duplicate rows; the soak met it at epoch 48.) No Spark here:
delta-rs reads the feed back, the same files Spark reads."""

from __future__ import annotations

import random

from tests.reliability import create_sources, random_batch, source_path
from tests.support import feed_problems


def test_random_batches_record_exact_change_feeds(tmp_path):
    root = str(tmp_path)
    create_sources(root)
    rng = random.Random(7)
    for _ in range(40):
        random_batch(root, rng, commits=3)
    problems = feed_problems(source_path(root, "a")) + feed_problems(source_path(root, "b"))
    assert not problems, "\n".join(problems)
