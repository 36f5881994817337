"""Delta tables kept open per thread (epochal/storage/deltalog.py, `opened`) read as a fresh open
would: a later commit is seen, a table deleted and created again is not mistaken for the old one
(its id, schema, versions and commits are the new table's), and a DeltaLog keeps what it read
when opened."""

from __future__ import annotations

import shutil
import threading

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from epochal.storage.deltalog import Commit, DeltaLog, opened, table_at


def _write(path, values, mode="append"):
    write_deltalake(path, pa.table({"x": pa.array(values, pa.int64())}), mode=mode)


def test_a_table_kept_open_sees_later_commits_and_a_recreated_table(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    _write(path, [2])
    first = opened(path)
    old_id = first.metadata().id
    assert first.version() == 1 and opened(path) is first
    _write(path, [3])
    assert opened(path).version() == 2 and opened(path).to_pyarrow_table().num_rows == 3

    before = DeltaLog(path).commits(0)  # kept by the process from here on
    shutil.rmtree(path)  # deleted and created again, to a version the old table also had
    write_deltalake(path, pa.table({"y": pa.array(["a"])}))
    write_deltalake(path, pa.table({"y": pa.array(["b"])}), mode="append")
    write_deltalake(path, pa.table({"y": pa.array(["c"])}), mode="append")
    again = opened(path)
    assert again.version() == 2 and again.metadata().id != old_id
    assert again.metadata().id == DeltaTable(path).metadata().id
    assert again.to_pyarrow_table().column_names == ["y"]
    fresh = sorted(DeltaTable(path).history(), key=lambda entry: entry["version"])
    assert [c.timestamp_ms for c in DeltaLog(path).commits(0)] == \
        [int(e.get("inCommitTimestamp") or e["timestamp"]) for e in fresh]
    assert len(before) == 3

    shutil.rmtree(path)  # and to fewer versions
    _write(path, [9])
    assert opened(path).version() == 0 and opened(path).to_pyarrow_table().column("x").to_pylist() == [9]


def test_a_version_kept_open_is_that_version_and_threads_keep_their_own(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    _write(path, [2])
    assert table_at(path, 0).to_pyarrow_table().num_rows == 1
    assert table_at(path, 1).to_pyarrow_table().num_rows == 2
    found = {}
    worker = threading.Thread(target=lambda: found.update(table=opened(path)))
    worker.start()
    worker.join()
    assert found["table"] is not opened(path) and found["table"].version() == opened(path).version()


def test_a_delta_log_keeps_the_version_and_schema_it_opened(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    log = DeltaLog(path)
    _write(path, [2])
    write_deltalake(path, pa.table({"x": pa.array([3], pa.int64()), "z": pa.array(["new"])}), mode="append",
                    schema_mode="merge")
    newer = DeltaLog(path)  # brings the thread's table forward
    assert newer.version == 2 and [f["name"] for f in newer.schema_json()["fields"]] == ["x", "z"]
    assert log.version == 0 and [f["name"] for f in log.schema_json()["fields"]] == ["x"]
    assert [c.version for c in log.commits(0)] == [0]
    assert [c.version for c in newer.commits(1)] == [1, 2]


def test_commits_read_from_the_log_files_are_delta_rs_history(spark, tmp_path):
    """DeltaLog.commits reads a local table's commitInfo lines itself: the same commits, with
    their operations, parameters, timestamps and user metadata, as delta-rs's history gives, for
    Spark's writes (a tagged append, an overwrite, a MERGE) and delta-rs's (a tagged append)."""
    path = str(tmp_path / "t")
    frame = spark.createDataFrame([(1, "a")], "x bigint, y string")
    frame.write.format("delta").option("userMetadata", '{"epochal": {"seq": 1}}').save(path)
    frame.write.format("delta").mode("overwrite").save(path)
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 2L AS x, 'b' AS y) s ON t.x = s.x "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    write_deltalake(path, pa.table({"x": pa.array([3], pa.int64()), "y": pa.array(["c"])}), mode="append",
                    commit_properties=CommitProperties(custom_metadata={"userMetadata": '{"epochal": {"seq": 4}}'}))
    expected = [Commit.of_entry(entry) for entry in sorted(DeltaTable(path).history(), key=lambda e: e["version"])]
    assert DeltaLog(path).commits(0) == expected
    assert [c.operation for c in expected] == ["WRITE", "WRITE", "MERGE", "WRITE"]
    assert expected[0].user_metadata and expected[3].user_metadata
