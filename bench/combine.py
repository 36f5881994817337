"""One report from a benchmark run in parts: `make bench` runs over disjoint sets of queries, each in
its own process and warehouse, with the same scale, fractions, epochs and change stream, merged as
if one run had measured every query.

Where all 22 queries at scale 10 do not fit in one sitting (a day there is 25 epochs, each beside a
recompute of every table), each part runs some of them; the same seed and the same cached TPC-H load
give every part the same change batches (checked: the report says so, per epoch, and refuses parts
that differ). Per epoch the parts' whole incremental epochs are added up, and so are their
recomputes, the first epochs and the daily maintenance; the driver's peak is the highest part's.
The sum leans against the incremental side: each part pays the epoch's fixed costs (reading the
change batches, the epoch's bookkeeping) again, where one run would pay them once. The noop,
unread-columns and floor figures are per part and left out.

    python -m bench.combine bench/results/<part 1> bench/results/<part 2>
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from bench.__main__ import report_markdown, write_report
from bench.results_folder import results_folder


def _total(values):
    values = list(values)
    return None if any(v is None for v in values) else round(sum(values), 3)


def _highest(processes: list[dict | None]) -> dict:
    """Per process (python, jvm), the highest of several peaks."""
    merged: dict = {}
    for each in filter(None, processes):
        for process, value in each.items():
            if value is not None:
                merged[process] = max(value, merged.get(process, value))
    return merged


def _highest_peaks(peaks: list[dict | None]) -> dict:
    """Per phase and process, the highest of the parts' peaks."""
    phases = {phase for each in filter(None, peaks) for phase in each}
    return {phase: _highest([(each or {}).get(phase) for each in peaks]) for phase in sorted(phases)}


def merge_epochs(epochs: list[dict]) -> dict:
    """The same epoch of every part as one: seconds added up, tables side by side."""
    changes = [e["source_changes"] for e in epochs]
    if any(c != changes[0] for c in changes):
        raise SystemExit(f"bench.combine: epoch {epochs[0]['index']}'s change batches differ between the parts "
                         "(not one change stream: same scale, fraction, seed and source writer?)")
    tables: dict = {}
    for epoch in epochs:
        overlap = tables.keys() & epoch["tables"].keys()
        if overlap:
            raise SystemExit(f"bench.combine: {sorted(overlap)} measured by more than one part")
        tables |= epoch["tables"]
    return dict(index=epochs[0]["index"], floor_seconds=None, floor_driver_seconds=None,
                incremental_seconds=_total(e["incremental_seconds"] for e in epochs),
                recompute_seconds=_total(e["recompute_seconds"] for e in epochs),
                noop_seconds=None, unread_columns={}, source_changes=changes[0],
                arranged=[a for e in epochs for a in e.get("arranged", [])],
                arranged_reads=[a for e in epochs for a in e.get("arranged_reads", [])],
                copies={},
                peak_gigabytes=_highest_peaks([e.get("peak_gigabytes") for e in epochs]),
                tables=tables)


def merge_runs(runs: list[dict]) -> dict:
    """The same (scale, fraction) run of every part as one."""
    first = runs[0]
    for run in runs[1:]:
        if (run["scale"], run["fraction"], len(run["epochs"])) != (first["scale"], first["fraction"], len(first["epochs"])):
            raise SystemExit("bench.combine: the parts differ in scale, fraction or epochs")
    daily = [r.get("daily") for r in runs]
    return dict(scale=first["scale"], fraction=first["fraction"],
                first_epoch_seconds=_total(r["first_epoch_seconds"] for r in runs),
                first_recompute_seconds=_total(r.get("first_recompute_seconds") for r in runs),
                daily=None if None in daily else {key: _total(d[key] for d in daily) for key in daily[0]},
                peak_gigabytes=_highest_peaks([r.get("peak_gigabytes") for r in runs]),
                epochs=[merge_epochs(list(same)) for same in zip(*(r["epochs"] for r in runs))])


def combine(parts: list[dict]) -> tuple[SimpleNamespace, list[dict], list[dict]]:
    """The parts' arguments (queries joined), runs and sweeps, each merged across the parts."""
    if len({len(p["runs"]) for p in parts}) > 1 or len({len(p["sweep"]) for p in parts}) > 1:
        raise SystemExit("bench.combine: the parts ran different scales or fractions")
    arguments = SimpleNamespace(**parts[0]["arguments"])
    arguments.queries = sorted({q for p in parts for q in p["arguments"]["queries"]})
    arguments.sweep_queries = sorted({q for p in parts for q in p["arguments"].get("sweep_queries", [])})
    runs = [merge_runs(list(same)) for same in zip(*(p["runs"] for p in parts))]
    sweep = [merge_runs(list(same)) for same in zip(*(p["sweep"] for p in parts))]
    return arguments, runs, sweep


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.combine", description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", help="results folders (bench/results/<timestamp>) of the parts")
    arguments = parser.parse_args(argv)
    folders = [Path(p) for p in arguments.parts]
    parts = [json.loads((folder / "results.json").read_text()) for folder in folders]
    merged, runs, sweep = combine(parts)
    out = results_folder("combined")
    started = out.name
    (out / "results.json").write_text(json.dumps(dict(arguments=vars(merged), runs=runs, sweep=sweep,
                                                      parts=[str(f) for f in folders]), indent=1))
    text = report_markdown(merged, runs, sweep, started)
    head, _, rest = text.partition("\n\n")
    parts_line = ("Combined from parts run one after another, each in its own process and warehouse over the "
                  "same change batches (checked per epoch): " + "; ".join(
                      f"{folder.name} (queries {', '.join(map(str, part['arguments']['queries']))})"
                      for folder, part in zip(folders, parts))
                  + ". Per epoch the parts' seconds are added up (each part pays the epoch's fixed costs); "
                  "noop, unread-columns and floor figures are per part and left out.")
    write_report(out, f"{head}\n\n{parts_line}\n\n{rest}", runs, sweep)


if __name__ == "__main__":
    main()
