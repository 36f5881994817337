"""Arrangements: a large input's columns kept sorted by the key its readers look rows up by, in
small row groups, so that a change batch's random keys read a bounded number of rows.

A join term `d_i ⋈ other inputs` reads each other input for the keys of its change batch
(shared_reads.SharedReads.keys_frame). Random keys touch every file and every row group of a
table laid out otherwise, so that read grows with the table, with pyarrow's `isin` and through
Spark alike. Sorted by the key in row groups of ROW_GROUP rows, the row groups whose statistics
miss every key are skipped and the same read costs about keys x ROW_GROUP rows at any size, a
fraction of the unsorted read at TPC-H's larger scales (`python -m bench.keyed_reads`).
Materialize's shared arrangements are the model: one per (input, key), shared by every join term
and table of the warehouse that looks the input up by that key.

An arrangement is a Z-set of the input's rows as of a version of it: a Delta table under
`<warehouse>/_epochal/arrangements/`, each row with a WEIGHT, named by its key and its input's
path within the warehouse (so a warehouse copied or moved elsewhere keeps its arrangements). It
is built from the input's snapshot (every weight 1, sorted by the key; on the driver by pyarrow
and delta-rs up to DRIVER_BUILD_ROWS rows, by Spark above) after the refresh that computes a reading table in full
(for the keys its plan marks: restrict_cogenerators.keyed_partners), or else after the first
refresh that read the input by key; each refresh that read the input by key appends the
input's change feed since (weights +1 and -1, a small delta-rs commit, sorted by the key in row
groups of ROW_GROUP rows too, so a read skips most of each appended file as well; a feed larger
than the driver holds is appended the same way by Spark). It is built
again once its appends are Upkeep.rebuild_appends files or Upkeep.rebuild_fraction of its built
rows (upkeep.py): every read
opens each appended file and cancelled rows pile up, while a build reads, sorts and writes the
whole input, so it is not repeated lightly. Every commit records, in its `userMetadata`, the
input versions its rows stand for (`since`, `to`) and the input's Delta table id (`source_id`),
so a reader takes the last commit at or before the version it wants and adds the change feed
from there; a chain with a gap (a lost or doubled append) is never read, nor one whose commits
stand for another table than the one now at the input's path (deleted and created again: its
versions count from 0 again and say nothing of the rows arranged).
A read goes through keyed_files.KeyedFiles: each file from its local copy (local_copies: Arrow
IPC batches of 256 rows with their key bounds, made when the arrangement is built), else from its
Parquet row groups, keeping those it decoded for the next reads, which in one refresh ask for
mostly the same changed keys. The vacuum job deletes the files a rebuild left behind.

An arrangement is a cache derived from its input alone: it holds no epoch's result, so a crash
between its commits and the epoch's loses nothing (the next refresh appends or rebuilds), and a
missing, stale or unreadable one sends the read back to the input itself (never a wrong answer,
at worst a slower one). Only integer and date keys are arranged: their Parquet statistics are
exact, a string's are truncated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from .. import faults
from ..arrow_rows import key_kind
from ..changes import CHANGE_TYPE, POSITIVE_TYPES, feed_weights, quoted
from ..graph import WEIGHT
from ..sessions import session_confs
from ..storage.commit_lock import commit_lock
from ..storage.commits import aligned, writer_properties
from ..storage.deltalog import DeltaLog, dataset_of, delta_rs_reads_alike, opened
from ..storage.warehouse import within
from .file_pruning import files_holding
from .keyed_files import KeyedFiles
from .upkeep import Upkeep

log = logging.getLogger("epochal")

ROW_GROUP = 2_000  # rows per Parquet row group of an arrangement (bench.keyed_reads: 2,000 vs 10,000)
ROWS_PER_FILE = 4_000_000
# every build and append, the driver's and Spark's: a Spark build of lineitem at scale 10 spent about a fifth
# of its time compressing (Spark's default, snappy) files whose reads go through local copies made once
# from them (`python -m bench.arrangement_writes 10`)
COMPRESSION = "UNCOMPRESSED"
ARRANGE_ROWS = 1_000_000  # inputs smaller than this are scanned (a scan of them costs what a lookup does)
DRIVER_BUILD_ROWS = 10_000_000  # inputs up to this many rows are arranged on the driver, larger ones by Spark
FORMAT = 1
# commits that add and remove no rows: the maintenance job's VACUUM (delta-rs logs its start and end)
ROWLESS_OPERATIONS = frozenset({"VACUUM START", "VACUUM END"})
_row_group_setting = threading.Lock()
SPARK_WRITE_CONFS = {  # the Spark session confs of its builds and appends
    "parquet.block.row.count.limit": str(ROW_GROUP), "spark.sql.parquet.compression.codec": COMPRESSION.lower()}


@dataclass(frozen=True)
class ArrangementCommit:
    """One commit of an arrangement: its version, and the input versions its rows stand for
    after it (`to`), appended on top of `since` (None: built from the input's snapshot)."""

    version: int
    since: int | None
    to: int
    columns: tuple[str, ...]
    rows: int | None = None  # rows built or appended (None: written before it was recorded)
    source_id: str | None = None  # the input's Delta table id (None: written before it was recorded)


def _bits(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """`column` in a form whose equality is the values' identity: floating point as its bits
    (-0.0 and 0.0, NaNs, stay apart as the stored rows are), string views as strings."""
    kind = column.type
    if pa.types.is_floating(kind):
        width = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[kind.bit_width]
        return pa.chunked_array([pa.Array.from_buffers(width, len(chunk), chunk.buffers(), chunk.null_count,
                                                       chunk.offset) for chunk in column.chunks], width)
    if pa.types.is_string_view(kind):
        return column.cast(pa.string())
    return column


def net_rows(weighted: pa.Table, key: str | None = None) -> pa.Table | None:
    """The multiset a Z-set of rows (columns and WEIGHT) stands for: each distinct row (equal as
    stored, bit for bit) repeated its summed weight, in the order of their first rows. None when
    a row's weight sums below zero (the arrangement does not hold what its input did) or a column
    is not groupable here. With `key`, a column on which equal rows agree, only the rows whose key
    some negative weight has are grouped: the others cannot cancel, and are taken their weight
    times as they stand (a read of an arrangement is mostly built rows: grouping every one was
    a large share of TPC-H Q5's reads)."""
    values = [c for c in weighted.column_names if c != WEIGHT]
    if not values:
        return None
    weights = weighted.column(WEIGHT).to_numpy()
    rows = np.arange(weighted.num_rows, dtype=np.int64)
    involved = np.ones(weighted.num_rows, dtype=bool)
    if key is not None:
        try:
            column = _bits(weighted.column(key))
            cancelling = pc.unique(column.filter(pa.array(weights < 0)))
            involved = pc.fill_null(pc.is_in(column, value_set=cancelling), False).to_numpy()
        except (pa.ArrowException, KeyError):
            pass  # group them all
    grouped = _netted(weighted.select(values + [WEIGHT]).take(pa.array(rows[involved])), values) \
        if involved.any() else np.empty(0, dtype=np.int64)
    if grouped is None:
        return None
    free = rows[~involved]  # no negative weight among them (every negative row is involved)
    taken = np.sort(np.concatenate([np.repeat(free, weights[free]), rows[involved][grouped]]))
    try:
        return _without_views(weighted.select(values)).take(pa.array(taken))
    except pa.ArrowException:
        return None


def _netted(weighted: pa.Table, values: list[str]) -> np.ndarray | None:
    """net_rows of all of `weighted` as the row indices to take (a distinct row's first index,
    repeated its summed weight), or None (a sum below zero, or a column not groupable)."""
    try:
        keys = [_bits(weighted.column(c)) for c in values]
        index = pa.array(np.arange(weighted.num_rows, dtype=np.int64))
        grouped = pa.Table.from_arrays(keys + [weighted.column(WEIGHT), index],
                                       names=[f"k{i}" for i in range(len(keys))] + [WEIGHT, "__i"]) \
            .group_by([f"k{i}" for i in range(len(keys))], use_threads=False) \
            .aggregate([(WEIGHT, "sum"), ("__i", "min")])
    except (pa.ArrowException, KeyError):
        return None
    weights = grouped.column(f"{WEIGHT}_sum").to_numpy(zero_copy_only=False)
    if (weights < 0).any():
        return None
    first = grouped.column("__i_min").to_numpy(zero_copy_only=False)
    kept = weights > 0
    return np.repeat(first[kept], weights[kept])


def _without_views(table: pa.Table) -> pa.Table:
    """`table` with string and binary views as plain strings and binaries: pyarrow's `take` has no
    kernel for views, which delta-rs reads strings as."""
    plain = {pa.types.is_string_view: pa.string(), pa.types.is_binary_view: pa.binary()}
    for i, field in enumerate(table.schema):
        for test, kind in plain.items():
            if test(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(kind))
    return table


def _sorted_by(rows: pa.Table, key: str) -> pa.Table:
    """`rows` in an arrangement's order: by `key`, NULLs first (as Spark's ascending sort)."""
    return rows.take(pc.sort_indices(rows, sort_keys=[(key, "ascending", "at_start")]))


def _named(columns, name: str) -> str:
    """`name` as `columns` spell it (Spark's names are case-insensitive)."""
    return next(c for c in columns if c.lower() == name.lower())


def due_for_rebuild(chain: list[ArrangementCommit], upkeep: Upkeep = Upkeep()) -> bool:
    """Whether an arrangement's appends (the commits after its build) are many or large enough
    that building it again costs less than reading them on: `upkeep.rebuild_appends` files, or
    more than `upkeep.rebuild_fraction` of the rows it was built with and `upkeep.rebuild_rows`."""
    appends = chain[1:]
    if len(appends) >= upkeep.rebuild_appends:
        return True
    if chain[0].rows is None or any(c.rows is None for c in appends):
        return len(appends) >= min(8, upkeep.rebuild_appends)  # written before rows were recorded: the bound it was written under
    return sum(c.rows for c in appends) > max(upkeep.rebuild_fraction * chain[0].rows, upkeep.rebuild_rows)


def what_was_done(advanced: str) -> str:
    """"built", "appended" or "current" of what `Arrangements.advance` returned."""
    return advanced.partition(":")[0]


class TooManyRows(Exception):
    """A keyed read found more rows than its limit: the keys' rows are read another way (a
    scan of the input would find the same rows, so none is made)."""


class Arrangements:
    """The warehouse's arrangements: where each lives, which commit serves a read, how to build
    and advance one. `root`: the folder they live under; `warehouse`: the folder their inputs are
    named relative to, where they lie under it, so a warehouse copied or moved keeps them."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None, min_rows: int = ARRANGE_ROWS,
                 rows_per_file: int = ROWS_PER_FILE, driver_build_rows: int = DRIVER_BUILD_ROWS,
                 files: KeyedFiles | None = None, upkeep: Upkeep = Upkeep(), warehouse: str | None = None):
        self.root = root.rstrip("/")
        self.warehouse = warehouse
        self.upkeep = upkeep
        self.files = files or KeyedFiles(storage_options)  # the keyed reads of its files, local copies included
        self.storage_options = storage_options
        self.min_rows = min_rows
        self.rows_per_file = rows_per_file
        self.driver_build_rows = driver_build_rows
        self._chains: dict[str, tuple[int, list[ArrangementCommit]]] = {}
        self._guard = threading.Lock()
        self._forgetting = threading.Lock()
        # (input, key) -> [reads, keys, files, row groups, rows read, change feed rows, files read from local
        # copies] since take_served
        self._served: dict[tuple[str, str], list[int]] = {}
        self._distrusted: set[str] = set()  # disagreed with its input or failed to advance: unusable until built
        self._source_ids: dict[str, str | None] = {}  # input path -> its Delta table id, read once a refresh

    @staticmethod
    def _prefix(source: str) -> str:
        """What every arrangement of `source` is named with first."""
        return re.sub(r"[^a-z0-9_]+", "_", source.rstrip("/").rsplit("/", 1)[-1].lower())[:40] + "."

    def _name(self, source: str) -> str:
        """What names `source`'s arrangements: its path within the warehouse, where it lies there."""
        return within(source, self.warehouse)

    def path(self, source: str, key: str) -> str:
        name = self._prefix(source)[:-1]
        digest = hashlib.sha1(f"{self._name(source)}\0{key.lower()}".encode()).hexdigest()[:10]
        return f"{self.root}/{name}.{re.sub(r'[^a-z0-9_]+', '_', key.lower())}.{digest}"

    def begin_refresh(self, source_ids: dict[str, str] | None = None) -> None:
        """Forget the inputs' table ids read so far, taking `source_ids` (input path -> the id of
        the table whose versions this refresh reads, as its epoch recorded them) instead of
        reading those logs again; the others are read once, when next needed."""
        with self._guard:
            self._source_ids = dict(source_ids or {})

    def source_id(self, source: str) -> str:
        """The Delta table id of the table now at `source` (None: none there, or its log unreadable)."""
        with self._guard:
            if source in self._source_ids:
                return self._source_ids[source]
        try:
            log_ = DeltaLog.open(source, self.storage_options)
            found = log_.table_id if log_ is not None else None
        except (DeltaError, OSError, ValueError):  # unknown: no arrangement of it is read
            found = None
        with self._guard:
            self._source_ids[source] = found
        return found

    def chain(self, source: str, key: str) -> list[ArrangementCommit]:
        """The arrangement's commits since its last build, oldest first, while each appends on
        top of the one before and stands for the table now at `source`; [] when there is none
        (or its log is not one this code wrote, or it was built from another table at the path)."""
        path = self.path(source, key)
        if path in self._distrusted:
            return []
        try:
            log_ = DeltaLog.open(path, self.storage_options)
        except (DeltaError, OSError, ValueError) as error:  # not a Delta table, or unreadable: none to read
            log.warning("arrangement %s unreadable (%s); %s is scanned instead", path, error, source)
            return []
        if log_ is None:
            return []
        with self._guard:
            cached = self._chains.get(path)
        if cached is not None and cached[0] == log_.version:
            return self._of_table_now_at(source, path, cached[1])
        commits = []
        for commit in log_.commits(0):
            if commit.operation in ROWLESS_OPERATIONS:
                continue
            try:
                meta = json.loads(commit.user_metadata or "")
            except ValueError:
                meta = None
            if not isinstance(meta, dict) or meta.get("arrangement") != FORMAT:
                commits = []  # a commit not ours: nothing before it can be trusted either
                continue
            step = ArrangementCommit(commit.version, meta.get("since"), int(meta["to"]), tuple(meta["columns"]),
                                     meta.get("rows"), meta.get("source_id"))
            if step.since is None:
                commits = [step]
            elif commits and step.since == commits[-1].to and step.columns == commits[-1].columns:
                commits.append(step)
            else:
                commits = []  # a gap or a doubled append: unusable until built again
        with self._guard:
            self._chains[path] = (log_.version, commits)
        return self._of_table_now_at(source, path, commits)

    def _of_table_now_at(self, source: str, path: str, commits: list[ArrangementCommit]) -> list[ArrangementCommit]:
        """`commits`, or [] where one records a table id other than that of the table now at `source`."""
        recorded = {c.source_id for c in commits if c.source_id is not None}
        if not recorded:
            return commits  # written before ids were recorded: the ledger's ids guard these (epoch.input_ranges)
        now = self.source_id(source)
        if recorded != {now}:
            log.debug("arrangement %s stands for table %s, and table %s is now at %s: it is not read, and is "
                      "built again", path, ", ".join(sorted(recorded)), now, source)
            return []
        return commits

    def serving(self, source: str, key: str, version: int, columns: list[str]) -> ArrangementCommit | None:
        """The last commit standing for `version` or an earlier one, holding `columns`."""
        wanted = {c.lower() for c in columns}
        found = [c for c in self.chain(source, key) if c.to <= version]
        if not found or not wanted <= {c.lower() for c in found[-1].columns}:
            return None
        return found[-1]

    def expected_rows(self, source: str, version: int, key: str, values: pa.Array, columns: list[str]) -> float | None:
        """About how many rows a `read` of `values` would find, from the arrangement's local
        copies' block bounds (KeyedFiles.expected_rows), reading no row and making no copy; None
        where no arrangement serves the version or its files have no copies yet. The change feed
        since the arrangement's commit is left out: one epoch's change, small beside a read worth
        estimating."""
        commit = self.serving(source, key, version, columns)
        if commit is None:
            return None
        try:
            table = opened(self.path(source, key), self.storage_options, commit.version)
            dataset = dataset_of(table)
            names = {n.lower(): n for n in dataset.schema.names}
            field = names[key.lower()]
            values = values.cast(dataset.schema.field(field).type)
            holding = files_holding(table, dataset, field, values, False, row_groups=False)
            return self.files.expected_rows(self.path(source, key), holding, values, field)
        except (DeltaError, OSError, KeyError, ValueError, pa.ArrowException):
            return None

    def read(self, source: str, version: int, key: str, values: pa.Array, nulls: bool, columns: list[str],
             changes, limit: int | None = None) -> pa.Table | None:
        """The input's rows as of `version` whose `key` is one of `values` (or NULL, with `nulls`),
        with `columns`; None when no arrangement serves it (then scan the input); TooManyRows when
        they are more than `limit` (a scan would find as many). `changes(before, after)`: the
        input's change feed as Arrow (`_change_type` and every column), or None."""
        commit = self.serving(source, key, version, columns)
        if commit is None:
            return None
        feed, cancelled = None, 0
        if commit.to < version:
            feed = changes(commit.to, version)
            if feed is None:
                return None
            feed = _without_views(feed)
            by_name = {n.lower(): n for n in feed.column_names}
            column = feed.column(by_name[key.lower()])
            mask = pc.is_in(column, value_set=values.cast(column.type))
            if nulls:
                mask = pc.or_(mask, pc.is_null(column))
            feed = feed.filter(pc.fill_null(mask, False))
            weight = feed_weights(feed)
            cancelled = int(pc.sum(pc.less(weight, 0)).as_py() or 0)  # stored rows the feed may take away
        at_most = None if limit is None else limit + cancelled
        try:
            table = opened(self.path(source, key), self.storage_options, commit.version)
            dataset = dataset_of(table)
            names = {n.lower(): n for n in dataset.schema.names}
            field = names[key.lower()]
            selected = [names[c.lower()] for c in columns] + [WEIGHT]
            values = values.cast(dataset.schema.field(field).type)
            condition = ds.field(field).isin(values)
            if nulls:
                condition = condition | ds.field(field).is_null()
            holding = files_holding(table, dataset, field, values, nulls, row_groups=self.files.copies is None)
            arranged, copied, row_groups = self.files.rows_of(self.path(source, key), holding, selected, field, values,
                                                        nulls, condition, at_most)
            if arranged is None:
                return None
            if at_most is not None and arranged.num_rows > at_most:
                raise TooManyRows(f"{source} by {key}: more than {limit} rows of {len(values)} keys")
            arranged = _without_views(arranged)
        except (DeltaError, OSError, KeyError, ValueError, pa.ArrowException) as error:
            log.warning("arrangement %s not read (%s); %s is scanned instead", self.path(source, key), error, source)
            return None
        parts = [arranged]
        files = len(list(holding.get_fragments()))
        served = [1, len(values), files, row_groups, arranged.num_rows, 0, copied]
        if feed is not None:
            served[5] = feed.num_rows
            by_name = {n.lower(): n for n in feed.column_names}
            try:
                parts.append(pa.Table.from_arrays(
                    [feed.column(by_name[c.lower()]).cast(arranged.schema.field(n).type)
                     for c, n in zip(columns, arranged.column_names)] + [weight],
                    names=arranged.column_names))
            except pa.ArrowException:
                return None
        rows = net_rows(pa.concat_tables(parts), field)
        if rows is None:
            log.warning("arrangement %s disagrees with %s as of version %d (a weight below zero); the input is "
                        "scanned instead, and the arrangement is built again by the next refresh",
                        self.path(source, key), source, version)
            self.distrust(source, key)
            return None
        if limit is not None and rows.num_rows > limit:
            raise TooManyRows(f"{source} by {key}: {rows.num_rows} rows of {len(values)} keys, more than {limit}")
        with self._guard:
            total = self._served.setdefault((source, key), [0] * len(served))
            total[:] = [a + b for a, b in zip(total, served)]
        return rows.rename_columns(list(columns))

    def take_served(self) -> dict[tuple[str, str], dict[str, int]]:
        """The reads served since the last call, per (input, key): how many, for how many keys,
        the files and Parquet row groups opened (none for a file read from its local copy), the
        arrangement's rows read, the change feed's rows added and the files read from their local
        copies; and forget them."""
        with self._guard:
            served, self._served = self._served, {}
        names = ("reads", "keys", "files", "row_groups", "rows", "feed_rows", "copied_files")
        return {k: dict(zip(names, v)) for k, v in served.items()}

    def _folders(self, source: str):
        """(folder path, its last commit's metadata, or None where unreadable) of every folder
        named like an arrangement of `source` and not recorded as another input's; None where the
        root cannot be listed from here."""
        try:
            filesystem, root = pafs.FileSystem.from_uri(self.root)
            entries = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except (pa.ArrowException, OSError, ValueError):
            return None
        prefix, found = self._prefix(source), []
        for entry in entries:
            if entry.type != pafs.FileType.Directory or not entry.base_name.startswith(prefix):
                continue
            path = f"{self.root}/{entry.base_name}"
            try:
                meta = json.loads(DeltaTable(path, storage_options=self.storage_options).history(1)[0]
                                  .get("userMetadata") or "{}")
            except (DeltaError, OSError, ValueError):
                meta = None
            if meta is None or self._name(meta.get("source", "")) == self._name(source):  # not another input's
                found.append((path, entry, meta))
        return found

    def of(self, source: str) -> list[dict] | None:
        """The arrangements of `source` in the warehouse (key, the input version they stand for,
        appends since the last build, columns, rows stored, files, bytes), for `explain`; None
        where the folder cannot be listed from here."""
        folders = self._folders(source)
        if folders is None:
            return None
        found = []
        for path, entry, meta in folders:
            try:
                if meta is None:
                    raise ValueError(path)
                chain = self.chain(source, meta["key"])
                actions = DeltaTable(path, storage_options=self.storage_options).get_add_actions(flatten=True)
                found.append(dict(key=meta["key"], to=chain[-1].to if chain else None,
                                  appends=len(chain) - 1 if chain else None, columns=list(meta["columns"]),
                                  rows=sum(v or 0 for v in actions.column("num_records").to_pylist()),
                                  files=actions.num_rows, bytes=sum(actions.column("size_bytes").to_pylist())))
            except Exception:  # noqa: BLE001 - a description; an unreadable one is shown as such
                found.append(dict(key=entry.base_name, to=None, appends=None, columns=[], rows=0, files=0, bytes=0))
        return sorted(found, key=lambda a: a["key"])

    def forget(self, source: str) -> int:
        """Delete every arrangement of `source`: a new table stands at its path (deleted and
        created again), whose versions say nothing about the rows arranged. Returns how many."""
        dropped = 0
        with self._forgetting:  # the readers of one source, refreshed at once, each forget it
            for path, entry, meta in self._folders(source) or []:
                if meta is None:  # unreadable: whose it is is unknown
                    continue
                with self._guard:
                    self._chains.pop(path, None)
                    self._distrusted.discard(path)
                try:
                    pafs.FileSystem.from_uri(self.root)[0].delete_dir(entry.path)
                except FileNotFoundError:  # another process forgot it first
                    continue
                dropped += 1
        return dropped

    def _written(self, source: str, key: str) -> None:
        """Forget the cached chain: the arrangement has a new commit."""
        with self._guard:
            self._chains.pop(self.path(source, key), None)

    def distrust(self, source: str, key: str) -> None:
        """Read no more of this arrangement, and build it again when next advanced."""
        with self._guard:
            self._distrusted.add(self.path(source, key))

    def worth_arranging(self, source: str, version: int, key: str) -> bool:
        """Whether `source` as of `version` is large enough to arrange, and `key` of a type whose
        statistics are exact."""
        try:
            table = DeltaTable(source, version=version, storage_options=self.storage_options)
            schema = pa.schema(table.schema().to_arrow())
            kinds = {f.name.lower(): key_kind(f.type) for f in schema}
            return kinds.get(key.lower()) in ("integer", "date") and table.count() >= self.min_rows
        except (DeltaError, OSError, ValueError, pa.ArrowException):  # not sized here: not arranged
            return False

    def build(self, spark, source: str, version: int, key: str, columns: list[str]) -> ArrangementCommit:
        """Write the arrangement of `source` as of `version`: on the driver up to
        `driver_build_rows` rows (`_build_on_driver`), else by Spark (`_build_by_spark`)."""
        if not self._build_on_driver(source, version, key, columns):
            self._build_by_spark(spark, source, version, key, columns)
        faults.point("after_arrangement_build")
        self._written(source, key)
        with self._guard:
            self._distrusted.discard(self.path(source, key))
        self._copy_files(source, key)
        return self.chain(source, key)[-1]

    def _copy_files(self, source: str, key: str) -> None:
        """Make the local copies of a built arrangement's files now, in the refresh that built
        it, not in the first incremental read (copying a large arrangement's files, such as
        lineitem's at scale 10, would otherwise fall on that epoch), and delete the copies of the
        files it was built from before."""
        self.files.copy_table(self.path(source, key), key)

    def _build_on_driver(self, source: str, version: int, key: str, columns: list[str]) -> bool:
        """Read, sort and write the arrangement on the driver (pyarrow and delta-rs), where the
        input is at most `driver_build_rows` rows and delta-rs reads it as Spark does; whether
        it did. Up to that size the driver builds it several times faster than Spark, which pays
        for a range partitioning, a sort and its jobs (`python -m bench.arrangement_builds 1`)."""
        try:
            table = DeltaTable(source, version=version, storage_options=self.storage_options)
            if not delta_rs_reads_alike(table) or table.count() > self.driver_build_rows:
                return False
            schema = _without_views(pa.schema(table.schema().to_arrow()).empty_table()).schema
            by_name = {f.name.lower(): f for f in schema}
            fields = [by_name[c.lower()] for c in columns]
            data = table.to_pyarrow_dataset().to_table(columns=[f.name for f in fields])
        except (DeltaError, OSError, ValueError, KeyError, pa.ArrowException):  # Spark's to read
            return False
        rows = pa.Table.from_arrays([data.column(f.name).cast(f.type) for f in fields]
                                    + [pa.array(np.ones(data.num_rows, dtype=np.int64))],
                                    schema=pa.schema(fields + [pa.field(WEIGHT, pa.int64())]))
        rows = _sorted_by(rows, by_name[key.lower()].name)
        meta = dict(arrangement=FORMAT, since=None, to=version, columns=[f.name for f in fields],
                    source=self._name(source), key=key, rows=rows.num_rows, source_id=table.metadata().id)
        with commit_lock(self.path(source, key)):
            write_deltalake(self.path(source, key), rows, mode="overwrite", schema_mode="overwrite",
                            storage_options=self.storage_options,
                            writer_properties=writer_properties(rows.schema, max_row_group_size=ROW_GROUP,
                                                                compression=COMPRESSION),
                            commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(meta)}))
        log.info("arranged %s by %s as of version %d on the driver: %d rows", source, key, version, rows.num_rows)
        return True

    def _build_by_spark(self, spark, source: str, version: int, key: str, columns: list[str]) -> None:
        """Write the arrangement of `source` as of `version` (Spark: the input is large), sorted by
        `key` in row groups of ROW_GROUP rows, in files of about `rows_per_file` rows, each one
        range of keys. (Key ranges taken from the input's Delta statistics instead of Spark's
        sampling pass saved nothing measurable: `python -m bench.arrangement_builds 1`.)"""
        frame = spark.read.format("delta").option("versionAsOf", version).load(source)
        by_name = {f.name.lower(): f.name for f in frame.schema.fields}
        names = [by_name[c.lower()] for c in columns]
        rows = frame.count()
        sorted_ = (frame.select(*[F.col(quoted(c)) for c in names], F.lit(1).cast("long").alias(WEIGHT))
                   .repartitionByRange(max(1, -(-rows // self.rows_per_file)), F.col(quoted(by_name[key.lower()])))
                   .sortWithinPartitions(F.col(quoted(by_name[key.lower()]))))
        meta = dict(arrangement=FORMAT, since=None, to=version, columns=names, source=self._name(source), key=key,
                    rows=rows, source_id=self._id_at(source, version))
        # Parquet takes the row-group bound (and Spark the codec) from the write's Hadoop conf, which
        # Spark builds from the session's confs (a DataFrameWriter option does not reach it through
        # Delta's writer); a session conf also reaches a Spark Connect server's session, the
        # client's Hadoop conf not.
        with _row_group_setting, session_confs(spark, SPARK_WRITE_CONFS), \
                commit_lock(self.path(source, key)):
            (sorted_.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
             .option("userMetadata", json.dumps(meta)).save(self.path(source, key)))
        log.info("arranged %s by %s as of version %d: %d rows", source, key, version, rows)

    def _id_at(self, source: str, version: int) -> str | None:
        """The Delta table id of `source` as of `version` (None where delta-rs cannot read its log)."""
        try:
            return opened(source, self.storage_options, version).metadata().id
        except (DeltaError, OSError, ValueError):
            return None

    def append(self, source: str, key: str, commit: ArrangementCommit, to: int, feed: pa.Table) -> None:
        """Append the input's change feed from `commit.to` to `to` (delta-rs, one small commit)."""
        path = self.path(source, key)
        table = DeltaTable(path, storage_options=self.storage_options)
        by_name = {n.lower(): n for n in feed.column_names}
        rows = pa.Table.from_arrays([feed.column(by_name[c.lower()]) for c in commit.columns] + [feed_weights(feed)],
                                    names=list(commit.columns) + [WEIGHT])
        rows = _sorted_by(_without_views(rows), _named(commit.columns, key))
        meta = dict(arrangement=FORMAT, since=commit.to, to=to, columns=list(commit.columns),
                    source=self._name(source), key=key, rows=rows.num_rows,
                    source_id=commit.source_id or self.source_id(source))
        with commit_lock(path):
            write_deltalake(table, aligned(rows, table), mode="append", storage_options=self.storage_options,
                            writer_properties=writer_properties(rows.schema, max_row_group_size=ROW_GROUP,
                                                                compression=COMPRESSION),
                            commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps(meta)}))
        faults.point("after_arrangement_append")
        self._written(source, key)

    def _append_by_spark(self, spark, source: str, key: str, chain: list[ArrangementCommit], to: int) -> str | None:
        """Append the input's change feed from the chain's last commit to `to` as Spark reads it,
        where the driver does not hold it (larger than a keyed read may hold, or not read by
        delta-rs as Spark reads it): one sorted file, a few Spark jobs, where building the
        arrangement again would read, sort and write the whole input (a large input's update of
        a column no table reads, between two epochs, did that). False, writing nothing, where
        the feed is large enough that the arrangement is due for a rebuild with it. Returns what
        `advance` reports: how many rows it appended, or (writing nothing) why it builds instead."""
        commit = chain[-1]
        try:
            feed = (spark.read.format("delta").option("readChangeFeed", "true")
                    .option("startingVersion", commit.to + 1).option("endingVersion", to).load(source))
            rows = feed.count()
        except PySparkException as error:  # no change feed kept for those versions: build it
            log.info("change feed of %s from version %d not read (%s); its arrangement by %s is built again",
                     source, commit.to + 1, type(error).__name__, key)
            return f"built: change feed from version {commit.to + 1} not read ({type(error).__name__})"
        by_name = {f.name.lower(): f.name for f in feed.schema.fields}
        missing = [c for c in commit.columns if c.lower() not in by_name]
        if missing:
            return f"built: change feed lacks {', '.join(missing)}"
        if due_for_rebuild([*chain, ArrangementCommit(-1, commit.to, to, commit.columns, rows)], self.upkeep):
            return f"built: due for a rebuild with the change feed's {rows} rows"
        weight = F.when(F.col(CHANGE_TYPE).isin(*POSITIVE_TYPES), F.lit(1)).otherwise(F.lit(-1)).cast("long")
        sorted_ = (feed.select(*[F.col(quoted(by_name[c.lower()])).alias(c) for c in commit.columns],
                               weight.alias(WEIGHT))
                   .repartition(1).sortWithinPartitions(F.col(quoted(_named(commit.columns, key)))))
        meta = dict(arrangement=FORMAT, since=commit.to, to=to, columns=list(commit.columns),
                    source=self._name(source), key=key, rows=rows,
                    source_id=commit.source_id or self.source_id(source))
        try:
            with _row_group_setting, session_confs(spark, SPARK_WRITE_CONFS), \
                    commit_lock(self.path(source, key)):
                (sorted_.write.format("delta").mode("append").option("userMetadata", json.dumps(meta))
                 .save(self.path(source, key)))
        except PySparkException as error:  # types Delta does not append to the arrangement's: build it
            log.info("change feed of %s not appended to its arrangement by %s (%s: %s); it is built again",
                     source, key, type(error).__name__, error)
            return f"built: Delta refused the change feed's append ({type(error).__name__})"
        faults.point("after_arrangement_append")
        self._written(source, key)
        log.info("appended %d change rows of %s to its arrangement by %s through Spark", rows, source, key)
        return f"appended: through Spark, {rows} rows"

    def advance(self, spark, source: str, version: int, key: str, columns: list[str], changes) -> str:
        """Bring the arrangement of `source` by `key` to `version`: build it (none yet, too many
        appends, a column missing, a feed neither the driver nor Spark appends), else append the
        change feed since. Returns what was done, "current", "appended" or "built", and after a
        colon how or why ("appended: through Spark, 150000 rows", "built: none yet"), so a run's
        report says which rule decided (`what_was_done` strips it)."""
        chain = self.chain(source, key)
        held = {c.lower() for c in chain[-1].columns} if chain else set()
        missing = [c for c in columns if c.lower() not in held]
        if chain and chain[-1].to >= version and not missing:
            return "current"  # (a later refresh may have advanced it already)
        if not chain:
            why = "built: none yet"
        elif missing:
            why = f"built: {', '.join(missing)} not held"
        elif due_for_rebuild(chain, self.upkeep):
            appended = sum(c.rows or 0 for c in chain[1:])
            why = f"built: due for a rebuild, {len(chain) - 1} appends of {appended} rows on {chain[0].rows}"
        else:
            feed = changes(chain[-1].to, version)
            if feed is not None:
                self.append(source, key, chain[-1], version, feed)
                return f"appended: on the driver, {feed.num_rows} rows"
            why = self._append_by_spark(spark, source, key, chain, version)
            if what_was_done(why) == "appended":
                return why
        wanted = list(dict.fromkeys([*(chain[-1].columns if chain else ()), *columns, key], None))
        unique = list({c.lower(): c for c in wanted}.values())
        self.build(spark, source, version, key, unique)
        return why
