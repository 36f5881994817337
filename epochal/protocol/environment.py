"""What one table's step sees of the engine: a typed value the engine builds for each step (its
Spark session, the reads shared by the steps of its refresh, the engine's settings, and how to
reach the other tables), so the protocol depends on exactly these and not on the engine."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ..keyed.arrangements import Arrangements
from ..keyed.keyed_files import KeyedFiles
from ..keyed.shared_reads import SharedReads
from ..keyed.upkeep import Upkeep
from ..storage.reclock import Remap
from ..storage.schemas import AnalysedSchemas


class Triggers:
    """The engine's rescan settings, and a short-lived memo of input checks (and of the rows a
    range's commits logged, for the cost model): several tables read one source over the same
    range in one epoch, and a range's log does not change (a VACUUM adds a commit, so the latest
    version is part of a check's key)."""

    def __init__(self, rescan_fraction: float | None = None):
        if rescan_fraction is not None and not 0 < rescan_fraction:
            raise ValueError(f"rescan_fraction must be positive (a fraction of the input rows), not {rescan_fraction!r}")
        self.rescan_fraction = rescan_fraction
        self._memo: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def remembered(self, key: tuple, compute):
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        found = compute()
        with self._lock:
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = found
        return found


@dataclass(frozen=True)
class Environment:
    """One step's view of the engine (Engine builds one per step; see `Engine.refresh`)."""

    spark: SparkSession  # the step's own session (a child of the engine's where steps run in parallel)
    reads: SharedReads | None  # the reads shared by the steps of the refresh
    storage_options: dict[str, str] | None
    driver_rows: int
    broadcast_rows: int
    cost_model: bool
    run_id: str
    arrangements: Arrangements | None
    keyed_files: KeyedFiles | None  # keyed reads of files, and their local copies (None: arrangements off)
    triggers: Triggers
    invalidation: Any  # invalidation.Invalidation: the column types each table was defined against
    remap: Remap
    sources: Mapping[str, Any]  # name -> engine.Source
    table: Callable[[str], Any]  # name -> engine.Table
    readers: Callable[[str], list[str]]  # name -> the derived tables that read it
    schema_of: Callable[[str], StructType]
    path_of: Callable[[str], str]
    output_frame: Callable[[Any, dict, str], DataFrame]  # (table, input ranges, side) -> its SQL in full
    upkeep: Upkeep = Upkeep()  # when state tables are compacted
    schemas: AnalysedSchemas | None = None  # Spark's analysed schemas, remembered on this machine's disk
    settings: dict | None = None  # settings.current of `spark`, where the refresh read it once for every step
