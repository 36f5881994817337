"""The TPC-H loader: eight Delta tables in one stamped commit each, range-partitioned big tables,
and a second load that is a no-op or a clear error, never a duplicate."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone

import deltalake
import pytest

from epochal.storage.clock import logical_time_metadata
from ops.tpch import SCALE_PROPERTY, TPCH_TABLES, TpchLoadConflict, load_tpch

LOADED_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)  # conftest's tpch_load time

ROWS_AT_SCALE_0_01 = {
    "region": 5,
    "nation": 25,
    "supplier": 100,
    "customer": 1500,
    "part": 2000,
    "partsupp": 8000,
    "orders": 15000,
    "lineitem": 60175,
}


@pytest.fixture(scope="module")
def warehouse(tpch_load) -> str:
    """The session's TPC-H load (these tests only read it or try to load over it)."""
    return tpch_load[0]


@pytest.fixture(scope="module")
def loaded(tpch_load):
    return tpch_load[1]


def source(warehouse: str, name: str) -> str:
    return os.path.join(warehouse, "sources", name)


def test_load_writes_eight_tables_each_in_one_stamped_commit(warehouse, loaded):
    assert not loaded.skipped and loaded.logical_time == LOADED_AT
    assert set(loaded.tables) == set(TPCH_TABLES)
    for name in TPCH_TABLES:
        table = deltalake.DeltaTable(source(warehouse, name))
        history = table.history()
        assert [h["version"] for h in history] == [0], name
        assert history[0]["userMetadata"] == logical_time_metadata(LOADED_AT)
        config = table.metadata().configuration
        assert config["delta.enableChangeDataFeed"] == "true"
        assert config[SCALE_PROPERTY] == "0.01"
        rows = table.to_pyarrow_dataset().count_rows()
        assert rows == loaded.tables[name].rows == ROWS_AT_SCALE_0_01[name], name


def test_columns_keep_tpch_names_and_types(spark, warehouse, loaded):
    def types(name):
        frame = spark.read.format("delta").load(source(warehouse, name))
        return {f.name: f.dataType.simpleString() for f in frame.schema.fields}

    lineitem = types("lineitem")
    assert lineitem["l_orderkey"] == "bigint"
    assert lineitem["l_linenumber"] == "int"
    assert lineitem["l_extendedprice"] == lineitem["l_discount"] == "decimal(15,2)"
    assert lineitem["l_shipdate"] == "date" and lineitem["l_returnflag"] == "string"
    orders = types("orders")
    assert orders["o_totalprice"] == "decimal(15,2)" and orders["o_orderdate"] == "date"
    assert types("customer")["c_acctbal"] == "decimal(15,2)"
    assert types("part")["p_retailprice"] == "decimal(15,2)"


@pytest.mark.parametrize("name,key", [("orders", "o_orderkey"), ("lineitem", "l_orderkey")])
def test_big_tables_have_disjoint_key_ranges_per_file(warehouse, loaded, name, key):
    """Disjoint min/max per file is what lets Delta skip files for a key lookup."""
    actions = deltalake.DeltaTable(source(warehouse, name)).get_add_actions(flatten=True)
    columns = actions.column_names if hasattr(actions, "column_names") else actions.schema.names
    assert f"min.{key}" in columns
    ranges = sorted(
        zip(actions.column(f"min.{key}").to_pylist(), actions.column(f"max.{key}").to_pylist())
    )
    assert len(ranges) >= 4
    for (_, high), (low, _) in zip(ranges, ranges[1:]):
        assert high < low


def test_loading_again_at_the_same_scale_is_a_reported_no_op(spark, warehouse, loaded):
    again = load_tpch(spark, warehouse, 0.01, LOADED_AT)
    assert again.skipped
    assert "skipped" in again.message and "nothing was written" in again.message
    for name in TPCH_TABLES:
        assert deltalake.DeltaTable(source(warehouse, name)).version() == 0


def test_loading_another_scale_fails_naming_table_and_remedy(spark, warehouse, loaded):
    with pytest.raises(TpchLoadConflict, match=r"'region'.*scale 0\.01, not 0\.02.*another warehouse"):
        load_tpch(spark, warehouse, 0.02, LOADED_AT)
    assert deltalake.DeltaTable(source(warehouse, "region")).version() == 0


def test_partial_set_fails_and_writes_nothing(spark, warehouse, loaded, tmp_path):
    shutil.copytree(source(warehouse, "region"), source(str(tmp_path), "region"))
    with pytest.raises(TpchLoadConflict, match=r"only part.*region present.*nation.*missing"):
        load_tpch(spark, str(tmp_path), 0.01, LOADED_AT)
    assert os.listdir(tmp_path / "sources") == ["region"]


def test_foreign_table_or_folder_fails(spark, tmp_path):
    spark.range(3).write.format("delta").save(source(str(tmp_path), "orders"))
    with pytest.raises(TpchLoadConflict, match=r"'orders'.*not written by the TPC-H loader"):
        load_tpch(spark, str(tmp_path), 0.01, LOADED_AT)

    other = tmp_path / "other"
    (other / "sources" / "nation").mkdir(parents=True)
    (other / "sources" / "nation" / "stray.parquet").write_bytes(b"")
    with pytest.raises(TpchLoadConflict, match=r"nation exists but is not a Delta table"):
        load_tpch(spark, str(other), 0.01, LOADED_AT)
