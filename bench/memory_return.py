"""What the driver's Python process gives back after each refresh (epochal/memory.py): TPC-H at a
scale, every named table's first run, then epochs of the benchmark's change batches. The engine's
own call at the end of a refresh (done when the refresh grew the process by `memory.GROWTH`) is
held back here and made after every refresh, so that the process's resident memory is read
before and after it, with the seconds it takes.

    .venv/bin/python -m bench.memory_return 1 [--fraction 0.01] [--epochs 3] [--queries 1 13 18]

Prints, per refresh, Python's resident memory (VmRSS) as the refresh left it, after the memory is
given back, and the call's seconds (of them, a first collection of Python's cycles).
"""

from __future__ import annotations

import argparse
import gc
import time
from datetime import timedelta
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scale", type=float)
    parser.add_argument("--queries", type=int, nargs="+", default=list(range(1, 23)))
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--driver-memory", default="12g")
    parser.add_argument("--work", default="/tmp/epochal-bench")
    arguments = parser.parse_args(argv)

    import epochal.memory
    from bench.__main__ import LOADED_AT, bench_engine, start_session, tpch_warehouse, batch_time
    from epochal.memory import give_back_freed_memory, resident_bytes
    from ops.changes import ChangeGenerator

    epochal.memory.give_back_freed_memory = lambda: None
    spark = start_session(arguments.driver_memory)
    names = [f"tpch_q{q:02d}" for q in arguments.queries]
    root = tpch_warehouse(spark, Path(arguments.work), arguments.scale, f"memory-return-{arguments.scale:g}")
    engine = bench_engine(spark, root, names)
    generator = ChangeGenerator(spark, root, seed=11, fraction=arguments.fraction, writer="spark")
    print(f"{'refresh':<8} {'refresh s':>9} {'left GB':>8} {'given back GB':>14} {'after GB':>9} {'call s':>7} {'of it gc s':>10}", flush=True)
    for index in range(arguments.epochs + 1):
        if index:
            generator.apply_batch(index, batch_time(index))
        began = time.perf_counter()
        engine.refresh(until=LOADED_AT + timedelta(hours=index, minutes=15 if not index else 0))
        seconds = time.perf_counter() - began
        left = resident_bytes() / (1 << 30)
        began = time.perf_counter()
        gc.collect()
        collect = time.perf_counter() - began
        give_back_freed_memory()
        call = time.perf_counter() - began
        after = resident_bytes() / (1 << 30)
        print(f"{'first' if not index else index:<8} {seconds:>9.1f} {left:>8.2f} {left - after:>14.2f} {after:>9.2f} "
              f"{call:>7.2f} {collect:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
