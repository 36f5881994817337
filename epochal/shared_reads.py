"""Small Delta reads made once per refresh, on the driver, and shared by every step that makes them.

Every table of an epoch that reads a source reads the same versions of it, and through Spark each
step paid for each of its reads: a change-feed read costs planning and jobs, and a time-travel
read is costly (Delta rebuilds the version's snapshot from the log, every time).
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
file, so Delta's file skipping saves nothing), at two versions; pyarrow scans the same rows on
the driver without a Spark job (figures in bench/RESULTS.md).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from .changes import POSITIVE_TYPES, consolidate_rows
from .graph import WEIGHT
from .local_copies import integers_and_nulls

CHANGE_TYPE = "_change_type"
log = logging.getLogger("epochal")


def key_kind(arrow_type: pa.DataType) -> str:
    for kind, test in (("integer", pa.types.is_integer), ("string", pa.types.is_string),
                       ("string", pa.types.is_large_string), ("string", pa.types.is_string_view),
                       ("date", pa.types.is_date), ("decimal", pa.types.is_decimal),
                       ("boolean", pa.types.is_boolean)):
        if test(arrow_type):
            return kind
    return str(arrow_type)


def _weights(data: pa.Table) -> pa.ChunkedArray:
    """A change feed's weights: +1 for inserts and post-images, -1 for deletes and pre-images."""
    positive = pc.is_in(data.column(CHANGE_TYPE).cast(pa.string()), value_set=pa.array(POSITIVE_TYPES))
    return pc.if_else(positive, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))


class LocalFrame(ClassicDataFrame):
    """A local relation of Arrow rows, handed to Spark only when Spark first needs it.

    Most rows read or computed on the driver stay there (a join term, an aggregate, a write
    computed in Arrow), yet each is a DataFrame in case a rule above gives it to Spark, and
    createDataFrame has a fixed cost that a step creating dozens of them pays dozens of times
    (TPC-H Q21's did). Until a method needs the Java DataFrame, only the schema is known; the
    first attribute that needs it creates it (once, under a lock: steps share frames), and from
    then on this is that DataFrame."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, session, create, schema: StructType):
        self.__dict__.update(_session=session, _create=create, _creating=threading.Lock(), schema=schema)

    @property
    def created(self) -> bool:
        return "_jdf" in self.__dict__

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_create", "_creating"):
            raise AttributeError(name)
        with self.__dict__["_creating"]:
            if "_jdf" not in self.__dict__:
                frame = self.__dict__["_create"]()
                self.__dict__.update({k: v for k, v in frame.__dict__.items() if k != "schema"})
        if name in self.__dict__:
            return self.__dict__[name]
        return super().__getattr__(name)  # DataFrame's: a column by name


def lazy_frame(spark, create, schema: StructType) -> DataFrame:
    """`create()`'s frame, of `schema`, created only when Spark first needs it (a LocalFrame);
    Spark Connect's frames are not classic: created now."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return create()
    return LocalFrame(spark, create, schema)


def _admits(keys: list, smallest, largest) -> bool:
    """Whether a [smallest, largest] range (either end None: unknown) holds one of the sorted `keys`."""
    import bisect

    if smallest is None or largest is None:
        return True
    at = bisect.bisect_left(keys, smallest)
    return at < len(keys) and keys[at] <= largest


