"""Small Delta reads made once per refresh, on the driver, and shared by every step that makes them.

Every table of an epoch that reads a source reads the same versions of it, and through Spark each
step paid for each of its reads: a change-feed read costs planning and jobs, and a time-travel
read is costly (Delta rebuilds the version's snapshot from the log, every time).
Here a change batch is read once per (table path, version range) and a snapshot once per (table
path, version), by delta-rs as Arrow with every column, when it is small: at most `driver_rows`
rows (from the commits' metrics, or the version's file statistics). Each step then selects its
columns from a local relation. A larger read, or one delta-rs cannot make, is left to Spark (the
methods return None); Spark also has the last word on ranges Delta refuses to read
(reasons.refusals).

A large table is read here too when only the rows holding some key values are wanted (a join
term's co-generators, an affected-key recompute): `keys_frame` scans one version once for one key
set, with the columns every table of the refresh reads from it, and shares the few rows it finds.
Through Spark each join term and table paid a full scan for those rows (random keys touch every
file, so Delta's file skipping saves nothing), at two versions; pyarrow scans the same rows on
the driver without a Spark job (figures in bench/RESULTS.md).
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from ..arrow_rows import key_kind, lazy_frame
from ..changes import consolidate_rows, feed_weights
from ..graph import WEIGHT
from ..storage.deltalog import changed_rows, dataset_of, delta_rs_reads_alike, opened
from .arrangements import TooManyRows
from .file_pruning import files_holding
from .keyed_files import KeyedFiles, filtered_batches

log = logging.getLogger("epochal")


KEY_ROWS_PER_DRIVER_ROW = 10


HELD_BYTES = 3 << 30


class SharedReads:
    """`driver_rows` bounds what is read whole (a change batch, a version); `key_rows` (default
    KEY_ROWS_PER_DRIVER_ROW x driver_rows) what a read of some keys' rows may find. The scan costs
    the same either way (random keys touch every file), and through Spark the same rows cost a
    time-travel read, a scan and the jobs of every operator computed over them: a dimension
    update touching 20,000 of scale 1's customers reads their 200,000 orders."""

    def __init__(self, storage_options: dict[str, str] | None = None, driver_rows: int = 0,
                 columns: dict[str, set[str]] | None = None, key_rows: int | None = None,
                 held_bytes: int = HELD_BYTES, arrangements=None, files: KeyedFiles | None = None):
        self.storage_options = storage_options
        self.driver_rows = driver_rows
        self.key_rows = KEY_ROWS_PER_DRIVER_ROW * driver_rows if key_rows is None else key_rows
        self.held_bytes = held_bytes  # what versions read whole for keys may hold, in all
        self._held = 0
        self._scanned: set[tuple] = set()  # (path, version) scanned for some keys already
        self._refused: dict[tuple, list[tuple[frozenset, bool]]] = {}  # (path, version, field) -> key sets read in vain
        self.columns = columns or {}  # per table path, the columns the refresh's plans read
        self.arrangements = arrangements  # arrangements.Arrangements: inputs kept sorted by a key
        self.files = files  # keyed_files.KeyedFiles: state tables' reads through their local copies
        self.keyed: dict[tuple[str, str], int] = {}  # (input path, key) read by key -> latest version asked
        self._reads: dict[tuple, pa.Table | None] = {}
        self._locks: dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()

    def remembered(self, key: tuple, read):
        """`read()`, made once per refresh for `key` (steps asking at once wait for one read)."""
        return self._once(key, read)

    def table_at(self, path: str, version: int) -> DeltaTable:
        """delta-rs's table as of `version`, opened once per refresh: a version does not change,
        and each open reads the log again (on an object store, requests)."""
        return self._once(("table", path, version),
                          lambda: opened(path, self.storage_options, version))

    def rows_at(self, path: str, version: int) -> int | None:
        """The rows of the table as of `version`, by its files' statistics; None when they do not tell."""
        def count() -> int | None:
            try:
                return self.table_at(path, version).count()
            except (DeltaError, OSError, ValueError):
                return None
        return self._once(("rows", path, version), count)

    def _once(self, key: tuple, read):
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # steps running at once wait for one read
            if key not in self._reads:
                self._reads[key] = read()
            return self._reads[key]

    def holds_changes(self, logged: int, limit: int | None = None) -> bool:
        """Whether a change batch whose commits logged `logged` rows is read on the driver
        (`change_rows`, up to `driver_rows` rows, or `limit`): an update records two rows in the
        change feed (pre- and post-image), so twice the logged rows must fit."""
        return 2 * logged <= (self.driver_rows if limit is None else limit)

    def holds_range(self, path: str, logged: int | None, limit: int | None = None) -> bool:
        """Whether the change batch of a range of the table at `path` whose commits logged
        `logged` rows is read on the driver (`change_rows`): it fits (`holds_changes`), and
        delta-rs reads the table as Spark does (no column mapping, no deletion vectors, ...)."""
        return logged is not None and self.holds_changes(logged, limit) and self._alike(path)

    def _alike(self, path: str) -> bool:
        def alike() -> bool:
            try:
                return delta_rs_reads_alike(opened(path, self.storage_options))
            except (DeltaError, OSError):
                return False
        return self._once(("alike", path), alike)

    def _changes(self, path: str, before: int, after: int, limit: int | None = None) -> pa.Table | None:
        if not self.holds_range(path, changed_rows(path, before, after, self.storage_options), limit):
            return None
        try:
            table = opened(path, self.storage_options)
            if not delta_rs_reads_alike(table):  # as the table is now (holds_range remembers its first answer)
                return None
            return pa.table(table.load_cdf(starting_version=before + 1, ending_version=after).read_all())
        except (DeltaError, OSError):  # Spark reads it, and names what is wrong where it cannot
            return None

    def _snapshot(self, path: str, version: int, limit: int) -> pa.Table | None:
        try:
            rows = self.rows_at(path, version)
            table = self.table_at(path, version)
            if rows is None or rows > limit or not delta_rs_reads_alike(table):
                return None
            return pa.table(table.to_pyarrow_table())
        except (DeltaError, OSError, ValueError):  # unreadable by delta-rs here: Spark's to read, and names what is wrong
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
        def create() -> DataFrame:
            if not local.num_rows:  # PySpark 4.1 fails on an Arrow table with no chunk and a STRUCT column
                return spark.createDataFrame([], schema=shape)
            return spark.createDataFrame(local.cast(to_arrow_schema(shape)), schema=shape)

        return lazy_frame(spark, create, shape)

    def local(self, spark, data: pa.Table, schema: StructType) -> DataFrame:
        """Arrow rows whose columns are named as `schema`'s as a local relation of that schema."""
        return self._local(spark, data, schema, None)

    def snapshot_rows(self, path: str, version: int) -> pa.Table | None:
        """The table as of `version` as Arrow (delta-rs's types), or None when it is Spark's to read."""
        return self._once(("version", path, version), lambda: self._snapshot(path, version, self.driver_rows))

    def whole_rows(self, path: str, version: int) -> pa.Table | None:
        """`snapshot_rows` up to `key_rows` rows: a state read whole to be finalized on the driver
        (a scalar subquery's aggregate, an aggregated view joined as a partner), whose every row
        a step computes with. Through Spark such a read costs a scan and the jobs of each operator
        over it, every epoch (TPC-H Q11 and Q15 at scale 10: 9 and 24 jobs a step)."""
        held = self._reads.get(("version", path, version))
        if held is not None:
            return held
        return self._once(("whole", path, version), lambda: self._snapshot(path, version, self.key_rows))

    def snapshot(self, spark, path: str, version: int, schema: StructType | None = None) -> DataFrame | None:
        """The table as of `version` as a local relation (with `schema`, else the table's), or
        None when it is Spark's to read."""
        data = self.snapshot_rows(path, version)
        if data is None:
            return None
        if schema is None:
            schema = StructType.fromJson(json.loads(self.table_at(path, version).schema().to_json()))
        return self._local(spark, data, schema, None)

    def change_rows(self, path: str, before: int, after: int) -> pa.Table | None:
        """The change feed of versions before+1..after as Arrow (every column, `_change_type`),
        or None when the batch is Spark's to read."""
        return self._once(("changes", path, before, after), lambda: self._changes(path, before, after))

    def keyed_change_rows(self, path: str, before: int, after: int) -> pa.Table | None:
        """`change_rows` for an arrangement (arrangements.py), which keeps only the rows of some
        keys of it: bounded by `key_rows`, what a read of some keys' rows may hold, not by
        `driver_rows`."""
        held = self._reads.get(("changes", path, before, after))
        if held is not None:
            return held
        return self._once(("keyed changes", path, before, after),
                          lambda: self._changes(path, before, after, max(self.key_rows, self.driver_rows)))

    def changes(self, spark, path: str, before: int, after: int, schema: StructType,
                columns: list[str]) -> DataFrame | None:
        """The weighted change rows of versions before+1..after for `columns` as a local
        relation, or None when the batch is Spark's to read."""
        data = self.change_rows(path, before, after)
        if data is None:
            return None
        return self._local(spark, data, schema, columns, feed_weights(data))

    def consolidated_changes(self, spark, path: str, before: int, after: int, schema: StructType,
                             columns: list[str]) -> tuple[DataFrame, pa.Table] | None:
        """The change batch of versions before+1..after for `columns`, consolidated on the
        driver (changes.consolidate_rows): as a local relation and as its Arrow rows (columns
        named as in `schema`, and WEIGHT). None when the batch is Spark's to read or to group."""
        data = self.change_rows(path, before, after)
        if data is None:
            return None
        by_name = {f.name.lower(): f.name for f in schema.fields}
        names = {c.lower(): c for c in data.column_names}
        if len({c.lower() for c in columns}) != len(columns) or \
                any(c.lower() not in by_name or c.lower() not in names for c in columns):
            return None
        fields = [by_name[c.lower()] for c in columns]
        rows = consolidate_rows(pa.Table.from_arrays(
            [data.column(names[c.lower()]) for c in columns] + [feed_weights(data)], names=fields + [WEIGHT]))
        if rows is None:
            return None
        return self._local(spark, rows, schema, fields, rows.column(WEIGHT)), rows

    @staticmethod
    def _key_array(keys: tuple, target: pa.DataType) -> pa.Array | None:
        """`keys` as an array of the column's type, or None where is_in would not decide as
        Spark's equality does (string keys for an integer column: Spark casts, is_in does not)."""
        if not keys:
            return pa.array([], target)
        values = pa.array(list(keys))
        if key_kind(values.type) != key_kind(target):
            return None
        return values.cast(target)  # raises where a value does not fit: Spark's to read

    def _dataset(self, path: str, version: int, field: str):
        """delta-rs's table and dataset as of `version`, the columns to read with `field`, and
        `field`'s Arrow field; None where delta-rs does not read the table as Spark does."""
        table = self.table_at(path, version)
        if not delta_rs_reads_alike(table):
            return None
        dataset = dataset_of(table)
        names = {name.lower(): name for name in dataset.schema.names}
        return table, dataset, self._read_columns(path, dataset.schema.names, field), \
            dataset.schema.field(names[field.lower()])

    def _bounded_scan(self, dataset, columns: list[str], condition) -> pa.Table | None:
        """The rows of `dataset` passing `condition`, at most `key_rows` of them, else None."""
        batches, rows = [], 0
        for batch in filtered_batches(dataset, columns, condition):
            rows += batch.num_rows
            if rows > self.key_rows:
                return None  # too many: Spark's to read
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=pa.schema([dataset.schema.field(c) for c in columns]))

    def _scan_for_keys(self, path: str, version: int, field: str, keys: tuple, nulls: bool,
                       copies: bool = True) -> pa.Table | None:
        try:
            opened = self._dataset(path, version, field)
            if opened is None:
                return None
            table, dataset, columns, target = opened
            values = self._key_array(keys, target.type)
            if values is None:
                return None
            if not keys and not nulls:  # no keys (a change batch its partners left empty): no rows
                return pa.schema([dataset.schema.field(c) for c in columns]).empty_table()
            copied = copies and self._copied(path, target.type)
            dataset = files_holding(table, dataset, target.name, values, nulls, row_groups=not copied)
            condition = ds.field(target.name).isin(values)
            if nulls:
                condition = condition | ds.field(target.name).is_null()
            if copied:
                found, copied, _ = self.files.rows_of(path, dataset, columns, target.name, values, nulls,
                                                             condition, self.key_rows)
                log.debug("read %s version %d for %d values of %s: %d files from local copies", path, version,
                          len(keys), field, copied)
                return found if found is not None and found.num_rows <= self.key_rows else None
            return self._bounded_scan(dataset, columns, condition)
        except (DeltaError, OSError, ValueError, TypeError, KeyError, pa.ArrowException):
            return None  # a type or table delta-rs cannot read as Spark does: Spark's to read

    def _copied(self, path: str, key_type: pa.DataType) -> bool:
        """Whether reads of `path` by a key of `key_type` go through local copies of its files: a
        state table's (written in key order, writes.py), by an integer or date key. An input's
        reads are its arrangement's (unsorted, a copy's batch bounds would admit every key)."""
        return path not in self.columns and self.files is not None and self.files.copied(key_type)

    def _read_columns(self, path: str, names: list[str], field: str) -> list[str]:
        """Of a table's column `names`, those the refresh reads from it and the key `field`
        (every column of a table no plan reads, such as a state table)."""
        wanted = self.columns.get(path)
        by_name = {name.lower(): name for name in names}
        return [by_name[c.lower()] for c in sorted(wanted | {field}) if c.lower() in by_name] if wanted else list(names)

    def _read_for_keys(self, path: str, version: int, field: str, keys: tuple, nulls: bool,
                       copies: bool = True) -> pa.Table | None:
        began = time.perf_counter()
        how = "from its arrangement"
        try:
            found = self._arrangement_rows(path, version, field, keys, nulls)
            if found is None:
                found, how = self._scan_for_keys(path, version, field, keys, nulls, copies), "by a scan"
        except TooManyRows:
            found = None
        if found is not None and path in self.columns:
            # an input of the refresh's plans (not a state table) whose keys' rows fit on the
            # driver: worth arranging (a key whose rows do not, as a nation key's, is Spark's anyway)
            with self._guard:
                self.keyed[(path, field)] = max(version, self.keyed.get((path, field), -1))
        log.debug("read %s version %d for %d values of %s on the driver %s: %s rows in %.2f s", path, version,
                  len(keys), field, how, "too many" if found is None else found.num_rows, time.perf_counter() - began)
        return found

    def _arrangement_rows(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """`_scan_for_keys`'s rows read from the input's arrangement by `field` (arrangements.py), or
        None where none serves this version and these columns."""
        if self.arrangements is None or path not in self.columns or not (keys or nulls):
            return None
        arranged = self._arranged_keys(path, version, field, keys)
        if arranged is None:
            return None
        schema, columns, values = arranged
        found = self.arrangements.read(path, version, field, values, nulls, columns,
                                       lambda before, after: self.keyed_change_rows(path, before, after),
                                       self.key_rows)
        if found is None:
            return None
        try:
            return found.cast(pa.schema([schema.field(c) for c in columns]))
        except (pa.ArrowException, ValueError):
            return None

    def expected_key_rows(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> float | None:
        """About how many rows a read of `keys` would take out of storage, before it is made (a
        join's reads choose their order by it, narrowing.narrow_partners): none where the refresh
        holds them already (the version whole, or every key read before), else the arrangement's
        estimate (Arrangements.expected_rows) for the keys not held; None where neither tells."""
        if self._reads.get(("version", path, version)) is not None or \
                self._reads.get(("read columns", path, version)) is not None:
            return 0.0
        held = self._reads.get(("restricted", path, version, field))
        missing = [k for k in keys if k not in held[0]] if held is not None else list(keys)
        if not missing and (not nulls or (held is not None and held[1])):
            return 0.0
        if self.arrangements is None or path not in self.columns or not missing:
            return None
        try:
            arranged = self._arranged_keys(path, version, field, tuple(sorted(missing)))
        except (TypeError, pa.ArrowException):  # values of unlike types, or not of the column's
            return None
        return None if arranged is None else self.arrangements.expected_rows(path, version, field, arranged[2],
                                                                             arranged[1])

    def _arranged_keys(self, path: str, version: int, field: str, keys: tuple):
        """The version's Arrow schema, the columns read of it, and `keys` as an array of `field`'s
        type; None where delta-rs does not read the version as Spark does, or the keys' type is
        not the column's."""
        try:
            table = self.table_at(path, version)
            if not delta_rs_reads_alike(table):
                return None
            schema = pa.schema(table.schema().to_arrow())
        except (DeltaError, OSError, ValueError, pa.ArrowException):
            return None
        columns = self._read_columns(path, schema.names, field)
        target = schema.field(columns[[c.lower() for c in columns].index(field.lower())])
        values = self._key_array(keys, target.type)
        return None if values is None else (schema, columns, values)

    def is_arranged(self, path: str, field: str, version: int) -> bool:
        """Whether an arrangement serves reads of `path` by `field` as of `version`."""
        if self.arrangements is None or path not in self.columns:
            return False
        wanted = [c for c in self.columns[path]] + [field]
        return self.arrangements.serving(path, field, version, wanted) is not None

    def _covering(self, path: str, version: int, field: str, keys: tuple, nulls: bool,
                  copies: bool = True) -> pa.Table | None:
        """The rows of `keys` out of the rows read so far for (path, version, field). A read for
        keys not yet held reads only those (an arrangement's read costs per key; a scan costs the
        same for any number of keys), adds their rows to the held ones, and the steps asking next
        for a subset (other tables, other terms) filter the held rows instead of reading again.
        Reading the union of every key set asked so far instead made each step of a refresh read
        again what the steps before it had read: TPC-H's lineitem by order key, 18 reads a refresh."""
        whole = self.snapshot_rows(path, version)
        if whole is not None:  # a small version is held whole: its rows of these keys
            return self._held_rows_of_keys(whole, path, field, keys, nulls)
        found = self._held_rows_of_keys(self._reads.get(("read columns", path, version)), path, field, keys, nulls)
        if found is not None:
            return self._bounded(found)
        slot = ("restricted", path, version, field)
        wanted = frozenset(keys)
        if self._refuses(slot[1:], wanted, nulls):
            return None
        with self._guard:
            lock = self._locks.setdefault(slot, threading.Lock())
        with lock:
            held = self._reads.get(slot)  # (values, nulls, rows)
            if held is None or not (wanted <= held[0] and (held[1] or not nulls)):
                missing = wanted - held[0] if held else wanted
                missing_nulls = nulls and not (held and held[1])
                try:
                    ordered = tuple(sorted(missing))
                except TypeError:  # values of unlike types: read these keys alone
                    ordered = None
                if (path, version) in self._scanned and held is not None and not self.is_arranged(path, field, version):
                    found = self._held_rows_of_keys(self._read_columns_whole(path, version, field, held[2]), path, field,
                                          keys, nulls)
                    if found is not None:
                        return self._bounded(found)
                data = self._read_for_keys(path, version, field, ordered, missing_nulls, copies) if ordered is not None else None
                self._scanned.add((path, version))
                if data is None:
                    if ordered is None:  # unlike values: these keys alone, not held
                        alone = self._read_for_keys(path, version, field, keys, nulls, copies)
                        if alone is None:
                            self._refuse(slot[1:], wanted, nulls)
                        return alone
                    self._refuse(slot[1:], missing, missing_nulls)
                    return None  # the missing keys' rows alone are too many, so are the wanted keys'
                merged = self._merged(held[2], data) if held is not None else data
                if merged is None or merged.num_rows > self.key_rows:  # not held: these keys' rows
                    found = data if held is None else self._merged(self._rows_of_keys(held[2], field, keys, nulls), data)
                    return self._bounded(found) if found is not None else \
                        self._read_for_keys(path, version, field, keys, nulls, copies)
                held = self._reads[slot] = (held[0] | missing if held else missing,
                                            bool(missing_nulls or (held and held[1])), merged)
            data = held[2]
        if held[0] == wanted and held[1] == nulls:
            return data
        found = self._rows_of_keys(data, field, keys, nulls)
        return found if found is not None else self._read_for_keys(path, version, field, keys, nulls, copies)

    @staticmethod
    def _merged(held: pa.Table | None, read: pa.Table | None) -> pa.Table | None:
        """The rows of two reads of one (path, version, field) together (disjoint key sets), or
        None where their types differ (an arrangement's read and a scan's)."""
        if held is None or read is None:
            return None
        try:
            return pa.concat_tables([held, read.select(held.column_names).cast(held.schema)])
        except (pa.ArrowException, KeyError, ValueError):
            return None

    def _refuses(self, read: tuple, keys: frozenset, nulls: bool) -> bool:
        """Whether a read of `keys` must fail as one of their subsets did: more keys match at
        least the same rows (TPC-H Q5's reduction asked orders for the same large set of
        customers twice per term, each a costly read refused for its rows)."""
        with self._guard:
            return any(failed <= keys and (nulls or not failed_nulls)
                       for failed, failed_nulls in self._refused.get(read, ()))

    def _refuse(self, read: tuple, keys: frozenset, nulls: bool) -> None:
        with self._guard:
            self._refused.setdefault(read, []).append((keys, nulls))

    def _held_rows_of_keys(self, whole: pa.Table | None, path: str, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """The rows of `keys` in `whole` (a version held whole), with the columns a read of them returns."""
        found = self._rows_of_keys(whole, field, keys, nulls) if whole is not None else None
        return found.select(self._read_columns(path, found.schema.names, field)) if found is not None else None

    def _bounded(self, found: pa.Table | None) -> pa.Table | None:
        return found if found is not None and found.num_rows <= self.key_rows else None

    def _read_columns_whole(self, path: str, version: int, field: str, sample: pa.Table) -> pa.Table | None:
        """The columns the refresh reads of the table as of `version`, every row, held for the
        rest of the refresh (with `field`, the key asked for, if the refresh reads no other column
        of it): asked when a version is about to be scanned for keys a second time.
        Random keys make every such scan decode every file (TPC-H's lineitem was scanned many
        times an epoch, a large share of the epoch: `python -m bench.epoch_reads` shows each such
        scan), where one decode and in-memory filters serve them all. Only while the estimate
        (its rows times the bytes per row of `sample`, an earlier read of the same columns) fits
        what `held_bytes` has left; None otherwise."""
        return self._once(("read columns", path, version), lambda: self._read_whole(path, version, field, sample))

    def _read_whole(self, path: str, version: int, field: str, sample: pa.Table) -> pa.Table | None:
        try:
            table = self.table_at(path, version)
            per_row = sample.nbytes / sample.num_rows if sample.num_rows else None
            with self._guard:
                room = per_row is not None and table.count() * per_row * 1.2 <= self.held_bytes - self._held
            if not room or not delta_rs_reads_alike(table):
                return None
            began = time.perf_counter()
            dataset = table.to_pyarrow_dataset()
            found = dataset.to_table(columns=self._read_columns(path, dataset.schema.names, field))
            with self._guard:
                self._held += found.nbytes
            log.debug("read %s version %d whole on the driver (%d columns, %d rows, %.0f MB) in %.2f s",
                      path, version, found.num_columns, found.num_rows, found.nbytes / 1e6, time.perf_counter() - began)
            return found
        except (DeltaError, OSError, ValueError, pa.ArrowException):
            return None

    def _rows_of_keys(self, data: pa.Table, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """The rows of `data` whose `field` is one of `keys` (or NULL, with `nulls`); None where
        is_in would not decide as Spark's equality does."""
        names = [c for c in data.column_names if c.lower() == field.lower()]
        if not names:
            return None
        column = data.column(names[0])
        values = self._key_array(keys, column.type)
        if values is None:
            return None
        mask = pc.is_in(column, value_set=values)
        if nulls:
            mask = pc.or_(mask, pc.is_null(column))
        return data.filter(pc.fill_null(mask, False))

    def keys_frame(self, spark, path: str, version: int, schema: StructType, field: str, keys: tuple,
                   nulls: bool = False) -> DataFrame | None:
        """The rows of the table as of `version` whose `field` is one of `keys` (sorted, distinct,
        non-NULL; with `nulls`, also the rows where it is NULL), as a local relation with the
        columns the refresh reads, or None when they are too many or Spark's to read."""
        found = self.keys_frame_and_rows(spark, path, version, schema, field, keys, nulls)
        return found[0] if found is not None else None

    def keys_rows(self, path: str, version: int, field: str, keys: tuple, nulls: bool = False,
                  copies: bool = True) -> pa.Table | None:
        """`keys_frame`'s rows as Arrow (every column the refresh reads, or every column of a
        table no plan reads, such as a state table), or None. `copies=False`: a table no plan
        reads is scanned without local copies of its files (a derived table's output: neither
        written in key order nor read again by key, its copies would only take the budget)."""
        return self._covering(path, version, field, keys, nulls, copies)

    def keys_frame_and_rows(self, spark, path: str, version: int, schema: StructType, field: str, keys: tuple,
                             nulls: bool = False) -> tuple[DataFrame, pa.Table] | None:
        """`keys_frame`, and the same rows as Arrow (the table's column names)."""
        data = self._covering(path, version, field, keys, nulls)
        if data is None:
            return None
        by_name = {f.name.lower(): f.name for f in schema.fields}
        return self._local(spark, data, schema, [by_name[c.lower()] for c in data.column_names]), data

    def range_frame_and_rows(self, spark, path: str, version: int, schema: StructType, field: str, low, high
                             ) -> tuple[DataFrame, pa.Table] | None:
        """The rows of the table as of `version` whose `field` lies in [low, high] (the bounds
        widened outward to the column's type: a superset), as a local relation with the columns
        the refresh reads and as Arrow (the table's column names); None where they are too many
        (`key_rows`), the column is not an integer, decimal or date, or Spark's to read."""
        data = self._once(("range", path, version, field, low, high),
                          lambda: self._scan_for_range(path, version, field, low, high))
        if data is None:
            return None
        by_name = {f.name.lower(): f.name for f in schema.fields}
        return self._local(spark, data, schema, [by_name[c.lower()] for c in data.column_names]), data

    def _scan_for_range(self, path: str, version: int, field: str, low, high) -> pa.Table | None:
        try:
            opened = self._dataset(path, version, field)
            bounds = widened_bounds(low, high, opened[3].type) if opened is not None else None
            if bounds is None:
                return None
            _, dataset, columns, target = opened
            condition = (ds.field(target.name) >= bounds[0]) & (ds.field(target.name) <= bounds[1])
            found = self._bounded_scan(dataset, columns, condition)
            log.debug("read %s version %d for %s in [%s, %s] on the driver: %s rows", path, version, field, low, high,
                      found.num_rows if found is not None else "too many")
            return found
        except (DeltaError, OSError, ValueError, TypeError, KeyError, pa.ArrowException):
            return None

    def clear(self) -> None:
        with self._guard:
            self._reads.clear()
            self._locks.clear()
            self._scanned.clear()
            self._refused.clear()
            self._held = 0


def widened_bounds(low, high, target: pa.DataType) -> tuple[pa.Scalar, pa.Scalar] | None:
    """[low, high] (integers, decimals, finite doubles, dates) as scalars of an integer, decimal or
    date column's Arrow type, rounded outward (floor and ceiling at its scale), so every value of
    the column within the exact bounds is within these; None for another type or a bound the type
    cannot hold. A DOUBLE column is not read by range (its NaN orders above every number)."""
    try:
        if pa.types.is_date(target):
            if not all(isinstance(v, datetime.date) and not isinstance(v, datetime.datetime) for v in (low, high)):
                return None
            return pa.scalar(low, target), pa.scalar(high, target)
        if not all(isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool) for v in (low, high)):
            return None
        scale = target.scale if pa.types.is_decimal(target) else 0
        if not (pa.types.is_decimal(target) or pa.types.is_integer(target)):
            return None
        unit = decimal.Decimal(1).scaleb(-scale)
        exact = decimal.Context(prec=100)
        down = decimal.Decimal(low).quantize(unit, rounding=decimal.ROUND_FLOOR, context=exact)
        up = decimal.Decimal(high).quantize(unit, rounding=decimal.ROUND_CEILING, context=exact)
        if pa.types.is_integer(target):
            return pa.scalar(int(down), target), pa.scalar(int(up), target)
        return pa.scalar(down, target), pa.scalar(up, target)
    except (pa.ArrowException, OverflowError, ValueError, TypeError, decimal.InvalidOperation):
        return None
