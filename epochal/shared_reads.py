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


class SharedReads:
    def __init__(self, storage_options: dict[str, str] | None = None, driver_rows: int = 0):
        self.storage_options = storage_options
        self.driver_rows = driver_rows
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
        local = pa.Table.from_arrays(arrays, names=shape.names)
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

    def clear(self) -> None:
        with self._guard:
            self._reads.clear()
            self._locks.clear()
