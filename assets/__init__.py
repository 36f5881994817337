"""Dagster assets: the TPC-H sources (observable, versioned by Delta version) and one derived-table
asset per assets/sql/*.sql, with its checks, jobs and schedules.

`ALL_ASSETS` is what definitions.py registers for the default warehouse; `derived_definitions`
builds the derived part for another SQL folder or warehouse (tests, the demo).
"""

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from assets.automation import derived_automation
from assets.checks import build_recompute_checks
from assets.derived import build_derived_assets
from assets.sources import SOURCE_ASSETS, first_logical_time
from assets.specs import PARTITION_START, SQL_FOLDER, TableSpec, load_specs
from resources.warehouse import default_root

SOURCE_NAMES = tuple(asset.key.to_user_string() for asset in SOURCE_ASSETS)


@dataclass(frozen=True)
class DerivedDefinitions:
    specs: dict[str, TableSpec]
    assets: list
    checks: list
    jobs: list
    schedules: list


def derived_definitions(sql_folder: Path | str = SQL_FOLDER, explain_root: str | None = None,
                        sources_start: datetime | None = None) -> DerivedDefinitions:
    """The derived tables of `sql_folder` as assets, checks, jobs and schedules. `explain_root` is
    the warehouse whose cached `engine.explain` texts go into the descriptions; `sources_start`
    the logical time of its sources' first commit, where partitions start unless a sidecar says
    otherwise (None: PARTITION_START)."""
    return _derived(str(sql_folder), explain_root, sources_start)


@lru_cache(maxsize=8)
def _derived(sql_folder: str, explain_root: str | None, sources_start: datetime | None) -> DerivedDefinitions:
    specs = load_specs(sql_folder, SOURCE_NAMES, default_start=sources_start or PARTITION_START)
    jobs, schedules = derived_automation(specs)
    return DerivedDefinitions(specs, build_derived_assets(specs, explain_root, sources_start),
                              build_recompute_checks(specs), jobs, schedules)


def __getattr__(name: str):
    """`DERIVED_ASSETS` and `ALL_ASSETS` (the default folder and warehouse), built on first use so
    importing `assets.sources` parses no SQL."""
    if name in ("DERIVED_ASSETS", "ALL_ASSETS"):
        root = default_root()
        derived = derived_definitions(SQL_FOLDER, root, first_logical_time(root)).assets
        return derived if name == "DERIVED_ASSETS" else [*SOURCE_ASSETS, *derived]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["ALL_ASSETS", "DERIVED_ASSETS", "SOURCE_ASSETS", "DerivedDefinitions", "derived_definitions"]
