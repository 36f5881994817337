"""A second process for the reliability tests (crash matrix, concurrency): it builds its own Spark
session, its own engine over a warehouse the test names, and runs what the test sends it.

The test talks to it with one JSON command per line on stdin; it answers one JSON line per command
on stdout, prefixed with MARK (the JVM may print to the same stream). A command names the
warehouse, its sources and definitions, the refresh to run, optionally a wall-clock time to start
it at (so two processes start at once) and a kill point (EPOCHAL_KILL_AT): the process then kills
itself with SIGKILL there, and the test kills the rest of its process group (the driver JVM), as
when the machine dies.

    child = Child.start(jars)            # the parent's resolved Delta JARs: no Ivy resolution
    child.send({"root": ..., "sources": ["a", "b"], "definitions": {...}, "until": iso, "at": t})
    answer = child.answer()              # {"reports": [...]} or {"error": type, "message": text}

A command with "appends" (a table's path) instead commits one row at a time to that table from
"at" until "until" (`append_until`), through Spark or delta-rs ("by"), and answers {"appends":
[outcome, ...]}.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path

MARK = "@@epochal "
REPO = Path(__file__).resolve().parent.parent
CHILD_MEMORY = os.environ.get("EPOCHAL_CHILD_MEMORY", "768m")


# ---- the child's side ----------------------------------------------------------------------------
def _say(message: dict) -> None:
    sys.stdout.write(MARK + json.dumps(message, default=str) + "\n")
    sys.stdout.flush()


def _refresh(spark, command: dict) -> dict:
    from epochal import Engine, Upkeep, faults

    from epochal.protocol import cost

    for name, value in (command.get("cost") or {}).items():  # the cost model's constants, as a test sets them
        setattr(cost, name, value)
    options = dict(command.get("options") or {})  # JSON: the upkeep as its fields
    if "upkeep" in options:
        options["upkeep"] = Upkeep(**options["upkeep"])
    engine = Engine(spark, command["root"], parallelism=command.get("parallelism", 2),
                    **{"cost_model": False, **options})
    for name in command.get("sources", []):
        engine.source(name, clock=command.get("clock", "commit"))
    engine.define_all(command["definitions"])
    if command.get("at"):
        time.sleep(max(0.0, command["at"] - time.time()))
    if command.get("kill_at"):
        os.environ[faults.KILL_AT] = command["kill_at"]
    until = datetime.fromisoformat(command["until"]) if command.get("until") else None
    started = time.time()
    try:
        reports = engine.refresh(command.get("tables"), until=until)
    except Exception as error:  # noqa: BLE001 - the test judges the message
        traceback.print_exc()  # into the child's log
        return {"error": type(error).__name__, "message": str(error), "started": started}
    finally:
        os.environ.pop(faults.KILL_AT, None)
    return {"reports": [r.as_dict() for r in reports], "started": started}


# ---- one row a commit, through the engine's write paths (tests/test_commit_race.py) ---------------
RACE_COLUMNS = ["writer", "n"]


def commit_row(spark, path: str, by: str, writer: str, n: int) -> None:
    """Append the row (writer, n) to the Delta table at `path` as the engine appends: through Spark
    (protocol/writes.apply_multiset, an epoch's output append) or delta-rs (storage/commits.append,
    the driver's), with the idempotent-write identity (race/<writer>, n) and the commit tagged
    {"race": writer, "n": n}."""
    import pyarrow as pa

    from epochal.protocol.writes import apply_multiset, write_identity
    from epochal.protocol.writes import writer as delta_writer
    from epochal.storage import commits

    app, tag = f"race/{writer}", json.dumps({"race": writer, "n": n})
    if by == "spark":
        frame = spark.createDataFrame([(writer, n, "insert")], f"writer string, n long, {commits.OP} string")
        apply_multiset(spark, path, frame, RACE_COLUMNS, write_identity(spark, app, n, tag),
                       lambda rows: delta_writer(rows, app, n, tag), has_deletes=False)
    elif by == "delta-rs":
        table = commits.open_unwritten(path, app, n)
        if table is not None:
            commits.append(table, pa.table({"writer": [writer], "n": pa.array([n], pa.int64())}), app, n, tag)
    else:
        raise ValueError(by)


def append_until(spark, path: str, by: str, writer: str, at: float, until: float, pause: float = 0.0,
                 threads: int = 1) -> dict[str, list[dict]]:
    """`commit_row` in a loop from wall-clock time `at` to `until` in each of `threads` threads,
    writers <writer>0, <writer>1, ..., n = 1, 2, ... each. Per writer, each commit's outcome:
    {"n", "ok"} and, where it raised, "error"."""
    outcomes = {f"{writer}{i}": [] for i in range(threads)}

    def loop(name: str) -> None:
        time.sleep(max(0.0, at - time.time()))
        n = 0
        while time.time() < until:
            n += 1
            try:
                commit_row(spark, path, by, name, n)
                outcomes[name].append({"n": n, "ok": True})
            except Exception as error:  # noqa: BLE001 - the test judges it
                outcomes[name].append({"n": n, "ok": False, "error": f"{type(error).__name__}: {str(error)[:500]}"})
            time.sleep(pause)

    workers = [threading.Thread(target=loop, args=(name,), daemon=True) for name in outcomes]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return outcomes


def main() -> None:
    from resources.session import SparkSettings, delta_spark_session

    jars = os.environ.get("EPOCHAL_CHILD_JARS")
    # A short-lived driver: C1-compiled code only and the serial collector (measured about twice
    # as fast over a JVM start and two small epochs as the default tiered JIT), with the code cache
    # C1 alone would shrink to 48 MB kept at its default size (see tests.support.TEST_JAVA_OPTIONS).
    extra = {"spark.driver.extraJavaOptions":
             "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"}
    if jars:  # the parent's resolved JARs: no Ivy resolution at start
        extra.update({"spark.jars.packages": "", "spark.jars": jars})
    spark = delta_spark_session(SparkSettings(master="local[2]", shuffle_partitions=1, ui=False,
                                              driver_memory=CHILD_MEMORY, extra_conf=extra))
    _say({"ready": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("quit"):
            break
        if command.get("appends"):
            _say({"appends": append_until(spark, command["appends"], command["by"], command["writer"],
                                          command["at"], command["until"], command.get("pause", 0.0),
                                          command.get("threads", 1))})
            continue
        _say(_refresh(spark, command))
    spark.stop()


# ---- the test's side -----------------------------------------------------------------------------
class Child:
    """A running worker process (in its own process group, with its JVM)."""

    def __init__(self, process: subprocess.Popen, log: Path):
        self.process = process
        self.log = log
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    @staticmethod
    def start(jars: str | None, log: Path, spark_conf: dict[str, str] | None = None) -> "Child":
        """`spark_conf`: further Spark settings of the child's session (added to EPOCHAL_SPARK_CONF)."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        env.pop("EPOCHAL_KILL_AT", None)
        if spark_conf:
            env["EPOCHAL_SPARK_CONF"] = ";".join(filter(None, [env.get("EPOCHAL_SPARK_CONF", ""), *(
                f"{key}={value}" for key, value in spark_conf.items())]))
        if jars:
            env["EPOCHAL_CHILD_JARS"] = jars
        with open(log, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.worker"], cwd=str(REPO), env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, text=True,
            )
        return Child(process, log)

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.startswith(MARK):
                self.lines.put(json.loads(line[len(MARK):]))
        self.lines.put(None)  # end of output: the process is gone

    def _next(self, timeout: float) -> dict | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"worker {self.process.pid} said nothing for {timeout:.0f}s; log {self.log}:\n"
                               + self.tail()) from None

    def ready(self, timeout: float = 300) -> None:
        """Wait until the child's Spark session is up (once; later calls return at once)."""
        if getattr(self, "_ready", False):
            return
        message = self._next(timeout)
        if message is None or "ready" not in message:
            raise RuntimeError(f"worker {self.process.pid} did not start ({message}); log {self.log}:\n{self.tail()}")
        self._ready = True

    def send(self, command: dict) -> None:
        self.process.stdin.write(json.dumps(command, default=str) + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float = 300) -> dict | None:
        """The next answer, or None when the process ended without one (it was killed)."""
        return self._next(timeout)

    def killed(self, timeout: float = 300) -> int:
        """Wait for the process to end; kill what is left of its group (its JVM); its exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            self.kill_group()
        return code

    def kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 30
        while time.time() < deadline and _group_alive(self.process.pid):
            time.sleep(0.1)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send({"quit": True})
                self.process.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill_group()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def parent_jars(spark) -> str | None:
    """The Delta JARs the parent's session resolved, so children skip Ivy resolution."""
    return spark.sparkContext.getConf().get("spark.jars", None) or None


if __name__ == "__main__":
    main()
