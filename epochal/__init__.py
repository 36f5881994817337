"""epochal: derived tables declared as Spark SQL over Delta Lake, maintained incrementally from
Delta change data feeds in reclocked batch epochs. The public API is `Engine` (see engine.py)."""

from .engine import Engine, Table
from .errors import DefinitionError, EpochalError, EpochError, StrictModeError
from .keyed.upkeep import Upkeep
from .protocol.epoch import Report

__all__ = ["Engine", "Table", "Report", "Upkeep", "DefinitionError", "EpochalError", "EpochError", "StrictModeError"]
