"""Writing an epoch step: the derived table's change and the state tables' appends.

Every write carries Delta's idempotent-write identity (app id = the table or state table, version =
the ledger step's `seq`) and is tagged in its commit's userMetadata with the table and `seq`, so a
step run again after a crash skips what it already wrote, and the versions it wrote can be found
in the tables' histories. The change is first shaped into MERGE source rows (`keyed_source`,
`multiset_source`); a change of at most `Engine.driver_rows` rows is then committed on the driver
(storage/commits.py), a larger one by Spark (`apply_keyed`, `apply_multiset`, `write_state`).
Each Spark write holds the table's commit lock on a local path (storage/commit_lock.py: `save`,
`merge_sql`).
"""

from __future__ import annotations

import json
import threading
import uuid
from contextlib import contextmanager

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from .. import faults
from ..changes import null_safe_on, quoted, restrict, rows_up_to
from ..errors import StateInconsistent
from ..graph import WEIGHT
from ..keyed.state import DELETE_FLAG, SEQ, StateStore, StateWrite, latest
from ..storage import commits as driver_commits
from ..storage.commit_lock import commit_lock
from ..storage.commits import OP
from ..storage.deltalog import DeltaLog, row_count

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"

# MERGE honours idempotent-write identities only through session confs; they are session-wide,
# so writes through one session take turns (table steps run in parallel use child sessions).
_locks: dict[int, threading.RLock] = {}
_locks_guard = threading.Lock()


def _session_lock(spark: SparkSession) -> threading.RLock:
    with _locks_guard:
        return _locks.setdefault(id(spark), threading.RLock())


def commit_tag(table: str, seq: int, epoch: str, what: str) -> str:
    return json.dumps({"epochal": {"table": table, "seq": seq, "epoch": epoch, "write": what}}, sort_keys=True)


@contextmanager
def write_identity(spark: SparkSession, app_id: str, seq: int, tag: str):
    """Session confs for one MERGE: its idempotent-write identity and commit tag. Delta still
    materializes the source (its default, `auto`): with materializeSource=none it refuses our
    sources, which read persisted frames ("the source plan was cached while the MERGE operation
    was running")."""
    confs = {TXN_APP_ID: app_id, TXN_VERSION: str(seq), USER_METADATA: tag}
    with _session_lock(spark):
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in confs:
                spark.conf.unset(key)


def writer(frame: DataFrame, app_id: str, seq: int, tag: str):
    return (
        frame.write.format("delta")
        .option("txnAppId", app_id)
        .option("txnVersion", seq)
        .option("userMetadata", tag)
    )


def save(write, path: str) -> None:
    """`write.save(path)` (a DataFrameWriter) holding the table's commit lock."""
    with commit_lock(path):
        write.save(path)


def version_written(path: str, table: str, seq: int, what: str, since: int, storage_options=None) -> int | None:
    """The version of the commit a step tagged, if it wrote one (searching after `since`)."""
    log = DeltaLog.open(path, storage_options)
    if log is None:
        return None
    for commit in reversed(log.commits(max(since, 0))):
        try:
            tag = json.loads(commit.user_metadata or "{}").get("epochal", {})
        except (ValueError, AttributeError):
            continue
        if tag.get("table") == table and tag.get("seq") == seq and tag.get("write") == what:
            return commit.version
    return None


def _merge_condition(columns: list[str], target: str = "t", source: str = "s") -> str:
    return " AND ".join(f"{target}.{quoted(c)} <=> {source}.{quoted(c)}" for c in columns) or "true"


