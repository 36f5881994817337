"""Reads made on the driver and shared by a refresh's steps (epochal/shared_reads.py) must hold the
rows Spark reads: a local relation keeps every row of the Arrow data (PySpark 4.1 drops the rows
after an empty chunk), and a restricted read of a large table's version holds every row whose key
is one of the wanted values, NULL keys when asked, over files written by Spark and changed by
MERGE. The engine's use of them is held against the recompute by a differential run whose tables
are larger than the driver threshold, so join terms and affected-key recomputes read their
co-generators' rows this way."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from datetime import date, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from deltalake import DeltaTable, WriterProperties, write_deltalake
from pyspark.sql import functions as F

from epochal import Engine
from epochal.changes import consolidate, consolidate_rows
from epochal.graph import WEIGHT
from epochal.keyed.file_pruning import files_holding
from epochal.keyed.shared_reads import SharedReads, widened_bounds
from tests.support import SyntheticSource, as_multiset, assert_matches_recompute
from tests.test_differential import DEFINITIONS, EXAMPLES, SLOW, epoch_lists, run_epochs
from tests.test_differential_sql import JOINS_AND_SUBQUERIES

SCHEMA = "k int, g string, d decimal(10,2), day date"
ROWS = [(k % 7 if k % 5 else None, f"g{k % 3}", Decimal(k) / 4, None) for k in range(60)]


BATCH_SCHEMA = f"k int, g string, d decimal(10,2), day date, x double, flag boolean, {WEIGHT} bigint"
BATCH_ROW = st.tuples(
    st.one_of(st.none(), st.integers(-2, 2)),
    st.sampled_from([None, "", "a", "b", "é"]),
    st.one_of(st.none(), st.sampled_from([Decimal("0.00"), Decimal("-1.50"), Decimal("2.25")])),
    st.one_of(st.none(), st.dates(min_value=date(1969, 12, 30), max_value=date(1970, 1, 2))),
    st.sampled_from([None, 0.0, -0.0, 1.5, float("nan"), float("inf")]),
    st.one_of(st.none(), st.booleans()),
    st.sampled_from([1, -1, 2]),
)


def _comparable_rows(rows) -> Counter:
    """Rows as a multiset, NaN made equal to itself (-0.0 already equals 0.0 in Python)."""
    return Counter(tuple("NaN" if isinstance(v, float) and v != v else v for v in row) for row in rows)


@settings(max_examples=10, deadline=None)
@given(rows=st.lists(BATCH_ROW, max_size=12))
def test_a_change_batch_consolidated_on_the_driver_equals_sparks(spark, rows):
    """consolidate_rows groups as Spark's consolidate does: NULL equal to NULL, -0.0 equal to 0.0,
    NaN equal to NaN, weights summed and zeros dropped, over every column type it takes."""
    batch = spark.createDataFrame(rows, BATCH_SCHEMA)
    want = _comparable_rows(tuple(row) for row in consolidate(batch).collect())
    got = consolidate_rows(batch.toArrow())
    assert got is not None and got.column_names == batch.columns
    assert _comparable_rows(zip(*[got.column(c).to_pylist() for c in got.column_names])) == want


def test_a_change_batch_of_nested_values_is_left_to_spark(spark):
    batch = spark.createDataFrame([([1, 2], 1)], f"a array<int>, {WEIGHT} bigint")
    assert consolidate_rows(batch.toArrow()) is None


def test_a_local_relation_keeps_every_row_across_empty_chunks(spark):
    empty = pa.record_batch({"x": pa.array([], pa.int64())})
    rows = pa.record_batch({"x": pa.array(range(100), pa.int64())})
    data = pa.Table.from_batches([rows, empty, rows, empty, empty, rows])
    schema = spark.createDataFrame([], "x long").schema
    local = SharedReads()._local(spark, data, schema, None)
    assert local.count() == 300
    assert local.agg(F.sum("x")).first()[0] == 3 * sum(range(100))


def test_an_empty_local_relation_of_a_struct_column_is_an_empty_frame(spark):
    """Found by the conformance suite (a STRUCT column, an outer join's affected keys read on the
    driver and matching no row): PySpark 4.1 cannot make a frame of an Arrow table with no chunk
    and a STRUCT column."""
    schema = spark.createDataFrame([], "id long, x struct<a:int,b:string>").schema
    data = pa.Table.from_batches([], pa.schema([("id", pa.int64()), ("x", pa.struct([("a", pa.int32()), ("b", pa.string())]))]))
    local = SharedReads()._local(spark, data.combine_chunks(), schema, None)
    assert local.count() == 0
    assert local.schema == schema


@pytest.fixture(scope="module")
def changed_table(spark, warehouse) -> str:
    """Several files, then a delete, an update and an append: versions 0 to 3."""
    path = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    (spark.createDataFrame(ROWS, SCHEMA).repartition(4).write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 3 AND g = 'g0'")
    spark.sql(f"UPDATE delta.`{path}` SET g = 'moved' WHERE k = 4")
    spark.createDataFrame([(3, "new", Decimal("0.5"), None), (None, "n", None, None)], SCHEMA) \
        .write.format("delta").mode("append").save(path)
    return path


@pytest.fixture(scope="module")
def held_reads(changed_table) -> SharedReads:
    """One SharedReads for every example: later key sets are subsets of what earlier reads hold,
    or widen it."""
    return SharedReads(None, driver_rows=1_000, columns={changed_table: {"k", "g"}})


@settings(SLOW, max_examples=4 * EXAMPLES)
@given(keys=st.lists(st.integers(0, 8), max_size=5, unique=True), nulls=st.booleans(),
       version=st.integers(0, 3))
def test_a_restricted_read_holds_every_row_of_its_keys(spark, changed_table, held_reads, keys, nulls, version):
    assert_reads_exactly_its_keys(spark, held_reads, changed_table, keys, nulls, version)


def assert_reads_exactly_its_keys(spark, reads: SharedReads, path: str, keys: list, nulls: bool, version: int):
    schema = spark.read.format("delta").load(path).schema
    restricted = reads.keys_frame(spark, path, version, schema, "k", tuple(sorted(keys)), nulls)
    assert restricted is not None
    assert sorted(restricted.columns) == ["g", "k"]
    wanted = F.col("k").isin(keys) | (F.col("k").isNull() if nulls else F.lit(False))
    spark_rows = spark.read.format("delta").option("versionAsOf", version).load(path).filter(wanted).select("k", "g")
    assert as_multiset(restricted.select("k", "g")) == as_multiset(spark_rows)  # exactly its keys' rows


@pytest.fixture(scope="module")
def scanned_reads(changed_table) -> SharedReads:
    """One SharedReads for every example whose versions are too large to hold whole at first
    (driver_rows=1): key sets are scanned, and a version's second scan reads its columns whole."""
    return SharedReads(None, driver_rows=1, key_rows=1_000, columns={changed_table: {"k", "g"}})