class _FileBounds:
    """A Parquet data file's fragment with its footer read, and its row groups' statistics of
    one column as arrays, kept across reads: a keyed read of an arrangement otherwise parsed
    every file's footer and looped over tens of thousands of row groups' statistics in Python on
    every read, a large share of the read. A Delta data file is never rewritten in place, so
    (path, size) names its contents. Bounded by column chunks held (CACHED_CHUNKS)."""

    def __init__(self):
        self._files: collections.OrderedDict = collections.OrderedDict()
        self._chunks = 0
        self._guard = threading.Lock()

    def get(self, fragment, size, column: str):
        """(fragment with its metadata, lows, highs, may hold NULL) for `column`, lows and highs
        as int64 (dates as days; a row group without statistics spans everything); None where
        the file has no such leaf column or its statistics are not integers or dates."""
        key = (fragment.path, size, column) if size is not None else None  # unsized: not kept
        with self._guard:
            found = self._files.get(key) if key is not None else None
            if found is not None:
                self._files.move_to_end(key)
                return found[:-1]
        metadata = fragment.metadata
        leaf = next((j for j in range(metadata.num_columns) if metadata.schema.column(j).path == column), None)
        if leaf is None:
            return None
        count = metadata.num_row_groups
        lows = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
        highs = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
        nulls = np.ones(count, dtype=bool)
        for index in range(count):
            statistics = metadata.row_group(index).column(leaf).statistics
            if statistics is None:
                continue
            if statistics.has_min_max:
                low, high = _as_integer(statistics.min), _as_integer(statistics.max)
                if low is None or high is None:
                    return None
                lows[index], highs[index] = low, high
            nulls[index] = not statistics.has_null_count or statistics.null_count > 0
        found = (fragment, lows, highs, nulls)
        if key is None:
            return found
        with self._guard:
            self._files[key] = (*found, count * metadata.num_columns)
            self._chunks += count * metadata.num_columns
            while self._chunks > CACHED_CHUNKS and len(self._files) > 1:
                self._chunks -= self._files.popitem(last=False)[1][-1]
        return found


CACHED_CHUNKS = 2_000_000  # column chunks of cached footers (a few hundred bytes each)
_FILE_BOUNDS = _FileBounds()


EPOCH_DAY = date(1970, 1, 1)


def _as_integer(value) -> int | None:
    """A statistic as _FileBounds holds it: an integer, or a date as days since 1970 (what
    date32 holds, so `_as_integers` casts keys alike); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, date) and not isinstance(value, datetime):
        return (value - EPOCH_DAY).days
    return None


def _as_integers(values: pa.Array) -> np.ndarray:
    """Sorted integer or date keys, none NULL, as int64 (dates as days since 1970), as _FileBounds
    and the local copies' bounds hold them."""
    return integers_and_nulls(values)[0]


def _row_groups_holding(fragment, column: str, keys: np.ndarray, nulls: bool, size=None):
    """`fragment` cut to its row groups whose statistics of `column` admit one of `keys` (sorted
    int64, `_as_integers`), or a NULL when `nulls`; None when it holds none; the fragment itself
    when it cannot tell."""
    found = _FILE_BOUNDS.get(fragment, size, column)
    if found is None:
        return fragment
    fragment, lows, highs, may_null = found
    at = np.searchsorted(keys, lows, side="left")
    admitted = (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] <= highs)
    if nulls:
        admitted |= may_null
    chosen = np.flatnonzero(admitted)
    if not len(chosen):
        return None
    return fragment if len(chosen) == len(lows) else fragment.subset(row_group_ids=chosen.tolist())


