"""A TPC-H warehouse whose tables were refreshed at least once, for the tools that time one
table's work over the input versions of its last step (rescan_phases.py, first_run.py)."""

from __future__ import annotations

import argparse
import threading
import time
from datetime import timedelta
from pathlib import Path

from bench.__main__ import LOADED_AT, bench_engine, start_session, tpch_warehouse
from epochal.changes import InputRange
from epochal.metrics import Meter, metered, scheduler_pool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("warehouse", nargs="?", help="a warehouse whose tables were refreshed (default: one "
                                                     "built at --scale, its tables' first run)")
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--queries", type=int, nargs="+", default=list(range(1, 23)))


def open_warehouse(arguments: argparse.Namespace, prefix: str):
    """(spark, engine, root, names): `arguments.warehouse`, or one built at `arguments.scale`
    under `prefix` and refreshed once, with the engine defining `arguments.queries`."""
    spark = start_session("12g")
    names = [f"tpch_q{q:02d}" for q in arguments.queries]
    root = arguments.warehouse or tpch_warehouse(spark, Path("/tmp/epochal-bench"), arguments.scale,
                                                 f"{prefix}-{arguments.scale:g}")
    engine = bench_engine(spark, root, names)
    if not arguments.warehouse:
        engine.refresh(until=LOADED_AT + timedelta(minutes=15))
    return spark, engine, root, names


def last_inputs(engine, name: str) -> dict:
    """The input ranges of `name`'s last committed step."""
    last = engine.table(name).ledger.last_committed()
    return {n: InputRange(n, engine.path_of(n), "source" if n in engine.sources else "derived", v["from"],
                          v["to"], engine.schema_of(n)) for n, v in last.inputs.items()}


def seconds_of(run) -> float:
    """The wall seconds `run()` took."""
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def timed_work(spark, run) -> tuple[float, float]:
    """The wall seconds `run()` took and its Spark tasks' CPU seconds (the work, which a loaded
    machine does not lengthen), its jobs in the thread's scheduler pool as a step runs its own."""
    meter = Meter()
    with scheduler_pool(spark, threading.current_thread().name), metered(spark, meter):
        wall = seconds_of(run)
    meter.count_jobs(spark)
    return wall, meter.task_cpu_seconds or 0.0
