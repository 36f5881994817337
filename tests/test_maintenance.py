"""The maintenance jobs' shortcuts (epochal/maintenance.py): OPTIMIZE and VACUUM are left
undone, without a Spark job, only where Delta's own command would have done nothing. The oracle
is Delta itself: hypothesis draws a table's history (appends, deletes, updates, merges, with or
without partitions, change feed and deletion vectors), ages some of its files past the retention
and leaves empty folders in it; wherever a shortcut says there is nothing to do, Spark's VACUUM
DRY RUN lists no file and its OPTIMIZE rewrites none."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal import maintenance
from epochal.maintenance import DEFAULT_RETENTION_HOURS, DeltaTarget

SETTINGS = settings(max_examples=6, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

OPERATIONS = st.lists(st.sampled_from(["append", "delete", "update", "merge"]), min_size=0, max_size=4)


def _history(spark, path: str, partitioned: bool, feed: bool, vectors: bool, operations: list[str]) -> None:
    partitioning = "PARTITIONED BY (p)" if partitioned else ""
    spark.sql(f"CREATE TABLE delta.`{path}` (k INT, p INT, v STRING) USING DELTA {partitioning} "
              f"TBLPROPERTIES (delta.enableChangeDataFeed = {str(feed).lower()}, "
              f"delta.enableDeletionVectors = {str(vectors).lower()})")
    spark.range(40).selectExpr("CAST(id AS INT) AS k", "CAST(id % 2 AS INT) AS p", "CAST(id AS STRING) AS v") \
        .write.format("delta").mode("append").save(path)
    for i, operation in enumerate(operations):
        if operation == "append":
            spark.range(3).selectExpr(f"CAST(id + {100 * (i + 1)} AS INT) AS k", "CAST(id % 2 AS INT) AS p",
                                      "'appended' AS v").write.format("delta").mode("append").save(path)
        elif operation == "delete":
            spark.sql(f"DELETE FROM delta.`{path}` WHERE k % 7 = {i % 7}")
        elif operation == "update":
            spark.sql(f"UPDATE delta.`{path}` SET v = 'updated {i}' WHERE k % 5 = {i % 5}")
        else:
            spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT {i} AS k, 1 AS p, 'merged' AS v) s ON t.k = s.k "
                      "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")


def _age(path: str, chosen: list[int], hours: float) -> None:
    """Set the modification time of the files numbered `chosen` (outside _delta_log) `hours` back."""
    files = sorted(p for p in Path(path).rglob("*") if p.is_file() and "_delta_log" not in p.parts)
    then = time.time() - hours * 3600
    for i in chosen:
        if files:
            os.utime(files[i % len(files)], (then, then))


def _listing(path: str) -> set[str]:
    """Every file and folder under `path` outside _delta_log, relative to it."""
    return {str(p.relative_to(path)) for p in Path(path).rglob("*") if "_delta_log" not in p.parts}


@pytest.mark.long  # a copy of the table vacuumed by Delta per example: make test-long, keeping make test within 10 minutes
@SETTINGS
@given(partitioned=st.booleans(), feed=st.booleans(), vectors=st.booleans(), operations=OPERATIONS,
       aged=st.lists(st.integers(0, 50), max_size=3), age=st.sampled_from([1.0, 166.5, 167.5, 200.0]),
       empty_folder=st.booleans())
def test_vacuum_skipped_only_where_delta_would_delete_nothing(spark, tmp_path, partitioned, feed, vectors, operations,
                                                               aged, age, empty_folder):
    """What Delta's VACUUM deletes is seen on a copy of the table (modification times kept): its
    DRY RUN lists folders it then fails to delete (a change feed's folder of new files, deleted
    non-recursively), so the listing before and after is the oracle, not the DRY RUN's count."""
    path = str(tmp_path / f"t{uuid.uuid4().hex[:8]}")
    _history(spark, path, partitioned, feed, vectors, operations)
    _age(path, aged, age)
    if empty_folder:
        os.makedirs(os.path.join(path, "left_behind"))
    twin = shutil.copytree(path, f"{path}_twin", copy_function=shutil.copy2)
    before = _listing(path)
    spark.sql(f"VACUUM delta.`{twin}` RETAIN {DEFAULT_RETENTION_HOURS} HOURS").collect()
    by_delta = _listing(twin)
    idle = maintenance.nothing_to_vacuum(path, DEFAULT_RETENTION_HOURS)
    assert idle is None or by_delta == before, (idle, sorted(before - by_delta))
    if not aged and not empty_folder:  # every file new: the shortcut must take it, or it never saves anything
        assert idle is not None
    result = maintenance.vacuum(spark, DeltaTarget("t", "derived", path))
    assert result.detail["nothing_to_do"] == (idle is not None)
    assert _listing(path) == by_delta
    assert sorted(spark.read.format("delta").load(path).collect()) == sorted(spark.read.format("delta").load(twin).collect())


@SETTINGS
@given(partitioned=st.booleans(), feed=st.booleans(), vectors=st.booleans(), operations=OPERATIONS,
       compacted_first=st.booleans())
def test_optimize_skipped_only_where_delta_would_rewrite_nothing(spark, tmp_path, partitioned, feed, vectors, operations,
                                                                  compacted_first):
    path = str(tmp_path / f"t{uuid.uuid4().hex[:8]}")
    _history(spark, path, partitioned, feed, vectors, operations)
    if compacted_first:
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    before = sorted(spark.read.format("delta").load(path).collect())
    idle = maintenance.nothing_to_compact(path)
    result = maintenance.optimize(spark, DeltaTarget("t", "derived", path))
    rewritten = spark.sql(f"OPTIMIZE delta.`{path}`").first()["metrics"]["numFilesRemoved"]
    if idle is not None:
        assert result.detail["files_removed"] == 0 and rewritten == 0, (idle, rewritten)
        assert "nothing to compact" in result.message
    else:
        assert rewritten == 0  # the maintenance job's OPTIMIZE left nothing for a second one
    if compacted_first:  # one file a partition: the shortcut must take it
        assert idle is not None
    assert sorted(spark.read.format("delta").load(path).collect()) == before
