"""Maintenance of a warehouse's derived tables: OPTIMIZE (compaction), VACUUM within retention,
compaction of the engine's bookkeeping tables (ledgers, remap), and deleting a table's state so the
engine rebuilds it. Knows nothing of Dagster (ops/maintenance.py wraps it in jobs).

VACUUM never removes a file the engine still needs. The next epoch of a table reads, by time
travel, its own output at the version its ledger last recorded (the base of a multiset MERGE), its
state tables at their recorded versions, and each derived input's change data feed after the
version it last read. For every table this module computes that oldest needed version from the
ledgers and keeps the retention long enough that the version stays readable: files removed at or
after the commit that followed it, and change files written since, survive. Retention is never
below Delta's default of 7 days unless the caller says so explicitly.

Do not run maintenance while epochs are being applied to the same tables: OPTIMIZE conflicts with a
concurrent MERGE (Delta retries or fails it), and deleting state under a running step fails it.
OPTIMIZE and VACUUM hold the table's commit lock on a local path (storage/commit_lock.py).
"""

from __future__ import annotations

import collections
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from .arrow_rows import is_connect
from .errors import EpochalError
from .protocol.writes import delta_path
from .sessions import session_confs
from .storage.commit_lock import commit_lock
from .storage.deltalog import DeltaLog
from .storage.ledger import Ledger
from .storage.warehouse import Warehouse, is_local, local_path

DEFAULT_RETENTION_HOURS = 168  # Delta's default delta.deletedFileRetentionDuration (7 days)
SAFETY_MARGIN_HOURS = 1  # change files are written just before their commit's timestamp
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
# VACUUM lists a table's files in a Spark job with this many tasks (default 10,000, sized for
# clusters: on a small machine scheduling them costs far more than listing a small table's folder);
# one task per core is plenty for a table's folder.
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@dataclass(frozen=True)
class DeltaTarget:
    """A Delta table maintenance works on."""

    table: str  # the derived table it belongs to
    kind: str  # "derived" | "state" | "ledger" | "remap" | "arrangement"
    path: str
    name: str = ""  # the state table's name

    @property
    def label(self) -> str:
        if self.kind in ("state", "arrangement"):
            return f"{self.table}/{self.name}"
        return self.table if self.kind == "derived" else f"{self.table} {self.kind}"


@dataclass
class MaintenanceResult:
    target: DeltaTarget
    action: str
    seconds: float
    detail: dict = field(default_factory=dict)
    message: str = ""


def _children(uri: str, spark=None) -> list[str]:
    """Names of the folders directly under `uri` (none when it does not exist)."""
    if is_local(uri):
        path = local_path(uri)
        return sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))) if os.path.isdir(path) else []
    if spark is None:
        raise EpochalError(f"listing {uri} needs a Spark session (its Hadoop file system)")
    _need_hadoop(spark, f"listing {uri}")
    jvm = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(hadoop_path):
        return []
    return sorted(status.getPath().getName() for status in fs.listStatus(hadoop_path) if status.isDirectory())


def _need_hadoop(spark, what: str) -> None:
    """Folders of an object-store warehouse are listed and deleted through the driver's Hadoop file
    system, which a Spark Connect client does not have."""
    if is_connect(spark):
        raise EpochalError(f"{what} needs the Hadoop file system of a classic Spark session; a Spark Connect "
                           "client has none. Run this maintenance job with a local[*] or spark:// master")


def _remove_tree(uri: str, spark=None) -> None:
    if is_local(uri):
        shutil.rmtree(local_path(uri))
        return
    if spark is None:
        raise EpochalError(f"deleting {uri} needs a Spark session (its Hadoop file system)")
    _need_hadoop(spark, f"deleting {uri}")
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(hadoop_path, True)


def derived_tables(root: str, spark=None) -> list[str]:
    """The derived tables the warehouse holds (a table folder or engine state under _epochal)."""
    warehouse = Warehouse(root)
    return sorted(set(_children(warehouse.join("tables"), spark)) | set(_children(warehouse.engine_path("tables"), spark)))


