"""`make bench`: incremental epochs against full recompute on TPC-H, in one Spark session.

For each scale factor: TPC-H is loaded (once per scale, cached under the bench folder), the chosen
queries (assets/sql/tpch_qNN.sql) are defined and built by a first epoch, then each epoch applies
one hourly change batch and, per table in dependency order and interleaved so machine drift hits
both sides alike, measures:

- the incremental epoch (`Engine.refresh` of that table alone: wall seconds with its Delta writes,
  rows read and written, technique);
- a full recompute-and-overwrite of the same SQL over the same source versions into a scratch Delta
  table;
- a noop epoch (no source changed since);
- the floor once per epoch: reading the epoch's change batches of every source plus one empty Delta
  commit.

A sweep over change fractions (one epoch each, on the first scale) shows where recompute wins.
Writes bench/results/<timestamp>/report.md, results.json and chart.png and prints the summary.

    make bench ARGS="--scales 0.01 0.1 --epochs 3 --fraction 0.001 --queries 1 3 5"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
RESULTS = Path(__file__).resolve().parent / "results"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--fraction", type=float, default=0.001, help="change fraction of orders per epoch")
    parser.add_argument("--same-change-rows", action="store_true",
                        help="scale the fraction down on larger scales so every scale changes as many rows per "
                             "epoch as the first (the scaling target)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--queries", type=int, nargs="+", default=list(range(1, 23)))
    parser.add_argument("--sweep", type=float, nargs="*", default=[0.0001, 0.001, 0.01, 0.1],
                        help="change fractions for the sweep (empty: no sweep)")
    parser.add_argument("--sweep-queries", type=int, nargs="+", default=[1, 3, 5, 10, 18])
    parser.add_argument("--work", default=os.environ.get("EPOCHAL_BENCH_WORK", "/tmp/epochal-bench"),
                        help="scratch folder: cached TPC-H loads and the warehouses")
    parser.add_argument("--driver-memory", default="12g")
    return parser.parse_args(argv)


def _session(memory: str):
    from resources.session import SparkSettings, delta_spark_session

    return delta_spark_session(SparkSettings(driver_memory=memory, shuffle_partitions=4, ui=False))


def _warehouse(spark, work: Path, scale: float, name: str) -> str:
    """A fresh warehouse holding TPC-H at `scale` (the load is cached per scale)."""
    from ops.tpch import load_tpch

    base = work / f"tpch-{scale:g}"
    if not (base / "sources" / "lineitem" / "_delta_log").exists():
        shutil.rmtree(base, ignore_errors=True)
        load_tpch(spark, str(base), scale, LOADED_AT)
    root = work / name
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base / "sources", root / "sources")
    return str(root)


def _engine(spark, root: str, queries: list[str]):
    from epochal import Engine

    engine = Engine(spark, root)
    for source in SOURCES:
        engine.source(source, clock="logical")
    engine.define_all({q: (SQL / f"{q}.sql").read_text() for q in queries})
    return engine


def _timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def _floor(spark, root: str, before: dict[str, int]) -> float:
    """Reading every source's change batch since `before` plus one empty Delta commit."""
    from delta.tables import DeltaTable

    def work():
        for source, version in before.items():
            path = f"{root}/sources/{source}"
            latest = DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]
            if latest > version:
                (spark.read.format("delta").option("readChangeFeed", "true")
                 .option("startingVersion", version + 1).option("endingVersion", latest).load(path).count())
        spark.range(0).write.format("delta").mode("append").save(f"{root}/_floor")

    return _timed(work)[0]


def _versions(spark, root: str) -> dict[str, int]:
    from delta.tables import DeltaTable

    return {s: DeltaTable.forPath(spark, f"{root}/sources/{s}").history(1).collect()[0]["version"] for s in SOURCES}


def _recompute_seconds(engine, name: str, root: str) -> float:
    frame = engine.recompute(name)
    return _timed(lambda: frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                  .save(f"{root}/_recompute/{name}"))[0]


