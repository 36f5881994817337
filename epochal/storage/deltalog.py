"""Reading a Delta table's log (versions, commits, schema) without a Spark job, through delta-rs."""

from __future__ import annotations

import collections
import json
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    operation: str
    parameters: dict
    user_metadata: str | None
    metrics: dict = field(default_factory=dict)  # operationMetrics: Spark's names, or delta-rs's

    @staticmethod
    def of_entry(entry: dict) -> "Commit":
        """A commit from its history entry, as delta-rs's history or DESCRIBE HISTORY gives it
        (`inCommitTimestamp` where the table has in-commit timestamps, else `timestamp`, in ms)."""
        parameters = entry.get("operationParameters") or {}
        metrics = entry.get("operationMetrics") or {}
        return Commit(version=int(entry["version"]),
                      timestamp_ms=int(entry.get("inCommitTimestamp") or entry["timestamp"]),
                      operation=str(entry.get("operation") or ""),
                      parameters=dict(parameters) if isinstance(parameters, dict) else {},
                      user_metadata=entry.get("userMetadata"),
                      metrics=dict(metrics) if isinstance(metrics, dict) else {})

    def as_dict(self) -> dict:
        return {"timestamp": self.timestamp_ms, "userMetadata": self.user_metadata}


def _entry_name(version: int) -> str:
    """Where commit `version`'s log entry lies, relative to its table."""
    return f"_delta_log/{version:020d}.json"


def _local_entry(uri: str, version: int) -> str | None:
    """The file of a local table's log entry `version`; None where the table is not on a local
    file system."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    return f"{uri.removeprefix('file://')}/{_entry_name(version)}"


def commit_stamp(uri: str, version: int) -> tuple[int, int, int] | None:
    """What identifies the file of a local table's commit `version` (inode, size, modification
    time), or None where it is missing or the table is not on a local file system."""
    entry = _local_entry(uri, version)
    if entry is None:
        return None
    try:
        found = os.stat(entry)
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _local_commit(uri: str, version: int) -> "Commit | None":
    """The commit `version` of a local table from its log entry's commitInfo action (one line of
    JSON, the first where Spark or delta-rs wrote it), or None where it is not there to read."""
    path = _local_entry(uri, version)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as entry:
            for line in entry:
                if line.startswith('{"commitInfo"'):
                    return Commit.of_entry({**json.loads(line)["commitInfo"], "version": version})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _keep_commit(uri: str, version: int, stamp: tuple, commit: "Commit") -> None:
    with _COMMITS_LOCK:
        if len(_COMMITS) >= 8192:
            _COMMITS.clear()
        _COMMITS[(uri, version, stamp)] = commit


_COMMITS: dict[tuple, "Commit"] = {}  # (uri, version, commit_stamp) -> the commit (DeltaLog.commits)
_COMMITS_LOCK = threading.Lock()
_KEPT = 256  # tables a thread keeps open, the least recently opened given up first
_HANDED_BACK: queue.SimpleQueue = queue.SimpleQueue()  # (key, held) a finished thread kept
_IDLE: collections.OrderedDict = collections.OrderedDict()  # key -> held, for the next thread opening it
_IDLE_LOCK = threading.Lock()
_DATASETS: dict[int, tuple] = {}  # id(table) -> (weakref to it, version, its pyarrow dataset)


class _Kept(collections.OrderedDict):
    """The tables one thread opened (key -> (table, version seen, commit_stamp of it)). When the
    thread ends they are handed back for the next thread to take (a refresh's worker threads
    live for one epoch): through a SimpleQueue, whose put is safe in a finalizer."""

    def __del__(self):
        try:
            for key, held in self.items():
                _HANDED_BACK.put((key, held))
        except Exception:  # the interpreter shutting down: nothing is left to take them
            pass


class _Opened(threading.local):
    def __init__(self):
        self.tables = _Kept()


_OPENED = _Opened()


def _taken_back(key: tuple) -> tuple | None:
    """The table a finished thread kept for `key`, now this thread's, or None."""
    with _IDLE_LOCK:
        while True:
            try:
                handed, held = _HANDED_BACK.get_nowait()
            except queue.Empty:
                break
            _IDLE[handed] = held
            _IDLE.move_to_end(handed)
        while len(_IDLE) > _KEPT:
            _IDLE.popitem(last=False)
        return _IDLE.pop(key, None)


def _unchanged_since(uri: str, seen: int) -> bool:
    """Whether a local table has no commit after `seen`: its next log entry is not there (a
    commit is that entry's creation), so bringing the table forward would find nothing."""
    entry = _local_entry(uri, seen + 1)
    return entry is not None and not os.path.exists(entry)


def brought_forward(uri: str, table: DeltaTable, seen: int, stamp: tuple | None, pinned: bool = False
                    ) -> DeltaTable | None:
    """`table`, kept since it was at version `seen` (whose commit had `stamp`), at the table's
    latest version: as it is where no commit followed (or it is `pinned` to its version), else
    brought forward by update_incremental (a listing). None where it must be opened afresh: the
    commit seen is gone or was written again (the table deleted and created anew), the table is
    not on a local file system, or delta-rs fails to bring it forward."""
    if stamp is None or commit_stamp(uri, seen) != stamp:
        return None
    if pinned or _unchanged_since(uri, seen):
        return table
    try:
        table.update_incremental()
    except (DeltaError, OSError):
        return None
    return table


