"""State tables: Delta tables under <root>/_epochal/tables/<table>/state/<name>, log-structured.

A state table holds rows keyed by the operator's keys (a group, a distinct row). An epoch does not
MERGE its changed rows in place: it appends them, each tagged with the step's `seq` (and a delete
flag for rows that left), and a reader takes, per key, the row with the highest `seq`. An append
writes only the changed rows, where a MERGE would rewrite every file holding one of them. Once
`compact_after` appends have added more than `compact_fraction` of the rows the table was
compacted to, or after `compact_appends` appends whatever their rows (upkeep.Upkeep), the epoch
writes the compacted table instead (an overwrite), so reads stay proportional to the state. A
large state whose appends are small is read as cheaply with them as without, and compacting it
rewrites every row for a few (TPC-H Q18's 15M groups at scale 10, for an hour's few thousand).

Rules read state as of the version the ledger recorded for the previous epoch (time travel), never
"whatever is there now", so a step interrupted after some of its writes recomputes the same change
when it is run again. Rules only queue writes; the epoch protocol performs them, each with its
Delta idempotent-write identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..arrow_rows import first_of_each_key, first_values, key_tuples
from ..changes import null_safe_on, quoted
from ..errors import EpochError
from ..storage.deltalog import CHANGED_ROWS, DeltaLog
from .upkeep import Upkeep

DELETE_FLAG = "__delete"
SEQ = "__seq"


class StateMissing(EpochError):
    """A state table the plan needs is absent (deleted, or never written)."""


@dataclass
class StateWrite:
    """A queued write. `checks` are (what would be wrong, SQL condition[, rescan reason code]): a
    row of `frame` satisfying a condition means the state disagrees with the change (a count below
    zero), or, with a reason code, that the step cannot be exact (a sum past its type)."""

    name: str
    frame: DataFrame
    keys: tuple[str, ...] = ()
    mode: str = "merge"  # "merge": upsert rows, delete rows with DELETE_FLAG; "overwrite": replace
    checks: tuple[tuple[str, ...], ...] = ()
    rows: int | None = None  # counted before writing (merges only)
    arrow: object | None = None  # the rows as a pyarrow Table, when collected to the driver
    held: object | None = None  # the rows and one `__bad<i>` flag per check, computed on the driver


def latest(raw: DataFrame, keys: list[str]) -> DataFrame:
    """Per key, the row of the highest seq; keys whose latest row is a deletion are gone."""
    columns = [c for c in raw.columns if c not in (SEQ, DELETE_FLAG)]
    ranked = raw.withColumn(
        "__rank",
        F.row_number().over(Window.partitionBy(*[F.col(quoted(k)) for k in keys]).orderBy(F.col(SEQ).desc())),
    )
    return ranked.filter((F.col("__rank") == 1) & ~F.col(DELETE_FLAG)).select(*[F.col(quoted(c)) for c in columns])


@dataclass
class StateStore:
    spark: SparkSession
    root: str
    versions: dict[str, int]
    storage_options: dict[str, str] | None = None
    reads: object | None = None  # shared_reads.SharedReads: small versions read on the driver
    upkeep: Upkeep = Upkeep()  # when a state table is compacted
    writes: list[StateWrite] = field(default_factory=list)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def read(self, name: str, keys: list[str], restrict: DataFrame | None = None) -> DataFrame:
        """The state as of the previous epoch; with `restrict` (a frame with the key columns),
        only the keys it holds, selected before the per-key reduction so a large state is not
        reduced in full for a small change."""
        version = self.versions.get(name)
        if version is None:
            raise StateMissing(f"state table {name} has no version recorded in the ledger")
        if DeltaLog.open(self.path(name), self.storage_options) is None:
            raise StateMissing(f"state table {self.path(name)} is missing")
        shared = self.reads.snapshot(self.spark, self.path(name), version) if self.reads is not None else None
        raw = shared if shared is not None else (
            self.spark.read.format("delta").option("versionAsOf", version).load(self.path(name)))
        if restrict is not None and keys:
            wanted = restrict.select(*[F.col(quoted(k)).alias(f"__r_{k}") for k in keys]).distinct()
            raw = raw.join(wanted, null_safe_on(raw, wanted, [(k, f"__r_{k}") for k in keys]), "left_semi")
        return latest(raw, keys)

    def _raw_on_driver(self, name: str, column: str | None, wanted: tuple[tuple, bool] | None):
        """The state's raw rows (every seq) as Arrow: the whole version when small, else with
        `column` those whose `column` is one of `wanted` (values, NULLs too); None where they
        are Spark's to read (too many, or a table delta-rs cannot read as Spark does)."""
        version = self.versions.get(name)
        if version is None:
            raise StateMissing(f"state table {name} has no version recorded in the ledger")
        if self.reads is None:
            return None
        path = self.path(name)
        if DeltaLog.open(path, self.storage_options) is None:
            raise StateMissing(f"state table {path} is missing")
        data = self.reads.snapshot_rows(path, version) if column is not None else self.reads.whole_rows(path, version)
        if data is None and column is not None and wanted is not None:
            data = self.reads.keys_rows(path, version, column, *wanted)
        return data

    def latest_on_driver(self, name: str, keys: list[str], wanted: list[tuple]) -> dict[tuple, dict] | None:
        """`read` restricted to the `wanted` keys, on the driver: per key its latest state row
        (column -> value) unless deleted; None where the rows are Spark's to read."""
        data = self._raw_on_driver(name, keys[0] if keys else None, first_values(wanted) if keys else None)
        return latest_rows(data, keys, wanted, SEQ, DELETE_FLAG) if data is not None else None

    def latest_table_of_keys(self, name: str, keys: list[str], first: tuple[tuple, bool] | None) -> pa.Table | None:
        """latest_on_driver as an Arrow table (delta-rs's types): the latest rows, not deleted, of
        at least the keys whose first column is one of `first` (column_first_values of the wanted
        keys' first column); None where the rows are Spark's to read."""
        data = self._raw_on_driver(name, keys[0] if keys else None, first if keys else None)
        return latest_table(_first_key_in(data, keys, first), keys, SEQ, DELETE_FLAG) if data is not None else None

    def latest_table_on_driver(self, name: str, keys: list[str], column: str | None = None,
                               wanted: tuple[tuple, bool] | None = None):
        """`read` on the driver as Arrow (delta-rs's types): every key's latest row when the state
        is small, else with `column` (a key) the keys whose `column` is one of `wanted` (values,
        NULLs too); None where the rows are Spark's to read."""
        data = self._raw_on_driver(name, column, wanted)
        return latest_table(data, keys, SEQ, DELETE_FLAG) if data is not None else None

    def merge(self, name: str, frame: DataFrame, keys: tuple[str, ...], checks=(), held=None) -> None:
        """Queue `frame`'s rows as the new state of their keys. `held`: the same rows as Arrow,
        with one boolean `__bad<i>` column per check, where the rule computed them on the driver
        (then no job collects them)."""
        self.writes.append(StateWrite(name, frame, keys, "merge", tuple(checks), held=held))

    def overwrite(self, name: str, frame: DataFrame, keys: tuple[str, ...] = ()) -> None:
        self.writes.append(StateWrite(name, frame, keys, "overwrite"))

    def due_for_compaction(self, name: str) -> bool:
        """Whether the next write of state `name` compacts it (the module's rule): the appends
        since it was last replaced, read from its log (an OPTIMIZE between them moves no row),
        their rows from the commits' metrics; where a commit does not tell its rows, the number
        of appends decides alone."""
        log = DeltaLog.open(self.path(name), self.storage_options)
        if log is None:
            return False
        appends, appended = 0, 0
        for commit in reversed(log.commits(max(0, log.version - self.upkeep.compact_appends - 1))):
            if commit.operation == "OPTIMIZE":
                continue
            if commit.operation != "WRITE" or str(commit.parameters.get("mode", "")).lower() != "append":
                break
            appends += 1
            rows = appended_rows(commit)
            appended = None if rows is None or appended is None else appended + rows
        if appends < self.upkeep.compact_after:
            return False
        if appends >= self.upkeep.compact_appends or appended is None:
            return True
        try:
            held = log.rows()
        except (DeltaError, OSError, ValueError):
            return True
        return appended > self.upkeep.compact_fraction * max(0, held - appended)


