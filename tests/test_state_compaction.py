"""When a state table is compacted (keyed/state.py, StateStore.due_for_compaction): after
`compact_after` appends once they have added more than `compact_fraction` of the rows it was
compacted to, or after `compact_appends` appends whatever their rows. Read from real Delta logs,
appends committed by delta-rs (the driver's commits) and by Spark, whose metrics name the rows
differently. That a compacted table reads the same is the differential tests' (test_upkeep.py)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from epochal import Upkeep
from epochal.keyed.state import StateStore

UPKEEP = Upkeep(compact_after=2, compact_fraction=0.1, compact_appends=5)


def _rows(count: int, start: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(range(start, start + count), pa.int64()),
                     "__seq": pa.array([1] * count, pa.int64()), "__delete": pa.array([False] * count)})


def test_small_appends_to_a_large_state_wait_for_the_most_appends(tmp_path):
    path = tmp_path / "s"
    store = StateStore(None, str(tmp_path), {}, upkeep=UPKEEP)
    write_deltalake(path, _rows(1_000), mode="overwrite")
    due = []
    for i in range(UPKEEP.compact_appends):
        write_deltalake(path, _rows(10, 10_000 + 10 * i), mode="append")
        due.append(store.due_for_compaction("s"))
    assert due == [False] * (UPKEEP.compact_appends - 1) + [True]  # 50 rows never pass 10% of 1,000


def test_appends_past_the_fraction_compact_once_there_are_enough_of_them(tmp_path):
    path = tmp_path / "s"
    store = StateStore(None, str(tmp_path), {}, upkeep=UPKEEP)
    write_deltalake(path, _rows(1_000), mode="overwrite")
    write_deltalake(path, _rows(150, 10_000), mode="append")
    assert not store.due_for_compaction("s")  # past 10%, but one append is fewer than compact_after
    DeltaTable(path).optimize.compact()  # moves no row: neither an append nor a replacement
    assert not store.due_for_compaction("s")
    write_deltalake(path, _rows(1, 20_000), mode="append")
    assert store.due_for_compaction("s")
    write_deltalake(path, _rows(1_151), mode="overwrite")  # the compaction
    write_deltalake(path, _rows(1, 30_000), mode="append")
    write_deltalake(path, _rows(1, 30_001), mode="append")
    assert not store.due_for_compaction("s")


def test_spark_appends_count_their_rows_too(spark, tmp_path):
    path = str(tmp_path / "s")
    store = StateStore(spark, str(tmp_path), {}, upkeep=UPKEEP)
    spark.createDataFrame(_rows(1_000).to_pandas()).write.format("delta").mode("overwrite").save(path)
    for start in (10_000, 20_000):
        spark.createDataFrame(_rows(20, start).to_pandas()).write.format("delta").mode("append").save(path)
    assert not store.due_for_compaction("s")  # 40 rows of 1,000
    spark.createDataFrame(_rows(200, 30_000).to_pandas()).write.format("delta").mode("append").save(path)
    assert store.due_for_compaction("s")
