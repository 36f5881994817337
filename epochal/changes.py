"""Change batches (Z-sets) from Delta's change data feed, and the helpers every rule shares.

A change batch is a DataFrame with the relation's columns plus a signed weight column WEIGHT:
`insert` and `update_postimage` weigh +1, `delete` and `update_preimage` -1. Consolidating sums
the weights per distinct row and drops zeros, which absorbs cancelling pairs and identical pre/post
images (an update of a column nobody reads).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from .graph import WEIGHT

POSITIVE_TYPES = ("insert", "update_postimage")


def quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def read_snapshot(spark: SparkSession, path: str, version: int, schema: StructType | None = None) -> DataFrame:
    """The table as of `version`; version -1 is the empty table before its first commit."""
    if version < 0:
        if schema is None:
            raise ValueError(f"reading {path} before its first version needs its schema")
        return spark.createDataFrame([], schema)
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


def consolidate(changes: DataFrame) -> DataFrame:
    values = [c for c in changes.columns if c != WEIGHT]
    return (
        changes.groupBy(*[F.col(quoted(c)) for c in values])
        .agg(F.sum(WEIGHT).alias(WEIGHT))
        .filter(F.col(WEIGHT) != 0)
    )


def empty_changes(spark: SparkSession, schema: StructType) -> DataFrame:
    return spark.createDataFrame([], StructType(list(schema.fields) + [StructField(WEIGHT, LongType())]))


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
