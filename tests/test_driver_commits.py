"""Driver commits (epochal/storage/commits.py): change-sized writes through delta-rs must leave the
table equal to the applied change and record a change data feed equal to the bag difference of
the versions around each commit (read by Spark, as downstream tables read it), with duplicate
rows and NULLs, for both shapes the engine writes: keyed (MERGE by a unique key) and multiset
(delete every copy of a row, insert the copies that remain; appends when nothing is deleted).
The tables are created by Spark, as the engine's first write creates them."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from epochal.graph import WEIGHT
from epochal.protocol.writes import copies_in, keyed_source, multiset_source
from epochal.storage import commits as driver_commits
from tests.support import as_multiset, feed_problems, local_frame

SCHEMA = "k int, g string, d decimal(10,2)"
COLUMNS = ["k", "g", "d"]
ROW = st.tuples(st.one_of(st.none(), st.integers(0, 3)), st.sampled_from([None, "x", "Y"]),
                st.one_of(st.none(), st.sampled_from([Decimal("1.50"), Decimal("-2.25")])))
INITIAL = [(1, "x", Decimal("1.50")), (1, "x", Decimal("1.50")), (None, None, None), (2, "Y", None)]
SETTINGS = settings(max_examples=int(os.environ.get("EPOCHAL_EXAMPLES", "2")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _create(spark, root: str, rows) -> str:
    path = f"{root}/{uuid.uuid4().hex[:8]}"
    local_frame(spark, rows, spark.createDataFrame([], SCHEMA).schema).write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(path)
    return path


def _change_frame(spark, weights: Counter):
    schema = StructType(list(spark.createDataFrame([], SCHEMA).schema.fields) + [StructField(WEIGHT, LongType())])
    return local_frame(spark, [(*row, weight) for row, weight in weights.items() if weight], schema)


@st.composite
def multiset_changes(draw):
    """Three changes, each deleting some copies of rows the table holds and inserting new ones."""
    held = Counter(INITIAL)
    changes = []
    for _ in range(3):
        change = Counter()
        for row in draw(st.lists(st.sampled_from(sorted(held, key=repr)), max_size=3, unique=True)) if held else []:
            change[row] -= draw(st.integers(1, held[row]))
        for row in draw(st.lists(ROW, max_size=3)):
            change[row] += 1
        change = Counter({row: w for row, w in change.items() if w})
        held.update(change)
        held = Counter({row: n for row, n in held.items() if n > 0})
        changes.append(change)
    return changes


def _multiset_source(spark, path: str, change: Counter, seq: int, shaped_on: str):
    """The MERGE source of a multiset change, shaped as the engine shapes it: by Spark
    (writes.multiset_source), or on the driver (driver_commits.multiset_rows) with the copies
    counted from a delta-rs read of the table (odd seq) or by Spark (writes.copies_in)."""
    frame = _change_frame(spark, change)
    deletes = any(w < 0 for w in change.values())
    base = spark.read.format("delta").load(path) if deletes else None
    if shaped_on == "spark":
        source, persisted = multiset_source(frame, COLUMNS, base)
        rows = source.toArrow()
        for persisted_frame in persisted:
            persisted_frame.unpersist()
        return rows
    rows = frame.toArrow()
    copies = None
    if deletes and seq % 2:
        minus = rows.filter(pc.less(rows.column(WEIGHT), 0))
        copies = driver_commits.copies_of(DeltaTable(path).to_pyarrow_table(), minus, COLUMNS)
    elif deletes:
        copies = copies_in(base, frame, COLUMNS)
    return driver_commits.multiset_rows(rows, COLUMNS, copies)


@SETTINGS
@given(changes=multiset_changes())
@pytest.mark.parametrize("shaped_on", [pytest.param("spark", marks=pytest.mark.long), "driver"])  # the Spark twin: make test-long
def test_multiset_commits_apply_the_change_and_record_it_exactly(spark, tmp_path_factory, changes, shaped_on):
    root = str(tmp_path_factory.mktemp("multiset"))
    path = _create(spark, root, INITIAL)
    expected = Counter(INITIAL)
    for seq, change in enumerate(changes, start=1):
        rows = _multiset_source(spark, path, change, seq, shaped_on)
        table = driver_commits.open_unwritten(path, "test/multiset", seq)
        if any(w < 0 for w in change.values()):
            driver_commits.merge_multiset(table, rows, COLUMNS, "test/multiset", seq, "tag")
        else:
            driver_commits.append(table, rows.drop_columns([driver_commits.OP]), "test/multiset", seq, "tag")
        expected.update(change)
        assert as_multiset(spark.read.format("delta").load(path)) == +expected
    assert not feed_problems(path, spark)


def test_copies_are_counted_as_spark_compares_rows():
    """NULL equals NULL, NaN equals NaN, arrays and structs by their elements."""
    wanted = pa.table({"f": [float("nan"), None, 1.0], "a": [[1, None], None, []], "s": [{"x": 1}, {"x": None}, None]})
    base = pa.concat_tables([wanted, wanted.slice(0, 1), pa.table({"f": [1.0], "a": [[]], "s": [{"x": 2}]},
                                                                    schema=wanted.schema)])
    assert driver_commits.copies_of(base, wanted, ["f", "a", "s"]).column(driver_commits.COPIES).to_pylist() == [2, 1, 1]


def test_copies_of_flat_rows_are_counted_in_arrow_as_spark_compares_them():
    """The same in Arrow's encoding of flat columns: NULL, NaN and -0.0 as Spark groups them."""
    nan = float("nan")
    wanted = pa.table({"f": [nan, None, 0.0, 1.0], "s": ["a", None, "b", "c"],
                       "d": pa.array([Decimal("1.5"), None, None, Decimal("2")], pa.decimal128(5, 2))})
    base = pa.concat_tables([wanted.slice(0, 3), wanted.slice(0, 2), pa.table(
        {"f": [-0.0, 1.0], "s": ["b", "x"], "d": [None, Decimal("2")]}, schema=wanted.schema)])
    assert driver_commits.copies_of(base, wanted, ["f", "s", "d"]).column(driver_commits.COPIES).to_pylist() == \
        [2, 2, 2, 0]