def targets(root: str, tables: list[str] | None = None, *, state: bool = True, bookkeeping: bool = False,
            arrangements: bool = False, spark=None) -> list[DeltaTarget]:
    """The Delta tables of `tables` (default: all derived tables): each derived table, its state
    tables, with `bookkeeping` its ledger and the shared remap, and with `arrangements` the
    warehouse's arrangements (epochal/keyed/arrangements.py; VACUUM only: compaction would undo their
    sort order, and they are rebuilt, not optimized)."""
    warehouse = Warehouse(root)
    known = derived_tables(root, spark)
    chosen = tables or known
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise EpochalError(f"no derived table named {', '.join(unknown)} in {warehouse.root}; present: "
                           f"{', '.join(known) or 'none'}")
    found = []
    for table in chosen:
        if DeltaLog.open(warehouse.table_path(table)) is not None:
            found.append(DeltaTarget(table, "derived", warehouse.table_path(table)))
        if state:
            state_root = warehouse.engine_path("tables", table, "state")
            for name in _children(state_root, spark):
                if DeltaLog.open(f"{state_root}/{name}") is not None:
                    found.append(DeltaTarget(table, "state", f"{state_root}/{name}", name))
        if bookkeeping and DeltaLog.open(warehouse.engine_path("tables", table, "ledger")) is not None:
            found.append(DeltaTarget(table, "ledger", warehouse.engine_path("tables", table, "ledger")))
    if bookkeeping and DeltaLog.open(warehouse.engine_path("remap")) is not None:
        found.append(DeltaTarget("(all tables)", "remap", warehouse.engine_path("remap")))
    if arrangements:
        folder = warehouse.engine_path("arrangements")
        for name in _children(folder, spark):
            if DeltaLog.open(f"{folder}/{name}") is not None:
                found.append(DeltaTarget("(arrangements)", "arrangement", f"{folder}/{name}", name))
    return found


def needed_versions(root: str, spark=None) -> dict[str, int]:
    """For each derived and state table path, the oldest version the engine's next epochs read
    (from every ledger: a table's own last output version, its state versions, and the version
    of each derived input that its downstream tables last read)."""
    warehouse = Warehouse(root)
    needed: dict[str, int] = {}

    def keep(path: str, version: int) -> None:
        if version is not None and version >= 0:
            needed[path] = min(needed.get(path, version), version)

    tables = derived_tables(root, spark)
    for table in tables:
        ledger = Ledger(warehouse.engine_path("tables", table, "ledger"))
        steps = [s for s in (ledger.last_committed(), ledger.pending()) if s is not None]
        for step in steps:
            keep(warehouse.table_path(table), step.output_version)
            for name, version in step.state_versions.items():
                keep(warehouse.engine_path("tables", table, "state", name), version)
            for name, versions in step.inputs.items():
                if name in tables:  # a derived input: its next epoch reads changes after "to"
                    keep(warehouse.table_path(name), versions["to"])
    return needed


def nothing_to_compact(path: str) -> str | None:
    """Why Delta's OPTIMIZE of the table at `path` would rewrite nothing, read from its log by
    delta-rs, or None where it may rewrite something. OPTIMIZE packs each partition's candidate
    files into bins and rewrites only the bins of two files or more (Delta's OptimizeTableCommand,
    groupFilesIntoBins), so a partition of one file gives it nothing to do whatever its size or
    deletion vectors. A clustered table, which OPTIMIZE reclusters, is left to it."""
    try:
        table = DeltaTable(path)
        if "clustering" in (table.protocol().writer_features or []):
            return None
        partitioning = [f"partition.{c}" for c in table.metadata().partition_columns]
        actions = table.get_add_actions(flatten=True)
        per_partition = collections.Counter(
            zip(*(actions.column(c).to_pylist() for c in partitioning)) if partitioning else [()] * actions.num_rows)
    except (DeltaError, OSError, ValueError, KeyError):  # not read here: OPTIMIZE decides
        return None
    if any(files > 1 for files in per_partition.values()):
        return None
    return f"at most one file in each of its {len(per_partition)} partitions" if partitioning else \
        f"{actions.num_rows} file{'s' if actions.num_rows != 1 else ''}"


