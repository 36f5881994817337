"""Fault matrix (docs/operations.md, "What users and machines do to a warehouse"): what users and machines do to a warehouse
with arrangements on, each followed by a refresh in a process of its own, as Dagster runs one.

Every case starts from the same history: the reliability pipeline (tests/reliability.py: a join,
an aggregate over it, a DISTINCT over the join, a global count) over sources a and b, with
arrangements forced (`arrange_rows=0`) and `driver_rows=4`, so that every version of more than 4
rows is read by key through the arrangements and their local copies. A first epoch builds them,
an incremental one appends to them and makes the copies. Then the fault, then a few changes written
by Spark, then a refresh in a child process (its own Spark session, a new engine). That refresh
must leave every table equal to its SQL recomputed in full, or fail with an error naming the cause;
then the next refresh (in this process, another engine) must converge, and equal the recompute.

The faults: the source recreated at its path (a new Delta table id); overwritten with a smaller
table; VACUUM with retention 0 while an arrangement lags (the change feed it would append is gone);
deletion vectors enabled on an existing source, then a DELETE that writes one; column mapping
enabled on an existing source; a column added; the local copies emptied, truncated, or deleted;
the copies' disk full (a 1 MiB tmpfs mounted over their folder). Two processes refreshing the same
tables at once are tests/test_concurrency.py's, with arrangements forced as well.
"""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from epochal.sessions import session_confs
from tests.reliability import (
    A_SCHEMA,
    PIPELINE,
    append,
    build_engine,
    create_sources,
    random_batch,
    source_path,
)
from tests.support import SUMMARIES, assert_matches_recompute
from tests.worker import Child, parent_jars

pytestmark = pytest.mark.faults  # a JVM per case: make test-faults (CI runs it after make test-long)

OPTIONS = {"arrange_rows": 0, "driver_rows": 4}
OUTCOMES: dict[str, str] = {}


def _sql(spark, statement: str) -> None:
    spark.sql(statement).collect()


def recreated(spark, root: str) -> None:
    """Deleted and created again at the same path: a new table, its log from version 0."""
    path = source_path(root, "a")
    shutil.rmtree(path)
    rows = [(k % 5, "new", k) for k in range(12)]
    write_deltalake(path, pa.Table.from_pylist([dict(zip(A_SCHEMA.names, r)) for r in rows], schema=A_SCHEMA),
                    configuration={"delta.enableChangeDataFeed": "true"})


def overwritten_smaller(spark, root: str) -> None:
    rows = [(1, "small", 1), (2, "small", None)]
    write_deltalake(source_path(root, "a"), pa.Table.from_pylist([dict(zip(A_SCHEMA.names, r)) for r in rows],
                                                                  schema=A_SCHEMA), mode="overwrite")