@settings(SLOW, max_examples=4 * EXAMPLES)
@given(keys=st.lists(st.integers(0, 8), max_size=5, unique=True), nulls=st.booleans(),
       version=st.integers(0, 3), budget=st.sampled_from([0, 1 << 20]))
def test_keys_read_from_a_version_held_whole_are_every_row_of_them(spark, changed_table, scanned_reads, keys,
                                                                  nulls, version, budget):
    scanned_reads.held_bytes = budget  # 0: no room, every read scans
    assert_reads_exactly_its_keys(spark, scanned_reads, changed_table, keys, nulls, version)


def test_a_version_scanned_twice_is_held_whole_within_its_budget(spark, changed_table):
    path = changed_table
    schema = spark.read.format("delta").load(path).schema
    for budget, held in ((1 << 20, True), (0, False)):
        reads = SharedReads(None, driver_rows=1, key_rows=1_000, columns={path: {"k", "g"}}, held_bytes=budget)
        for keys in ((1,), (2,), (5, 6)):
            found = reads.keys_frame(spark, path, 2, schema, "k", keys)
            assert as_multiset(found.select("k", "g")) == as_multiset(
                spark.read.format("delta").option("versionAsOf", 2).load(path).filter(F.col("k").isin(list(keys)))
                .select("k", "g"))
        whole = reads._reads.get(("read columns", path, 2))
        assert (whole is not None) == held
        if held:
            assert whole.num_rows == spark.read.format("delta").option("versionAsOf", 2).load(path).count()
            assert sorted(whole.column_names) == ["g", "k"]