def optimize(spark, target: DeltaTarget) -> MaintenanceResult:
    """Compact small files (Delta OPTIMIZE for Spark-written tables, delta-rs compaction plus a
    checkpoint for the engine's bookkeeping tables). Rows and their versions are unchanged: the
    new commit has dataChange=false, so change feeds and epochs do not see it. A table with
    nothing to compact (`nothing_to_compact`) is left as it is, without a Spark job."""
    began = time.monotonic()
    idle = nothing_to_compact(target.path) if target.kind not in ("ledger", "remap") else None
    if idle is not None:
        detail = {"files_removed": 0, "files_added": 0, "version": DeltaLog.open(target.path).version,
                  "nothing_to_do": True}
        return MaintenanceResult(target, "optimize", round(time.monotonic() - began, 3), detail,
                                 f"{target.label}: nothing to compact ({idle})")
    if target.kind in ("ledger", "remap"):
        with commit_lock(target.path):
            table = DeltaTable(target.path)
            metrics = table.optimize.compact()
            table.create_checkpoint()
        detail = {"files_removed": int(metrics.get("numFilesRemoved", 0)), "files_added": int(metrics.get("numFilesAdded", 0)),
                  "nothing_to_do": False}
    else:
        # SQL rather than Delta's DeltaTable API, which a Spark Connect server runs only with Delta's plugin
        with commit_lock(target.path):
            row = spark.sql(f"OPTIMIZE {delta_path(target.path)}").first()
        metrics = row["metrics"].asDict() if row is not None else {}
        detail = {"files_removed": int(metrics.get("numFilesRemoved", 0)), "files_added": int(metrics.get("numFilesAdded", 0)),
                  "nothing_to_do": False}
    detail["version"] = DeltaLog.open(target.path).version
    return MaintenanceResult(target, "optimize", round(time.monotonic() - began, 3), detail,
                             f"{target.label}: {detail['files_removed']} files compacted into {detail['files_added']}")


def safe_retention_hours(path: str, requested: float, keep_version: int | None, now: datetime | None = None) -> tuple[float, str]:
    """The retention that honours `requested` and keeps version `keep_version` readable: files
    tombstoned since the commit after it, and change files written since, must survive."""
    if keep_version is None:
        return requested, ""
    log = DeltaLog.open(path)
    if log is None or keep_version >= log.version:
        return requested, ""
    [following] = log.commits(keep_version + 1, keep_version + 1)
    now = now or datetime.now(timezone.utc)
    age = (now.timestamp() - following.timestamp_ms / 1000) / 3600
    needed = math.ceil(age) + SAFETY_MARGIN_HOURS
    if needed <= requested:
        return requested, ""
    return float(needed), (f"retention raised from {requested:g}h to {needed}h: the engine's next epoch "
                           f"still reads version {keep_version}")


def nothing_to_vacuum(path: str, retention_hours: float, now: float | None = None) -> str | None:
    """Why Delta's VACUUM of the table at `path` with `retention_hours` would delete nothing,
    found by listing its folder on the driver, or None where it may delete something (or the
    folder is not on a local file system). VACUUM deletes only files older than the retention
    that the table no longer holds, and empty folders (Delta's VacuumCommand.gc); a folder whose
    every file outside _delta_log is younger than the retention (less SAFETY_MARGIN_HOURS), and
    that holds no empty folder, has nothing for it, however its log reads."""
    if not is_local(path):
        return None
    root = local_path(path)
    cutoff = (now if now is not None else time.time()) - (retention_hours - SAFETY_MARGIN_HOURS) * 3600

    def refuse(error):
        raise error

    files = 0
    try:
        for folder, folders, names in os.walk(root, onerror=refuse):
            if folder == root:
                folders[:] = [f for f in folders if f != "_delta_log"]
            elif not folders and not names:
                return None
            for name in names:
                if os.stat(os.path.join(folder, name)).st_mtime < cutoff:
                    return None
            files += len(names)
    except OSError:
        return None
    return f"none of its {files} files is older than {retention_hours - SAFETY_MARGIN_HOURS:g}h"