def keyed_source(change: DataFrame, columns: list[str], key: list[str]) -> DataFrame:
    """A keyed change as MERGE source rows: `upsert` for each +row, `delete` for each -row whose
    key has no +row (at most one -row and one +row per key)."""
    plus = change.filter(F.col(WEIGHT) > 0)
    minus = change.filter(F.col(WEIGHT) < 0)
    plus_keys = plus.select(*[F.col(quoted(k)).alias(f"__k{i}") for i, k in enumerate(key)])
    only_minus = minus.join(plus_keys, null_safe_on(minus, plus_keys, [(k, f"__k{i}") for i, k in enumerate(key)]), "left_anti")
    return plus.select(*[F.col(quoted(c)) for c in columns], F.lit("upsert").alias(OP)).unionByName(
        only_minus.select(*[F.col(quoted(c)) for c in columns], F.lit("delete").alias(OP))
    )


def apply_keyed(spark, path: str, source: DataFrame, columns: list[str], key: list[str], identity) -> None:
    """Spark MERGE of a keyed_source: update, insert or delete by key."""
    sets = ", ".join(f"t.{quoted(c)} = s.{quoted(c)}" for c in columns)
    with identity:
        merge_sql(spark, path, source, _merge_condition(key), [
            f"WHEN MATCHED AND s.{OP} = 'delete' THEN DELETE",
            f"WHEN MATCHED THEN UPDATE SET {sets}",
            f"WHEN NOT MATCHED AND s.{OP} = 'upsert' THEN {_insert(columns)}",
        ])


def _insert(columns: list[str]) -> str:
    return (f"INSERT ({', '.join(quoted(c) for c in columns)}) "
            f"VALUES ({', '.join('s.' + quoted(c) for c in columns)})")


def delta_path(path: str) -> str:
    """A Delta table by path in Spark SQL: delta.`path` (backticks in the path doubled)."""
    return "delta.`" + path.replace("`", "``") + "`"


def merge_sql(spark, path: str, source: DataFrame, condition: str, clauses: list[str]) -> None:
    """`MERGE INTO delta.`path` AS t USING <source> AS s ON condition <clauses>` through Spark
    SQL, which a classic session and a Spark Connect server with Delta's SQL extension both run
    (Delta's DeltaTable API needs Delta's own Connect plugin). The source is a temporary view of
    this session, under a name of its own, dropped after."""
    view = f"epochal_merge_source_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        with commit_lock(path):
            spark.sql(f"MERGE INTO {delta_path(path)} AS t USING {view} AS s ON {condition} "
                      + " ".join(clauses)).collect()
    finally:
        spark.catalog.dropTempView(view)


def multiset_source(change: DataFrame, columns: list[str], base: DataFrame | None) -> tuple[DataFrame, list[DataFrame]]:
    """A change to a table that may hold duplicate rows as MERGE source rows: a row whose
    multiplicity drops from n to m gets one `delete` row (matching all its n copies) and m
    `insert` rows; a +row gets one `insert` row per copy. Without deletes (`base` None) only
    `insert` rows. Returns the source and the frames it persisted (to release after the write)."""
    keep = [F.col(quoted(c)) for c in columns]
    plus = change.filter(F.col(WEIGHT) > 0)
    if base is None:
        copies = plus.select(*keep, F.explode(F.sequence(F.lit(1), F.col(WEIGHT))).alias("__copy"))
        return copies.select(*keep, F.lit("insert").alias(OP)), []
    minus = change.filter(F.col(WEIGHT) < 0)
    counts = restrict(base, minus, columns).groupBy(*keep).agg(F.count(F.lit(1)).alias("__n"))
    counts = counts.select(*[F.col(quoted(c)).alias(f"__b{i}") for i, c in enumerate(columns)], "__n")
    minus = minus.join(counts, null_safe_on(minus, counts, [(c, f"__b{i}") for i, c in enumerate(columns)]), "left")
    remaining = F.coalesce(F.col("__n"), F.lit(0)).cast(LongType()) + F.col(WEIGHT)
    minus = minus.withColumn("__m", remaining).persist()
    # count, not isEmpty: the cache must be complete before a Spark MERGE reads it (Delta refuses a
    # source that is cached while it runs)
    if minus.filter(F.col("__m") < 0).count():
        minus.unpersist()
        raise StateInconsistent("the change deletes more copies of a row than the table holds")
    markers = minus.select(*keep, F.lit("delete").alias(OP))
    inserts = plus.select(*keep, F.col(WEIGHT).alias("__times")).unionByName(
        minus.filter(F.col("__m") > 0).select(*keep, F.col("__m").alias("__times"))
    )
    inserts = inserts.select(*keep, F.explode(F.sequence(F.lit(1), F.col("__times"))).alias("__copy"))
    return markers.unionByName(inserts.select(*keep, F.lit("insert").alias(OP))), [minus]