def test_a_restricted_read_beyond_its_rows_is_left_to_spark(spark, changed_table):
    path = changed_table
    schema = spark.read.format("delta").load(path).schema
    assert SharedReads(None, driver_rows=5, key_rows=5).keys_frame(spark, path, 0, schema, "k", (1, 2)) is None
    assert SharedReads(None, driver_rows=5).keys_frame(spark, path, 0, schema, "k", (1, 2)) is not None  # 10 x 5 rows
    assert SharedReads(None, driver_rows=5).keys_frame(spark, path, 0, schema, "g", (1, 2)) is None  # int keys, string column


def test_keys_whose_subset_was_refused_are_not_read_again(spark, changed_table):
    """A read refused for its rows is made once, and a later read of more keys (which match at
    least those rows) is refused without reading; fewer keys are read."""
    path = changed_table
    schema = spark.read.format("delta").load(path).schema
    reads = SharedReads(None, driver_rows=5, key_rows=8)  # keys 1 and 2: 7 and 8 rows
    made = []
    timed_read = reads._read_for_keys
    reads._read_for_keys = lambda *arguments: made.append(arguments[3]) or timed_read(*arguments)
    assert reads.keys_frame(spark, path, 0, schema, "k", (1, 2)) is None
    assert made == [(1, 2)]
    assert reads.keys_frame(spark, path, 0, schema, "k", (1, 2, 5)) is None
    assert reads.keys_frame(spark, path, 0, schema, "k", (1, 2), nulls=True) is None
    assert made == [(1, 2)]
    single = reads.keys_rows(path, 0, "k", (1,))
    assert made[-1] == (1,) and single is not None and set(single.column("k").to_pylist()) == {1}


def test_a_read_of_keys_partly_held_reads_only_the_keys_not_held(spark, changed_table):
    """Each step of a refresh asks for its own keys: the keys an earlier read holds are filtered
    from its rows, and only the others are read (an arrangement's read costs per key)."""
    path = changed_table
    schema = spark.read.format("delta").load(path).schema
    reads = SharedReads(None, driver_rows=1, key_rows=1_000, columns={path: {"k", "g"}}, held_bytes=0)
    made = []
    timed_read = reads._read_for_keys
    reads._read_for_keys = lambda *arguments: made.append((arguments[3], arguments[4])) or timed_read(*arguments)
    version = spark.read.format("delta").option("versionAsOf", 3)
    for keys, nulls, read in (((1, 2), False, ((1, 2), False)), ((2, 5), False, ((5,), False)),
                              ((1, 5), False, None), ((5,), True, ((), True)), ((1, 2, 5), True, None)):
        before = len(made)
        found = reads.keys_frame(spark, path, 3, schema, "k", keys, nulls)
        assert made[before:] == ([read] if read is not None else [])
        wanted = F.col("k").isin(list(keys)) | (F.col("k").isNull() if nulls else F.lit(False))
        assert as_multiset(found.select("k", "g")) == as_multiset(version.load(path).filter(wanted).select("k", "g"))


@pytest.fixture(scope="module")
def clustered_table(spark, warehouse) -> str:
    """Files of disjoint key ranges, as a range-partitioned load leaves them (NULL keys in the
    first), then an update rewriting one file and an append of new keys: versions 0 to 2."""
    path = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    rows = [(k if k % 11 else None, f"g{k % 3}", Decimal(k) / 4, date(2020, 1, 1) + timedelta(days=k)) for k in range(80)]
    (spark.createDataFrame(rows, SCHEMA).repartitionByRange(4, "k").write.format("delta")
     .option("delta.enableChangeDataFeed", "true").save(path))
    spark.sql(f"UPDATE delta.`{path}` SET g = 'moved' WHERE k = 45")
    spark.createDataFrame([(200, "new", None, date(2021, 1, 1)), (201, "new", None, None)], SCHEMA) \
        .write.format("delta").mode("append").save(path)
    return path


