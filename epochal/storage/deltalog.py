"""Reading a Delta table's log (versions, commits, schema) without a Spark job, through delta-rs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    operation: str
    parameters: dict
    user_metadata: str | None

    @staticmethod
    def of_entry(entry: dict) -> "Commit":
        """A commit from its history entry, as delta-rs's history or DESCRIBE HISTORY gives it
        (`inCommitTimestamp` where the table has in-commit timestamps, else `timestamp`, in ms)."""
        parameters = entry.get("operationParameters") or {}
        return Commit(version=int(entry["version"]),
                      timestamp_ms=int(entry.get("inCommitTimestamp") or entry["timestamp"]),
                      operation=str(entry.get("operation") or ""),
                      parameters=dict(parameters) if isinstance(parameters, dict) else {},
                      user_metadata=entry.get("userMetadata"))

    def as_dict(self) -> dict:
        return {"timestamp": self.timestamp_ms, "userMetadata": self.user_metadata}


class DeltaLog:
    """One table's log, opened once per use; all reads come from the same snapshot."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = uri
        self.storage_options = storage_options
        self._table = DeltaTable(uri, storage_options=storage_options, without_files=True)

    @staticmethod
    def open(uri: str, storage_options: dict[str, str] | None = None) -> "DeltaLog | None":
        try:
            return DeltaLog(uri, storage_options)
        except TableNotFoundError:
            return None

    @property
    def version(self) -> int:
        return self._table.version()

    def commits(self, start: int, end: int | None = None) -> list[Commit]:
        """Commits with start <= version <= end (default: the latest), oldest first."""
        end = self.version if end is None else end
        if end < start:
            return []
        found = []
        for entry in self._table.history(limit=self.version - start + 1):
            version = entry.get("version")
            if version is None or not start <= version <= end:
                continue
            found.append(Commit.of_entry(entry))
        return sorted(found, key=lambda commit: commit.version)

    @property
    def table_id(self) -> str:
        """Delta's id of the table (`metaData.id`): kept by every commit, overwrites and schema
        changes included, and new when a table is deleted and created again at the same path."""
        return self._table.metadata().id

    def schema_json(self) -> dict:
        return json.loads(self._table.schema().to_json())

    def spark_schema(self):
        return StructType.fromJson(self.schema_json())

    def properties(self) -> dict[str, str]:
        return dict(self._table.metadata().configuration)


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
        name = f"_delta_log/{version:020d}.json"
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
    """delta-rs's table as of `version` (schema, properties, files, row count from statistics)."""
    return DeltaTable(uri, version=version, storage_options=storage_options)


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
