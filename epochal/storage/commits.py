"""Change-sized commits made on the driver through delta-rs, without a Spark job.

A Spark MERGE of even one row is costly (it rebuilds the snapshot, materializes its source,
scans and writes in a dozen jobs), and a Spark append pays a job and a snapshot too; delta-rs
commits the same change without a job, an order of magnitude faster (`python -m
bench.driver_threshold`; figures in bench/RESULTS.md). So a change that Spark computed and that is
small enough to hold on the driver is collected as Arrow and committed here; larger ones stay with
Spark (writes.py).

Each commit keeps the guarantees of every engine write:
- idempotent: the Delta `txn` of (app id, seq) is checked on the snapshot the commit is made
  against and recorded by the commit, so a rerun skips a step already written, and delta-rs
  refuses our commit when a concurrent one recorded the same app id meanwhile
  (`CommitFailedError`, which the epoch protocol treats as a conflict);
- tagged: the commit's userMetadata is the step's tag, as Spark's writes carry it;
- an exact change data feed: only append and MERGE with matched delete, matched update of a
  unique key and not-matched insert, whose feeds tests/test_driver_commits.py proves equal to
  the bag difference of the versions around them (duplicates and NULLs included). Never delta-rs
  UPDATE: on duplicate rows it records too few images;
- readable by Spark's filters: no Parquet statistics for FLOAT and DOUBLE columns
  (`writer_properties`);
- made holding the table's commit lock on a local path (commit_lock.py), as Spark's writes are.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, CommitProperties, DeltaTable, WriterProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import Transaction
from pyspark.sql.types import ArrayType, DataType, DoubleType, FloatType, MapType, StructType

from ..arrow_rows import code_positions, key_codes
from ..errors import StateInconsistent
from ..graph import WEIGHT
from .commit_lock import commit_lock

OP = "__op"


def _floating(kind: pa.DataType) -> bool:
    return pa.types.is_floating(kind) or (pa.types.is_struct(kind) and any(_floating(f.type) for f in kind))


def writer_properties(schema: pa.Schema, **options) -> WriterProperties | None:
    """Parquet settings for a table Spark reads: no min/max statistics for FLOAT and DOUBLE columns
    (nor, where a struct holds one, for any column but the plain top-level ones). Parquet's min/max
    of a floating column leave NaN out (arrow's writer; delta-rs takes its log statistics from them)
    while Spark orders NaN above every number, so Spark's pruning by them skipped the row groups and
    files holding NaN for `x > 2` or `x = NaN`, and a filtered read of the table silently missed
    those rows (docs/exactness.md; tests/test_float_statistics.py). Spark's own writer keeps no
    min/max for a chunk holding NaN.

    `options`: further WriterProperties (max_row_group_size, compression). None when there is
    nothing to set, so delta-rs's own defaults hold; otherwise compression is SNAPPY, delta-rs's
    default, unless `options` name another (a WriterProperties without it writes uncompressed)."""
    floating = [f for f in schema if _floating(f.type)]
    if not floating:
        return WriterProperties(**options) if options else None
    options = {"compression": "SNAPPY", **options}
    off = ColumnProperties(statistics_enabled="NONE")
    if not any(pa.types.is_struct(f.type) for f in floating):  # delta-rs names top-level columns only
        return WriterProperties(column_properties={f.name: off for f in floating}, **options)
    on = ColumnProperties(statistics_enabled="PAGE")
    return WriterProperties(default_column_properties=off, column_properties={
        f.name: on for f in schema if not _floating(f.type) and not pa.types.is_nested(f.type)}, **options)


def _properties(app_id: str, seq: int, tag: str) -> CommitProperties:
    return CommitProperties(custom_metadata={"userMetadata": tag}, app_transactions=[Transaction(app_id, seq)])


def open_unwritten(path: str, app_id: str, seq: int, storage_options=None) -> DeltaTable | None:
    """The table to commit against, or None when (app id, seq) is already written (a rerun)."""
    table = DeltaTable(path, storage_options=storage_options)
    recorded = table.transaction_version(app_id)
    return None if recorded is not None and recorded >= seq else table


def _column(name: str, alias: str | None = None) -> str:
    quoted = '"' + name.replace('"', '""') + '"'
    return f"{alias}.{quoted}" if alias else quoted


def aligned(rows: pa.Table, table: DeltaTable, extra: tuple[str, ...] = ()) -> pa.Table:
    """`rows` cast to the table's own Arrow schema (Spark's Arrow types and nullability differ in
    details delta-rs does not coerce), plus the `extra` columns as they are."""
    target = pa.schema(table.schema().to_arrow())
    columns = [rows.column(field.name).cast(field.type) for field in target]
    fields = list(target)
    for name in extra:
        columns.append(rows.column(name))
        fields.append(rows.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _same(columns, table: DeltaTable, target: str = "t", source: str = "s") -> str:
    """Spark's null-safe equality (`<=>`) of `columns` as a delta-rs predicate. DataFusion compares
    floating point by IEEE total order, so a NaN with its sign bit set (what x86 arithmetic such as
    inf - inf yields) differs from the positive NaN Spark or Python writes for the same value; Spark
    holds every NaN equal, so floating-point columns match NaN to NaN explicitly."""
    types = {field.name: field.type for field in pa.schema(table.schema().to_arrow())}

    def same(c):
        t, s = _column(c, target), _column(c, source)
        equal = f"({t} IS NOT DISTINCT FROM {s})"
        return f"({equal} OR (isnan({t}) AND isnan({s})))" if pa.types.is_floating(types[c]) else equal

    return " AND ".join(map(same, columns)) or "true"


def matches_as_spark(types: list[DataType]) -> bool:
    """Whether _same matches columns of these Spark types as Spark's `<=>` does: not where
    floating point sits inside an array, map or struct (its NaN and -0.0 are compared bit for
    bit there), for Spark's MERGE to match instead."""
    def floats_within(t: DataType) -> bool:
        if isinstance(t, (FloatType, DoubleType)):
            return True
        if isinstance(t, ArrayType):
            return floats_within(t.elementType)
        if isinstance(t, MapType):
            return floats_within(t.keyType) or floats_within(t.valueType)
        if isinstance(t, StructType):
            return any(floats_within(f.dataType) for f in t.fields)
        return False

    return not any(isinstance(t, (ArrayType, MapType, StructType)) and floats_within(t) for t in types)


