"""Errors the engine raises to its users. Each message names the table, what is wrong and the fix."""

from __future__ import annotations


class EpochalError(Exception):
    """Base class of every error epochal raises on purpose."""


class DefinitionError(EpochalError):
    """A derived table's SQL cannot be accepted: syntax, unknown names, non-determinism, cycles."""

    def __init__(self, table: str, problem: str, *, construct: str | None = None,
                 line: int | None = None, column: int | None = None, fix: str | None = None):
        self.table = table
        self.problem = problem
        self.construct = construct
        self.line = line
        self.column = column
        self.fix = fix
        where = f" at line {line}, column {column}" if line is not None else ""
        text = f"table {table!r}: {problem}{where}"
        if construct:
            text += f" [{construct}]"
        if fix:
            text += f". {fix}"
        super().__init__(text)


class Unsupported(Exception):
    """Raised inside the planner for a construct with no delta rule; the table is then maintained
    by rescans with reason NOT_INCREMENTAL naming `construct`."""

    def __init__(self, construct: str):
        self.construct = construct
        super().__init__(construct)


class EpochError(EpochalError):
    """An epoch could not be applied to a table; nothing half-written is left visible."""


class StrictModeError(EpochError):
    """A table in strict mode would have needed a rescan."""


class StateInconsistent(EpochError):
    """A state table disagrees with the change it is asked to absorb (a count below zero)."""
