"""Replay a conformance case that mismatched: `python -m tests.conformance_replay RESULTS [N]` runs
the N-th recorded case carrying a `replay` (default: the first) again, on a local Spark session,
and prints each table's technique per epoch and any mismatch. A run that records instead of
failing (EPOCHAL_CONFORMANCE_KEEP_GOING) prints no hypothesis seed; its results carry this."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile

from resources.session import SparkSettings, delta_spark_session
from tests.conformance import replayed, run_case


def main(argv: list[str]) -> int:
    path, wanted = argv[0], int(argv[1]) if len(argv) > 1 else 0
    with open(path) as lines:
        cases = [entry for entry in map(json.loads, lines) if entry.get("replay")]
    if wanted >= len(cases):
        print(f"{path} records {len(cases)} case(s) to replay")
        return 2
    run = dataclasses.replace(replayed(cases[wanted]["replay"]), only=(cases[wanted]["shape"],))  # its case alone
    print(run.describe())
    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False))
    outcome, _ = run_case(spark, tempfile.mkdtemp(prefix="conformance-replay-"), run)
    for name, steps in outcome.cases.items():
        print(name, [f"{technique} {reason}".strip() for technique, reason in steps])
    for problem in outcome.mismatches + [f"{name}: {error}" for name, error in outcome.errors.items()]:
        print("MISMATCH", problem)
    return 1 if outcome.mismatches or outcome.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
