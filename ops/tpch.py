"""Load the eight TPC-H tables as Delta source tables with change data feed on.

`tpchgen-cli` writes Parquet into a temporary folder; Spark rewrites each table as a Delta table at
`<warehouse>/sources/<name>` in a single creating commit (version 0) that already has the change
data feed enabled, carries the scale as a table property and is stamped with a logical time, so the
engine's logical clock places the initial load in an epoch like any later change.

Loading is refused rather than repeated: a warehouse that already holds the tables at the same scale
is left alone (the report says so), anything else (another scale, a partial set, a foreign table)
raises `TpchLoadConflict` naming the table and the way out. A duplicated source would silently
double every derived result.

The Parquet folder is local to the driver: with a cluster master the executors must see it, so point
TMPDIR at shared storage there.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from epochal.storage.clock import logical_time_metadata, utc
from epochal.storage.warehouse import Warehouse, is_local, local_path
from ops import deltalog
from ops.confs import USER_METADATA_CONF, session_confs

TPCH_TABLES: tuple[str, ...] = (
    "region",
    "nation",
    "supplier",
    "customer",
    "part",
    "partsupp",
    "orders",
    "lineitem",
)

PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "region": ("r_regionkey",),
    "nation": ("n_nationkey",),
    "supplier": ("s_suppkey",),
    "customer": ("c_custkey",),
    "part": ("p_partkey",),
    "partsupp": ("ps_partkey", "ps_suppkey"),
    "orders": ("o_orderkey",),
    "lineitem": ("l_orderkey", "l_linenumber"),
}

SCALE_PROPERTY = "epochal.tpch.scale"
LOAD_THREADS = 4  # tables are written side by side: small writes are mostly driver-side overhead

# Files are range-partitioned on the table's leading key, so each file covers a disjoint key range
# and Delta's per-file min/max statistics let a scan restricted to a few keys skip the rest.
ROWS_PER_FILE = 500_000
MIN_FILES = {"orders": 8, "lineitem": 8}


class TpchLoadConflict(RuntimeError):
    """The warehouse already holds source tables that a load would contradict or duplicate."""


@dataclass(frozen=True)
class TableLoad:
    name: str
    path: str
    version: int
    files: int
    rows: int | None  # None when the load was skipped (counting would cost a scan)


@dataclass(frozen=True)
class LoadReport:
    warehouse: str
    scale: float
    logical_time: datetime
    skipped: bool
    message: str
    tables: dict[str, TableLoad] = field(default_factory=dict)
    seconds: float = field(default=0.0, compare=False)


def tpchgen_executable() -> str:
    """The `tpchgen-cli` console script of the running interpreter's environment (a virtualenv's
    scripts are not on PATH unless it is activated), else the one on PATH."""
    beside_python = Path(sys.executable).parent / "tpchgen-cli"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise FileNotFoundError(
            "tpchgen-cli is not installed next to this Python nor on PATH: run `make setup` "
            "(it is a dependency in pyproject.toml)"
        )
    return found


def generate_parquet(scale: float, folder: str) -> dict[str, str]:
    """Generate all eight tables at `scale` as Parquet files; returns table name -> file."""
    subprocess.run(
        [tpchgen_executable(), "parquet", "--scale-factor", format_scale(scale),
         "--output-dir", folder, "--quiet"],
        check=True,
    )
    files = {name: os.path.join(folder, f"{name}.parquet") for name in TPCH_TABLES}
    missing = [name for name, path in files.items() if not os.path.exists(path)]
    if missing:
        raise RuntimeError(f"tpchgen-cli did not write {missing} into {folder}")
    return files


def format_scale(scale: float) -> str:
    return format(scale, "g")


def parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def file_count(name: str, rows: int) -> int:
    return max(MIN_FILES.get(name, 1), math.ceil(rows / ROWS_PER_FILE))


def _table_exists(spark, path: str) -> bool:
    if deltalog.is_delta_table(spark, path):
        return True
    if is_local(path) and os.path.isdir(local_path(path)) and os.listdir(local_path(path)):
        raise TpchLoadConflict(
            f"{path} exists but is not a Delta table (a load interrupted before its first commit, "
            f"or foreign files): remove that folder and load again"
        )
    return False


def existing_sources(spark, warehouse: Warehouse) -> dict[str, str | None]:
    """Source tables already present: name -> recorded scale (None when not written by the loader)."""
    present = {}
    for name in TPCH_TABLES:
        path = warehouse.source_path(name)
        if _table_exists(spark, path):
            present[name] = deltalog.properties(spark, path).get(SCALE_PROPERTY)
    return present


def check_existing(present: dict[str, str | None], scale: float, warehouse: Warehouse) -> bool:
    """True when all eight tables are there at this scale (the load is a no-op); raises
    TpchLoadConflict for any other non-empty state; False for an empty warehouse."""
    if not present:
        return False
    sources = warehouse.join("sources")
    for name, recorded in present.items():
        if recorded is None:
            raise TpchLoadConflict(
                f"source table {name!r} at {warehouse.source_path(name)} was not written by the "
                f"TPC-H loader (it has no {SCALE_PROPERTY} property): load TPC-H into another "
                f"warehouse, or remove that table first"
            )
        if not math.isclose(float(recorded), scale):
            raise TpchLoadConflict(
                f"source table {name!r} at {warehouse.source_path(name)} holds TPC-H scale "
                f"{recorded}, not {format_scale(scale)}: load scale {format_scale(scale)} into "
                f"another warehouse, or delete {sources} (and any derived tables built on it) "
                f"and load again"
            )
    missing = [name for name in TPCH_TABLES if name not in present]
    if missing:
        raise TpchLoadConflict(
            f"the warehouse {warehouse.root} holds only part of the TPC-H sources: "
            f"{', '.join(present)} present, {', '.join(missing)} missing (an interrupted load?). "
            f"Delete {sources} and load again; loading the missing tables alone would mix "
            f"generations"
        )
    return True


def _write_table(spark, name: str, parquet: str, rows: int, path: str, scale: float) -> None:
    """Create the table from the Parquet file in one commit. DataFrameWriterV2 because it sets
    any table property at creation (the v1 writer keeps only `delta.*` options); it ignores the
    `userMetadata` writer option, so the caller sets the session conf instead."""
    from pyspark.sql import functions as F

    keys = PRIMARY_KEYS[name]
    frame = (
        spark.read.parquet(parquet)
        .repartitionByRange(file_count(name, rows), F.col(keys[0]))
        .sortWithinPartitions(*keys)
    )
    identifier = "delta.`" + path.replace("`", "``") + "`"
    (
        frame.writeTo(identifier)
        .using("delta")
        .tableProperty("delta.enableChangeDataFeed", "true")
        .tableProperty(SCALE_PROPERTY, format_scale(scale))
        .create()
    )


def _describe(spark, name: str, path: str, rows: int | None) -> TableLoad:
    return TableLoad(
        name=name,
        path=path,
        version=deltalog.latest_commit(spark, path).version,
        files=deltalog.file_count(spark, path),
        rows=rows,
    )


def load_tpch(spark, warehouse_root: str, scale: float, logical_time: datetime) -> LoadReport:
    """Create the eight TPC-H source tables at `scale`, each in one commit (version 0) with the
    change data feed on and `userMetadata` stamping `logical_time`.

    Idempotent in the only safe way: the same scale already loaded returns a report with
    `skipped=True`; any other existing state raises TpchLoadConflict before anything is written.
    """
    if not scale > 0:
        raise ValueError(f"TPC-H scale must be positive, got {scale}")
    started = time.monotonic()
    warehouse = Warehouse(warehouse_root)
    logical_time = utc(logical_time)

    if check_existing(existing_sources(spark, warehouse), scale, warehouse):
        tables = {n: _describe(spark, n, warehouse.source_path(n), None) for n in TPCH_TABLES}
        return LoadReport(
            warehouse=warehouse.root,
            scale=scale,
            logical_time=logical_time,
            skipped=True,
            message=(
                f"skipped: {warehouse.root} already holds all eight TPC-H tables at scale "
                f"{format_scale(scale)}; nothing was written"
            ),
            tables=tables,
            seconds=time.monotonic() - started,
        )

    with tempfile.TemporaryDirectory(prefix="epochal-tpch-") as folder:
        files = generate_parquet(scale, folder)
        rows = {name: parquet_rows(files[name]) for name in TPCH_TABLES}
        largest_first = sorted(TPCH_TABLES, key=rows.get, reverse=True)
        meta = {USER_METADATA_CONF: logical_time_metadata(logical_time)}
        with session_confs(spark, meta), ThreadPoolExecutor(LOAD_THREADS) as pool:
            writes = [
                pool.submit(_write_table, spark, name, files[name], rows[name],
                            warehouse.source_path(name), scale)
                for name in largest_first
            ]
            for write in writes:
                write.result()
    tables = {n: _describe(spark, n, warehouse.source_path(n), rows[n]) for n in TPCH_TABLES}
    total = sum(t.rows or 0 for t in tables.values())
    return LoadReport(
        warehouse=warehouse.root,
        scale=scale,
        logical_time=logical_time,
        skipped=False,
        message=(
            f"loaded TPC-H scale {format_scale(scale)} into {warehouse.join('sources')}: "
            f"{total} rows in 8 tables at logical time {logical_time.isoformat()}"
        ),
        tables=tables,
        seconds=time.monotonic() - started,
    )
