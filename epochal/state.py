"""State tables: Delta tables under <root>/_epochal/tables/<table>/state/<name>.

Rules read state as of the version the ledger recorded for the previous epoch (time travel), never
"whatever is there now", so a step interrupted after some of its writes recomputes the same change
when it is run again. Rules only queue writes; the epoch protocol performs them, each with its
Delta idempotent-write identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from .deltalog import DeltaLog
from .errors import EpochError

DELETE_FLAG = "__delete"


class StateMissing(EpochError):
    """A state table the plan needs is absent (deleted, or never written)."""


@dataclass
class StateWrite:
    """A queued write. `checks` are (what would be wrong, SQL condition): a row of `frame`
    satisfying a condition means the state disagrees with the change (a count below zero)."""

    name: str
    frame: DataFrame
    keys: tuple[str, ...] = ()
    mode: str = "merge"  # "merge": upsert rows, delete rows with DELETE_FLAG; "overwrite": replace
    checks: tuple[tuple[str, str], ...] = ()


@dataclass
class StateStore:
    spark: SparkSession
    root: str
    versions: dict[str, int]
    storage_options: dict[str, str] | None = None
    writes: list[StateWrite] = field(default_factory=list)

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def read(self, name: str) -> DataFrame:
        version = self.versions.get(name)
        if version is None:
            raise StateMissing(f"state table {name} has no version recorded in the ledger")
        if DeltaLog.open(self.path(name), self.storage_options) is None:
            raise StateMissing(f"state table {self.path(name)} is missing")
        return self.spark.read.format("delta").option("versionAsOf", version).load(self.path(name))

    def merge(self, name: str, frame: DataFrame, keys: tuple[str, ...], checks=()) -> None:
        self.writes.append(StateWrite(name, frame, keys, "merge", tuple(checks)))

    def overwrite(self, name: str, frame: DataFrame) -> None:
        self.writes.append(StateWrite(name, frame, (), "overwrite"))
