"""Where an epoch's driver time goes: the wall time and CPU seconds of the Python driver and of
the JVM for whole incremental epochs of the 22 TPC-H tables, and each driver read of some keys'
rows (table, version, key column: reads, seconds, keys) and each version held whole, from the
engine's debug log.

    .venv/bin/python -m bench.epoch_reads 1 --epochs 2 --parallelism 2 1

Python CPU above the wall time means pyarrow's threads were busy (scans decode every file for
random keys); Python and JVM CPU near twice the wall time means the 2 cores were saturated, so
running steps in parallel cannot help and only less work can. This found TPC-H lineitem scanned
16 times an epoch at scale 1 (18 s of 43 s), which SharedReads._read_columns_whole removed.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

READ = re.compile(r"read (\S+) version (\d+) for (\d+) values of (\S+) on the driver: (.+) rows in ([\d.]+) s")
WHOLE = re.compile(r"read (\S+) version (\d+) whole on the driver \((\d+) columns, (\d+) rows, (\d+) MB\) in ([\d.]+) s")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process (Python and its native threads) and of its children (the JVM)."""
    children = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split()
    return _cpu_seconds(os.getpid()), sum(_cpu_seconds(int(c)) for c in children)


class _Reads(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("read ") and "on the driver" in message:
            self.lines.append(message)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scale", type=float)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[2], help="one per epoch, cycled")
    arguments = parser.parse_args(argv)
    from bench.__main__ import LOADED_AT, bench_engine, start_session, tpch_warehouse, batch_time
    from ops.changes import ChangeGenerator

    spark = start_session("12g")
    queries = [f"tpch_q{q:02d}" for q in range(1, 23)]
    root = tpch_warehouse(spark, Path("/tmp/epochal-bench"), arguments.scale, f"reads-{arguments.scale:g}")
    engine = bench_engine(spark, root, queries)
    engine.refresh(until=LOADED_AT + timedelta(minutes=15))
    generator = ChangeGenerator(spark, root, seed=11, fraction=0.001)
    handler = _Reads()
    logger = logging.getLogger("epochal")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    for index in range(1, arguments.epochs + 1):
        engine.parallelism = arguments.parallelism[(index - 1) % len(arguments.parallelism)]
        generator.apply_batch(index, batch_time(index))
        handler.lines.clear()
        began, (python, jvm) = time.perf_counter(), _cpu()
        reports = engine.refresh(queries, until=LOADED_AT + timedelta(hours=index), upstream=False)
        wall, (python_after, jvm_after) = time.perf_counter() - began, _cpu()
        print(f"epoch {index}, parallelism {engine.parallelism}: {wall:.1f} s; steps {sum(r.seconds for r in reports):.1f} s "
              f"summed; CPU: Python {python_after - python:.1f} s, JVM {jvm_after - jvm:.1f} s")
        scans = defaultdict(lambda: [0, 0.0, 0])
        for line in handler.lines:
            found = READ.match(line)
            if found:
                entry = scans[(found[1].rsplit("/", 1)[-1], int(found[2]), found[4])]
                entry[0] += 1
                entry[1] += float(found[6])
                entry[2] += int(found[3])
                continue
            whole = WHOLE.match(line)
            if whole:
                print(f"  held whole: {whole[1].rsplit('/', 1)[-1]} version {whole[2]}: {whole[4]} rows, "
                      f"{whole[3]} columns, {whole[5]} MB in {whole[6]} s")
        for (table, version, column), (reads, seconds, keys) in sorted(scans.items(), key=lambda kv: -kv[1][1]):
            print(f"  scanned for keys: {table} version {version} by {column}: {reads} reads, {seconds:.1f} s, {keys} keys")
        print(f"  scans for keys: {sum(v[1] for v in scans.values()):.1f} s in all")


if __name__ == "__main__":
    main()