def appended_rows(commit) -> int | None:
    """The rows an append commit added, from its metrics (Spark's, or delta-rs's); None where
    they do not say."""
    for name in CHANGED_ROWS["WRITE"]:
        if name in commit.metrics:
            return int(commit.metrics[name] or 0)
    return None


def latest_rows(data: pa.Table, keys: list[str], wanted: list[tuple], seq: str, delete_flag: str) -> dict[tuple, dict]:
    """state.latest on the driver, for the `wanted` keys only: per key the row of the highest
    `seq`, unless that row is a deletion. Keys match NULL-safely (None equals None), as Spark's
    join on the state does."""
    names = {c.lower(): c for c in data.column_names}
    latest = latest_table(_first_key_in(data, keys, first_values(wanted) if keys else None), keys, seq, delete_flag)
    wanted_set = set(wanted)
    found = key_tuples(latest, [names[k.lower()] for k in keys]) if keys else [()] * latest.num_rows
    return {key: row for key, row in zip(found, latest.to_pylist()) if key in wanted_set}


def _first_key_in(data: pa.Table, keys: list[str], first: tuple[tuple, bool] | None) -> pa.Table:
    """The rows of `data` whose first key is one of `first` (first_values: the values, and
    whether NULL); all rows where there are none or they do not compare."""
    names = {c.lower(): c for c in data.column_names}
    if keys and first is not None and (first[0] or first[1]):
        values, null = first
        column = data.column(names[keys[0].lower()])
        try:
            mask = pc.is_in(column, value_set=pa.array(list(values), type=column.type))
        except (pa.ArrowException, TypeError, ValueError):
            mask = None
        if mask is not None:
            if null:
                mask = pc.or_(mask, pc.is_null(column))
            data = data.filter(pc.fill_null(mask, False))
    return data


def latest_table(data: pa.Table, keys: list[str], seq: str, delete_flag: str) -> pa.Table:
    """state.latest on the driver over every key in `data`: per key the row of the highest `seq`
    unless it is a deletion, without the `seq` and `delete_flag` columns. Keys match NULL-safely."""
    names = {c.lower(): c for c in data.column_names}
    ordered = data.sort_by([(names[seq.lower()], "descending")])
    latest = ordered.take(pa.array(first_of_each_key(ordered, [names[k.lower()] for k in keys]), pa.int64()))
    latest = latest.filter(pc.invert(pc.fill_null(latest.column(names[delete_flag.lower()]), False)))
    return latest.drop_columns([names[seq.lower()], names[delete_flag.lower()]])
