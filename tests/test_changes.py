"""The change generator, checked against the real change data feed: what a batch reports is
exactly what Delta recorded, stamped with its logical time, deterministic, and never leaving a
dangling foreign key. Its local MERGEs are delta-rs's; Spark's (what it runs on an object store)
must write the same batch."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import deltalake
import pytest

from epochal.storage.clock import parse_logical_time
from ops.changes import ALWAYS_CHANGED, ChangeConflict, ChangeGenerator, ChangeHistory
from ops.tpch import PRIMARY_KEYS, TPCH_TABLES
from tests.support import feed_problems

SEED = 11
FIRST_BATCH_AT = datetime(2026, 1, 1, 0, 30, tzinfo=timezone.utc)  # after conftest's TPC-H load


def batch_time(index: int) -> datetime:
    return FIRST_BATCH_AT + timedelta(hours=index - 1)


def source(warehouse: str, name: str) -> str:
    return os.path.join(warehouse, "sources", name)


@pytest.fixture(scope="module")
def generator(spark, warehouse, copy_tpch):
    copy_tpch(warehouse)
    return ChangeGenerator(spark, warehouse, seed=SEED, fraction=0.001)


@pytest.fixture(scope="module")
def first_batch(generator):
    return generator.apply_batch(1, batch_time(1))


def change_feed(spark, path: str, version: int) -> dict[str, list]:
    """Change type -> sorted key tuples, read from Delta's change data feed at one version."""
    frame = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(path)
    )
    return {
        change: sorted(keys)
        for change, keys in group_keys(frame.collect(), PRIMARY_KEYS[os.path.basename(path)]).items()
    }


def group_keys(rows, key_columns) -> dict[str, list]:
    grouped = defaultdict(list)
    for row in rows:
        grouped[row["_change_type"]].append(tuple(row[c] for c in key_columns))
    return grouped


def test_batch_touches_every_kind_of_change(first_batch):
    assert set(first_batch.tables) == set(ALWAYS_CHANGED)
    orders = first_batch.tables["orders"]
    assert orders.inserted == orders.deleted == orders.updated == 15  # 0.1% of 15000, each kind
    lineitem = first_batch.tables["lineitem"]
    assert lineitem.inserted >= orders.inserted and lineitem.deleted >= orders.deleted
    for dimension in ("customer", "part", "supplier"):
        assert first_batch.tables[dimension].updated >= 1


def test_change_feed_shows_exactly_the_reported_changes(spark, warehouse, first_batch):
    for name, change in first_batch.tables.items():
        feed = change_feed(spark, source(warehouse, name), change.version)
        assert feed.get("insert", []) == list(change.inserted_keys), name
        assert feed.get("delete", []) == list(change.deleted_keys), name
        assert feed.get("update_preimage", []) == list(change.updated_keys), name
        assert feed.get("update_postimage", []) == list(change.updated_keys), name


def test_every_version_written_records_exactly_its_change(spark, warehouse, generator, first_batch):
    """The feed (read by Spark, as the engine reads it) of each version the generator wrote equals
    the bag difference of the versions around it."""
    assert generator.writer == "delta-rs"
    for name in first_batch.tables:
        assert not feed_problems(source(warehouse, name), spark), name


@pytest.mark.long  # the generator written twice over; make test-long
def test_sparks_merge_writes_the_same_batch(spark, warehouse, tmp_path_factory, copy_tpch, first_batch):
    fresh = copy_tpch(str(tmp_path_factory.mktemp("spark-writer")))
    again = ChangeGenerator(spark, fresh, seed=SEED, fraction=0.001, writer="spark").apply_batch(1, batch_time(1))
    assert again == first_batch
    for name, change in again.tables.items():
        assert change_feed(spark, source(fresh, name), change.version) == \
            change_feed(spark, source(warehouse, name), change.version), name


def test_tables_without_changes_get_no_commit(warehouse, first_batch):
    for name in set(TPCH_TABLES) - set(first_batch.tables):
        assert deltalake.DeltaTable(source(warehouse, name)).version() == 0, name


def test_each_commit_carries_the_logical_time_and_batch(warehouse, first_batch):
    for name, change in first_batch.tables.items():
        table = deltalake.DeltaTable(source(warehouse, name))
        commit = table.history(1)[0]
        assert commit["version"] == change.version == 1
        assert commit["operation"] == "MERGE"
        assert parse_logical_time(commit["userMetadata"]) == batch_time(1)
        assert json.loads(commit["userMetadata"])["batch"] == 1


