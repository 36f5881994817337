"""Hunt a conformance mismatch seen once: `python -m tests.conformance_hunt TYPE SHAPE [N] [--path
driver|spark] [--arranged yes|no]` draws N runs (default 50) of one column type and one shape
(`all`: every shape of the type, in one run, as `make conformance` runs them), the path and
arrangements pinned where given and drawn otherwise, on one Spark session, until one mismatches. It prints the first mismatch with the replay text
`tests.conformance_replay` reads (written to conformance-hunt.jsonl), so a case that needed many
draws to recur can be rerun at once. Much faster than a keep-going `make conformance` when the
type and shape are known: one table per run instead of every shape of the type."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile

from hypothesis import HealthCheck, given, settings

from resources.session import SparkSettings, delta_spark_session
from tests.conformance import run_case, runs, type_strategy


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance_hunt")
    parser.add_argument("type")
    parser.add_argument("shape")
    parser.add_argument("runs", type=int, nargs="?", default=50)
    parser.add_argument("--path", choices=["driver", "spark"])
    parser.add_argument("--arranged", choices=["yes", "no"])
    parser.add_argument("--results", default="conformance-hunt.jsonl")
    args = parser.parse_args(argv)
    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, ui=False))
    warehouse = tempfile.mkdtemp(prefix="conformance-hunt-")
    found: list[str] = []
    tried = [0]

    @settings(max_examples=args.runs, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(run=runs(type_strategy(args.type)))
    def hunt(run):
        if found:
            return
        pinned = {"only": None if args.shape == "all" else (args.shape,)}
        if args.path:
            pinned["path"] = args.path
        if args.arranged:
            pinned["arranged"] = args.arranged == "yes"
        run = dataclasses.replace(run, **pinned)
        if not run.shapes():
            return
        tried[0] += 1
        outcome, _ = run_case(spark, warehouse, run)
        seconds = ", ".join(f"{phase} {value:.0f}s" for phase, value in outcome.seconds.most_common())
        print(f"{tried[0]}: {run.describe()}: {'MISMATCH' if outcome.mismatches else 'equal'} ({seconds})", flush=True)
        if outcome.mismatches:
            found.extend(outcome.mismatches)
            with open(args.results, "a") as out:
                for mismatch in outcome.mismatches:
                    shape = mismatch.split(":")[0].removeprefix("c_")
                    out.write(json.dumps({"shape": shape, "mismatch": mismatch, "replay": run.replay()}) + "\n")

    hunt()
    for problem in found:
        print("MISMATCH", problem)
    print(f"{tried[0]} runs, {'a mismatch recorded in ' + args.results if found else 'no mismatch'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