def copies_in(base: DataFrame, change: DataFrame, columns: list[str]) -> pa.Table:
    """How many copies `base` holds of each row the change deletes, counted by Spark over the
    base's rows that equal one (a semi-join first, not a count of every row of the base)."""
    minus = change.filter(F.col(WEIGHT) < 0).select(*[F.col(quoted(c)) for c in columns])
    counts = restrict(base, minus, columns).groupBy(*[F.col(quoted(c)) for c in columns]).agg(
        F.count(F.lit(1)).alias("__n"))
    return driver_commits.copies_counted(counts.toArrow(), columns, "__n")


def apply_multiset(spark, path: str, source: DataFrame, columns: list[str], identity, append_writer,
                   has_deletes: bool = True) -> None:
    """Spark write of a multiset_source: a plain append without deletes, else a MERGE in which
    `delete` rows match every copy of their row and `insert` rows never match."""
    if not has_deletes:
        save(append_writer(source.drop(OP)).mode("append"), path)
        return
    with identity:
        merge_sql(spark, path, source, _merge_condition(columns) + f" AND s.{OP} = 'delete'", [
            "WHEN MATCHED THEN DELETE",
            f"WHEN NOT MATCHED AND s.{OP} = 'insert' THEN {_insert(columns)}",
        ])


def _tagged(rows, seq: int):
    """Collected state rows with the columns write_state adds in Spark: the delete flag and seq."""
    if DELETE_FLAG not in rows.column_names:
        rows = rows.append_column(DELETE_FLAG, pa.array([False] * rows.num_rows, pa.bool_()))
    return rows.append_column(SEQ, pa.array([seq] * rows.num_rows, pa.int64()))


# column types delta-rs writes with the Delta type Spark's writer gives them (nested and
# interval types, CHAR/VARCHAR and NTZ timestamps stay with Spark)
DRIVER_WRITE_TYPES = (BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType,
                       StringType, BinaryType, DateType, TimestampType)


def written_on_driver(schema: StructType) -> bool:
    """Whether every column of `schema` is of a type delta-rs reads and writes as Spark does
    (DRIVER_WRITE_TYPES): only then may the driver read or write the table's rows itself."""
    return all(type(f.dataType) in DRIVER_WRITE_TYPES for f in schema.fields)


def replace_contents(frame: DataFrame, path: str, app_id: str, seq: int, tag: str, storage_options=None,
            driver_rows: int = 0, change_data_feed: bool = False, expected_rows: int | None = None) -> bool:
    """Write `frame` as the table's whole contents (Spark's overwrite with overwriteSchema), with
    the step's identity and tag. At most `driver_rows` rows whose columns delta-rs writes as
    Spark would (DRIVER_WRITE_TYPES) are collected (one job) and committed by delta-rs: a first
    epoch's output or state of a small table then costs a small commit, not a Spark write's jobs.
    The frame is cached while collected, so that one past the limit is computed once, by the
    collect, and written from the cache; `expected_rows` past the limit (the rows the table holds
    now) skips the collect and the caching. Returns whether it was committed on the driver."""
    if driver_rows <= 0 or not written_on_driver(frame.schema) or \
            (expected_rows is not None and expected_rows > driver_rows):
        _spark_replace(frame, path, app_id, seq, tag, change_data_feed)
        return False
    frame = frame.persist()  # computed once, whichever writes it
    try:
        rows = rows_up_to(frame, driver_rows)
        if rows is not None:
            driver_commits.replace(path, arrow_as(rows, frame.schema), app_id, seq, tag, storage_options,
                                   change_data_feed)
            return True
        _spark_replace(frame, path, app_id, seq, tag, change_data_feed)
        return False
    finally:
        frame.unpersist()


