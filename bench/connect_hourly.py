"""An hourly run of the demo's assets, as the schedule launches it (a process of its own: the code
location loaded, the Spark session made, the partition materialized), through a long-lived Spark
Connect server against a local session started in the run. Wall seconds of each.

    python -m bench.connect_hourly --warehouse /path/demo --remote sc://127.0.0.1:15002 \\
        --partition 2026-11-28-04:00 --select tpch_q10,returns_by_nation

The warehouse is copied once per side (sources, tables, engine state and the Dagster instance),
so both runs apply the same epoch over the same state; the server must already be running (and
warm: it is long-lived). Prints one line per side and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def run(warehouse: str, partition: str, select: str, remote: str | None, log: Path) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")}
    env.update({"EPOCHAL_WAREHOUSE": warehouse, "DAGSTER_HOME": os.path.join(warehouse, ".dagster"),
                "PYTHONPATH": str(REPOSITORY)})
    if remote:
        env["SPARK_REMOTE"] = remote
    command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-m", "definitions",
               "--select", select, "--partition", partition]
    began = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=REPOSITORY, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}); see {log}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warehouse", required=True, help="a demo warehouse whose partition is not applied yet")
    parser.add_argument("--remote", required=True, help="the Connect server, sc://host:port")
    parser.add_argument("--partition", required=True)
    parser.add_argument("--select", default="*")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="epochal-connect-hourly-"))
    results = {}
    for side, remote in (("connect", args.remote), ("local", None)):
        copy = work / side
        shutil.copytree(args.warehouse, copy, ignore=shutil.ignore_patterns("logs"))
        results[side] = run(str(copy), args.partition, args.select, remote, work / f"{side}.log")
        print(f"{side:8s} {results[side]:7.1f} s  (log {work / f'{side}.log'})", flush=True)
    print(f"connect / local: {results['connect'] / results['local']:.2f}")


if __name__ == "__main__":
    main()
