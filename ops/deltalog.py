"""Reading a Delta table's log for bookkeeping (versions, commit metadata, file counts).

Local tables are read with delta-rs, which answers in milliseconds without a Spark job; other URIs
go through Spark SQL (DESCRIBE HISTORY / DETAIL of delta.`path`), which knows the cluster's storage
credentials and which a Spark Connect server with Delta's SQL extension runs too.
"""

from __future__ import annotations

from epochal.storage.deltalog import Commit
from epochal.storage.warehouse import is_local, local_path


def history(spark, path: str, limit: int | None = None) -> list[Commit]:
    """The table's commits, newest first."""
    if is_local(path):
        import deltalake

        return [Commit.of_entry(entry) for entry in deltalake.DeltaTable(local_path(path)).history(limit)]
    history_ = spark.sql(f"DESCRIBE HISTORY {delta_path(path)}" + (f" LIMIT {int(limit)}" if limit else ""))
    rows = history_.select("version", "timestamp", "operation", "operationParameters", "userMetadata")
    return [Commit.of_entry({**row.asDict(), "timestamp": int(row.timestamp.timestamp() * 1000)})
            for row in rows.orderBy(history_["version"].desc()).collect()]


def latest_commit(spark, path: str) -> Commit:
    return history(spark, path, 1)[0]


def file_count(spark, path: str) -> int:
    if is_local(path):
        import deltalake

        return len(deltalake.DeltaTable(local_path(path)).file_uris())
    return _detail(spark, path)["numFiles"]


def is_delta_table(spark, path: str) -> bool:
    if is_local(path):
        import deltalake

        return deltalake.DeltaTable.is_deltatable(local_path(path))
    try:
        return _detail(spark, path)["format"] == "delta"
    except Exception:  # noqa: BLE001 - no table there (an AnalysisException, classic or Connect's)
        return False


def properties(spark, path: str) -> dict[str, str]:
    """The table properties (Delta calls them configuration)."""
    if is_local(path):
        import deltalake

        return dict(deltalake.DeltaTable(local_path(path)).metadata().configuration)
    return dict(_detail(spark, path)["properties"] or {})


def delta_path(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def _detail(spark, path: str) -> dict:
    return spark.sql(f"DESCRIBE DETAIL {delta_path(path)}").first().asDict()


def read_arrow(spark, path: str, columns: list[str] | None = None, key_column: str | None = None,
               keys=None):
    """The table's current rows as a pyarrow Table, optionally only `columns` and only rows whose
    `key_column` is in `keys`. Locally delta-rs reads it with no Spark job, which matters for the
    change generator's many small reads."""
    import pyarrow as pa

    if is_local(path):
        import deltalake
        import pyarrow.compute as pc

        dataset = deltalake.DeltaTable(local_path(path)).to_pyarrow_dataset()
        condition = pc.field(key_column).isin(pa.array(keys)) if key_column is not None else None
        return dataset.to_table(columns=columns, filter=condition)
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    if key_column is not None:
        frame = frame.filter(F.col(key_column).isin(pa.array(keys).to_pylist()))
    if columns is not None:
        frame = frame.select(*columns)
    return frame.toArrow()