def row_count(path: str, version: int, storage_options=None) -> int:
    """Rows in a Delta table at a version, from its file statistics (no Spark job); 0 where it
    has no such version."""
    if version < 0:
        return 0
    try:
        return opened(path, storage_options, version).count()
    except (DeltaError, TableNotFoundError):
        return 0


def opened(uri: str, storage_options: dict[str, str] | None = None, version: int | None = None) -> DeltaTable:
    """delta-rs's table at its latest version (or at `version`), for reading only. A step opens
    the same logs again and again (its inputs, its state, its output), and each open replays the
    log from its last checkpoint; so each thread keeps the tables it opened, and hands them on
    when it ends to the threads of the next epoch, and brings a latest one forward by the commits
    since (`brought_forward`), opening afresh where it cannot. Raises TableNotFoundError as
    DeltaTable does. Not shared between threads, and the same object for the same table within
    one: keep what you read of it, not the table, across another open."""
    kept = _OPENED.tables
    key = (uri, version, tuple(sorted((storage_options or {}).items())))
    held = kept.get(key)
    if held is None:
        held = _taken_back(key)
    table = brought_forward(uri, *held, pinned=version is not None) if held is not None else None
    if table is not None:
        kept[key] = held if table.version() == held[1] else (table, table.version(), commit_stamp(uri, table.version()))
        kept.move_to_end(key)
        return table
    table = DeltaTable(uri, version=version, storage_options=storage_options)
    kept[key] = (table, table.version(), commit_stamp(uri, table.version()))
    kept.move_to_end(key)
    while len(kept) > _KEPT:
        kept.popitem(last=False)
    return table


def dataset_of(table: DeltaTable):
    """`table.to_pyarrow_dataset()`, kept for the table object (as `opened` keeps it, and hands
    it from thread to thread) while its version stays the same: building one makes a fragment per
    data file in Python, and a refresh reads the same arrangement and state versions by key many
    times."""
    version = table.version()
    found = _DATASETS.get(id(table))
    if found is not None and found[0]() is table and found[1] == version:
        return found[2]
    dataset = table.to_pyarrow_dataset()
    key = id(table)
    _DATASETS[key] = (weakref.ref(table, lambda _, key=key: _DATASETS.pop(key, None)), version, dataset)
    return dataset