def test_files_whose_statistics_miss_every_key_are_not_read(clustered_table):


    table = DeltaTable(clustered_table, version=0)
    dataset = table.to_pyarrow_dataset()
    every = len(list(dataset.get_fragments()))
    one_key = files_holding(table, dataset, "k", pa.array([75], pa.int32()), False)
    assert len(list(one_key.get_fragments())) == 1 < every
    days = pa.array([date(2020, 1, 1) + timedelta(days=75)], pa.date32())
    assert len(list(files_holding(table, dataset, "day", days, False).get_fragments())) == 2  # NULL keys' file too
    assert len(list(files_holding(table, dataset, "k", pa.array([75], pa.int32()), True).get_fragments())) == 2
    assert len(list(files_holding(table, dataset, "k", pa.array([], pa.int32()), True).get_fragments())) == 1
    assert files_holding(table, dataset, "g", pa.array(["g1"]), False) is dataset  # strings: truncated statistics


@pytest.fixture(scope="module")
def row_grouped_table(spark, warehouse) -> str:
    """One file sorted by k in row groups of 7 rows (as a join's keyed state is laid out), NULL
    keys and dates among them, written by delta-rs; version 1 appends a file of unsorted keys."""
    path = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    ks = sorted(range(0, 120, 2), key=lambda k: (k % 13 != 0, k))  # NULLs (k % 13 == 0) first, then sorted
    first = pa.table({"k": pa.array([k if k % 13 else None for k in ks], pa.int32()),
                      "day": pa.array([date(2020, 1, 1) + timedelta(days=k) if k % 17 else None for k in ks],
                                      pa.date32())})
    write_deltalake(path, first, writer_properties=WriterProperties(max_row_group_size=7),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"k": pa.array([5, 90, None], pa.int32()),
                                    "day": pa.array([None, date(2021, 1, 1), date(2020, 1, 3)], pa.date32())}),
                    mode="append")
    return path


@pytest.mark.parametrize("layout", ["clustered_table", "row_grouped_table"])
@settings(SLOW, max_examples=4 * EXAMPLES)
@given(keys=st.lists(st.integers(-2, 210), max_size=6, unique=True), nulls=st.booleans(),
       version=st.integers(0, 2), column=st.sampled_from(["k", "day"]))
def test_a_restricted_read_skipping_files_and_row_groups_finds_every_row(spark, request, layout, keys, nulls,
                                                                         version, column):
    """Files and row groups whose statistics admit none of the keys are skipped (files_holding);
    the rows read are still exactly the keys' rows, NULLs included when asked."""
    path = request.getfixturevalue(layout)
    version = min(version, {"clustered_table": 2, "row_grouped_table": 1}[layout])
    schema = spark.read.format("delta").load(path).schema
    values = tuple(sorted(keys)) if column == "k" else tuple(sorted(date(2020, 1, 1) + timedelta(days=k) for k in keys))
    restricted = SharedReads(None, driver_rows=1, key_rows=1_000).keys_frame(
        spark, path, version, schema, column, values, nulls)  # too large to hold whole: scanned for the keys
    assert restricted is not None
    wanted = F.col(column).isin(list(values)) | (F.col(column).isNull() if nulls else F.lit(False))
    spark_rows = spark.read.format("delta").option("versionAsOf", version).load(path).filter(wanted)
    assert as_multiset(restricted.select(*spark_rows.columns)) == as_multiset(spark_rows)


def test_row_groups_whose_statistics_miss_every_key_are_not_read(row_grouped_table):


    table = DeltaTable(row_grouped_table, version=0)
    dataset = table.to_pyarrow_dataset()
    (whole,) = dataset.get_fragments()
    groups = whole.metadata.num_row_groups

    def read(column, values, nulls):
        return [f.row_groups for f in files_holding(table, dataset, column, values, nulls).get_fragments()]

    (one_key,) = read("k", pa.array([50], pa.int32()), False)
    assert len(one_key) == 1 < groups
    (with_nulls,) = read("k", pa.array([50], pa.int32()), True)
    assert len(with_nulls) == 2  # the NULL keys' row group too
    (only_nulls,) = read("k", pa.array([], pa.int32()), True)
    assert len(only_nulls) == 1  # NULLs alone: their row group
    assert read("k", pa.array([51], pa.int32()), False) == [[g for g in one_key]]  # in range, absent: still read
    assert read("k", pa.array([1000], pa.int32()), False) == []