def _spark_replace(frame: DataFrame, path: str, app_id: str, seq: int, tag: str, change_data_feed: bool) -> None:
    write = writer(frame, app_id, seq, tag).mode("overwrite").option("overwriteSchema", "true")
    if change_data_feed:
        write = write.option("delta.enableChangeDataFeed", "true")
    save(write, path)


def arrow_as(rows, schema: StructType):
    """Collected rows with the Arrow types of the Spark schema (a collect's types can differ in
    details: large strings, time zones)."""
    target = to_arrow_schema(schema)
    return pa.Table.from_arrays([rows.column(i).cast(field.type) for i, field in enumerate(target)], schema=target)


def replaces_state(store: StateStore, write: StateWrite) -> bool:
    """Whether `write_state` replaces the table's contents (a rebuild, a first write, or a
    compaction) rather than appending to them."""
    return (write.mode == "overwrite" or DeltaLog.open(store.path(write.name), store.storage_options) is None
            or store.due_for_compaction(write.name))


def _in_key_order(frame: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """`frame` sorted by `keys`: Spark writes each file as one range of keys, sorted, so a read of
    some keys admits a few files and, from a file's local copy (local_copies.py), a batch or so
    per key (TPC-H Q18's aggregate state at scale 10: 15M groups, read whole for 3,700 keys)."""
    return frame.orderBy(*[F.col(quoted(k)) for k in keys]) if keys else frame


def write_state(spark, store: StateStore, write: StateWrite, seq: int, app_id: str, tag: str,
                driver_rows: int = 0) -> bool:
    """Append the write's rows tagged with `seq` (log-structured state, see state.py); replace the
    table, in key order, for a rebuild, or with its compacted contents once enough appends have
    piled up. An append of at most `driver_rows` rows (counted before, in `write.rows`) is
    committed on the driver (storage/commits.py); returns whether it was."""
    path = store.path(write.name)

    def tagged_rows() -> DataFrame:  # Spark's plan: not built where the driver commits held rows
        frame = write.frame
        if DELETE_FLAG not in frame.columns:
            frame = frame.withColumn(DELETE_FLAG, F.lit(False))
        return frame.withColumn(SEQ, F.lit(seq).cast(LongType()))

    if write.mode == "overwrite" or DeltaLog.open(path, store.storage_options) is None:
        held = store.versions.get(write.name)
        return replace_contents(_in_key_order(tagged_rows().filter(~F.col(DELETE_FLAG)), write.keys), path, app_id,
                                seq, tag, store.storage_options, driver_rows,
                                expected_rows=row_count(path, held, store.storage_options) if held is not None else None)
    if store.due_for_compaction(write.name):
        earlier = spark.read.format("delta").option("versionAsOf", store.versions[write.name]).load(path)
        compacted = latest(earlier.unionByName(tagged_rows()), list(write.keys))
        compacted = compacted.withColumn(DELETE_FLAG, F.lit(False)).withColumn(SEQ, F.lit(seq).cast(LongType()))
        save(writer(_in_key_order(compacted, write.keys), app_id, seq, tag).mode("overwrite"), path)
        faults.point("after_state_compaction")
        return False
    if write.rows is not None and write.rows <= driver_rows:
        table = driver_commits.open_unwritten(path, app_id, seq, store.storage_options)
        if table is not None:
            driver_commits.append(table, _tagged(write.arrow, seq) if write.arrow is not None else tagged_rows().toArrow(),
                                  app_id, seq, tag, store.storage_options)
        return True
    save(writer(tagged_rows(), app_id, seq, tag).mode("append"), path)
    return False
