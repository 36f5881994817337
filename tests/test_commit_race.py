"""Two processes committing to one local Delta table at the same time (docs/architecture.md,
section 3: concurrent runs). Delta-Spark commits to a file: path through HDFSLogStore, whose
"create the commit file if absent" is Hadoop's "is it there? no: rename onto it" (FileContext's
rename without overwrite on the local file system), and a local rename replaces what is there: two
processes committing the same version could both succeed, the second replacing the first's commit
(a commit lost), and the .crc renamed after it then being the other writer's (a ChecksumException
on the next read: CI's failure in test_concurrency). delta-rs renames without replacing, but a
Spark writer's check-then-rename still overwrites a delta-rs commit landing between the two.

Here a child (tests/worker.py, its own Spark session) appends through Spark, and this process
through Spark (two threads) or delta-rs, one distinct row a commit, for a few seconds, both through
the engine's own write paths (worker.commit_row). Hadoop's window between its last check and the
rename is microseconds (two processes contesting 1,347 versions through HDFSLogStore itself, in
lockstep, never both won one), so the child's file system pauses inside it (tests/java/
SlowCommitRenameFs.java): a commit of this process landing in the pause is then overwritten.
Afterwards every commit that returned is in the table once and in its history at a version of its
own (one that raised left nothing behind), and the table reads, through Spark and delta-rs.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.worker import Child, append_until, parent_jars

pytestmark = pytest.mark.long  # make test-long (CI runs it after make test)

SECONDS = 6.0  # each race's loop
ROUNDS = 4  # races at most, until each process has committed twice
WARM_UP = 6.0  # both processes' first Spark commits, each to a table of its own, before any race
RENAME_PAUSE_MS = 500  # the child's pause between Hadoop's last "absent" check and its rename
# this process's writers: a Spark commit costs a job, a delta-rs one milliseconds, and a Spark
# commit that loses its version retries at the next only after reading the commits since, so
# delta-rs committing without a pause starves it
THREADS = {"spark": 2, "delta-rs": 1}
PAUSE = {"spark": 0.0, "delta-rs": 0.1}  # between a writer's commits
SLOW_FS = Path(__file__).resolve().parent / "java" / "SlowCommitRenameFs.java"


def _slow_fs_jar(folder: Path) -> str:
    """tests/java/SlowCommitRenameFs.java compiled against pyspark's Hadoop, as a JAR in `folder`."""
    import pyspark

    classes = folder / "classes"
    classpath = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", classpath, str(SLOW_FS)], check=True,
                   capture_output=True, text=True)
    jar = folder / "slow-commit-rename-fs.jar"
    with zipfile.ZipFile(jar, "w") as out:
        for name in glob.glob(f"{classes}/**/*.class", recursive=True):
            out.write(name, os.path.relpath(name, classes))
    return str(jar)


@pytest.fixture(scope="module")
def child(spark, tmp_path_factory):
    """The child, its commits' renames paused after Hadoop's check, its Spark session up, and both
    processes' Spark writes warmed up (their first commits take seconds each: classes loaded, code
    compiled), each on a table of its own."""
    folder = tmp_path_factory.mktemp("commit-race")
    slow = {"spark.driver.extraClassPath": _slow_fs_jar(folder),
            "spark.hadoop.fs.AbstractFileSystem.file.impl": "io.epochal.tests.SlowCommitRenameFs",
            "spark.hadoop.epochal.test.commitRenamePauseMs": str(RENAME_PAUSE_MS)}
    worker = Child.start(parent_jars(spark), folder / "child.log", slow)
    try:
        worker.ready()
        for writer in ("parent", "child"):
            _create(spark, str(folder / writer))
        at = time.time() + 0.5
        worker.send({"appends": str(folder / "child"), "by": "spark", "writer": "child", "at": at,
                     "until": at + WARM_UP})
        append_until(spark, str(folder / "parent"), "spark", "parent", at, at + WARM_UP)
        assert worker.answer() is not None, worker.tail()
        yield worker
    finally:
        worker.close()