RESTRICTED = {name: DEFINITIONS[name] for name in ("joined", "joined_agg", "diamond", "left_path", "right_path")} | {
    name: JOINS_AND_SUBQUERIES[name] for name in ("left_outer", "with_partner", "without_partner", "not_in_nulls")} | {
    # TPC-H Q21's shape: semi- and anti-joins over a join, each read for the affected keys
    "exists_over_join": "SELECT a.k, a.g, b.name FROM a JOIN b ON a.k = b.k "
                        "WHERE EXISTS (SELECT 1 FROM a a2 WHERE a2.k = a.k AND a2.g <> a.g) "
                        "AND NOT EXISTS (SELECT 1 FROM b b2 WHERE b2.k = a.k AND b2.name <> b.name)",
}


DRIVER_ROWS = 2  # the synthetic sources (6 and 5 rows) are too large to be read whole on the driver


@pytest.mark.long  # a further differential run; make test-long
@SLOW
@given(epochs=epoch_lists(min_size=2, max_size=3))
def test_co_generators_read_for_their_keys_on_the_driver_match_recompute(spark, warehouse, epochs):
    """Join terms and affected-key recomputes read their partners' rows for the change's keys on
    the driver (a read finding more than DRIVER_ROWS rows goes to Spark), and stay exact. Every
    input read by key is arranged after the refresh that read it (arrange_rows=0), so the first
    epoch scans for its keys and later ones read the arrangement plus its change feed since
    (tests/test_arrangements.py shows both are made)."""
    run_epochs(spark, warehouse, RESTRICTED, epochs, driver_rows=DRIVER_ROWS, arrange_rows=0)


@pytest.mark.long  # the reads counted over a further run; make test-long
def test_restricted_reads_are_made_and_counted(spark, warehouse):
    """A key changed on each side: the join terms and the semi-joins read the other side's rows of
    that key as restricted versions (the step's cost counts them), and the tables stay exact."""
    epochs = [([("delete_key", 4)], [("rename", 1, "uno")]), ([("move_key", "y", 1)], [])]
    shapes = {name: RESTRICTED[name] for name in ("joined", "with_partner", "exists_over_join")}
    reports = run_epochs(spark, warehouse, shapes, epochs, driver_rows=DRIVER_ROWS)
    restricted = Counter()
    for report in reports:
        if report.technique == "incremental":
            restricted[report.table] += report.detail["cost"]["restricted_version_reads"]
    assert all(restricted[name] > 0 for name in shapes), restricted


@pytest.mark.parametrize("keys, nulls", [((True,), False), ((True,), True), ((False,), True), ((), True)])
def test_a_restricted_read_by_a_boolean_key_finds_its_rows(spark, warehouse, keys, nulls):
    """Spark's Delta keeps a BOOLEAN column's null count but no min/max; delta-rs builds each
    file's guarantee from them as `flag >= null and flag <= null`, and a scan filtered by the
    scanner then found no rows at all (the conformance suite's anti join over BOOLEAN on the Spark
    path missed the rows whose key turned True). The read filters after the scan
    (keyed_files.filtered_batches)."""
    path = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    schema = "id int, flag boolean"
    spark.createDataFrame([(1, None), (2, True), (3, False)], schema).write.format("delta").save(path)
    spark.createDataFrame([(4, True), (5, None)], schema).write.format("delta").mode("append").save(path)
    spark.sql(f"UPDATE delta.`{path}` SET flag = true WHERE id = 1")
    reads = SharedReads(None, driver_rows=1, key_rows=1_000, columns={path: {"id", "flag"}})
    restricted = reads.keys_frame(spark, path, 2, spark.read.format("delta").load(path).schema, "flag", keys, nulls)
    assert restricted is not None
    wanted = F.col("flag").isin(list(keys)) | (F.col("flag").isNull() if nulls else F.lit(False))
    spark_rows = spark.read.format("delta").option("versionAsOf", 2).load(path).filter(wanted).select("id", "flag")
    assert as_multiset(restricted.select("id", "flag")) == as_multiset(spark_rows)


@settings(SLOW, max_examples=4 * EXAMPLES)
@given(column=st.sampled_from(["k", "d"]), version=st.integers(0, 3),
       bounds=st.tuples(st.decimals(-2, 16, places=3), st.decimals(-2, 16, places=3)).map(sorted))
