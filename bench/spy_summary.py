"""Where the driver's threads spent an epoch's incremental steps, from a py-spy recording of a
running benchmark (`--idle` so waits on disk and on Spark show, `--format raw`):

    py-spy record --pid <bench's pid> --idle --nonblocking --rate 10 --format raw -o spy.txt
    python -m bench.spy_summary spy.txt [--within incremental_rows] [--top 40]

Only samples whose stack passes through `--within` (an engine function; the incremental
computation by default) count, so the recomputes' waits on Spark between them do not. Prints the
functions by inclusive samples (engine and library alike) and the leaves (where the thread was:
in Arrow, numpy, delta-rs, a py4j socket or Python itself) by their own samples.
"""

from __future__ import annotations

import argparse
import collections
import re

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/epochal/", "/bench/", "/ops/"):
        if marker in path:
            path = path.split(marker, 1)[1] if marker == "site-packages/" else marker.strip("/") + "/" + path.split(marker, 1)[1]
            break
    return f"{match['function']} ({path})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording")
    parser.add_argument("--within", default="incremental_rows")
    parser.add_argument("--top", type=int, default=40)
    arguments = parser.parse_args(argv)
    inclusive, leaves, total = collections.Counter(), collections.Counter(), 0
    with open(arguments.recording) as recording:
        for line in recording:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit() or arguments.within not in stack:
                continue
            frames = [_short(f) for f in stack.split(";")]
            total += int(count)
            for frame in set(frames):
                inclusive[frame] += int(count)
            leaves[frames[-1]] += int(count)
    print(f"{total} samples through {arguments.within}")
    print("\nby inclusive samples:")
    for frame, count in inclusive.most_common(arguments.top):
        print(f"  {count:7d} {100 * count / max(total, 1):5.1f}%  {frame}")
    print("\nleaves by own samples:")
    for frame, count in leaves.most_common(arguments.top):
        print(f"  {count:7d} {100 * count / max(total, 1):5.1f}%  {frame}")


if __name__ == "__main__":
    main()