def _create(spark, path: str) -> None:
    spark.createDataFrame([], "writer string, n long").write.format("delta").save(path)


def _problems(spark, path: str, outcomes: dict[str, list[dict]]) -> list[str]:
    """What is wrong with the table after the race: a returned commit missing from its rows or its
    history, or there more than once; a raised one that left something behind; a row nobody wrote."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "userMetadata").collect()
    landed = defaultdict(list)  # (writer, n) -> the versions whose commit carries its tag
    for entry in history:
        tag = json.loads(entry["userMetadata"]) if entry["userMetadata"] else {}
        if "race" in tag:
            landed[(tag["race"], tag["n"])].append(entry["version"])
    rows = Counter((r["writer"], r["n"]) for r in spark.read.format("delta").load(path).collect())
    by_delta_rs = DeltaTable(path).to_pyarrow_table().to_pylist()
    problems = [] if Counter((r["writer"], r["n"]) for r in by_delta_rs) == rows else [
        "Spark and delta-rs read different rows"]
    versions = sorted(entry["version"] for entry in history)
    if versions != list(range(len(versions))):
        problems.append(f"the history's versions are not 0..{len(versions) - 1}: {versions}")
    attempted = set()
    for writer, results in outcomes.items():
        for outcome in results:
            key = (writer, outcome["n"])
            attempted.add(key)
            if outcome["ok"] and (rows[key], len(landed[key])) != (1, 1):
                problems.append(f"{key} returned, but the table holds its row {rows[key]} times and its history "
                                f"has it at versions {landed[key]}")
            elif not outcome["ok"] and (rows[key] > 1 or rows[key] != len(landed[key])):
                problems.append(f"{key} raised ({outcome['error'][:200]}), but the table holds its row "
                                f"{rows[key]} times, its history at versions {landed[key]}")
    problems += [f"{key}: a row nobody wrote" for key in rows.keys() - attempted]
    return problems


@pytest.mark.parametrize("mine", ["spark", "delta-rs"])
def test_two_processes_committing_to_one_local_table_at_once_lose_no_commit(spark, child, tmp_path, mine):
    """Spark appends in the child, Spark or delta-rs appends here, the same table, the same
    seconds: no commit lost or overwritten, and the table reads without a ChecksumException. The
    race runs again (up to ROUNDS times, writers named for their round) until each process has
    committed at least twice: on a slow machine one round's Spark commits are few."""
    path = str(tmp_path / "table")
    _create(spark, path)
    outcomes: dict[str, list[dict]] = {}
    for round_ in range(1, ROUNDS + 1):
        at = time.time() + 1.0
        child.send({"appends": path, "by": "spark", "writer": f"child-{round_}-", "at": at, "until": at + SECONDS})
        outcomes.update(append_until(spark, path, mine, f"parent-{round_}-", at, at + SECONDS, PAUSE[mine],
                                     THREADS[mine]))
        answer = child.answer()
        assert answer is not None and "appends" in answer, f"the child failed: {answer}\n{child.tail()}"
        outcomes.update(answer["appends"])
        committed = {writer: sum(o["ok"] for o in results) for writer, results in outcomes.items()}
        per_process = Counter()
        for writer, n in committed.items():
            per_process[writer.split("-")[0]] += n
        if min(per_process.values()) >= 2:
            break
    raised = [f"{writer} {o['n']}: {o['error'][:300]}" for writer, results in outcomes.items() for o in results
              if not o["ok"]]
    try:
        problems = _problems(spark, path, outcomes)
    except Exception as error:  # noqa: BLE001 - a read that fails (ChecksumException) is the finding
        problems = [f"the table does not read: {type(error).__name__}: {str(error)[:1000]}"]
    assert not problems, "\n".join([f"commits: {committed}", *problems, "raised:", *raised])
    assert min(per_process.values()) >= 2, f"too few commits to race in {ROUNDS} rounds: {committed}"
