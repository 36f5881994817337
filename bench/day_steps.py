"""The slow steps of a benchmark run, epoch by epoch, from its results.json: each step at least
`--times` its table's median step of the run (and `--over` seconds), with its technique, phases,
the seconds it spent making local copies (`copying`, not counted against its budget) and what
it gave up past its budget; then every step given up, and what the table's steps cost over the
epochs until it was incremental again, against its median. Each epoch's line gives, for runs
since 2026-12-07 midday, the machine's I/O wait and stolen CPU seconds and the bench process's
major page faults over its incremental epoch (`incremental_machine`), which tell a step slowed by
the machine or by the local copies' pages read from disk again from one that did more work.

A day at scale 10 (`--day`) has 24 hourly epochs beside the first: its shortfall against the 5x
target was in a few such steps (bench/RESULTS.md), and this is how they were found.

    .venv/bin/python -m bench.day_steps bench/results/<run> [--times 3] [--over 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _epochs(results: dict) -> list[dict]:
    runs = results.get("runs") or []
    epochs = runs[0]["epochs"] if runs else (results.get("in_progress") or {}).get("epochs", [])
    return [e for e in epochs if e.get("index", 0) >= 1]


def _phases(table: dict) -> str:
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in (table.get("phases") or {}).items() if seconds >= 0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench/results/<timestamp> folder, or its results.json")
    parser.add_argument("--times", type=float, default=3.0, help="a step this many times its table's median is slow")
    parser.add_argument("--over", type=float, default=10.0, help="... and at least this many seconds")
    args = parser.parse_args(argv)
    path = args.run / "results.json" if args.run.is_dir() else args.run
    epochs = _epochs(json.loads(path.read_text()))
    names = sorted({name for epoch in epochs for name in epoch["tables"]})
    medians = {name: statistics.median(e["tables"][name]["incremental_seconds"] for e in epochs if name in e["tables"])
               for name in names}
    print(f"{len(epochs)} epochs after the first; incremental {sum(e['incremental_seconds'] for e in epochs):.1f} s")
    for epoch in epochs:
        slow = {name: t for name, t in epoch["tables"].items()
                if t["incremental_seconds"] >= max(args.over, args.times * medians[name])}
        copying = sum(t.get("copying_seconds") or 0.0 for t in epoch["tables"].values())
        print(f"epoch {epoch['index']}: {epoch['incremental_seconds']:.1f} s (recompute "
              f"{epoch.get('recompute_seconds') or 0:.1f} s), copies {epoch.get('copies') or {}}, "
              f"steps making copies {copying:.1f} s"
              + (f", machine {epoch['incremental_machine']}" if epoch.get("incremental_machine") else ""))
        for name, table in sorted(slow.items(), key=lambda item: -item[1]["incremental_seconds"]):
            given_up = table.get("gave_up")
            print(f"  {name} {table['incremental_seconds']:.1f} s (median {medians[name]:.1f} s) "
                  f"{table['technique']} {table['reason'].split(':')[0]} rows {table['rows_read']}: {_phases(table)}"
                  + (f"; copying {table['copying_seconds']:.1f} s" if table.get("copying_seconds") else "")
                  + (f"; gave up at {given_up['seconds']:.1f} s of {given_up['budget']:.1f} s" if given_up else ""))
    print("\nsteps given up past their budget, and the table's steps until it was incremental again:")
    for index, epoch in enumerate(epochs):
        for name, table in epoch["tables"].items():
            if not table.get("gave_up"):
                continue
            spent, until = 0.0, index
            for later in epochs[index:]:
                step = later["tables"].get(name) or {}
                if later is not epoch and step.get("technique") == "incremental":
                    break
                spent += step.get("incremental_seconds", 0.0)
                until = later["index"]
            print(f"  {name} in epoch {epoch['index']}: {table['gave_up']} ; epochs {epoch['index']}-{until} "
                  f"cost {spent:.1f} s against {medians[name] * (until - epoch['index'] + 1):.1f} s at its median")


if __name__ == "__main__":
    main()
