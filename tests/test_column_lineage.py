"""Column lineage (epochal/lineage.py) of TPC-H queries, checked against lineage worked out by hand
from the queries' text, and its Dagster form (assets/lineage.py). No Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from epochal.lineage import lineage_of_sql

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"

# The TPC-H schema (the types as tpchgen-cli writes them; lineage needs only the names)
TPCH = {
    "region": {"r_regionkey": "bigint", "r_name": "string", "r_comment": "string"},
    "nation": {"n_nationkey": "bigint", "n_name": "string", "n_regionkey": "bigint", "n_comment": "string"},
    "supplier": {"s_suppkey": "bigint", "s_name": "string", "s_address": "string", "s_nationkey": "bigint",
                 "s_phone": "string", "s_acctbal": "decimal(15,2)", "s_comment": "string"},
    "customer": {"c_custkey": "bigint", "c_name": "string", "c_address": "string", "c_nationkey": "bigint",
                 "c_phone": "string", "c_acctbal": "decimal(15,2)", "c_mktsegment": "string",
                 "c_comment": "string"},
    "part": {"p_partkey": "bigint", "p_name": "string", "p_mfgr": "string", "p_brand": "string",
             "p_type": "string", "p_size": "int", "p_container": "string", "p_retailprice": "decimal(15,2)",
             "p_comment": "string"},
    "partsupp": {"ps_partkey": "bigint", "ps_suppkey": "bigint", "ps_availqty": "int",
                 "ps_supplycost": "decimal(15,2)", "ps_comment": "string"},
    "orders": {"o_orderkey": "bigint", "o_custkey": "bigint", "o_orderstatus": "string",
               "o_totalprice": "decimal(15,2)", "o_orderdate": "date", "o_orderpriority": "string",
               "o_clerk": "string", "o_shippriority": "int", "o_comment": "string"},
    "lineitem": {"l_orderkey": "bigint", "l_partkey": "bigint", "l_suppkey": "bigint", "l_linenumber": "int",
                 "l_quantity": "decimal(15,2)", "l_extendedprice": "decimal(15,2)",
                 "l_discount": "decimal(15,2)", "l_tax": "decimal(15,2)", "l_returnflag": "string",
                 "l_linestatus": "string", "l_shipdate": "date", "l_commitdate": "date",
                 "l_receiptdate": "date", "l_shipinstruct": "string", "l_shipmode": "string",
                 "l_comment": "string"},
}


def traced(name: str, schemas=TPCH) -> dict[str, set[tuple[str, str]]]:
    return {o.name: set(o.inputs) for o in lineage_of_sql(name, (SQL / f"{name}.sql").read_text(), schemas)}


def L(*columns: str) -> set[tuple[str, str]]:  # noqa: N802 - reads as a table of lineitem columns
    return {("lineitem", c) for c in columns}


def test_q01_every_aggregate_names_the_lineitem_columns_it_sums():
    assert traced("tpch_q01") == {
        "l_returnflag": L("l_returnflag"),
        "l_linestatus": L("l_linestatus"),
        "sum_qty": L("l_quantity"),
        "sum_base_price": L("l_extendedprice"),
        "sum_disc_price": L("l_extendedprice", "l_discount"),
        "sum_charge": L("l_extendedprice", "l_discount", "l_tax"),
        "avg_qty": L("l_quantity"),
        "avg_price": L("l_extendedprice"),
        "avg_disc": L("l_discount"),
        "count_order": set(),  # count(*): no column; l_shipdate only filters
    }


def test_q03_columns_come_from_lineitem_and_orders_not_from_the_filtering_customer():
    assert traced("tpch_q03") == {
        "l_orderkey": L("l_orderkey"),
        "revenue": L("l_extendedprice", "l_discount"),
        "o_orderdate": {("orders", "o_orderdate")},
        "o_shippriority": {("orders", "o_shippriority")},
    }


def test_q10_reads_four_tables():
    assert traced("tpch_q10") == {
        "c_custkey": {("customer", "c_custkey")},
        "c_name": {("customer", "c_name")},
        "revenue": L("l_extendedprice", "l_discount"),
        "c_acctbal": {("customer", "c_acctbal")},
        "n_name": {("nation", "n_name")},
        "c_address": {("customer", "c_address")},
        "c_phone": {("customer", "c_phone")},
        "c_comment": {("customer", "c_comment")},
    }


def test_q07_traces_through_a_subquery_and_two_aliases_of_one_table():
    assert traced("tpch_q07") == {
        "supp_nation": {("nation", "n_name")},
        "cust_nation": {("nation", "n_name")},
        "l_year": L("l_shipdate"),
        "revenue": L("l_extendedprice", "l_discount"),
    }


def test_q15_traces_through_a_cte():
    assert traced("tpch_q15") == {
        "s_suppkey": {("supplier", "s_suppkey")},
        "s_name": {("supplier", "s_name")},
        "s_address": {("supplier", "s_address")},
        "s_phone": {("supplier", "s_phone")},
        "total_revenue": L("l_extendedprice", "l_discount"),
    }


def test_a_derived_table_reading_a_derived_table_names_its_columns():
    schemas = {**TPCH, "tpch_q10": {"c_custkey": "bigint", "n_name": "string", "revenue": "decimal(38,4)"}}
    assert traced("returns_by_nation", schemas) == {
        "n_name": {("tpch_q10", "n_name")},
        "customers": set(),
        "revenue": {("tpch_q10", "revenue")},
    }


def test_star_and_union_and_scalar_subquery_in_the_select_list():
    schemas = {"a": {"x": "int", "y": "int"}, "b": {"x": "int", "z": "int"}}
    found = {o.name: set(o.inputs) for o in lineage_of_sql(
        "t", "select * from a union all select x, z from b", schemas)}
    assert found == {"x": {("a", "x"), ("b", "x")}, "y": {("a", "y"), ("b", "z")}}
    found = {o.name: set(o.inputs) for o in lineage_of_sql(
        "t", "select x, (select max(z) from b where b.x = a.x) as top from a", schemas)}
    assert found == {"x": {("a", "x")}, "top": {("b", "z")}}


@pytest.mark.parametrize("name", sorted(p.stem for p in SQL.glob("tpch_q*.sql")))
def test_every_tpch_query_traces_each_output_column_to_tpch_columns(name):
    outputs = lineage_of_sql(name, (SQL / f"{name}.sql").read_text(), TPCH)
    assert outputs
    for output in outputs:
        for table, column in output.inputs:
            assert column in TPCH[table], (name, output.name, table, column)


def test_asset_definitions_carry_columns_and_lineage_read_from_the_warehouse(tmp_path):
    """Definition time, no Spark: the sources' schemas from their Delta logs (written here by
    delta-rs); tpch_q10 is written, so it has a column schema; returns_by_nation is not, so it
    has lineage (through tpch_q10's columns) and no schema."""
    import shutil

    import pyarrow as pa
    from deltalake import write_deltalake

    from assets import derived_definitions
    from assets.lineage import LINEAGE, SCHEMA
    from epochal.storage.warehouse import Warehouse

    arrow = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string(), "date": pa.date32(),
             "decimal(15,2)": pa.decimal128(15, 2)}
    warehouse = Warehouse(str(tmp_path / "warehouse"))
    for name, columns in TPCH.items():
        schema = pa.schema([(c, arrow[t]) for c, t in columns.items()])
        write_deltalake(warehouse.source_path(name), schema.empty_table())
    q10 = pa.schema([("c_custkey", pa.int64()), ("c_name", pa.string()), ("revenue", pa.decimal128(38, 4)),
                     ("c_acctbal", pa.decimal128(15, 2)), ("n_name", pa.string()), ("c_address", pa.string()),
                     ("c_phone", pa.string()), ("c_comment", pa.string())])
    write_deltalake(warehouse.table_path("tpch_q10"), q10.empty_table())
    folder = tmp_path / "sql"
    folder.mkdir()
    for name in ("tpch_q10.sql", "tpch_q10.yml", "returns_by_nation.sql", "returns_by_nation.yml"):
        shutil.copy(SQL / name, folder / name)

    assets = {a.key.to_user_string(): a for a in derived_definitions(folder, warehouse.root).assets}
    q10_meta = assets["tpch_q10"].specs_by_key[next(iter(assets["tpch_q10"].keys))].metadata
    assert [(c.name, c.type) for c in q10_meta[SCHEMA].columns][:3] == [
        ("c_custkey", "bigint"), ("c_name", "string"), ("revenue", "decimal(38,4)")]
    deps = q10_meta[LINEAGE].deps_by_column
    assert [(d.asset_key.to_user_string(), d.column_name) for d in deps["revenue"]] == [
        ("lineitem", "l_discount"), ("lineitem", "l_extendedprice")]
    assert [(d.asset_key.to_user_string(), d.column_name) for d in deps["n_name"]] == [("nation", "n_name")]

    nation = assets["returns_by_nation"].specs_by_key[next(iter(assets["returns_by_nation"].keys))].metadata
    assert SCHEMA not in nation
    assert {c: [(d.asset_key.to_user_string(), d.column_name) for d in deps] for c, deps in
            nation[LINEAGE].deps_by_column.items()} == {
        "n_name": [("tpch_q10", "n_name")], "revenue": [("tpch_q10", "revenue")]}


