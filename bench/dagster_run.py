"""One hourly partition of every derived asset, materialized as its schedule launches it (a process
of its own running the `derived_hourly` job for that partition), beside the same run with
`full_refresh` for every asset (each recomputed from its SQL). Wall seconds of both, each split into
the process and code location start, the Spark session, defining the tables, the engine's refresh,
the checks, the metadata, and Dagster's own time around and between the steps.

    python -m bench.dagster_run --scale 1 [--batches 2] [--fraction 0.001] [--work /tmp/epochal-bench]

The warehouse is prepared once per scale and batch count (kept under the work folder): the demo
(`ops.demo`) loads TPC-H stamped `batches + 1` hours before the current hour, applies and
materializes `batches` hourly batches, then one more batch is applied and observed, so its
partition is closed and not yet materialized. Each side runs on a copy of it (sources, tables,
engine state and the Dagster instance), so both apply the same epoch over the same state. The
split comes from the run's event log (each asset logs its seconds by phase, assets/derived.py's
SECONDS_LINE). Writes bench/results/<timestamp>-<commit>-dagster/report.md and results.json.

Dagster and the code location are imported where they are used, as in bench/__main__.py: importing
`definitions` builds the definitions of the default warehouse, and the preparing process must set
DAGSTER_HOME first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.results_folder import results_folder

REPOSITORY = Path(__file__).resolve().parent.parent
HOUR = timedelta(hours=1)
SIDES = ("incremental", "full refresh")


def prepare(root: Path, scale: float, batches: int, fraction: float, seed: int) -> None:
    """The warehouse at `root` with `batches` batches materialized and one more applied (run in a
    process of its own: its Spark session ends with it)."""
    from dagster import DagsterInstance

    from assets.automation import derived_job_name
    from definitions import build_definitions
    from ops import demo
    from ops.jobs import clock_start
    from resources.spark import SparkResource
    from resources.warehouse import WarehouseResource

    home = root / ".dagster"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    instance = DagsterInstance.get()
    start = clock_start(batches + 1)
    resources = {"warehouse": WarehouseResource(root=str(root)),
                 "spark": SparkResource(log_file=str(root / "logs" / "spark.log"))}
    defs = build_definitions(**resources)
    defs.resolve_job_def("load_tpch").execute_in_process(run_config={**demo.SILENT_LOGS, "ops": {"load_tpch_sources": {
        "config": {"scale": scale, "logical_time": start.isoformat()}}}}, instance=instance)
    if demo.run(demo.parse_args(["--warehouse", str(root), "--scale", str(scale), "--batches", str(batches),
                                 "--fraction", str(fraction), "--seed", str(seed)])) != 0:
        raise SystemExit(f"the demo over {root} failed: see its output above")
    defs.resolve_job_def("apply_changes").execute_in_process(run_config={**demo.QUIET_LOGS, "ops": {
        "apply_change_batches": {"config": {"batches": 1, "fraction": fraction, "seed": seed}}}}, instance=instance)
    defs.resolve_job_def("observe_sources").execute_in_process(run_config=demo.QUIET_LOGS, instance=instance)
    job = build_definitions(**resources).resolve_job_def(derived_job_name("hourly"))
    names = sorted(key.to_user_string() for key in job.asset_layer.executable_asset_keys)
    (root / "bench.json").write_text(json.dumps({"partition": demo.partition_key(start + batches * HOUR),
                                                 "assets": names}))


def launch(root: Path, partition: str, assets: list[str], full_refresh: bool, log: Path) -> tuple[float, float]:
    """Run the hourly job for `partition` over the warehouse at `root` in a new process, as the
    schedule does; returns (when it was launched, its wall seconds)."""
    from assets.automation import derived_job_name

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update({"EPOCHAL_WAREHOUSE": str(root), "DAGSTER_HOME": str(root / ".dagster"),
                "PYTHONPATH": str(REPOSITORY)})
    command = [str(Path(sys.executable).parent / "dagster"), "job", "execute", "-m", "definitions",
               "-j", derived_job_name("hourly"), "--tags", json.dumps({"dagster/partition": partition})]
    if full_refresh:
        config = root / "full_refresh.json"
        config.write_text(json.dumps({"ops": {name: {"config": {"full_refresh": True}} for name in assets}}))
        command += ["-c", str(config)]
    launched = time.time()
    began = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=REPOSITORY, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"the {'full refresh' if full_refresh else 'incremental'} run failed "
                         f"({done.returncode}); see {log}")
    return launched, seconds


PHASE = re.compile(r"^(\S+): seconds by phase: (.*)$")


def split(root: Path, launched: float, wall: float) -> dict:
    """The run's wall seconds by part, from its event log."""
    from dagster import DagsterEventType, DagsterInstance

    from assets.derived import SECONDS_LINE

    named = {DagsterEventType.RUN_START: "RUN_START", DagsterEventType.RUN_SUCCESS: "RUN_SUCCESS",
             DagsterEventType.STEP_START: "STEP_START", DagsterEventType.STEP_SUCCESS: "STEP_SUCCESS"}

    instance = DagsterInstance.from_config(str(root / ".dagster"))
    [run] = instance.get_runs(limit=1)
    events = instance.all_logs(run.run_id)
    stamp = {}
    steps: dict[str, list[float]] = {}
    phases: Counter = Counter()
    per_asset: dict[str, dict] = {}
    for event in events:
        kind = named.get(event.dagster_event_type, "other") if event.dagster_event else None
        if kind in ("RUN_START", "RUN_SUCCESS") and kind not in stamp:
            stamp[kind] = event.timestamp
        elif kind in ("STEP_START", "STEP_SUCCESS"):
            steps.setdefault(event.step_key, []).append(event.timestamp)
        elif kind is None and SECONDS_LINE in (event.user_message or ""):
            found = PHASE.match(event.user_message)
            if found:
                each = {name: float(value) for name, value in
                        (part.rsplit(" ", 1) for part in found.group(2).split(", "))}
                per_asset[found.group(1)] = each
                phases.update(each)
    in_steps = sum(max(times) - min(times) for times in steps.values() if len(times) == 2)
    running = stamp["RUN_SUCCESS"] - stamp["RUN_START"]
    parts = {"process start and code location load": stamp["RUN_START"] - launched,
             **{name: phases[name] for name in ("session", "define", "refresh", "row checks", "metadata",
                                                 "table checks") if name in phases},
             "Dagster within the steps": in_steps - sum(phases.values()),
             "Dagster between the steps": running - in_steps,
             "process end": launched + wall - stamp["RUN_SUCCESS"]}
    return dict(run_id=run.run_id, wall_seconds=round(wall, 2), parts={k: round(v, 2) for k, v in parts.items()},
                steps=len(steps), assets=per_asset)


