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
    found, opening = {}, threading.Event()
    release = threading.Event()

    def work():
        found.update(table=opened(path))
        opening.set()
        release.wait()

    worker = threading.Thread(target=work)
    worker.start()
    opening.wait()
    mine = opened(path)
    assert found["table"] is not mine and found["table"].version() == mine.version()
    release.set()
    worker.join()


def test_a_finished_threads_tables_go_to_the_next_thread_brought_forward(tmp_path):
    """A refresh's worker threads live for one epoch: the tables they kept are handed to the next
    epoch's threads, which bring them forward by the commits since, and open afresh a table
    deleted and created again meanwhile."""
    kept, recreated = str(tmp_path / "kept"), str(tmp_path / "recreated")
    for path in (kept, recreated):
        _write(path, [1])

    def in_a_thread(work):
        done = {}
        worker = threading.Thread(target=lambda: done.update(work()))
        worker.start()
        worker.join()
        return done

    first = in_a_thread(lambda: {path: (opened(path), opened(path).metadata().id) for path in (kept, recreated)})
    _write(kept, [2])
    shutil.rmtree(recreated)
    _write(recreated, [7])
    _write(recreated, [8])
    second = in_a_thread(lambda: {path: (opened(path), opened(path).version(),
                                         sorted(opened(path).to_pyarrow_table().column("x").to_pylist()))
                                  for path in (kept, recreated)})
    assert second[kept][0] is first[kept][0] and second[kept][1:] == (1, [1, 2])
    assert second[recreated][0] is not first[recreated][0] and second[recreated][1:] == (1, [7, 8])
    assert DeltaTable(recreated).metadata().id != first[recreated][1]


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
