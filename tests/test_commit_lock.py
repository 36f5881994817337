"""The commit lock of a local Delta table (epochal/storage/commit_lock.py; docs/architecture.md,
section 3): it excludes other processes and other threads, is reentrant within a thread, takes
nothing on a remote path, and its file is invisible to Delta-Spark and delta-rs (a table is not
made by it, reads and VACUUM leave it be). Then, with the engine's commits timed: every commit the
engine makes to a table of a local warehouse, Spark's and delta-rs's, outputs, state, arrangements,
ledgers, the remap, OPTIMIZE and VACUUM, lands while it holds that table's lock
(test_commit_race.py shows what a commit without it can do)."""

from __future__ import annotations

import glob
import multiprocessing
import os
import random
import threading
import time
from collections import defaultdict

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from epochal import Upkeep, maintenance
from epochal.storage import commit_lock as module
from epochal.storage.commit_lock import LOCK_FILE, commit_lock, local_folder
from epochal.storage.deltalog import DeltaLog
from tests.reliability import build_engine, create_sources, random_batch


def test_local_paths_and_only_they_are_locked(tmp_path):
    folder = str(tmp_path / "t")
    assert local_folder(folder) == folder
    assert local_folder(f"file://{folder}/") == local_folder(f"file:{folder}") == folder
    assert local_folder(f"file://{tmp_path}/a%20b") == str(tmp_path / "a b")
    assert local_folder("relative/t") == os.path.join(os.getcwd(), "relative", "t")
    for remote in ("s3a://bucket/t", "s3://bucket/t", "abfss://c@a.dfs.core.windows.net/t", "gs://b/t"):
        assert local_folder(remote) is None
        with commit_lock(remote):  # nothing to take, nothing made
            pass


def _hold(path: str, seconds: float, ready, done) -> None:
    with commit_lock(path):
        ready.set()
        time.sleep(seconds)
        done.value = time.time()


def test_a_held_lock_keeps_other_processes_and_threads_waiting_and_its_holder_reenters(tmp_path):
    path = str(tmp_path / "t")
    context = multiprocessing.get_context("spawn")
    ready, released = context.Event(), context.Value("d", 0.0)
    holder = context.Process(target=_hold, args=(path, 1.0, ready, released))
    holder.start()
    try:
        assert ready.wait(60), "the other process did not take the lock"
        with commit_lock(path):
            assert released.value > 0, "the lock was taken while another process held it"
            taken = []
            other = threading.Thread(target=lambda: _taken_in(path, taken))
            other.start()
            with commit_lock(path):  # reentrant in this thread
                time.sleep(0.3)
            assert not taken, "another thread took the lock while this one held it"
            released_here = time.time()
        other.join(10)
        assert taken and taken[0] >= released_here
    finally:
        holder.join(30)
    assert os.path.exists(os.path.join(path, "_delta_log", LOCK_FILE))


def _taken_in(path: str, taken: list) -> None:
    with commit_lock(path):
        taken.append(time.time())


def test_the_lock_file_is_invisible_to_delta_spark_and_delta_rs(spark, tmp_path):
    """Taken before the table exists, it makes no table; the table written after reads alike
    through both, and VACUUM of either, retaining nothing, keeps it."""
    for writer in ("spark", "delta-rs"):
        path = str(tmp_path / writer)
        with commit_lock(path):
            assert DeltaLog.open(path) is None
            if writer == "spark":
                spark.range(3).write.format("delta").save(path)
                spark.range(3, 5).write.format("delta").mode("overwrite").save(path)
            else:
                write_deltalake(path, pa.table({"id": pa.array([0, 1, 2], pa.int64())}))
                write_deltalake(path, pa.table({"id": pa.array([3, 4], pa.int64())}), mode="overwrite")
        with commit_lock(path):
            if writer == "spark":
                with maintenance.session_confs(spark, {maintenance.RETENTION_CHECK: "false"}):
                    spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
            else:
                DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        assert os.path.exists(os.path.join(path, "_delta_log", LOCK_FILE)), writer
        assert sorted(r["id"] for r in spark.read.format("delta").load(path).collect()) == [3, 4], writer
        assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [3, 4], writer
        current = {os.path.basename(uri) for uri in DeltaTable(path).file_uris()}
        assert {os.path.basename(f) for f in glob.glob(f"{path}/*.parquet")} == current, writer  # VACUUM ran
        assert [c.operation for c in DeltaLog.open(path).commits(0)][:2] == ["WRITE", "WRITE"], writer


@pytest.mark.long  # make test-long: several engines' epochs and the maintenance after
def test_every_commit_the_engine_makes_to_a_local_table_holds_its_lock(spark, tmp_path, monkeypatch):
    """Epochs through Spark and delta-rs, state compactions, arrangements built and appended,
    OPTIMIZE and VACUUM of every kind of table: each commit's timestamp (taken by its writer when
    it commits) lies within a time this process held that table's lock."""
    held = defaultdict(list)  # folder -> [(taken, released)]
    taken: dict[int, tuple[str, float]] = {}
    flock, unflock = module._flock, module._unflock

    def timed_flock(folder: str) -> int:
        fd = flock(folder)
        taken[fd] = (folder, time.time())
        return fd

    def timed_unflock(fd: int) -> None:
        folder, since = taken.pop(fd)
        held[folder].append((since, time.time()))
        unflock(fd)

    monkeypatch.setattr(module, "_flock", timed_flock)
    monkeypatch.setattr(module, "_unflock", timed_unflock)
    upkeep = Upkeep(compact_after=2, compact_fraction=0.0, rebuild_appends=2, rebuild_rows=0)
    roots = []
    for name, options in (("spark", {"driver_rows": 0}), ("mixed", {"driver_rows": 4, "arrange_rows": 0})):
        root = str(tmp_path / name)
        roots.append(root)
        create_sources(root)
        engine = build_engine(spark, root, upkeep=upkeep, **options)
        rng = random.Random(name)
        for _ in range(4):
            engine.refresh()
            random_batch(root, rng, commits=3)
        engine.refresh()
        for target in maintenance.targets(root, bookkeeping=True, arrangements=True, spark=spark):
            if target.kind != "arrangement":
                maintenance.optimize(spark, target)
            maintenance.vacuum(spark, target, 0, allow_short_retention=True)
    unlocked, kinds = [], set()
    for root in roots:
        for folder, subfolders, _ in os.walk(root):
            if "_delta_log" not in subfolders or folder.startswith(f"{root}/sources"):
                continue
            spans = held.get(os.path.normpath(folder), [])
            for commit in DeltaLog(folder).commits(0):
                kinds.add(commit.operation)
                at = commit.timestamp_ms / 1000
                if not any(since - 0.002 <= at <= until + 0.002 for since, until in spans):
                    unlocked.append(f"{os.path.relpath(folder, root)} version {commit.version} ({commit.operation})")
    assert not [f for f in held if "/sources/" in f + "/"], "the engine locked a source: it never writes one"
    assert not unlocked, "commits made without the table's lock:\n" + "\n".join(unlocked)
    for operation in ("WRITE", "MERGE", "OPTIMIZE", "VACUUM END"):
        assert operation in kinds, f"no {operation} commit: the test no longer covers it ({sorted(kinds)})"