def _hashable(value):
    """A value as Spark's null-safe equality compares it: NULL equals NULL (None == None in
    Python already), NaN equals NaN (float NaNs never compare equal in Python); arrays, maps and
    structs (lists, key-value lists and dicts in Python) by their elements."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, (list, tuple)):
        return tuple(map(_hashable, value))
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _row_codes(*keyed: tuple[pa.Table, list[str]]) -> list[np.ndarray]:
    """arrow_rows.key_codes, which encodes flat columns in Arrow, extended to arrays, maps and
    structs (by their elements, through _hashable, a Python tuple per row)."""
    if not any(pa.types.is_nested(rows.schema.field(c).type) for rows, columns in keyed for c in columns):
        return key_codes(*keyed)
    seen: dict[tuple, int] = {}
    return [np.fromiter((seen.setdefault(tuple(map(_hashable, row)), len(seen))
                         for row in zip(*[rows.column(c).to_pylist() for c in columns])),
                        dtype=np.int64, count=rows.num_rows)
            for rows, columns in keyed]


def keyed_rows(change: pa.Table, columns: list[str], key: list[str]) -> pa.Table:
    """writes.keyed_source on the driver: `upsert` for each +row, `delete` for each -row whose key
    has no +row."""
    weight = change.column(WEIGHT)
    plus, minus = change.filter(pc.greater(weight, 0)), change.filter(pc.less(weight, 0))
    plus_keys, minus_keys = _row_codes((plus, key), (minus, key))
    minus = minus.filter(pa.array(~np.isin(minus_keys, plus_keys), pa.bool_()))
    upserts = plus.select(columns).append_column(OP, pa.array(["upsert"] * plus.num_rows, pa.string()))
    deletes = minus.select(columns).append_column(OP, pa.array(["delete"] * minus.num_rows, pa.string()))
    return pa.concat_tables([upserts, deletes])


COPIES = "__copies"


def copies_of(base: pa.Table, wanted: pa.Table, columns: list[str]) -> pa.Table:
    """`wanted`'s rows (`columns`) with the number of copies `base` holds of each, in COPIES."""
    aligned = pa.table({c: base.column(c).cast(wanted.schema.field(c).type) for c in columns})
    codes, held = _row_codes((wanted, columns), (aligned, columns))
    distinct, counts = np.unique(held, return_counts=True)
    at, found = code_positions(codes, distinct)
    copies = np.where(found, counts[at] if len(counts) else 0, 0)
    return wanted.select(columns).append_column(COPIES, pa.array(copies, pa.int64()))


def copies_counted(counts: pa.Table, columns: list[str], count: str) -> pa.Table:
    """copies_of from rows already counted (by Spark), the count in column `count`."""
    return counts.select(columns).append_column(COPIES, counts.column(count).cast(pa.int64()))


