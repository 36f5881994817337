"""Dagster assets: the sources, and (in later issues) one derived-table asset per assets/sql/*.sql.

`ALL_ASSETS` is what definitions.py registers; derived assets are appended to it here.
"""

from assets.sources import SOURCE_ASSETS

DERIVED_ASSETS: list = []  # one asset per assets/sql/*.sql, built by a later issue

ALL_ASSETS = [*SOURCE_ASSETS, *DERIVED_ASSETS]

__all__ = ["ALL_ASSETS", "DERIVED_ASSETS", "SOURCE_ASSETS"]
