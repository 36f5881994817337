"""Small Delta reads made once per refresh, on the driver, and shared by every step that makes them.

Every table of an epoch that reads a source reads the same versions of it, and through Spark each
step paid for each of its reads: a change-feed read costs about 0.3 s of planning and jobs, a
time-travel read about 0.4 s (Delta rebuilds the version's snapshot from the log, every time).
Here a change batch is read once per (table path, version range) and a snapshot once per (table
path, version), by delta-rs as Arrow with every column, when it is small: at most `driver_rows`
rows (from the commits' metrics, or the version's file statistics). Each step then selects its
columns from a local relation. A larger read, or one delta-rs cannot make, is left to Spark (the
methods return None); Spark also has the last word on ranges Delta refuses to read
(rescan.refusals).

A large table is read here too when only the rows holding some key values are wanted (a join
term's co-generators, an affected-key recompute): `restricted` scans one version once for one key
set, with the columns every table of the refresh reads from it, and shares the few rows it finds.
Through Spark each join term and table paid a full scan for those rows (random keys touch every
file, so Delta's file skipping saves nothing), at two versions; pyarrow scans TPC-H scale 1's
lineitem for 1,500 order keys in about 0.3 s.
"""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from .changes import POSITIVE_TYPES
from .graph import WEIGHT

CHANGE_TYPE = "_change_type"


def _kind(arrow_type: pa.DataType) -> str:
    for kind, test in (("integer", pa.types.is_integer), ("string", pa.types.is_string),
                       ("string", pa.types.is_large_string), ("string", pa.types.is_string_view),
                       ("date", pa.types.is_date), ("decimal", pa.types.is_decimal),
                       ("boolean", pa.types.is_boolean)):
        if test(arrow_type):
            return kind
    return str(arrow_type)


