"""Change batches (Z-sets) from Delta's change data feed, and the helpers every rule shares.

A change batch is a DataFrame with the relation's columns plus a signed weight column WEIGHT:
`insert` and `update_postimage` weigh +1, `delete` and `update_preimage` -1. Consolidating sums
the weights per distinct row and drops zeros, which absorbs cancelling pairs and identical pre/post
images (an update of a column nobody reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.types import ArrayType, LongType, MapType, StructField, StructType

from .arrow_rows import is_connect
from .graph import WEIGHT

POSITIVE_TYPES = ("insert", "update_postimage")


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def empty_frame(spark: SparkSession, schema: StructType) -> DataFrame:
    """An empty DataFrame of `schema`, made in the JVM as a local relation: PySpark's
    `createDataFrame([], schema)` builds it through an RDD, a dozen times slower, and defining a
    table or typing an operator makes one per input. A Spark Connect session has no JVM here."""
    if is_connect(spark):
        return spark.createDataFrame([], schema)
    session = spark._jsparkSession
    return ClassicDataFrame(session.createDataFrame(spark._jvm.java.util.ArrayList(),
                                                    session.parseDataType(schema.json())), spark)


def read_snapshot(spark: SparkSession, path: str, version: int, schema: StructType | None = None) -> DataFrame:
    """The table as of `version`; version -1 is the empty table before its first commit."""
    if version < 0:
        if schema is None:
            raise ValueError(f"reading {path} before its first version needs its schema")
        return empty_frame(spark, schema)
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def read_changes(spark: SparkSession, path: str, after: int, upto: int, columns: list[str]) -> DataFrame:
    """Weighted change rows of commits after..upto (exclusive, inclusive), for `columns`."""
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", after + 1)
        .option("endingVersion", upto)
        .load(path)
    )
    weight = F.when(F.col("_change_type").isin(*POSITIVE_TYPES), F.lit(1)).otherwise(F.lit(-1)).cast(LongType())
    return feed.select(
        *[F.col(quoted(c)) for c in columns], weight.alias(WEIGHT)
    )


def rows_up_to(frame: DataFrame, limit: int) -> pa.Table | None:
    """`frame`'s rows as Arrow when they are at most `limit`, else None: one job, which stops
    after limit + 1 rows."""
    rows = frame.limit(limit + 1).toArrow()
    return rows if rows.num_rows <= limit else None


def atomic(schema: StructType) -> bool:
    """Whether every column is of an atomic type (no struct, array or map)."""
    return all(not isinstance(f.dataType, (StructType, ArrayType, MapType)) for f in schema.fields)


def consolidated_schema(schema: StructType) -> StructType | None:
    """consolidate's schema over rows of `schema` with atomic columns, as Spark's analysis gives
    it (the grouped values as they are, the summed weight a nullable BIGINT); None otherwise."""
    if not atomic(schema) or WEIGHT not in schema.names:
        return None
    return StructType([f for f in schema.fields if f.name != WEIGHT] + [StructField(WEIGHT, LongType(), True)])


def consolidate(changes: DataFrame) -> DataFrame:
    values = [c for c in changes.columns if c != WEIGHT]
    return (
        changes.groupBy(*[F.col(quoted(c)) for c in values])
        .agg(F.sum(WEIGHT).alias(WEIGHT))
        .filter(F.col(WEIGHT) != 0)
    )


def _groupable(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """`column` as Arrow groups it the way Spark's groupBy does, or None where it may not: floating
    point with -0.0 and NaN normalized (Spark's NormalizeFloatingNumbers), string views as
    strings; nested types are Spark's to group."""
    kind = column.type
    if pa.types.is_floating(kind):
        zero, nan = pa.scalar(0.0, kind), pa.scalar(float("nan"), kind)
        return pc.if_else(pc.is_nan(column), nan, pc.if_else(pc.equal(column, zero), zero, column))
    if pa.types.is_string_view(kind):
        return column.cast(pa.string())
    if any(test(kind) for test in (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string,
                                   pa.types.is_binary, pa.types.is_large_binary, pa.types.is_date,
                                   pa.types.is_decimal, pa.types.is_boolean, pa.types.is_timestamp)):
        return column
    return None


def consolidate_rows(changes: pa.Table) -> pa.Table | None:
    """`consolidate` on the driver, for a change batch held as Arrow (columns and WEIGHT): the
    weights summed per distinct row (NULL equal to NULL, as Spark groups), zeros dropped. None
    where a column's type is Spark's to group, or there is no column to group by."""
    values = [c for c in changes.column_names if c != WEIGHT]
    columns = [_groupable(changes.column(c)) for c in values]
    if not values or any(c is None for c in columns):
        return None
    grouped = pa.Table.from_arrays(columns + [changes.column(WEIGHT)], names=values + [WEIGHT]) \
        .group_by(values, use_threads=False).aggregate([(WEIGHT, "sum")])
    weight = grouped.column(f"{WEIGHT}_sum")
    kept = grouped.filter(pc.not_equal(weight, 0))
    return pa.Table.from_arrays([kept.column(c) for c in values] + [kept.column(f"{WEIGHT}_sum")],
                                names=values + [WEIGHT])


def empty_changes(spark: SparkSession, schema: StructType) -> DataFrame:
    return empty_frame(spark, StructType(list(schema.fields) + [StructField(WEIGHT, LongType())]))


def null_safe_on(left: DataFrame, right: DataFrame, pairs: list[tuple[str, str]]):
    """A join condition of null-safe equalities (group keys: NULL is a key like any other)."""
    condition = F.lit(True)
    for a, b in pairs:
        condition = condition & left[quoted(a)].eqNullSafe(right[quoted(b)])
    return condition


def restrict(frame: DataFrame, keys: DataFrame, columns: list[str]) -> DataFrame:
    """Rows of `frame` whose `columns` (null-safely) equal a row of `keys` (same column names)."""
    if not columns:
        return frame
    renamed = keys.select(*[F.col(quoted(c)).alias(f"__key{i}") for i, c in enumerate(columns)]).distinct()
    return frame.join(
        renamed, null_safe_on(frame, renamed, [(c, f"__key{i}") for i, c in enumerate(columns)]), "left_semi"
    )


CHANGE_TYPE = "_change_type"


def feed_weights(data: pa.Table) -> pa.ChunkedArray:
    """A change feed's weights: +1 for inserts and post-images, -1 for deletes and pre-images."""
    positive = pc.is_in(data.column(CHANGE_TYPE).cast(pa.string()), value_set=pa.array(POSITIVE_TYPES))
    return pc.if_else(positive, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))


OLD, NEW = "old", "new"


@dataclass(frozen=True)
class InputRange:
    """An input table and the versions an epoch step reads: `before` is its version as of the
    epoch's start, `after` as of its end (-1: the table had no version yet)."""

    name: str
    path: str
    kind: str  # "source" | "derived"
    before: int
    after: int
    schema: StructType
    table_id: str | None = None  # Delta's metaData.id of the table read, where known
    replaced: str | None = None  # the id the table's last step read, where a new table stands there now

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def version(self, side: str) -> int:
        return self.before if side == OLD else self.after