def _files_holding(table, dataset, column: str, values: pa.Array, nulls: bool, row_groups: bool = True):
    """`dataset` cut to the files whose min/max statistics of `column` admit one of `values`
    (sorted), or a NULL when `nulls`, and within them (with `row_groups`) to the row groups whose
    statistics do (that reads each file's footer: not wanted where local copies, with bounds of
    their own, serve the files).
    pyarrow skips neither for an `isin` filter, and Delta keeps every file's statistics: changes
    to recent or old keys (an OLTP table's usual pattern) then read a few files instead of all,
    and a table sorted by the key in small row groups (a join's keyed state) is read for random
    keys in about (keys x row group) rows, at any size, several times faster than with `isin`
    alone (`python -m bench.keyed_reads` measures both).
    Only for integers and dates, whose statistics are exact (a string's are truncated); a file
    or row group without statistics is kept."""
    import pyarrow.dataset as ds

    if key_kind(values.type) not in ("integer", "date") or not len(values):
        return dataset
    actions = table.get_add_actions(flatten=True)
    low, high, null_count = (f"min.{column}", f"max.{column}", f"null_count.{column}")
    if low not in actions.column_names or high not in actions.column_names:
        return dataset
    keys = sorted(values.to_pylist())
    kept = {}
    counts = actions.column(null_count).to_pylist() if null_count in actions.column_names \
        else [None] * actions.num_rows
    for path, size, smallest, largest, count in zip(
            actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(),
            actions.column(low).to_pylist(), actions.column(high).to_pylist(), counts):
        if _admits(keys, smallest, largest) or (nulls and count != 0):
            kept[path] = size
    fragments = list(dataset.get_fragments())
    chosen = [f for f in fragments if f.path in kept]
    if len(chosen) != len(kept):  # paths spelled otherwise (encoded): read every file
        chosen = fragments
    if not row_groups:
        cut = chosen
    else:
        cut = _row_groups_cut(chosen, column, keys, values.type, nulls, kept)
    cut = [f for f in cut if f is not None]
    if len(cut) == len(fragments) and all(a is b for a, b in zip(cut, fragments)):
        return dataset
    return ds.FileSystemDataset(cut, dataset.schema, dataset.format, dataset.filesystem)