class SharedReads:
    def __init__(self, storage_options: dict[str, str] | None = None, driver_rows: int = 0,
                 columns: dict[str, set[str]] | None = None):
        self.storage_options = storage_options
        self.driver_rows = driver_rows
        self.columns = columns or {}  # per table path, the columns the refresh's plans read
        self._reads: dict[tuple, pa.Table | None] = {}
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()

    def _once(self, key: tuple, read) -> pa.Table | None:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # steps running at once wait for one read
            if key not in self._reads:
                self._reads[key] = read()
            return self._reads[key]

    @staticmethod
    def _plain(table) -> bool:
        """Whether delta-rs reads the table as Spark does: not with column mapping (delta-rs
        1.6.6 returns wrong change rows for a column-mapped table) nor deletion vectors."""
        configuration = table.metadata().configuration
        return (str(configuration.get("delta.columnMapping.mode", "none")).lower() == "none"
                and str(configuration.get("delta.enableDeletionVectors", "false")).lower() != "true")

    def _changes(self, path: str, before: int, after: int) -> pa.Table | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        from .rescan import changed_rows

        rows = changed_rows(path, before, after, self.storage_options)
        # an update records two rows (pre- and post-image)
        if rows is None or 2 * rows > self.driver_rows:
            return None
        try:
            table = DeltaTable(path, storage_options=self.storage_options)
            if not self._plain(table):
                return None
            return pa.table(table.load_cdf(starting_version=before + 1, ending_version=after).read_all())
        except (DeltaError, OSError):  # Spark reads it, and names what is wrong where it cannot
            return None

    def _snapshot(self, path: str, version: int) -> pa.Table | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        try:
            table = DeltaTable(path, version=version, storage_options=self.storage_options)
            if not self._plain(table) or table.count() > self.driver_rows:  # count: the files' statistics
                return None
            return pa.table(table.to_pyarrow_table())
        except (DeltaError, OSError, ValueError):  # no statistics, or unreadable here: Spark's to read
            return None

    def _local(self, spark, data: pa.Table, schema: StructType, columns: list[str] | None,
               weight: pa.ChunkedArray | None = None) -> DataFrame:
        """`columns` (names as in `schema`, any case; None: all) of `data` as a local relation."""
        by_name = {f.name.lower(): f for f in schema.fields}
        fields = [by_name[c.lower()] for c in columns] if columns is not None else list(schema.fields)
        arrays = [data.column(f.name) for f in fields]
        if weight is not None:
            fields, arrays = fields + [StructField(WEIGHT, LongType())], arrays + [weight]
        shape = StructType(fields)
        # one chunk: PySpark 4.1's createDataFrame drops every row after an empty chunk, and
        # delta-rs and pyarrow scans yield empty batches (a file with no matching rows)
        local = pa.Table.from_arrays(arrays, names=shape.names).combine_chunks()
        # delta-rs's Arrow types (string views, time zones) as Spark reads them
        return spark.createDataFrame(local.cast(to_arrow_schema(shape)), schema=shape)

    def snapshot_rows(self, path: str, version: int) -> pa.Table | None:
        """The table as of `version` as Arrow (delta-rs's types), or None when it is Spark's to read."""
        return self._once(("version", path, version), lambda: self._snapshot(path, version))

    def snapshot(self, spark, path: str, version: int, schema: StructType | None = None) -> DataFrame | None:
        """The table as of `version` as a local relation (with `schema`, else the table's), or
        None when it is Spark's to read."""
        data = self.snapshot_rows(path, version)
        if data is None:
            return None
        if schema is None:
            from .deltalog import table_at

            schema = StructType.fromJson(json.loads(table_at(path, version, self.storage_options).schema().to_json()))
        return self._local(spark, data, schema, None)

    def change_rows(self, path: str, before: int, after: int) -> pa.Table | None:
        """The change feed of versions before+1..after as Arrow (every column, `_change_type`),
        or None when the batch is Spark's to read."""
        return self._once(("changes", path, before, after), lambda: self._changes(path, before, after))

    def changes(self, spark, path: str, before: int, after: int, schema: StructType,
                columns: list[str]) -> DataFrame | None:
        """The weighted change rows of versions before+1..after for `columns` as a local
        relation, or None when the batch is Spark's to read."""
        data = self.change_rows(path, before, after)
        if data is None:
            return None
        positive = pc.is_in(data.column(CHANGE_TYPE).cast(pa.string()), value_set=pa.array(POSITIVE_TYPES))
        weight = pc.if_else(positive, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))
        return self._local(spark, data, schema, columns, weight)

    def _restricted(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        import pyarrow.dataset as ds
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        try:
            table = DeltaTable(path, version=version, storage_options=self.storage_options)
            if not self._plain(table):
                return None
            dataset = table.to_pyarrow_dataset()
            names = {name.lower(): name for name in dataset.schema.names}
            wanted = self.columns.get(path)
            columns = [names[c.lower()] for c in sorted(wanted | {field}) if c.lower() in names] \
                if wanted else dataset.schema.names
            target = dataset.schema.field(names[field.lower()])
            values = pa.array(list(keys)) if keys else pa.array([], target.type)
            if keys and _kind(values.type) != _kind(target.type):
                return None  # e.g. string keys for an integer column: Spark's equality casts, is_in does not
            values = values.cast(target.type)  # raises where a value does not fit: Spark's to read
            condition = ds.field(target.name).isin(values)
            if nulls:
                condition = condition | ds.field(target.name).is_null()
            batches, rows = [], 0
            for batch in dataset.scanner(columns=columns, filter=condition).to_batches():
                rows += batch.num_rows
                if rows > self.driver_rows:
                    return None  # too many: Spark's to read
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=pa.schema([dataset.schema.field(c) for c in columns]))
        except (DeltaError, OSError, ValueError, TypeError, KeyError, pa.ArrowException):
            return None  # a type or table delta-rs cannot read as Spark does: Spark's to read

    def restricted(self, spark, path: str, version: int, schema: StructType, field: str, keys: tuple,
                   nulls: bool = False) -> DataFrame | None:
        """The rows of the table as of `version` whose `field` is one of `keys` (sorted, distinct,
        non-NULL; with `nulls`, also the rows where it is NULL), as a local relation with the
        columns the refresh reads, or None when they are too many or Spark's to read."""
        data = self._once(("restricted", path, version, field, keys, nulls),
                          lambda: self._restricted(path, version, field, keys, nulls))
        if data is None:
            return None
        by_name = {f.name.lower(): f.name for f in schema.fields}
        return self._local(spark, data, schema, [by_name[c.lower()] for c in data.column_names])

    def clear(self) -> None:
        with self._guard:
            self._reads.clear()
            self._locks.clear()