def _epoch(engine, spark, root: str, generator, index: int, queries: list[str]) -> dict:
    """One change batch, then per table: incremental, recompute, noop; and the floor."""
    before = _versions(spark, root)
    batch = generator.apply_batch(index, LOADED_AT + timedelta(hours=index - 1, minutes=30))
    until = LOADED_AT + timedelta(hours=index)
    floor = _floor(spark, root, before)
    tables = {}
    for name in engine.tables():
        if name not in queries:
            continue
        seconds, reports = _timed(lambda n=name: engine.refresh([n], until=until, upstream=False))
        report = reports[0]
        full = _recompute_seconds(engine, name, root)
        noop_seconds, noop = _timed(lambda n=name: engine.refresh([n], until=until, upstream=False))
        tables[name] = dict(
            technique=report.technique, reason=report.reason, incremental_seconds=round(seconds, 3),
            recompute_seconds=round(full, 3), noop_seconds=round(noop_seconds, 3), noop_technique=noop[0].technique,
            rows_read=report.rows_read, rows_inserted=report.rows_inserted, rows_deleted=report.rows_deleted,
            phases=report.detail.get("phases", {}),
        )
    changed = {t: batch.counts(t) for t in SOURCES}
    return dict(index=index, floor_seconds=round(floor, 3), source_changes=changed, tables=tables)


