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
