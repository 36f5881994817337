"""Where a test's time goes, by the test helpers and engine calls it makes (wall seconds under
cProfile: Spark's time shows as the Python call that waited for it).

    python -m bench.test_profile tests/test_differential.py::test_random_changes_match_recompute_after_every_epoch

Prints the calls of tests/ and epochal/ functions above --min seconds, most expensive first: for
test_differential's first test it split the time into the oracle's checks (mismatched_tables),
the engine's refreshes, the sources' writes (SyntheticSource, apply_a/apply_b) and the feed
checks, which is how the oracle's per-version Spark reads were found (46 s of 113 s). Threads
are profiled too (the engine's steps run on its pool when `parallelism` > 1), so the engine's
functions show under `Engine._run_steps`; steps that overlap add up to more than the wall time."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import threading


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.test_profile")
    parser.add_argument("tests", nargs="+", help="pytest node ids or files")
    parser.add_argument("--min", type=float, default=1.0, help="seconds below which a call is not shown")
    parser.add_argument("--top", type=int, default=40)
    arguments = parser.parse_args(argv)
    import pytest

    output = tempfile.NamedTemporaryFile(suffix=".prof", delete=False).name
    threads: list[cProfile.Profile] = []

    def profile_thread(*_):  # the engine's steps run on its thread pool when parallelism > 1
        sys.setprofile(None)
        threads.append(cProfile.Profile())
        threads[-1].enable()

    threading.setprofile(profile_thread)
    profile = cProfile.Profile()
    code = profile.runcall(pytest.main, ["-p", "no:cacheprovider", "-q", *arguments.tests])
    threading.setprofile(None)
    profile.dump_stats(output)
    stats = pstats.Stats(output)
    for thread in threads:
        stats.add(thread)
    rows = []
    for (path, line, name), (_, calls, _, cumulative, _) in stats.stats.items():
        if cumulative >= arguments.min and any(part in path for part in ("/tests/", "/epochal/")):
            rows.append((cumulative, calls, path.split("/")[-2] + "/" + path.split("/")[-1], line, name))
    for cumulative, calls, where, line, name in sorted(rows, reverse=True)[:arguments.top]:
        print(f"{cumulative:8.1f}s {calls:6d}  {where}:{line} {name}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