def run_scale(spark, work: Path, scale: float, fraction: float, epochs: int, queries: list[str]) -> dict:
    from ops.changes import ChangeGenerator

    root = _warehouse(spark, work, scale, f"run-{scale:g}-{fraction:g}")
    engine = _engine(spark, root, queries)
    first, _ = _timed(lambda: engine.refresh(until=LOADED_AT + timedelta(minutes=15)))
    generator = ChangeGenerator(spark, root, seed=11, fraction=fraction)
    results = []
    for index in range(1, epochs + 1):
        results.append(_epoch(engine, spark, root, generator, index, queries))
        print(f"  scale {scale:g} fraction {fraction:g} epoch {index}: " + ", ".join(
            f"{n} {t['incremental_seconds']:.1f}s/{t['recompute_seconds']:.1f}s" for n, t in results[-1]["tables"].items()),
            flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return dict(scale=scale, fraction=fraction, first_epoch_seconds=round(first, 1), epochs=results)


def summarize(run: dict) -> list[dict]:
    """Per table: techniques, mean incremental, recompute and noop seconds, speedup."""
    rows = []
    names = sorted({n for e in run["epochs"] for n in e["tables"]})
    for name in names:
        entries = [e["tables"][name] for e in run["epochs"] if name in e["tables"]]
        incremental = [t["incremental_seconds"] for t in entries if t["technique"] == "incremental"]
        recompute = [t["recompute_seconds"] for t in entries]
        mean_incremental = statistics.mean(incremental) if incremental else None
        rows.append(dict(
            table=name, techniques="".join(t["technique"][0].upper() for t in entries),
            incremental=mean_incremental, recompute=statistics.mean(recompute),
            noop=statistics.mean(t["noop_seconds"] for t in entries),
            speedup=(statistics.mean(recompute) / mean_incremental) if mean_incremental else None,
            rows_read=statistics.mean(t["rows_read"] for t in entries),
        ))
    return rows


def _format(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_markdown(arguments, runs: list[dict], sweep: list[dict], started: str) -> str:
    lines = [f"# epochal benchmark, {started}", "",
             f"Arguments: scales {arguments.scales}, fraction {arguments.fraction}"
             f"{' (same change rows on every scale)' if getattr(arguments, 'same_change_rows', False) else ''}, "
             f"epochs {arguments.epochs}, "
             f"queries {arguments.queries}. One Spark session, local[*] on {os.cpu_count()} cores; per table and "
             "epoch the incremental epoch and a full recompute-and-overwrite run back to back.", ""]
    for run in runs:
        floors = [e["floor_seconds"] for e in run["epochs"]]
        rows = summarize(run)
        speedups = [r["speedup"] for r in rows if r["speedup"]]
        lines += [f"## Scale {run['scale']:g}, {run['fraction'] * 100:g}% of orders changed per epoch", "",
                  f"First epoch (all tables, rescan): {run['first_epoch_seconds']} s. Floor (read the change "
                  f"batches + one empty commit): mean {statistics.mean(floors):.2f} s.",
                  f"Median speedup {statistics.median(speedups):.1f}x; slower than recompute: "
                  f"{', '.join(r['table'] for r in rows if r['speedup'] and r['speedup'] < 1) or 'none'}.", "",
                  "| table | techniques | incremental s | recompute s | speedup | noop s | rows read |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['table']} | {r['techniques']} | {_format(r['incremental'])} | {_format(r['recompute'])} | "
                         f"{_format(r['speedup'], 1)} | {_format(r['noop'])} | {r['rows_read']:.0f} |")
        lines.append("")
    if sweep:
        lines += ["## Sweep over change fractions (first scale, one epoch each)", "",
                  "| fraction | table | incremental s | recompute s | speedup |", "|---:|---|---:|---:|---:|"]
        for run in sweep:
            for r in summarize(run):
                lines.append(f"| {run['fraction'] * 100:g}% | {r['table']} | {_format(r['incremental'])} | "
                             f"{_format(r['recompute'])} | {_format(r['speedup'], 1)} |")
        lines.append("")
    return "\n".join(lines)


def chart(runs: list[dict], sweep: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2 if sweep else 1, figsize=(14 if sweep else 8, 5), squeeze=False)
    left, right = axes[0][0], (axes[0][1] if sweep else None)
    for run in runs:
        rows = [r for r in summarize(run) if r["speedup"]]
        left.plot([r["table"].replace("tpch_", "") for r in rows], [r["speedup"] for r in rows], "o-",
                  label=f"scale {run['scale']:g}")
    left.axhline(1, color="grey", linewidth=0.8)
    left.set_yscale("log")
    left.set_ylabel("recompute s / incremental s")
    left.set_title("speedup per query")
    left.tick_params(axis="x", rotation=90)
    left.legend()
    if sweep:
        tables = sorted({r["table"] for run in sweep for r in summarize(run)})
        for name in tables:
            points = [(run["fraction"], r) for run in sweep for r in summarize(run) if r["table"] == name]
            right.plot([f * 100 for f, _ in points], [r["incremental"] or float("nan") for _, r in points], "o-", label=f"{name} incremental")
            right.plot([f * 100 for f, _ in points], [r["recompute"] for _, r in points], "x--", label=f"{name} recompute")
        right.set_xscale("log")
        right.set_xlabel("% of orders changed per epoch")
        right.set_ylabel("seconds")
        right.set_title("seconds vs change fraction")
        right.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None) -> None:
    arguments = _arguments(argv)
    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work = Path(arguments.work)
    work.mkdir(parents=True, exist_ok=True)
    spark = _session(arguments.driver_memory)
    out = RESULTS / started
    out.mkdir(parents=True, exist_ok=True)
    runs, sweep = [], []

    def save():
        (out / "results.json").write_text(json.dumps(dict(arguments=vars(arguments), runs=runs, sweep=sweep), indent=1))

    queries = [f"tpch_q{n:02d}" for n in arguments.queries]
    for scale in arguments.scales:
        fraction = arguments.fraction * (arguments.scales[0] / scale if arguments.same_change_rows else 1)
        runs.append(run_scale(spark, work, scale, fraction, arguments.epochs, queries))
        save()
    sweep_queries = [f"tpch_q{n:02d}" for n in arguments.sweep_queries]
    for fraction in arguments.sweep:
        sweep.append(run_scale(spark, work, arguments.scales[0], fraction, 1, sweep_queries))
        save()
    text = report_markdown(arguments, runs, sweep, started)
    (out / "report.md").write_text(text)
    chart(runs, sweep, out / "chart.png")
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
