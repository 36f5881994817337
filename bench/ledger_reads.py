"""What a step's bookkeeping costs as its table's ledger grows: the ledger is never trimmed (the
cost model and a crash's resumption read it), so a table refreshed hourly holds 24 epochs of
records after a day and 8,760 after a year. For ledgers of `--epochs` epochs of records copied
from a real table's (one `started` and one `committed` record an epoch, as a step writes them),
the seconds of what every step does with its ledger: read its steps (`Ledger.steps`, twice: the
step's start and its history), estimate from them (`cost.estimate`) and record the step's two
records. And for a remap of as many epochs over TPC-H's eight sources (a record per source and
epoch, shared by every table of the warehouse), what a refresh does with it: the first read of
its epochs in a process, then per epoch the new epoch's window (`Remap.window`: read, record,
read again) and a lookup of it (`Remap.get`, as a Dagster partition's run does). delta-rs only,
no Spark session.

    .venv/bin/python -m bench --scales 0.1 --epochs 2 --no-sweep --keep
    .venv/bin/python -m bench.ledger_reads /tmp/epochal-bench/run-0.1-0.001 --epochs 24 720 8760
    .venv/bin/python -m bench.ledger_reads --remap-only --epochs 24 720 8760
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from epochal.protocol import cost
from epochal.storage.clock import CommitClock
from epochal.storage.ledger import COMMITTED, LEDGER_SCHEMA, STARTED, Ledger, Step
from epochal.storage.reclock import REMAP_SCHEMA, Remap, Source, epoch_key

SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def _template(warehouse: str) -> tuple[Step, Step]:
    """The last started and committed records of an incremental step in the warehouse's ledgers,
    the one of the most detail (the largest records)."""
    best = None
    for path in sorted(Path(warehouse, "_epochal", "tables").glob("*/ledger")):
        steps = Ledger(str(path)).steps()
        started = [s for s in steps if s.status == STARTED and s.technique == "incremental"]
        committed = [s for s in steps if s.status == COMMITTED and s.technique == "incremental"]
        if started and committed:
            size = len(str(committed[-1].to_record()))
            if best is None or size > best[0]:
                best = (size, started[-1], committed[-1])
    if best is None:
        raise SystemExit(f"no ledger with an incremental step under {warehouse}/_epochal/tables: "
                         "run `python -m bench --scales 0.1 --epochs 2 --no-sweep --keep` for one")
    return best[1], best[2]


def _filled(root: str, epochs: int, started: Step, committed: Step) -> Ledger:
    records = []
    for seq in range(1, epochs + 1):
        end = committed.epoch_end + timedelta(hours=seq)
        for step in (started, committed):
            records.append(replace(step, seq=seq, epoch=end.isoformat(), epoch_end=end).to_record())
    for first in range(0, len(records), 2_000):  # a file a day's worth of commits would compact to
        write_deltalake(root, pa.Table.from_pylist(records[first:first + 2_000], schema=LEDGER_SCHEMA), mode="append")
    return Ledger(root)


def _timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def _epoch(ledger: Ledger, started: Step, committed: Step) -> dict[str, float]:
    """One step's use of its ledger (epochal/protocol/epoch.py: `run`, then the metered step)."""
    steps_s, steps = _timed(ledger.steps)
    seq = ledger.next_seq(steps)
    end = committed.epoch_end + timedelta(hours=seq)
    record_s, _ = _timed(lambda: ledger.record(replace(started, seq=seq, epoch=end.isoformat(), epoch_end=end)))
    history_s, history = _timed(lambda: [s for s in ledger.committed() if s.seq < seq])
    estimate_s, _ = _timed(lambda: cost.estimate(history, committed.rows_read or 1000, spark_path=False))
    commit_s, _ = _timed(lambda: ledger.record(replace(committed, seq=seq, epoch=end.isoformat(), epoch_end=end)))
    return {"steps": steps_s, "start record": record_s, "history": history_s, "estimate": estimate_s,
            "commit record": commit_s}