def report(scale: float, batches: int, partition: str, results: dict) -> str:
    incremental, full = (results[side] for side in SIDES)
    lines = [f"# Dagster run of one hourly partition, scale {scale:g}", "",
             f"**The hourly job over partition {partition} ({incremental['steps']} assets): incremental "
             f"{incremental['wall_seconds']:.1f} s, every asset with full_refresh {full['wall_seconds']:.1f} s: "
             f"{full['wall_seconds'] / incremental['wall_seconds']:.2f}x** (each a process of its own, "
             f"`dagster job execute`, as the schedule launches it; the warehouse held {batches} materialized "
             "partitions before it).", "",
             "| part | incremental s | full refresh s |", "|---|---:|---:|"]
    for part in incremental["parts"]:
        lines.append(f"| {part} | {incremental['parts'][part]:.2f} | {full['parts'].get(part, 0.0):.2f} |")
    lines += [f"| whole run (wall) | {incremental['wall_seconds']:.2f} | {full['wall_seconds']:.2f} |", "",
              "Per asset, the refresh and everything else it spent (seconds):", "",
              "| asset | incremental refresh | incremental other | full refresh refresh | full refresh other |",
              "|---|---:|---:|---:|---:|"]
    for name in sorted(incremental["assets"]):
        a, b = incremental["assets"][name], full["assets"].get(name, {})
        lines.append(f"| {name} | {a.get('refresh', 0):.2f} | {sum(a.values()) - a.get('refresh', 0):.2f} | "
                     f"{b.get('refresh', 0):.2f} | {sum(b.values()) - b.get('refresh', 0):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=2, help="partitions materialized before the measured one")
    parser.add_argument("--fraction", type=float, default=0.001, help="share of orders changed per batch")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work", default=os.environ.get("EPOCHAL_BENCH_WORK", "/tmp/epochal-bench"))
    parser.add_argument("--prepare", help=argparse.SUPPRESS)  # the preparing process's own entry
    arguments = parser.parse_args(argv)
    if arguments.prepare:
        prepare(Path(arguments.prepare), arguments.scale, arguments.batches, arguments.fraction, arguments.seed)
        return
    base = Path(arguments.work) / f"dagster-{arguments.scale:g}-{arguments.batches}-{arguments.fraction:g}"
    if not (base / "bench.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        print(f"preparing {base} (the demo at scale {arguments.scale:g}, {arguments.batches} partitions, then "
              "one more batch)", flush=True)
        subprocess.run([sys.executable, "-m", "bench.dagster_run", "--prepare", str(base), "--scale",
                        str(arguments.scale), "--batches", str(arguments.batches), "--fraction",
                        str(arguments.fraction), "--seed", str(arguments.seed)], cwd=REPOSITORY, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPOSITORY)})
    prepared = json.loads((base / "bench.json").read_text())
    out = results_folder("dagster")
    results = {}
    for side in SIDES:
        copy = Path(arguments.work) / f"dagster-run-{side.replace(' ', '-')}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(base, copy, ignore=shutil.ignore_patterns("logs"))
        launched, wall = launch(copy, prepared["partition"], prepared["assets"], side == "full refresh",
                                out / f"{side.replace(' ', '-')}.log")
        results[side] = split(copy, launched, wall)
        print(f"{side}: {wall:.1f} s " + json.dumps(results[side]["parts"]), flush=True)
        shutil.rmtree(copy, ignore_errors=True)
    text = report(arguments.scale, arguments.batches, prepared["partition"], results)
    (out / "results.json").write_text(json.dumps(dict(arguments=vars(arguments), partition=prepared["partition"],
                                                      results=results), indent=1))
    (out / "report.md").write_text(text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