def test_a_range_read_holds_every_row_within_its_span(spark, changed_table, held_reads, column, version, bounds):
    """range_frame_and_rows against Spark's rows of the same version whose column lies in the span
    (bounds finer than the column: rounded outward, so the read holds every row within them, and
    at most the rows of the column's values at the rounded bounds more)."""
    low, high = bounds
    schema = spark.read.format("delta").load(changed_table).schema
    found = held_reads.range_frame_and_rows(spark, changed_table, version, schema, column, low, high)
    assert found is not None
    frame, rows = found
    assert sorted(rows.column_names) == sorted({"k", "g", column})
    version_rows = spark.read.format("delta").option("versionAsOf", version).load(changed_table)
    within = version_rows.filter(F.col(column).between(F.lit(low), F.lit(high))).select("k", "g", column)
    unit = 1 if column == "k" else 100  # an INT's span widens to whole numbers, a DECIMAL(10,2)'s to cents
    widened = version_rows.filter(F.col(column).between(F.lit(Decimal(math.floor(low * unit)) / unit),
                                                        F.lit(Decimal(math.ceil(high * unit)) / unit)))
    got = as_multiset(frame.select("k", "g", column))
    assert as_multiset(within) <= got <= as_multiset(widened.select("k", "g", column))


def test_a_span_the_column_cannot_hold_is_not_read_on_the_driver():
    assert widened_bounds(Decimal("1.234"), Decimal("5.001"), pa.decimal128(10, 2)) == \
        (pa.scalar(Decimal("1.23"), pa.decimal128(10, 2)), pa.scalar(Decimal("5.01"), pa.decimal128(10, 2)))
    assert widened_bounds(-1.5, 2.25, pa.int32()) == (pa.scalar(-2, pa.int32()), pa.scalar(3, pa.int32()))
    assert widened_bounds(Decimal("1e12"), Decimal("1e13"), pa.decimal128(10, 2)) is None  # past its precision
    assert widened_bounds(0, 2 ** 40, pa.int32()) is None
    assert widened_bounds(1.0, 2.0, pa.float64()) is None  # NaN orders above every number
    assert widened_bounds("a", "b", pa.string()) is None
    assert widened_bounds(date(2020, 1, 1), date(2020, 3, 1), pa.date32()) == \
        (pa.scalar(date(2020, 1, 1), pa.date32()), pa.scalar(date(2020, 3, 1), pa.date32()))


# TPC-H Q11's and Q15's shapes: an aggregate compared with a scalar subquery over its own rows;
# Q15's named: the groups of the maximum joined to a table past driver_rows, read for their keys
WHOLE_STATES = {
    "above_a_share": "SELECT g, sum(d) AS s FROM parts GROUP BY g HAVING sum(d) > (SELECT sum(d) * 0.018 FROM parts)",
    "the_largest": "WITH totals AS (SELECT g, sum(d) AS s FROM parts GROUP BY g) "
                   "SELECT g, s FROM totals WHERE s = (SELECT max(s) FROM totals)",
    "the_largest_named": "WITH totals AS (SELECT g, sum(d) AS s FROM parts GROUP BY g) "
                         "SELECT n.g, n.name, t.s FROM names n JOIN totals t ON n.g = t.g "
                         "WHERE t.s = (SELECT max(s) FROM totals)",
}
GROUPS = 100  # the aggregates' groups: past WHOLE_DRIVER_ROWS, within 10 times it (the reads' key_rows)
# above each epoch's change rows (at most three inserted, one deleted) and the outputs' rows (the
# groups above 1.8% of the total, the largest, as Q11's few at scale 10): the outputs are read
# whole (protocol.output), and what is read past driver_rows is the states only
WHOLE_DRIVER_ROWS = 20
PART_ROW = st.tuples(st.integers(0, GROUPS - 1), st.sampled_from([Decimal("-3.00"), Decimal("0.50"), Decimal("7.50")]))


@SLOW
@given(batches=st.lists(st.tuples(st.lists(PART_ROW, max_size=3), st.integers(0, GROUPS - 1)), min_size=2, max_size=3,
                       unique_by=lambda batch: batch[1]))  # each epoch deletes a row: no epoch is a no-op