def _remap_filled(folder: Path, epochs: int) -> tuple[Remap, list[Source], datetime]:
    """A remap of `epochs` hourly epochs over SOURCES (small tables of two commits each, every
    frontier 1), and the end of the last."""
    sources = []
    for name in SOURCES:
        path = str(folder / name)
        for n in range(2):
            write_deltalake(path, pa.table({"id": [n]}), mode="append")
        sources.append(Source(name, path, CommitClock()))
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    records = []
    for n in range(1, epochs + 1):
        end = start + timedelta(hours=n)
        records.extend(dict(epoch=epoch_key(end), end_time=end, kind="window", source=s.name, path=s.path, frontier=1,
                            note="", created_at=end, run_id="filled", table_id=None) for s in sources)
    uri = str(folder / "remap")
    for first in range(0, len(records), 16_000):  # a file a day's worth of commits would compact to
        write_deltalake(uri, pa.Table.from_pylist(records[first:first + 16_000], schema=REMAP_SCHEMA), mode="append")
    return Remap(uri), sources, start + timedelta(hours=epochs)


def _remap_epoch(remap: Remap, sources: list[Source], end: datetime) -> dict[str, float]:
    window_s, epoch = _timed(lambda: remap.window(end, sources, now=end + timedelta(minutes=1)))
    get_s, _ = _timed(lambda: remap.get(epoch.key))
    return {"window": window_s, "get": get_s}


def _remap_sizes(sizes: list[int], repeat: int) -> None:
    for epochs in sizes:
        with tempfile.TemporaryDirectory() as folder:
            remap, sources, last = _remap_filled(Path(folder), epochs)
            cold, _ = _timed(remap.epochs)
            timed = [_remap_epoch(remap, sources, last + timedelta(hours=n + 1)) for n in range(repeat)]
            medians = {name: statistics.median(t[name] for t in timed) for name in timed[0]}
            print(f"{epochs:>6} epochs of remap ({epochs * len(SOURCES):,} records): first read {cold * 1000:.1f} ms; "
                  f"an epoch's {sum(medians.values()) * 1000:.1f} ms (" +
                  ", ".join(f"{name} {seconds * 1000:.1f}" for name, seconds in medians.items()) + ")", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_reads", description=__doc__.split("\n\n")[0])
    parser.add_argument("warehouse", nargs="?", help="a benchmark warehouse whose tables have run incremental steps")
    parser.add_argument("--epochs", type=int, nargs="+", default=[24, 720, 8760])
    parser.add_argument("--repeat", type=int, default=5, help="epochs timed at each size (the median reported)")
    parser.add_argument("--remap-only", action="store_true", help="the remap alone (no warehouse needed)")
    arguments = parser.parse_args(argv)
    _remap_sizes(arguments.epochs, arguments.repeat)
    if arguments.remap_only:
        return
    if arguments.warehouse is None:
        parser.error("a warehouse is needed for the ledgers (or --remap-only)")
    started, committed = _template(arguments.warehouse)
    print(f"template: {committed.technique} step of {len(str(committed.to_record()))} characters a record")
    for epochs in arguments.epochs:
        with tempfile.TemporaryDirectory() as folder:
            ledger = _filled(str(Path(folder, "ledger")), epochs, started, committed)
            cold, _ = _timed(ledger.steps)
            timed = [_epoch(ledger, started, committed) for _ in range(arguments.repeat)]
            medians = {name: statistics.median(t[name] for t in timed) for name in timed[0]}
            print(f"{epochs:>6} epochs: first read {cold * 1000:.1f} ms; an epoch's bookkeeping "
                  f"{sum(medians.values()) * 1000:.1f} ms (" +
                  ", ".join(f"{name} {seconds * 1000:.1f}" for name, seconds in medians.items()) + ")", flush=True)


if __name__ == "__main__":
    main()
