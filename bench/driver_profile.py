"""Where a step's driver time goes, from a py-spy profile of a bench run: each sample of a step
thread is charged to the deepest engine frame on its stack and to the library call under it
(a PySpark method waiting on the JVM, a pyarrow or delta-rs read, Python), so time spent
planning DataFrames, waiting on Spark jobs and reading on the driver are told apart.

    .venv/bin/pip install py-spy
    .venv/bin/py-spy record -r 40 --idle --threads --nonblocking -f speedscope -o /tmp/steps.json -- \\
        .venv/bin/python -m bench --scales 1 --epochs 2 --queries 3 4 13 --sweep
    .venv/bin/python -m bench.driver_profile /tmp/steps.json [--depth 40]

or attached to a running benchmark (`--within incremental_rows`: the incremental computation
only, not the recomputes' waits on Spark between the epochs):

    .venv/bin/py-spy record --pid <bench> --idle --nonblocking --rate 10 --format raw -o spy.txt
    .venv/bin/python -m bench.driver_profile spy.txt --rate 10 --within incremental_rows

A speedscope profile keeps each thread's samples in order, so by default only the samples after a
thread's first incremental step count (`--after`); raw profiles (`-f raw`) count every sample.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

FRAME = re.compile(r"^(?P<function>.+) \((?P<file>[^:()]+):(?P<line>\d+)\)$")


def _frames(stack: str) -> list[tuple[str, str, str]]:
    frames = []
    for part in stack.split(";")[1:]:
        match = FRAME.match(part)
        if match:
            frames.append((match["file"], match["function"], match["line"]))
    return frames


def _library_call(frames: list[tuple[str, str, str]], engine_at: int) -> str:
    for file, function, _ in frames[engine_at + 1:]:
        for library in ("pyspark/", "pyarrow/", "deltalake/", "py4j/"):
            if library in file:
                return f"{library.rstrip('/')}.{function}"
    return "python"


def _relative(file: str) -> str:
    for root in ("epochal/", "pyspark/", "pyarrow/", "deltalake/", "py4j/"):
        at = file.rfind("/" + root)
        if at >= 0:
            return file[at + 1:]
    return file


def speedscope_lines(profile: dict, after: str | None):
    """The samples of a speedscope profile as raw lines (`thread;frame;... count`), each thread's
    from its first sample holding `after` on."""
    frames = [f"{f['name']} ({_relative(f['file'])}:{f.get('line') or 0})" for f in profile["shared"]["frames"]]
    for thread in profile["profiles"]:
        started = after is None
        for sample in thread["samples"]:
            stack = ";".join(frames[i] for i in sample)
            started = started or after in stack
            if started:
                yield f"{thread['name']};{stack} 1"


def summarize(lines, within: str = "epochal/epoch.py", without: tuple[str, ...] = ()
              ) -> tuple[collections.Counter, collections.Counter, int]:
    by_site, by_call, total = collections.Counter(), collections.Counter(), 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if within not in stack or any(marker in stack for marker in without):
            continue
        frames = _frames(stack)
        engine = [i for i, (file, _, _) in enumerate(frames) if file.startswith("epochal/")]
        if not engine:
            continue
        deepest = engine[-1]
        file, function, line_number = frames[deepest]
        call = _library_call(frames, deepest)
        samples = int(count)
        total += samples
        by_site[f"{file}:{line_number} {function} -> {call}"] += samples
        by_call[call] += samples
    return by_site, by_call, total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", help="py-spy output (-f speedscope or -f raw), recorded with --idle --threads")
    parser.add_argument("--rate", type=float, default=40.0, help="the samples per second py-spy took")
    parser.add_argument("--after", default="incremental_rows",
                        help="speedscope: count each thread's samples from the first holding this on")
    parser.add_argument("--depth", type=int, default=40)
    parser.add_argument("--within", default="epochal/protocol/epoch.py",
                        help="count only stacks holding this (default: step threads)")
    parser.add_argument("--without", nargs="*", default=["rescan", "replace_contents"],
                        help="leave out stacks holding any of these (default: the first epoch's rescans)")
    arguments = parser.parse_args(argv)
    with open(arguments.profile) as file:
        if arguments.profile.endswith(".json"):
            lines = speedscope_lines(json.load(file), arguments.after or None)
        else:
            lines = file.readlines()
        by_site, by_call, total = summarize(lines, arguments.within, tuple(arguments.without))
    seconds = 1.0 / arguments.rate
    print(f"step threads: {total * seconds:.1f} thread-seconds")
    print("\nby library call:")
    for call, samples in by_call.most_common(arguments.depth):
        print(f"  {samples * seconds:7.1f} s  {call}")
    print("\nby engine frame and call:")
    for site, samples in by_site.most_common(arguments.depth):
        print(f"  {samples * seconds:7.1f} s  {site}")


if __name__ == "__main__":
    main()