def _listing_tasks(spark) -> int:
    try:
        return max(2, spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext on the client
        return 8


def vacuum(spark, target: DeltaTarget, retention_hours: float = DEFAULT_RETENTION_HOURS, *,
           keep_version: int | None = None, allow_short_retention: bool = False,
           dry_run: bool = False) -> MaintenanceResult:
    """VACUUM a table: delete files no version within the retention needs. Never below the 7-day
    default unless `allow_short_retention`; never removing files `keep_version` needs."""
    began = time.monotonic()
    if retention_hours < DEFAULT_RETENTION_HOURS and not allow_short_retention:
        raise EpochalError(
            f"vacuum of {target.label}: a retention of {retention_hours:g}h is below Delta's default of "
            f"{DEFAULT_RETENTION_HOURS}h (7 days), which protects readers and time travel; ask for it "
            "explicitly (allow_short_retention) if you mean it"
        )
    hours, note = safe_retention_hours(target.path, retention_hours, keep_version)
    detail = {"nothing_to_do": False}
    if target.kind in ("ledger", "remap", "arrangement"):
        with commit_lock(target.path):  # delta-rs logs VACUUM START and END as commits
            removed = DeltaTable(target.path).vacuum(retention_hours=int(math.ceil(hours)), dry_run=dry_run,
                                                     enforce_retention_duration=not allow_short_retention)
        count = len(removed)
    elif (idle := nothing_to_vacuum(target.path, hours)) is not None:
        count, note = 0, "; ".join(filter(None, [note, idle]))
        detail["nothing_to_do"] = True
    else:
        quoted = target.path.replace("`", "``")
        confs = {LISTING_PARALLELISM: str(_listing_tasks(spark))}
        if hours < DEFAULT_RETENTION_HOURS:
            confs[RETENTION_CHECK] = "false"
        with session_confs(spark, confs):
            count = spark.sql(f"VACUUM delta.`{quoted}` RETAIN {hours:g} HOURS DRY RUN").count()
            if count and not dry_run:
                with commit_lock(target.path):
                    spark.sql(f"VACUUM delta.`{quoted}` RETAIN {hours:g} HOURS").collect()
    detail |= {"files_deleted": 0 if dry_run else count, "files_deletable": count, "retention_hours": hours,
               "keep_version": -1 if keep_version is None else keep_version}
    verb = "would delete" if dry_run else "deleted"
    message = f"{target.label}: {verb} {count} files older than {hours:g}h" + (f" ({note})" if note else "")
    return MaintenanceResult(target, "vacuum", round(time.monotonic() - began, 3), detail, message)


def delete_state(root: str, table: str, spark=None) -> MaintenanceResult:
    """Delete a derived table's state tables so the engine rebuilds them: its next epoch that has
    input changes finds the state missing and rescans the table (reason STATE_MISSING), which
    rewrites the state; tables downstream stay incremental. Refused while a step of the table is
    in progress (or was interrupted and is waiting to be finished)."""
    began = time.monotonic()
    warehouse = Warehouse(root)
    if table not in derived_tables(root, spark):
        raise EpochalError(f"no derived table named {table!r} in {warehouse.root}; present: "
                           f"{', '.join(derived_tables(root, spark)) or 'none'}")
    ledger = Ledger(warehouse.engine_path("tables", table, "ledger"))
    pending = ledger.pending()
    if pending is not None:
        raise EpochalError(
            f"table {table!r} has a step in progress (epoch {pending.epoch}, seq {pending.seq}) or one a "
            "crash interrupted; let it finish (materialize that partition again) before deleting its state"
        )
    state_root = warehouse.engine_path("tables", table, "state")
    names = _children(state_root, spark)
    target = DeltaTarget(table, "state", state_root)
    if not names:
        return MaintenanceResult(
            target, "delete_state", round(time.monotonic() - began, 3), {"deleted": []},
            f"{table} keeps no state tables (its plan needs none, or it rescans every epoch): nothing "
            "deleted; to rebuild the table itself, materialize its next partition with full_refresh",
        )
    last = ledger.last_committed()
    _remove_tree(state_root, spark)
    return MaintenanceResult(
        target, "delete_state", round(time.monotonic() - began, 3),
        {"deleted": names, "last_epoch": last.epoch if last else ""},
        f"deleted the state of {table} ({', '.join(names)}). Its next epoch with input changes finds the "
        "state missing and rescans the table (reason STATE_MISSING), which rebuilds the state; tables "
        "downstream stay incremental",
    )
