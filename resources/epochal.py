"""The epochal engine as a Dagster resource.

One `Engine` per process and warehouse: the Spark session is built once (`SparkResource`), sources
are declared when a table first needs them, and a derived table is defined (Spark analyses its
SQL, a second or so) the first time an asset of this process needs it, together with the derived
tables it reads. Every step of a run (runs execute in process, see definitions.py) then shares the
session, the engine and the definitions.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Sequence

from dagster import ConfigurableResource
from pydantic import Field

from epochal import Engine
from epochal.errors import EpochalError
from epochal.storage.warehouse import is_local, local_path
from resources.session import storage_options_for
from resources.spark import SparkResource
from resources.warehouse import WarehouseResource

_engines: dict[tuple, Engine] = {}
_defined: dict[tuple, dict[str, tuple[str, bool]]] = {}
_lock = threading.RLock()


def explain_cache_path(root: str, table: str) -> str | None:
    """Where the last `engine.explain` of a table is kept for the asset's description (local
    warehouses only): <root>/_dagster/explain/<table>.json."""
    if not is_local(root):
        return None
    return os.path.join(local_path(root), "_dagster", "explain", f"{table}.json")


def cached_explain(root: str, table: str, sql_sha: str) -> str | None:
    """The cached explain text, if it was written for exactly this SQL text."""
    path = explain_cache_path(root, table)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            cached = json.load(handle)
    except (OSError, ValueError):
        return None
    return cached.get("explain") if cached.get("sql_sha") == sql_sha else None


class EpochalResource(ConfigurableResource):
    """The engine over the warehouse, with Spark from the Spark resource."""

    spark: SparkResource
    warehouse: WarehouseResource
    source_clock: str = Field(
        default="logical",
        description="how source commit times are read: 'logical' (the time a writer stamped in "
        "the commit's userMetadata, as the TPC-H change generator does) or 'commit'",
    )
    parallelism: int = Field(default=1, description="tables refreshed at once inside one engine call")
    cost_model: bool = Field(
        default=True,
        description="rescan a table (reason COST) when its own past steps estimate a rescan cheaper than "
        "the incremental step; never for strict tables",
    )

    def _key(self, spark) -> tuple:
        return (self.warehouse.warehouse().root, id(spark), self.source_clock, self.parallelism, self.cost_model)

    def engine(self) -> Engine:
        """The process's engine for this warehouse (built on first use)."""
        spark = self.spark.session()
        key = self._key(spark)
        with _lock:
            if key not in _engines:
                root = self.warehouse.warehouse().root
                _engines[key] = Engine(spark, root, storage_options=storage_options_for(root),
                                       parallelism=self.parallelism, cost_model=self.cost_model)
                _defined[key] = {}
            return _engines[key]

    def define(self, chain: Sequence) -> Engine:
        """Make sure every table of `chain` (TableSpec objects, upstream first) is defined with its
        current SQL and strictness, declaring the sources they read. Returns the engine."""
        engine = self.engine()
        key = self._key(engine.spark)
        with _lock:
            defined = _defined[key]
            for spec in chain:
                for name in spec.inputs:
                    if name not in engine.sources and not any(s.name == name for s in chain):
                        engine.source(name, clock=self.source_clock)
                if defined.get(spec.name) != (spec.sql, spec.strict):
                    table = engine.define(spec.name, spec.sql, strict=spec.strict)
                    if set(table.compiled.inputs) != set(spec.inputs):
                        raise EpochalError(
                            f"table {spec.name!r}: the engine reads {sorted(table.compiled.inputs)} but the "
                            f"asset's lineage says {sorted(spec.inputs)} (internal error: please report)"
                        )
                    defined[spec.name] = (spec.sql, spec.strict)
                    self._cache_explain(engine, spec)
        return engine

    def _cache_explain(self, engine: Engine, spec) -> None:
        path = explain_cache_path(engine.warehouse.root, spec.name)
        if path is None:
            return
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "w") as handle:
                json.dump({"sql_sha": spec.sql_sha, "explain": engine.explain(spec.name)}, handle)
            os.replace(temporary, path)
        except OSError:
            pass  # the description falls back to the SQL; nothing depends on the cache
