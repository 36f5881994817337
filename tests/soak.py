"""The soak (`make soak`, not part of `make test`): many hourly epochs of randomized change batches
over TPC-H queries and synthetic tables with NULLs and duplicate rows, with a chain and a diamond
of derived tables; after every epoch every table must equal the full recompute of its SQL.
Arrangements are forced on (every input read by key is arranged), and over 200 epochs the kept
state's periodic rewrites run at their default thresholds (keyed/upkeep.py): state tables are
compacted every 8 appends, arrangements built again after 64.

    make soak                                   # 200 epochs at TPC-H scale 0.1, then the differential tests
    make soak ARGS="--epochs 50 --examples 0"   # shorter; no differential tests
    make soak ARGS="--scale 0.01 --minutes 30"  # smaller, time-boxed

Each epoch: one TPC-H change batch (ops/changes.py, scale 0.01) and a few random commits on the
synthetic sources `a` and `b` (tests/reliability.py), all stamped with the epoch's logical hour,
then `refresh(until=<end of the hour>)` and one comparison job for all tables. Prints one line per
epoch and at the end: epochs, mismatches (must be 0), techniques, and peak memory (driver JVM
resident set and heap, Python resident set) at the start and at the end, and how many state
compactions and arrangement rebuilds ran. Exits 1 on any mismatch or error.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SQL = REPO / "assets" / "sql"
TPCH_SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
# Three queries that between them join, aggregate, outer-join, filter on a subquery and keep a top
# 100; the soak's point is length (state appended, compacted and read back over hundreds of
# epochs), `make test-tpch` covers the breadth of all 22. Each query added lengthens every epoch.
TPCH_QUERIES = ("tpch_q03", "tpch_q13", "tpch_q18")
LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)

SYNTHETIC = {
    # join + aggregate, a multiset join, DISTINCT over it (a chain), a global aggregate
    "agg": "SELECT b.name, count(*) AS n, sum(a.v) AS s FROM a JOIN b ON a.k = b.k GROUP BY b.name",
    "j": "SELECT a.k, a.g, b.name, a.v FROM a JOIN b ON a.k = b.k",
    "dist": "SELECT DISTINCT g, name FROM j",
    "cnt": "SELECT count(*) AS n, count(v) AS nv, sum(v) AS s FROM a",
    # a longer chain: a -> keyed -> keyed_sum -> busy
    "keyed": "SELECT g, k, v FROM a WHERE k IS NOT NULL",
    "keyed_sum": "SELECT g, sum(v) AS s, count(*) AS n FROM keyed GROUP BY g",
    "busy": "SELECT g, s FROM keyed_sum WHERE n > 1",
    # a diamond: two paths from `a` joined again
    "left_path": "SELECT k, sum(v) AS sv FROM a GROUP BY k",
    "right_path": "SELECT k, count(*) AS c, count(DISTINCT g) AS dg FROM a WHERE g IS NOT NULL GROUP BY k",
    "diamond": "SELECT l.k, l.sv, r.c, r.dg FROM left_path l JOIN right_path r ON l.k = r.k",
    # a diamond mixing TPC-H and a derived TPC-H table
    "nation_orders": "SELECT n.n_name, count(*) AS orders, sum(o.o_totalprice) AS total FROM orders o "
                     "JOIN customer c ON o.o_custkey = c.c_custkey JOIN nation n ON c.c_nationkey = n.n_nationkey "
                     "GROUP BY n.n_name",
    "nation_share": "SELECT q.n_name, q.total, r.r_name FROM nation_orders q JOIN nation n ON q.n_name = n.n_name "
                    "JOIN region r ON n.n_regionkey = r.r_regionkey WHERE q.orders > 0",
}


class Memory:
    """Peak resident memory of this process and of the driver JVM, sampled after each epoch."""

    def __init__(self, spark):
        jvm = spark.sparkContext._jvm
        try:
            self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - fall back to the java child of this process
            self.jvm_pid = _java_child()
        self.runtime = jvm.java.lang.Runtime.getRuntime()
        self.heap_peak = 0

    def sample(self) -> None:
        self.heap_peak = max(self.heap_peak, self.runtime.totalMemory() - self.runtime.freeMemory())

    def jvm(self, field: str) -> int:
        try:
            for line in Path(f"/proc/{self.jvm_pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def python_peak(self) -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def line(self) -> str:
        mb = 1024 * 1024
        return (f"driver JVM {self.jvm('VmRSS') / mb:.0f} MB now, peak {self.jvm('VmHWM') / mb:.0f} MB resident, "
                f"peak heap used {self.heap_peak / mb:.0f} MB; python peak {self.python_peak() / mb:.0f} MB")


def _java_child() -> int:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().split()[3]) == os.getpid() \
                    and b"java" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return 0


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=200, help="hourly epochs to run (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random batches")
    parser.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor (default 0.1)")
    parser.add_argument("--arrange-rows", type=int, default=0,
                        help="arrange inputs of at least this many rows read by key (default 0: every one; "
                             "-1: no arrangements)")
    parser.add_argument("--fraction", type=float, default=0.002,
                        help="share of TPC-H orders a batch changes (default 0.002)")
    parser.add_argument("--examples", type=int, default=10,
                        help="then run the hypothesis differential tests with this many examples each "
                             "(make test runs 2; 0: skip)")
    parser.add_argument("--queries", default=",".join(TPCH_QUERIES),
                        help=f"TPC-H queries to maintain (default {','.join(TPCH_QUERIES)})")
    parser.add_argument("--warehouse", help="warehouse folder (default: a new temporary folder)")
    parser.add_argument("--driver-memory", default=os.environ.get("EPOCHAL_DRIVER_MEMORY", "6g"))
    parser.add_argument("--minutes", type=float, default=None,
                        help="start no epoch after this many minutes (a time-boxed soak; the summary says "
                             "how many epochs ran)")
    parser.add_argument("--stop-on-mismatch", action="store_true", help="stop at the first mismatch")
    return parser.parse_args(argv)


def soak(args) -> int:
    from epochal import Engine
    from ops.changes import ChangeGenerator
    from ops.tpch import load_tpch
    from resources.session import SparkSettings, delta_spark_session
    from tests.reliability import create_sources, random_batch
    from tests.support import mismatched_tables, multiset_diff, upkeep_done

    began = time.monotonic()
    root = args.warehouse or tempfile.mkdtemp(prefix="epochal-soak-")
    spark = delta_spark_session(SparkSettings(shuffle_partitions=2, driver_memory=args.driver_memory))
    memory = Memory(spark)
    print(f"soak: {args.epochs} epochs, TPC-H scale {args.scale:g}, seed {args.seed}, warehouse {root}", flush=True)

    load_tpch(spark, root, args.scale, LOADED_AT)
    create_sources(root, at=LOADED_AT)
    engine = Engine(spark, root, cost_model=False, arrange_rows=None if args.arrange_rows < 0 else args.arrange_rows)
    for name in TPCH_SOURCES + ("a", "b"):
        engine.source(name, clock="logical")
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    definitions = {name: (SQL / f"{name}.sql").read_text() for name in queries}
    definitions.update(SYNTHETIC)
    engine.define_all(definitions)
    names = engine.tables()
    generator = ChangeGenerator(spark, root, seed=args.seed, fraction=args.fraction)
    rng = random.Random(args.seed)
    print(f"tables ({len(names)}): {', '.join(names)}; set up in {time.monotonic() - began:.0f}s", flush=True)
    at_start = None

    mismatches: list[str] = []
    techniques: Counter = Counter()
    table_seconds: Counter = Counter()
    errors = 0
    epochs_run = 0
    for index in range(args.epochs + 1):
        if args.minutes is not None and index > 0 and time.monotonic() - began > args.minutes * 60:
            print(f"time box of {args.minutes:g} min reached after epoch {index - 1}", flush=True)
            break
        started = time.monotonic()
        hour = LOADED_AT + timedelta(hours=index)
        if index > 0:
            generator.apply_batch(index, hour - timedelta(minutes=30))
            random_batch(root, rng, commits=rng.randint(0, 4), at=hour - timedelta(minutes=20))
        written = time.monotonic()
        try:
            reports = engine.refresh(until=hour + timedelta(minutes=0 if index else 15))
        except Exception as error:  # noqa: BLE001 - a soak reports and stops
            errors += 1
            print(f"epoch {index}: refresh failed: {type(error).__name__}: {error}", flush=True)
            break
        refreshed = time.monotonic()
        epochs_run = index
        if index > 0:
            techniques.update(r.technique for r in reports)
            table_seconds.update({r.table: r.seconds for r in reports})
        wrong = mismatched_tables(engine, names)
        for name in wrong:
            difference = multiset_diff(engine, name)
            if difference:
                mismatches.append(f"epoch {index}: {difference}")
                print(f"MISMATCH epoch {index}: {difference}", flush=True)
        memory.sample()
        if index == 0:
            at_start = memory.line()
        shown = Counter(r.technique for r in reports)
        rescans = [f"{r.table} ({r.reason.split(':')[0]})" for r in reports if r.technique == "rescan" and index > 0]
        print(f"epoch {index:4d}: {dict(shown)}{' rescans ' + ', '.join(rescans) if rescans else ''}; changes "
              f"{written - started:4.1f}s, refresh {refreshed - written:5.1f}s, check "
              f"{time.monotonic() - refreshed:4.1f}s; mismatches so far {len(mismatches)}; {memory.line()}", flush=True)
        if mismatches and args.stop_on_mismatch:
            break

    seconds = time.monotonic() - began
    print("", flush=True)
    print("soak summary", flush=True)
    print(f"  epochs:      {epochs_run} after the first (tables: {len(names)}; table epochs {sum(techniques.values())})")
    print(f"  mismatches:  {len(mismatches)}")
    print(f"  errors:      {errors}")
    print(f"  techniques:  {dict(techniques)}")
    slowest = ", ".join(f"{name} {total / max(epochs_run, 1):.1f}s" for name, total in table_seconds.most_common(6))
    print(f"  slowest:     {slowest} (mean seconds per epoch, table steps run two at a time)")
    compactions, rebuilds = upkeep_done(root)
    print(f"  upkeep:      {compactions} state compactions, {rebuilds} arrangement rebuilds")
    print(f"  memory:      after the first epoch: {at_start}")
    print(f"               at the end:            {memory.line()}")
    print(f"  wall time:   {seconds / 60:.1f} min ({seconds / max(epochs_run, 1):.1f}s per epoch)", flush=True)
    spark.stop()
    if not args.warehouse and not mismatches and not errors:
        shutil.rmtree(root, ignore_errors=True)  # kept for inspection when something went wrong
    return 1 if mismatches or errors else 0


def differential(examples: int) -> int:
    """The hypothesis differential tests with more examples (they read EPOCHAL_EXAMPLES)."""
    print(f"\ndifferential tests with {examples} examples each", flush=True)
    env = {**os.environ, "EPOCHAL_EXAMPLES": str(examples), "PYTHONPATH": str(REPO)}
    began = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/test_differential.py", "tests/test_differential_sql.py", "tests/test_upkeep.py"], cwd=REPO, env=env)
    print(f"differential tests: {'passed' if code == 0 else 'FAILED'} in {(time.monotonic() - began) / 60:.1f} min",
          flush=True)
    return code


def main(argv=None) -> int:
    args = parse(argv)
    code = soak(args)
    if args.examples > 0:
        code = differential(args.examples) or code
    return code


if __name__ == "__main__":
    sys.exit(main())