def test_a_state_past_driver_rows_read_whole_is_finalized_on_the_driver(spark, warehouse, batches):
    """An aggregate's state read whole (a scalar subquery over it, or the view joined with its
    maximum) with more rows than `driver_rows` but within the reads' `key_rows` is read by
    delta-rs and finalized on the driver, and a table joined to the groups of the maximum is read
    for their keys: the incremental steps run no Spark job, and every table equals its recompute
    after every epoch."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    parts = SyntheticSource(spark, f"{root}/sources/parts", "g int, d decimal(10,2)",
                            [(g, Decimal(g) + Decimal("0.25")) for g in range(GROUPS)])
    SyntheticSource(spark, f"{root}/sources/names", "g int, name string", [(g, f"group {g}") for g in range(GROUPS)])
    engine = Engine(spark, root, cost_model=False, driver_rows=WHOLE_DRIVER_ROWS)
    engine.source("parts")
    engine.source("names")
    engine.define_all(WHOLE_STATES)
    engine.refresh()
    for inserted, deleted in batches:
        parts.insert(inserted)
        parts.delete(f"g = {deleted} AND d = {deleted}.25")  # the group's first row (no insert ends in .25)
        reports = engine.refresh()
        assert_matches_recompute(engine, context=f"after inserting {inserted} and deleting group {deleted}")
        jobs = {r.table: r.detail["cost"]["spark_jobs"] for r in reports if r.technique == "incremental"}
        assert set(jobs) == set(WHOLE_STATES) and not any(jobs.values()), \
            (jobs, [(r.table, r.technique, r.reason) for r in reports])


KEPT_ROWS = 80  # the outputs' rows, past KEPT_DRIVER_ROWS after any epochs' deletes: not read whole
KEPT_DRIVER_ROWS = 40  # above each epoch's change rows (at most five deleted, four updated, four inserted)
ITEM = st.tuples(st.one_of(st.none(), st.integers(0, 9)), st.sampled_from(["x", "y"]), st.sampled_from([Decimal("1.00"), Decimal("2.50")]))


@SLOW
@given(batches=st.lists(st.tuples(st.lists(ITEM, max_size=4), st.one_of(st.none(), st.integers(0, 9)), st.integers(0, 9)),
                        min_size=2, max_size=3, unique_by=(lambda batch: batch[1], lambda batch: batch[2])))
def test_a_large_multiset_output_counts_a_deleted_rows_copies_on_the_driver(spark, warehouse, batches):
    """A delete from an output with no key and more rows than `driver_rows` counts the copies it
    holds of each deleted row from the rows sharing the row's first column, read on the driver
    (NULLs too), not by a Spark scan of the output: the incremental steps run no Spark job, and
    the table equals its recompute after every epoch (duplicates, NULL keys, copies that remain)."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    # about four copies of each row; a delete takes those of d 2.50 only, so of (g, k) some copies remain
    start = [(k % 10 if k % 7 else None, "xy"[k % 2], Decimal("2.50") if k // 10 % 2 else Decimal("1.00"))
             for k in range(KEPT_ROWS)]
    items = SyntheticSource(spark, f"{root}/sources/items", "k int, g string, d decimal(10,2)", start)
    engine = Engine(spark, root, cost_model=False, driver_rows=KEPT_DRIVER_ROWS)
    engine.source("items")
    engine.define_all({"kept": "SELECT k, g, d FROM items WHERE d > 0", "kept_by_g": "SELECT g, k FROM items WHERE k IS NULL OR k > 0"})
    engine.refresh()
    for inserted, deleted, updated in batches:
        items.insert(inserted)
        items.delete(f"k {'IS NULL' if deleted is None else f'= {deleted}'} AND d = 2.50")
        items.update(f"k = {updated} AND d = 1.00", {"d": "d + 1"})
        reports = engine.refresh()
        assert_matches_recompute(engine, context=f"after inserting {inserted}, deleting {deleted}, updating {updated}")
        jobs = {r.table: r.detail["cost"]["spark_jobs"] for r in reports if r.technique == "incremental"}
        assert set(jobs) == {"kept", "kept_by_g"} and not any(jobs.values()), \
            (jobs, [(r.table, r.technique, r.reason) for r in reports])