@st.composite
def keyed_changes(draw):
    """Three changes to a table keyed by k: updates (-old +new), inserts of new keys, deletes."""
    held = {1: (1, "x", Decimal("1.50")), None: (None, None, None), 2: (2, "Y", None)}
    changes = []
    for _ in range(3):
        change = Counter()
        for key in draw(st.lists(st.sampled_from([None, 0, 1, 2, 3]), max_size=3, unique=True)):
            new = (key, *draw(ROW)[1:]) if draw(st.booleans()) else None
            old = held.get(key)
            if old == new:
                continue
            if old is not None:
                change[old] -= 1
                del held[key]
            if new is not None:
                change[new] += 1
                held[key] = new
        changes.append(change)
    return changes


@SETTINGS
@given(changes=keyed_changes())
def test_keyed_commits_apply_the_change_and_record_it_exactly(spark, tmp_path_factory, changes):
    root = str(tmp_path_factory.mktemp("keyed"))
    initial = [(1, "x", Decimal("1.50")), (None, None, None), (2, "Y", None)]
    path = _create(spark, root, initial)
    expected = Counter(initial)
    for seq, change in enumerate(changes, start=1):
        source = keyed_source(_change_frame(spark, change), COLUMNS, ["k"])
        table = driver_commits.open_unwritten(path, "test/keyed", seq)
        driver_commits.merge_keyed(table, source.toArrow(), COLUMNS, ["k"], "test/keyed", seq, "tag")
        expected.update(change)
        assert as_multiset(spark.read.format("delta").load(path)) == +expected
    assert not feed_problems(path, spark)