def _row_groups_cut(chosen: list, column: str, keys: list, kind: pa.DataType, nulls: bool, sizes: dict) -> list:
    """Each of `chosen` cut by `_row_groups_holding` (None: holds none), or all of them as they
    are where they are not Parquet fragments or their statistics are unlike."""
    try:
        integers = _as_integers(pa.array(keys, kind))
        return [_row_groups_holding(f, column, integers, nulls, sizes.get(f.path)) for f in chosen]
    except (AttributeError, TypeError, pa.ArrowException):  # not Parquet fragments, or unlike statistics
        return chosen


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
                 held_bytes: int = HELD_BYTES, arrangements=None):
        self.storage_options = storage_options
        self.driver_rows = driver_rows
        self.key_rows = KEY_ROWS_PER_DRIVER_ROW * driver_rows if key_rows is None else key_rows
        self.held_bytes = held_bytes  # what versions read whole for keys may hold, in all
        self._held = 0
        self._scanned: set[tuple] = set()  # (path, version) scanned for some keys already
        self._refused: dict[tuple, list[tuple[frozenset, bool]]] = {}  # (path, version, field) -> key sets read in vain
        self.columns = columns or {}  # per table path, the columns the refresh's plans read
        self.arrangements = arrangements  # arrangements.Arrangements: inputs kept sorted by a key
        self.keyed: dict[tuple[str, str], int] = {}  # (input path, key) read by key -> latest version asked
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

    def _changes(self, path: str, before: int, after: int, limit: int | None = None) -> pa.Table | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        from .rescan import changed_rows

        rows = changed_rows(path, before, after, self.storage_options)
        # an update records two rows (pre- and post-image)
        if rows is None or 2 * rows > (self.driver_rows if limit is None else limit):
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
        def create() -> DataFrame:
            return spark.createDataFrame(local.cast(to_arrow_schema(shape)), schema=shape)

        return lazy_frame(spark, create, shape)

    def local(self, spark, data: pa.Table, schema: StructType) -> DataFrame:
        """Arrow rows whose columns are named as `schema`'s as a local relation of that schema."""
        return self._local(spark, data, schema, None)

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
        return self._local(spark, data, schema, columns, _weights(data))

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
            [data.column(names[c.lower()]) for c in columns] + [_weights(data)], names=fields + [WEIGHT]))
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
            columns = self._read_columns(path, dataset.schema.names, field)
            target = dataset.schema.field(names[field.lower()])
            values = self._key_array(keys, target.type)
            if values is None:
                return None
            if not keys and not nulls:  # no keys (a change batch its partners left empty): no rows
                return pa.schema([dataset.schema.field(c) for c in columns]).empty_table()
            copied = self._copied(path, target.type)
            dataset = _files_holding(table, dataset, target.name, values, nulls, row_groups=not copied)
            condition = ds.field(target.name).isin(values)
            if nulls:
                condition = condition | ds.field(target.name).is_null()
            if copied:
                found, copied, _ = self.arrangements.rows_of(path, dataset, columns, target.name, values, nulls,
                                                             condition, self.key_rows)
                log.debug("read %s version %d for %d values of %s: %d files from local copies", path, version,
                          len(keys), field, copied)
                return found if found is not None and found.num_rows <= self.key_rows else None
            batches, rows = [], 0
            for batch in dataset.scanner(columns=columns, filter=condition).to_batches():
                rows += batch.num_rows
                if rows > self.key_rows:
                    return None  # too many: Spark's to read
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=pa.schema([dataset.schema.field(c) for c in columns]))
        except (DeltaError, OSError, ValueError, TypeError, KeyError, pa.ArrowException):
            return None  # a type or table delta-rs cannot read as Spark does: Spark's to read

    def _copied(self, path: str, key_type: pa.DataType) -> bool:
        """Whether reads of `path` by a key of `key_type` go through local copies of its files: a
        state table's (written in key order, writes.py), by an integer or date key. An input's
        reads are its arrangement's (unsorted, a copy's batch bounds would admit every key)."""
        return (path not in self.columns and self.arrangements is not None and self.arrangements.copies is not None
                and key_kind(key_type) in ("integer", "date"))

    def _read_columns(self, path: str, names: list[str], field: str) -> list[str]:
        """Of a table's column `names`, those the refresh reads from it and the key `field`
        (every column of a table no plan reads, such as a state table)."""
        wanted = self.columns.get(path)
        by_name = {name.lower(): name for name in names}
        return [by_name[c.lower()] for c in sorted(wanted | {field}) if c.lower() in by_name] if wanted else list(names)

    def _timed_read(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        began = time.perf_counter()
        found = self._arranged(path, version, field, keys, nulls)
        how = "from its arrangement"
        if found is None:
            found, how = self._restricted(path, version, field, keys, nulls), "by a scan"
        if found is not None and path in self.columns:
            # an input of the refresh's plans (not a state table) whose keys' rows fit on the
            # driver: worth arranging (a key whose rows do not, as a nation key's, is Spark's anyway)
            with self._guard:
                self.keyed[(path, field)] = max(version, self.keyed.get((path, field), -1))
        log.debug("read %s version %d for %d values of %s on the driver %s: %s rows in %.2f s", path, version,
                  len(keys), field, how, "too many" if found is None else found.num_rows, time.perf_counter() - began)
        return found

    def _arranged(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """`_restricted`'s rows read from the input's arrangement by `field` (arrangements.py), or
        None where none serves this version and these columns."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        if self.arrangements is None or path not in self.columns or not keys:
            return None
        try:
            table = DeltaTable(path, version=version, storage_options=self.storage_options)
            if not self._plain(table):
                return None
            schema = pa.schema(table.schema().to_arrow())
        except (DeltaError, OSError, ValueError, pa.ArrowException):
            return None
        columns = self._read_columns(path, schema.names, field)
        target = schema.field(columns[[c.lower() for c in columns].index(field.lower())])
        values = self._key_array(keys, target.type)
        if values is None:
            return None
        found = self.arrangements.read(path, version, field, values, nulls, columns,
                                       lambda before, after: self.keyed_change_rows(path, before, after),
                                       self.key_rows)
        if found is None:
            return None
        try:
            return found.cast(pa.schema([schema.field(c) for c in columns]))
        except (pa.ArrowException, ValueError):
            return None

    def arranged(self, path: str, field: str, version: int) -> bool:
        """Whether an arrangement serves reads of `path` by `field` as of `version`."""
        if self.arrangements is None or path not in self.columns:
            return False
        wanted = [c for c in self.columns[path]] + [field]
        return self.arrangements.serving(path, field, version, wanted) is not None

    def _covering(self, path: str, version: int, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """The rows of `keys` out of the rows read so far for (path, version, field). A scan costs
        the same for any number of keys (random keys touch every file), so a read for keys not yet
        held reads the union of every key set asked for, and the steps asking next for a subset
        (other tables, other terms) filter the held rows instead of scanning again."""
        whole = self.snapshot_rows(path, version)
        if whole is not None:  # a small version is held whole: its rows of these keys
            return self._keys_of(whole, path, field, keys, nulls)
        found = self._keys_of(self._reads.get(("read columns", path, version)), path, field, keys, nulls)
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
                union = wanted | held[0] if held else wanted
                union_nulls = nulls or bool(held and held[1])
                try:
                    ordered = tuple(sorted(union))
                except TypeError:  # values of unlike types: read these keys alone
                    ordered = None
                if (path, version) in self._scanned and held is not None and not self.arranged(path, field, version):
                    found = self._keys_of(self._read_columns_whole(path, version, field, held[2]), path, field,
                                          keys, nulls)
                    if found is not None:
                        return self._bounded(found)
                data = self._timed_read(path, version, field, ordered, union_nulls) if ordered is not None else None
                self._scanned.add((path, version))
                if data is None:  # the union is too many rows (or unlike): these keys alone, not held
                    if ordered is not None:
                        self._refuse(slot[1:], union, union_nulls)
                    if held is None and ordered is not None:
                        return None  # these keys were the union
                    alone = self._timed_read(path, version, field, keys, nulls)
                    if alone is None:
                        self._refuse(slot[1:], wanted, nulls)
                    return alone
                held = self._reads[slot] = (union, union_nulls, data)
            data = held[2]
        if held[0] == wanted and held[1] == nulls:
            return data
        found = self._of_keys(data, field, keys, nulls)
        return found if found is not None else self._timed_read(path, version, field, keys, nulls)

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

    def _keys_of(self, whole: pa.Table | None, path: str, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
        """The rows of `keys` in `whole` (a version held whole), with the columns a read of them returns."""
        found = self._of_keys(whole, field, keys, nulls) if whole is not None else None
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
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        try:
            table = DeltaTable(path, version=version, storage_options=self.storage_options)
            per_row = sample.nbytes / sample.num_rows if sample.num_rows else None
            with self._guard:
                room = per_row is not None and table.count() * per_row * 1.2 <= self.held_bytes - self._held
            if not room or not self._plain(table):
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

    def _of_keys(self, data: pa.Table, field: str, keys: tuple, nulls: bool) -> pa.Table | None:
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

    def restricted(self, spark, path: str, version: int, schema: StructType, field: str, keys: tuple,
                   nulls: bool = False) -> DataFrame | None:
        """The rows of the table as of `version` whose `field` is one of `keys` (sorted, distinct,
        non-NULL; with `nulls`, also the rows where it is NULL), as a local relation with the
        columns the refresh reads, or None when they are too many or Spark's to read."""
        found = self.restricted_with_rows(spark, path, version, schema, field, keys, nulls)
        return found[0] if found is not None else None

    def restricted_rows(self, path: str, version: int, field: str, keys: tuple, nulls: bool = False) -> pa.Table | None:
        """`restricted`'s rows as Arrow (every column the refresh reads, or every column of a
        table no plan reads, such as a state table), or None."""
        return self._covering(path, version, field, keys, nulls)

    def restricted_with_rows(self, spark, path: str, version: int, schema: StructType, field: str, keys: tuple,
                             nulls: bool = False) -> tuple[DataFrame, pa.Table] | None:
        """`restricted`, and the same rows as Arrow (the table's column names)."""
        data = self._covering(path, version, field, keys, nulls)
        if data is None:
            return None
        by_name = {f.name.lower(): f.name for f in schema.fields}
        return self._local(spark, data, schema, [by_name[c.lower()] for c in data.column_names]), data

    def clear(self) -> None:
        with self._guard:
            self._reads.clear()
            self._locks.clear()
            self._scanned.clear()
            self._refused.clear()
            self._held = 0