def multiset_rows(change: pa.Table, columns: list[str], copies: pa.Table | None) -> pa.Table:
    """writes.multiset_source on the driver: one `delete` row per row whose multiplicity drops
    (matching all its copies) and `insert` rows for the copies that remain, one `insert` row per
    copy of a +row. `copies`: the table's copies of the rows the change deletes (copies_of), None
    where it deletes none."""
    weight = change.column(WEIGHT)
    plus, minus = change.filter(pc.greater(weight, 0)), change.filter(pc.less(weight, 0))
    held = np.zeros(minus.num_rows, np.int64)
    if copies is not None and copies.num_rows and minus.num_rows:
        codes, counted = _row_codes((minus, columns), (copies, columns))
        at, found = code_positions(codes, counted)
        held = np.where(found, np.asarray(copies.column(COPIES), dtype=np.int64)[at], 0)
    remaining = held + np.asarray(minus.column(WEIGHT), dtype=np.int64)
    if (remaining < 0).any():
        raise StateInconsistent("the change deletes more copies of a row than the table holds")
    times = np.concatenate([np.asarray(plus.column(WEIGHT), dtype=np.int64), remaining])
    both = pa.concat_tables([plus.select(columns), minus.select(columns)])
    inserts = both.take(pa.array(np.repeat(np.arange(len(times), dtype=np.int64), times), pa.int64()))
    return pa.concat_tables([
        minus.select(columns).append_column(OP, pa.array(["delete"] * minus.num_rows, pa.string())),
        inserts.append_column(OP, pa.array(["insert"] * inserts.num_rows, pa.string())),
    ])


def merge_keyed(table: DeltaTable, rows: pa.Table, columns: list[str], key: list[str], app_id: str, seq: int,
                tag: str) -> None:
    """MERGE rows marked `upsert` (update the key's row or insert it) and `delete` (remove the
    key's row); at most one row per key, as apply_keyed's source."""
    values = {_column(c): _column(c, "s") for c in columns}
    with commit_lock(table.table_uri):
        (
            table.merge(aligned(rows, table, (OP,)), _same(key, table), source_alias="s", target_alias="t",
                        streamed_exec=False, commit_properties=_properties(app_id, seq, tag),
                        writer_properties=writer_properties(rows.schema))
            .when_matched_delete(predicate=f"s.{OP} = 'delete'")
            .when_matched_update(updates=values)
            .when_not_matched_insert(updates=values, predicate=f"s.{OP} = 'upsert'")
            .execute()
        )


def merge_multiset(table: DeltaTable, rows: pa.Table, columns: list[str], app_id: str, seq: int, tag: str) -> None:
    """MERGE a multiset change: a `delete` row removes every copy of the row it equals, `insert`
    rows never match and are added (one row per copy), as apply_multiset's source."""
    values = {_column(c): _column(c, "s") for c in columns}
    with commit_lock(table.table_uri):
        (
            table.merge(aligned(rows, table, (OP,)), _same(columns, table) + f" AND s.{OP} = 'delete'",
                        source_alias="s", target_alias="t", streamed_exec=False,
                        commit_properties=_properties(app_id, seq, tag), writer_properties=writer_properties(rows.schema))
            .when_matched_delete()
            .when_not_matched_insert(updates=values, predicate=f"s.{OP} = 'insert'")
            .execute()
        )


def append(table: DeltaTable, rows: pa.Table, app_id: str, seq: int, tag: str, storage_options=None) -> None:
    with commit_lock(table.table_uri):
        write_deltalake(table, aligned(rows, table), mode="append", storage_options=storage_options,
                        commit_properties=_properties(app_id, seq, tag), writer_properties=writer_properties(rows.schema))


def replace(path: str, rows: pa.Table, app_id: str, seq: int, tag: str, storage_options=None,
            change_data_feed: bool = False) -> bool:
    """Write `rows` as the table's whole contents, as Spark's overwrite with overwriteSchema does:
    create the table (with the change data feed on when asked) or overwrite its rows and schema,
    every column nullable as Delta makes them. False when (app id, seq) is already written."""
    try:
        existing = DeltaTable(path, storage_options=storage_options)
    except TableNotFoundError:
        existing = None
    if existing is not None:
        recorded = existing.transaction_version(app_id)
        if recorded is not None and recorded >= seq:
            return False
    schema = pa.schema([field.with_nullable(True) for field in rows.schema])
    data = pa.Table.from_arrays([rows.column(i) for i in range(rows.num_columns)], schema=schema)
    configuration = {"delta.enableChangeDataFeed": "true"} if change_data_feed and existing is None else None
    with commit_lock(path):
        write_deltalake(existing if existing is not None else path, data, mode="overwrite",
                        schema_mode="overwrite" if existing is not None else None, configuration=configuration,
                        storage_options=storage_options, commit_properties=_properties(app_id, seq, tag),
                        writer_properties=writer_properties(schema))
    return True
