"""Reading a Delta table's log (versions, commits, schema) without a Spark job, through delta-rs."""

from __future__ import annotations

import json
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError


@dataclass(frozen=True)
class Commit:
    version: int
    timestamp_ms: int
    operation: str
    parameters: dict
    user_metadata: str | None

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
            parameters = entry.get("operationParameters") or {}
            found.append(
                Commit(
                    version=version,
                    timestamp_ms=int(entry.get("inCommitTimestamp") or entry["timestamp"]),
                    operation=str(entry.get("operation", "")),
                    parameters=parameters if isinstance(parameters, dict) else {},
                    user_metadata=entry.get("userMetadata"),
                )
            )
        return sorted(found, key=lambda commit: commit.version)

    def schema_json(self) -> dict:
        return json.loads(self._table.schema().to_json())

    def spark_schema(self):
        from pyspark.sql.types import StructType

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
    from urllib.parse import unquote

    if "://" in path or path.startswith("/") or path.startswith("file:"):
        return None
    return unquote(path)


class TableFiles:
    """A table's storage as delta-rs sees it (same storage options), for reading log entries and
    checking that data files still exist, without Spark."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        import pyarrow.fs as pafs
        from deltalake.fs import DeltaStorageHandler

        self.uri = uri
        self._fs = pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options))

    def commit(self, version: int) -> CommitActions | None:
        """The log entry of `version`; None when it no longer exists (log retention)."""
        import pyarrow.fs as pafs

        name = f"_delta_log/{version:020d}.json"
        if self._fs.get_file_info(name).type == pafs.FileType.NotFound:
            return None
        with self._fs.open_input_stream(name) as stream:
            lines = stream.read().decode("utf-8").splitlines()
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
        import pyarrow.fs as pafs

        relative = {p: _relative(p) for p in dict.fromkeys(paths)}
        checkable = [r for r in relative.values() if r is not None]
        if not checkable:
            return []
        gone = {i.path for i in self._fs.get_file_info(checkable) if i.type == pafs.FileType.NotFound}
        return [p for p, r in relative.items() if r is not None and r in gone]


def table_at(uri: str, version: int, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """delta-rs's table as of `version` (schema, properties, files, row count from statistics)."""
    return DeltaTable(uri, version=version, storage_options=storage_options)