def test_updates_change_rows_and_keep_the_unit_price(spark, warehouse, first_batch):
    version = first_batch.tables["lineitem"].version
    frame = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(source(warehouse, "lineitem"))
        .filter("_change_type LIKE 'update%'")
    )
    images = defaultdict(dict)
    for row in frame.collect():
        images[(row.l_orderkey, row.l_linenumber)][row._change_type] = row
    assert images
    for before_after in images.values():
        before, after = before_after["update_preimage"], before_after["update_postimage"]
        assert after.l_quantity != before.l_quantity
        unit_before = before.l_extendedprice / before.l_quantity
        assert abs(after.l_extendedprice - unit_before * after.l_quantity) <= Decimal("0.01")


def test_no_dangling_foreign_keys_after_several_batches(spark, warehouse, generator, first_batch):
    for index in (2, 3):
        generator.apply_batch(index, batch_time(index))
    for name in TPCH_TABLES:
        spark.read.format("delta").load(source(warehouse, name)).createOrReplaceTempView(name)
    dangling = {
        "lineitem->orders": "SELECT * FROM lineitem LEFT ANTI JOIN orders ON l_orderkey = o_orderkey",
        "orders->lineitem": "SELECT * FROM orders LEFT ANTI JOIN lineitem ON o_orderkey = l_orderkey",
        "orders->customer": "SELECT * FROM orders LEFT ANTI JOIN customer ON o_custkey = c_custkey",
        "lineitem->partsupp": "SELECT * FROM lineitem LEFT ANTI JOIN partsupp "
        "ON l_partkey = ps_partkey AND l_suppkey = ps_suppkey",
        "lineitem->part": "SELECT * FROM lineitem LEFT ANTI JOIN part ON l_partkey = p_partkey",
        "lineitem->supplier": "SELECT * FROM lineitem LEFT ANTI JOIN supplier ON l_suppkey = s_suppkey",
        "customer->nation": "SELECT * FROM customer LEFT ANTI JOIN nation ON c_nationkey = n_nationkey",
        "supplier->nation": "SELECT * FROM supplier LEFT ANTI JOIN nation ON s_nationkey = n_nationkey",
    }
    counts = spark.sql(
        "SELECT " + ", ".join(f"(SELECT count(*) FROM ({query})) AS `{relation}`"
                              for relation, query in dangling.items())
    ).first().asDict()
    assert counts == {relation: 0 for relation in dangling}
    for name in ALWAYS_CHANGED:
        assert deltalake.DeltaTable(source(warehouse, name)).version() == 3, name


def test_batches_leave_the_middle_of_the_key_range_alone(warehouse, generator, first_batch):
    """Deletes at the old end and updates at the new end rewrite only the outer files, so the
    loader's range-partitioned files in between (and data skipping on them) survive."""
    assert generator.history().last_batch >= 2
    for name in ("orders", "lineitem"):
        path = source(warehouse, name)
        loaded = set(deltalake.DeltaTable(path, version=0).file_uris())
        kept = loaded & set(deltalake.DeltaTable(path).file_uris())
        assert len(kept) >= len(loaded) / 2, name


def test_a_batch_is_never_applied_twice_nor_back_in_time(generator, first_batch):
    last = generator.history().last_batch
    with pytest.raises(ChangeConflict, match=rf"batches up to {last} are already there"):
        generator.apply_batch(last, batch_time(last))
    with pytest.raises(ChangeConflict, match="must not go backwards"):
        generator.apply_batch(last + 1, batch_time(1))


def test_a_half_applied_batch_is_recognised():
    """A batch that stopped between its table commits leaves the sources off a batch boundary."""
    complete = dict.fromkeys(TPCH_TABLES, 0) | dict.fromkeys(ALWAYS_CHANGED, 4)
    assert ChangeHistory(complete, None).incomplete() == []
    half = complete | {"orders": 5, "part": 5}
    assert ChangeHistory(half, None).last_batch == 5
    assert ChangeHistory(half, None).incomplete() == ["supplier", "customer", "lineitem"]


def test_same_seed_on_a_fresh_warehouse_gives_the_same_batch(
    spark, tmp_path_factory, copy_tpch, first_batch
):
    fresh = copy_tpch(str(tmp_path_factory.mktemp("fresh")))
    again = ChangeGenerator(spark, fresh, seed=SEED, fraction=0.001).apply_batch(1, batch_time(1))
    assert again == first_batch