def vacuumed_while_lagging(spark, root: str) -> None:
    """Commits the arrangements have not seen, then every file no longer current deleted, the
    change data files of those commits included."""
    path = source_path(root, "a")
    for k in (1, 2):
        _sql(spark, f"DELETE FROM delta.`{path}` WHERE k = {k}")
    append(root, "a", [(1, "after", 2), (2, "after", 3)])
    with session_confs(spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
        _sql(spark, f"VACUUM delta.`{path}` RETAIN 0 HOURS")


def deletion_vectors(spark, root: str) -> None:
    path = source_path(root, "a")
    _sql(spark, f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    _sql(spark, f"DELETE FROM delta.`{path}` WHERE k = 3")


def column_mapping(spark, root: str) -> None:
    _sql(spark, f"ALTER TABLE delta.`{source_path(root, 'a')}` SET TBLPROPERTIES ('delta.minReaderVersion' = '2', "
                "'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')")


def column_added(spark, root: str) -> None:
    _sql(spark, f"ALTER TABLE delta.`{source_path(root, 'a')}` ADD COLUMNS (w STRING)")
    _sql(spark, f"INSERT INTO delta.`{source_path(root, 'a')}` VALUES (1, 'wide', 6, 'w')")


def _copies(root: str) -> list[str]:
    found = glob.glob(f"{root}/_epochal/local_copies/**/*.arrow", recursive=True)
    assert found, f"no local copies under {root}: the case would test nothing"
    return found


def copies_emptied(spark, root: str) -> None:
    for copy in _copies(root):
        open(copy, "wb").close()


def copies_truncated(spark, root: str) -> None:
    for copy in _copies(root):
        os.truncate(copy, os.path.getsize(copy) // 2)


def copies_deleted(spark, root: str) -> None:
    for copy in _copies(root):
        os.remove(copy)


def copies_disk_full(spark, root: str) -> None:
    """The copies' folder on a disk with less room than a copy needs (LocalCopies.min_free_bytes)."""
    folder = f"{root}/_epochal/local_copies"
    _copies(root)
    shutil.rmtree(folder)
    os.makedirs(folder)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], check=False,
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a full disk is a 1 MiB tmpfs here, and this machine does not let it be mounted: {mounted.stderr}")


FAULTS = {fault.__name__: fault for fault in (
    recreated, overwritten_smaller, vacuumed_while_lagging, deletion_vectors, column_mapping, column_added,
    copies_emptied, copies_truncated, copies_deleted, copies_disk_full)}


def changes_by_spark(spark, root: str) -> None:
    """Changes after the fault, written by Spark (a table with deletion vectors or column mapping
    is not delta-rs's to write): an insert joining b, a delete, an update of b."""
    a, b = source_path(root, "a"), source_path(root, "b")
    columns = [f.name for f in spark.read.format("delta").load(a).schema.fields]
    values = {"k": "2", "g": "'late'", "v": "9"}
    _sql(spark, f"INSERT INTO delta.`{a}` ({', '.join(c for c in columns if c in values)}) "
                f"VALUES ({', '.join(values[c] for c in columns if c in values)})")
    _sql(spark, f"DELETE FROM delta.`{a}` WHERE k = 4")
    _sql(spark, f"UPDATE delta.`{b}` SET name = 'late' WHERE k = 1")


@pytest.fixture(scope="module", autouse=True)
def summary():
    """The outcome of each case this process ran, shown after the run."""
    yield
    if OUTCOMES:
        SUMMARIES.append("Fault matrix (arrangements forced; the refresh after the fault in a process of its own -> "
                         "what it did; each table then equal to its recompute)\n"
                         + "\n".join(f"  {name:24} {OUTCOMES[name]}" for name in FAULTS if name in OUTCOMES))


def _outcome(answer: dict) -> str:
    if "error" in answer:
        return f"failed: {answer['error']}: {answer['message'][:160]}"
    parts = []
    for report in answer["reports"]:
        reason = f" {report['reason'].split(':')[0]}" if report.get("reason") else ""
        parts.append(f"{report['table']} {report['technique']}{reason}")
    arranged = answer["reports"][0]["detail"].get("arrangements") if answer["reports"] else None
    return "; ".join(parts) + (f"; arrangements {arranged}" if arranged else "")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_refresh_after_the_fault_is_exact_or_fails_naming_it_and_the_next_converges(spark, warehouse,
                                                                                     tmp_path, fault):
    child = Child.start(parent_jars(spark), tmp_path / "child.log")  # its JVM starts while this one sets up
    root = f"{warehouse}/fault-{fault}"
    create_sources(root)
    engine = build_engine(spark, root, PIPELINE, **OPTIONS)
    engine.refresh()
    random_batch(root, random.Random(3), commits=3)
    append(root, "a", [(1, "base", 3), (2, "base", 4)])
    append(root, "b", [(2, "base")])
    engine.refresh()
    assert engine.arranged, "the incremental epoch arranged nothing: the case would test nothing"
    assert_matches_recompute(engine, context="before the fault")

    try:
        FAULTS[fault](spark, root)
        changes_by_spark(spark, root)
        child.ready()
        child.send({"root": root, "sources": ["a", "b"], "definitions": PIPELINE, "options": OPTIONS})
        answer = child.answer()
        assert answer is not None, f"the child refreshing after {fault} gave no answer:\n{child.tail()}"
        OUTCOMES[fault] = _outcome(answer)
        engine = build_engine(spark, root, PIPELINE, **OPTIONS)
        if "error" in answer:  # then it names what it met: the source, or a table reading it
            assert any(name in answer["message"] for name in (source_path(root, "a"), "`a`", "'a'", *PIPELINE)), answer
            engine.refresh()
        assert_matches_recompute(engine, context=f"after {fault} and the refresh in its own process")
        append(root, "b", [(3, "next")])
        engine.refresh()
        assert_matches_recompute(engine, context=f"the epoch after {fault}")
    finally:
        child.close()
        if fault == "copies_disk_full":
            subprocess.run(["umount", f"{root}/_epochal/local_copies"], check=False, capture_output=True)