def test_a_commit_is_written_once_per_app_id_and_seq(spark, tmp_path):
    path = _create(spark, str(tmp_path), INITIAL)
    source, _ = multiset_source(_change_frame(spark, Counter({(3, "x", None): 1})), COLUMNS, None)
    rows = source.drop(driver_commits.OP).toArrow()
    driver_commits.append(driver_commits.open_unwritten(path, "test/once", 4), rows, "test/once", 4, '{"t": 1}')
    assert driver_commits.open_unwritten(path, "test/once", 4) is None  # a rerun of seq 4 skips
    assert driver_commits.open_unwritten(path, "test/once", 3) is None  # so does an older seq
    assert driver_commits.open_unwritten(path, "test/once", 5) is not None
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert history[-1]["userMetadata"] == '{"t": 1}'
    assert as_multiset(spark.read.format("delta").load(path))[(3, "x", None)] == 1


def test_a_concurrent_commit_of_the_same_app_id_is_refused(spark, tmp_path):
    from deltalake.exceptions import CommitFailedError

    path = _create(spark, str(tmp_path), INITIAL)
    source, _ = multiset_source(_change_frame(spark, Counter({(3, "x", None): 1})), COLUMNS, None)
    rows = source.drop(driver_commits.OP).toArrow()
    first, second = (driver_commits.open_unwritten(path, "test/race", 1) for _ in range(2))
    driver_commits.append(first, rows, "test/race", 1, "tag")
    with pytest.raises(CommitFailedError):
        driver_commits.append(second, rows, "test/race", 1, "tag")
    assert as_multiset(spark.read.format("delta").load(path))[(3, "x", None)] == 1


def test_a_replacing_write_on_the_driver_makes_the_table_spark_would(spark, tmp_path):
    """A first epoch's output of a small table is created by delta-rs (writes.replace_contents):
    the table must be the one Spark's write creates (columns nullable, the same types, the change
    data feed on), take Spark's and delta-rs's later commits, skip a rerun of its step, and record
    an exact feed from its first version on, overwrites included."""
    from epochal.protocol.writes import apply_multiset, replace_contents, writer

    frame = spark.createDataFrame(INITIAL, SCHEMA).selectExpr("k", "g", "d", "k IS NULL AS b", "date_from_unix_date(k) AS e",
                                                             "timestamp'2026-01-02 03:04:05' AS t")
    by_spark, by_driver = f"{tmp_path}/spark", f"{tmp_path}/driver"
    assert not replace_contents(frame, by_spark, "test/replace", 1, "tag", change_data_feed=True)
    assert replace_contents(frame, by_driver, "test/replace", 1, "tag", driver_rows=10, change_data_feed=True)
    replace_contents(frame.limit(1), by_driver, "test/replace", 1, "tag", driver_rows=10)  # a rerun: skipped
    assert DeltaTable(by_driver).version() == 0
    spark_table, driver_table = (spark.read.format("delta").load(p) for p in (by_spark, by_driver))
    assert driver_table.schema == spark_table.schema
    assert as_multiset(driver_table) == as_multiset(spark_table)
    assert DeltaTable(by_driver).metadata().configuration["delta.enableChangeDataFeed"] == "true"

    deleted = Counter({(1, "x", Decimal("1.50")): -1, (4, None, None): 1})
    change = _change_frame(spark, deleted).selectExpr("k", "g", "d", "false AS b", "date_from_unix_date(k) AS e",
                                                           "timestamp'2026-01-02 03:04:05' AS t", WEIGHT)
    columns = ["k", "g", "d", "b", "e", "t"]
    source, persisted = multiset_source(change, columns, spark.read.format("delta").load(by_driver))
    apply_multiset(spark, by_driver, source, columns, contextlib.nullcontext(),
                   lambda f: writer(f, "test/replace", 2, "tag"))
    for frame_ in persisted:
        frame_.unpersist()
    bigger = frame.unionByName(frame).withColumn("k", frame.k + 1)
    assert replace_contents(bigger, by_driver, "test/replace", 3, "tag", driver_rows=10)
    assert as_multiset(spark.read.format("delta").load(by_driver)) == as_multiset(bigger)
    assert not feed_problems(by_driver, spark, first=0)
    assert replace_contents(bigger.drop("t"), by_driver, "test/replace", 4, "tag", driver_rows=10)  # new schema
    assert as_multiset(spark.read.format("delta").load(by_driver)) == as_multiset(bigger.drop("t"))
    assert not replace_contents(bigger, f"{tmp_path}/over", "test/replace", 1, "tag", driver_rows=5)  # too many
    # the rows the table held decide the way: past the limit Spark's write, whatever the result's size ...
    assert not replace_contents(frame, by_driver, "test/replace", 5, "tag", driver_rows=10, expected_rows=11)
    assert as_multiset(spark.read.format("delta").load(by_driver)) == as_multiset(frame)
    restored = DeltaTable(by_driver).version()  # the change feed does not cross the schema changes before it
    # ... within it a collect, and Spark's write after all when the result outgrew the limit
    assert replace_contents(frame, by_driver, "test/replace", 6, "tag", driver_rows=10, expected_rows=len(INITIAL))
    assert not replace_contents(bigger, by_driver, "test/replace", 7, "tag", driver_rows=len(INITIAL),
                                expected_rows=len(INITIAL))
    assert as_multiset(spark.read.format("delta").load(by_driver)) == as_multiset(bigger)
    assert not feed_problems(by_driver, spark, first=restored + 1)


