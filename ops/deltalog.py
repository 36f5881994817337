"""Reading a Delta table's log for bookkeeping (versions, commit metadata, file counts).

Local tables are read with delta-rs, which answers in milliseconds without a Spark job; other URIs
go through Spark's DeltaTable, which knows the cluster's storage credentials.
"""

from __future__ import annotations

from dataclasses import dataclass

from epochal.warehouse import is_local, local_path


@dataclass(frozen=True)
class Commit:
    version: int
    operation: str
    user_metadata: str | None


def history(spark, path: str, limit: int | None = None) -> list[Commit]:
    """The table's commits, newest first."""
    if is_local(path):
        import deltalake

        return [
            Commit(entry["version"], entry.get("operation", ""), entry.get("userMetadata"))
            for entry in deltalake.DeltaTable(local_path(path)).history(limit)
        ]
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    rows = (table.history(limit) if limit else table.history()).select(
        "version", "operation", "userMetadata"
    )
    return [Commit(r.version, r.operation, r.userMetadata) for r in rows.collect()]


def latest_commit(spark, path: str) -> Commit:
    return history(spark, path, 1)[0]


def file_count(spark, path: str) -> int:
    if is_local(path):
        import deltalake

        return len(deltalake.DeltaTable(local_path(path)).file_uris())
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).detail().select("numFiles").first().numFiles


def is_delta_table(spark, path: str) -> bool:
    if is_local(path):
        import deltalake

        return deltalake.DeltaTable.is_deltatable(local_path(path))
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def properties(spark, path: str) -> dict[str, str]:
    """The table properties (Delta calls them configuration)."""
    if is_local(path):
        import deltalake

        return dict(deltalake.DeltaTable(local_path(path)).metadata().configuration)
    from delta.tables import DeltaTable

    return dict(DeltaTable.forPath(spark, path).detail().select("properties").first()[0] or {})


def read_arrow(spark, path: str, columns: list[str] | None = None, key_column: str | None = None,
               keys=None):
    """The table's current rows as a pyarrow Table, optionally only `columns` and only rows whose
    `key_column` is in `keys`. Locally delta-rs reads it with no Spark job, which matters for the
    change generator's many small reads."""
    if is_local(path):
        import deltalake
        import pyarrow.compute as pc

        dataset = deltalake.DeltaTable(local_path(path)).to_pyarrow_dataset()
        condition = pc.field(key_column).isin(list(keys)) if key_column is not None else None
        return dataset.to_table(columns=columns, filter=condition)
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    if key_column is not None:
        frame = frame.filter(F.col(key_column).isin(list(keys)))
    if columns is not None:
        frame = frame.select(*columns)
    return frame.toArrow()
