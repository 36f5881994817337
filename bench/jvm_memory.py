"""Where the driver JVM's resident memory goes while another command runs: its resident set and
anonymous memory beside the heap G1 has committed and uses (`jcmd <pid> GC.heap_info`), sampled
every `--every` seconds, so a resident set past `-Xmx` can be split into heap kept committed after
a peak and memory outside the heap.

    .venv/bin/python -m bench.jvm_memory [--every 60] [--pid PID] [--out FILE]

Without `--pid` it waits for the one JVM running `org.apache.spark.deploy.SparkSubmit` (a bench run
started beside it) and stops when that process ends. Each line: the time, RSS, RssAnon, the heap's
committed and used bytes, and Metaspace's committed, in GiB.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from datetime import datetime, timezone

from bench.__main__ import status_fields

GIB = 1024 ** 3


def spark_submit_pid() -> int | None:
    """The pid of the one SparkSubmit JVM on the machine, or None."""
    found = subprocess.run(["pgrep", "-f", "org.apache.spark.deploy.SparkSubmit"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    return pids[0] if len(pids) == 1 else None


HEAP = re.compile(r"garbage-first heap\s+total (\d+)K, used (\d+)K")
METASPACE = re.compile(r"Metaspace\s+used (\d+)K, committed (\d+)K")


def heap_info(pid: int) -> tuple[int | None, int | None, int | None]:
    """(heap committed, heap used, metaspace committed) in bytes, None where jcmd gave nothing."""
    try:
        text = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, None, None
    heap, metaspace = HEAP.search(text), METASPACE.search(text)
    return (int(heap.group(1)) * 1024 if heap else None, int(heap.group(2)) * 1024 if heap else None,
            int(metaspace.group(2)) * 1024 if metaspace else None)


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=60.0)
    parser.add_argument("--pid", type=int, default=None)
    parser.add_argument("--out", default=None, help="append the lines to this file too")
    arguments = parser.parse_args(argv)
    pid = arguments.pid
    while pid is None:
        pid = spark_submit_pid()
        if pid is None:
            time.sleep(5)
    out = open(arguments.out, "a") if arguments.out else None
    peak = None
    print("time rss anonymous heap_committed heap_used metaspace_committed (GiB)", file=out or sys.stdout, flush=True)
    while True:
        rss, anonymous = status_fields(pid, ("VmRSS", "RssAnon"))
        if rss is None:
            break
        committed, used, metaspace = heap_info(pid)
        peak = max(peak or 0, rss)
        line = (f"{datetime.now(timezone.utc):%H:%M:%S} {gib(rss * 1024)} {gib((anonymous or 0) * 1024)} "
                f"{gib(committed)} {gib(used)} {gib(metaspace)}")
        for target in filter(None, (sys.stdout, out)):
            print(line, file=target, flush=True)
        time.sleep(arguments.every)
    summary = f"process {pid} ended; peak sampled RSS {gib((peak or 0) * 1024)} GiB"
    for target in filter(None, (sys.stdout, out)):
        print(summary, file=target, flush=True)


if __name__ == "__main__":
    main()