class DeltaLog:
    """One table's log as of when it was opened: its version, id, schema and properties are read
    then, so that a later open of the same table (the same object, brought forward: `opened`)
    does not move them."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = uri
        self.storage_options = storage_options
        self._table = opened(uri, storage_options)
        self.version = self._table.version()
        self._metadata = self._table.metadata()
        self._schema = self._table.schema()

    @staticmethod
    def open(uri: str, storage_options: dict[str, str] | None = None) -> "DeltaLog | None":
        try:
            return DeltaLog(uri, storage_options)
        except TableNotFoundError:
            return None

    def commits(self, start: int, end: int | None = None) -> list[Commit]:
        """Commits with start <= version <= end (default: the version opened), oldest first.
        Each is read once per process and kept while its log entry's file is the same
        (`commit_stamp`, local tables): from its commitInfo line where the file is local (delta-rs's
        history gives the same entry, but lists and parses the log holding Python's GIL), else
        from delta-rs's history."""
        end = self.version if end is None else end
        if end < start:
            return []
        stamps = {version: commit_stamp(self.uri, version) for version in range(start, end + 1)}
        kept = {version: _COMMITS.get((self.uri, version, stamp)) for version, stamp in stamps.items()
                if stamp is not None}
        if len(kept) == len(stamps):
            for version, commit in kept.items():
                if commit is None:
                    commit = _local_commit(self.uri, version)
                    if commit is None:
                        break
                    kept[version] = commit
                    _keep_commit(self.uri, version, stamps[version], commit)
            else:
                return [kept[version] for version in range(start, end + 1)]
        found = []
        for entry in self._table.history(limit=self._table.version() - start + 1):
            version = entry.get("version")
            if version is None or not start <= version <= end:
                continue
            commit = Commit.of_entry(entry)
            found.append(commit)
            if stamps.get(version) is not None:
                _keep_commit(self.uri, version, stamps[version], commit)
        return sorted(found, key=lambda commit: commit.version)

    @property
    def table_id(self) -> str:
        """Delta's id of the table (`metaData.id`): kept by every commit, overwrites and schema
        changes included, and new when a table is deleted and created again at the same path."""
        return self._metadata.id

    def schema_json(self) -> dict:
        return json.loads(self._schema.to_json())

    def spark_schema(self):
        return StructType.fromJson(self.schema_json())

    def properties(self) -> dict[str, str]:
        return dict(self._metadata.configuration)

    def rows(self) -> int:
        """The rows the table holds at the version opened, from its files' statistics (rows a
        deletion vector hides included); ValueError where a file's statistics do not say."""
        counts = table_at(self.uri, self.version, self.storage_options).get_add_actions(flatten=True) \
            .column("num_records").to_pylist()
        if any(count is None for count in counts):
            raise ValueError(f"{self.uri}: a file without a row count in its statistics")
        return int(sum(counts))


@dataclass(frozen=True)
class CommitActions:
    """One commit as its log entry holds it: what the history does not say (the files it added,
    removed and wrote change data to; a schema or property change), read for the rescan triggers."""

    version: int
    info: dict  # commitInfo: operation, operationParameters, operationMetrics
    metadata: dict | None  # the metaData action, when the commit changed schema or properties
    added: tuple[str, ...]
    removed: tuple[str, ...]
    cdc: tuple[str, ...]

    @property
    def operation(self) -> str:
        return str(self.info.get("operation", ""))

    @property
    def parameters(self) -> dict:
        parameters = self.info.get("operationParameters") or {}
        return parameters if isinstance(parameters, dict) else {}

    @property
    def metrics(self) -> dict:
        metrics = self.info.get("operationMetrics") or {}
        return metrics if isinstance(metrics, dict) else {}


def _relative(path: str) -> str | None:
    """A data file's path relative to the table root (log paths are URI-encoded); None for an
    absolute path (a shallow clone's), which the table's own storage cannot check."""
    if "://" in path or path.startswith("/") or path.startswith("file:"):
        return None
    return unquote(path)


class TableFiles:
    """A table's storage as delta-rs sees it (same storage options), for reading log entries and
    checking that data files still exist, without Spark."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = uri
        self._fs = pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options))

    def commit(self, version: int) -> CommitActions | None:
        """The log entry of `version`; None when it no longer exists (log retention)."""
        name = _entry_name(version)
        if self._fs.get_file_info(name).type == pafs.FileType.NotFound:
            return None
        with self._fs.open_input_stream(name) as stream:
            lines = stream.read().decode("utf-8").split("\n")  # not splitlines(): U+0085, U+2028 may stand in a value
        info, metadata, added, removed, cdc = {}, None, [], [], []
        for line in lines:
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "metaData" in action:
                metadata = action["metaData"]
            elif "add" in action:
                added.append(action["add"]["path"])
            elif "remove" in action:
                removed.append(action["remove"]["path"])
            elif "cdc" in action:
                cdc.append(action["cdc"]["path"])
        return CommitActions(version, info, metadata, tuple(added), tuple(removed), tuple(cdc))

    def missing(self, paths) -> list[str]:
        """The paths (as the log writes them) whose files are gone."""
        relative = {p: _relative(p) for p in dict.fromkeys(paths)}
        checkable = [r for r in relative.values() if r is not None]
        if not checkable:
            return []
        gone = {i.path for i in self._fs.get_file_info(checkable) if i.type == pafs.FileType.NotFound}
        return [p for p, r in relative.items() if r is not None and r in gone]


def table_at(uri: str, version: int, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """delta-rs's table as of `version` (schema, properties, files, row count from statistics),
    for reading only (`opened`)."""
    return opened(uri, storage_options, version)


CHANGED_ROWS = {  # operation -> metrics whose sum is the rows it changed (Spark's names, then delta-rs's)
    "WRITE": ("numOutputRows", "num_added_rows"),
    "STREAMING UPDATE": ("numOutputRows",),
    "MERGE": ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
              "num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted"),
    "DELETE": ("numDeletedRows", "num_deleted_rows"),
    "UPDATE": ("numUpdatedRows", "num_updated_rows"),
}


# ---- cost ----------------------------------------------------------------------------------------
def changed_rows(path: str, before: int, after: int, storage_options=None) -> int | None:
    """Rows the commits after `before` up to `after` inserted, updated or deleted, from their
    metrics; None when a data-changing commit has no metrics to tell."""
    files = TableFiles(path, storage_options)
    total = 0
    for version in range(before + 1, after + 1):
        commit = files.commit(version)
        if commit is None:
            return None
        names = CHANGED_ROWS.get(commit.operation.upper())
        if names is None:
            if commit.added or commit.removed:
                if commit.operation.upper() in ("OPTIMIZE", "VACUUM START", "VACUUM END"):
                    continue
                return None
            continue
        metrics = commit.metrics
        if not any(name in metrics for name in names):
            return None
        total += sum(int(metrics.get(name, 0) or 0) for name in names)
    return total


def delta_rs_reads_alike(table: DeltaTable) -> bool:
    """Whether delta-rs reads the table as Spark does: not with column mapping (delta-rs 1.6.6
    returns wrong change rows for a column-mapped table) nor deletion vectors."""
    configuration = table.metadata().configuration
    return (str(configuration.get("delta.columnMapping.mode", "none")).lower() == "none"
            and str(configuration.get("delta.enableDeletionVectors", "false")).lower() != "true")