def test_without_a_warehouse_the_definitions_have_no_columns(tmp_path):
    from assets.lineage import definition_metadata
    from assets.specs import load_specs

    specs = load_specs(SQL, ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"))
    assert definition_metadata(specs, str(tmp_path / "nothing")) == {name: {} for name in specs}


def test_a_columns_description_names_its_input_columns():
    """Open-source Dagster shows column descriptions, not the lineage graph: the description says it."""
    from dagster import AssetKey, TableColumnDep, TableColumnLineage
    from pyspark.sql.types import DecimalType, LongType, StructField

    from assets.lineage import table_schema

    lineage = TableColumnLineage(deps_by_column={"revenue": [
        TableColumnDep(asset_key=AssetKey("lineitem"), column_name="l_extendedprice"),
        TableColumnDep(asset_key=AssetKey("lineitem"), column_name="l_discount")]})
    schema = table_schema([StructField("l_orderkey", LongType(), True), StructField("revenue", DecimalType(38, 4), True)],
                          key=("l_orderkey",), lineage=lineage)
    assert [(c.name, c.type, c.description) for c in schema.columns] == [
        ("l_orderkey", "bigint", "declared key"),
        ("revenue", "decimal(38,4)", "from lineitem.l_discount, lineitem.l_extendedprice")]