def test_a_nan_matches_every_nan_as_spark_compares_them(spark, tmp_path):
    """x86 arithmetic on the driver (inf - inf in Python or numpy) yields a NaN with its sign bit
    set, Spark writes the positive one; both are NaN, and Spark's `<=>` holds them equal. A
    driver commit that deletes a row holding NaN must match the table's copy whichever NaN each
    side carries (a rescan's diff once left the old NaN row in place beside the new one)."""
    import numpy as np

    negative_nan = np.array([0xFFF8000000000000], np.uint64).view(np.float64)
    assert np.isnan(negative_nan[0]) and np.signbit(negative_nan[0])
    schema = "k int, x double, y float"
    columns = ["k", "x", "y"]
    path = str(tmp_path / "nan")
    spark.createDataFrame([(0, 1.0, 1.0)], schema).write.format("delta") \
        .option("delta.enableChangeDataFeed", "true").save(path)
    held = pa.table({"k": pa.array([1, 2], pa.int32()), "x": pa.array(np.repeat(negative_nan, 2)),
                     "y": pa.array(np.repeat(negative_nan, 2)).cast(pa.float32())})
    driver_commits.append(driver_commits.open_unwritten(path, "test/nan", 1), held, "test/nan", 1, "tag")
    change_schema = StructType(list(spark.createDataFrame([], schema).schema.fields) + [StructField(WEIGHT, LongType())])
    nan = float("nan")

    multiset_change = spark.createDataFrame([(1, nan, nan, -1), (1, 2.0, 2.0, 1)], change_schema).toArrow()
    copies = driver_commits.copies_of(DeltaTable(path).to_pyarrow_table(), multiset_change.slice(0, 1), columns)
    assert copies.column(driver_commits.COPIES).to_pylist() == [1]
    rows = driver_commits.multiset_rows(multiset_change, columns, copies)
    driver_commits.merge_multiset(driver_commits.open_unwritten(path, "test/nan", 2), rows, columns, "test/nan", 2, "tag")

    keyed_change = spark.createDataFrame([(2, nan, nan, -1)], change_schema)
    source = keyed_source(keyed_change, columns, ["x"]).toArrow()
    driver_commits.merge_keyed(driver_commits.open_unwritten(path, "test/nan", 3), source, columns, ["x"], "test/nan", 3, "tag")

    assert sorted(spark.read.format("delta").load(path).collect()) == [(0, 1.0, 1.0), (1, 2.0, 2.0)]
    assert not feed_problems(path, spark)


def test_floating_point_inside_nested_columns_is_left_to_sparks_merge():
    """delta-rs compares an array, map or struct bit for bit, so NaN (and -0.0) inside one would
    not match as Spark's `<=>` does: such columns are matched by Spark's MERGE instead."""
    assert driver_commits.matches_as_spark([DoubleType(), IntegerType(), ArrayType(IntegerType()),
                                            StructType([StructField("a", StringType())])])
    for nested in (ArrayType(DoubleType()), MapType(StringType(), DoubleType()),
                   StructType([StructField("a", ArrayType(DoubleType()))])):
        assert not driver_commits.matches_as_spark([IntegerType(), nested])
