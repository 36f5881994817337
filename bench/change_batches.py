"""What drawing one of the benchmark's change batches costs the driver (ops.changes): seconds and
peak resident memory of drawing batch `--index` at `--fraction` over a TPC-H warehouse, and each
table's share of it, without writing it (delta-rs reads, no Spark session). At a tenth of scale
10's orders the batch is 15 million changed rows; drawn as Python objects it outgrew the machine.

    .venv/bin/python -m bench.change_batches /tmp/epochal-bench/tpch-10 --fraction 0.1
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa

from ops.changes import ChangeGenerator


def _peak_megabytes() -> dict[str, int]:
    with open("/proc/self/status") as status:
        return {line.split(":")[0]: int(line.split()[1]) >> 10 for line in status if line.startswith(("VmHWM", "VmRSS"))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.change_batches", description=__doc__.split("\n\n")[0])
    parser.add_argument("warehouse", help="a TPC-H warehouse (its sources/ folder), local")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--index", type=int, default=1, help="the batch's index (its random stream)")
    parser.add_argument("--seed", type=int, default=11)
    arguments = parser.parse_args(argv)
    generator = ChangeGenerator(None, arguments.warehouse, seed=arguments.seed, fraction=arguments.fraction,
                                writer="delta-rs")
    began = time.perf_counter()
    plans = generator.draw(arguments.index)
    seconds = time.perf_counter() - began
    memory = _peak_megabytes()
    print(f"drawn in {seconds:.1f} s; Python peak {memory['VmHWM']} MB, now {memory['VmRSS']} MB, "
          f"Arrow {pa.total_allocated_bytes() >> 20} MB")
    for name, plan in plans.items():
        held = sum(t.nbytes for t in (plan.inserts, plan.deletes, plan.updates) if t is not None)
        print(f"  {name}: {plan.rows('inserts')} inserted, {plan.rows('deletes')} deleted, "
              f"{plan.rows('updates')} updated; {held >> 20} MB")


if __name__ == "__main__":
    main()
