"""Column lineage of a derived table: for each output column, the input table columns its values
are computed from, traced by sqlglot's lineage through CTEs, subqueries in FROM, set operations
and scalar subqueries in the select list.

It reads the same qualified tree the compiler builds (`Compiled.tree`: every column qualified with
its table, `*` expanded against the inputs' schemas), so the lineage is that of the SQL the engine
maintains. Only the columns that flow into a value count: a column used only to filter, join or
group (`WHERE`, `ON`, `GROUP BY`) is not a source of an output column, and `count(*)` has none.

Pure sqlglot: no Spark, no Dagster (the Dagster metadata is built from this in assets/).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.lineage import lineage
from sqlglot.optimizer.scope import build_scope

from .planning.compile import parse, qualified_query


@dataclass(frozen=True)
class OutputLineage:
    """One output column (by position, with the name sqlglot gives it) and the input columns
    `(table, column)` it is computed from, sorted."""

    position: int
    name: str
    inputs: tuple[tuple[str, str], ...]


def column_lineage(tree: exp.Expression, schemas: dict[str, dict[str, str]] | None = None) -> list[OutputLineage]:
    """The lineage of each output column of a qualified query (`epochal.compile.qualified_query`'s
    tree). Tables are named as the query names them (lower case for the engine's inputs), columns
    as the schemas spell them. `schemas` (table -> column -> type) is only consulted by sqlglot
    for what the tree does not say; the compiled tree needs none."""
    scope = build_scope(tree)
    if scope is None or not isinstance(tree, exp.Query):
        raise SqlglotError("column lineage needs a query")
    nodes = lineage(None, tree, schemas or {}, dialect="spark", scope=scope, copy=False)
    result = []
    for position, (name, node) in enumerate(nodes.items()):
        found: set[tuple[str, str]] = set()
        for step in node.walk():
            if isinstance(step.expression, exp.Table) and not step.downstream:
                column = _column_name(step.name)
                if column is not None and column != "*":
                    found.add((step.expression.name, column))
        result.append(OutputLineage(position, name, tuple(sorted(found))))
    return result


def _column_name(text: str) -> str | None:
    """The column of a lineage leaf's name (`"table"."column"`, sqlglot's own dialect)."""
    try:
        parsed = sqlglot.parse_one(text)
    except SqlglotError:
        return None
    return parsed.name if isinstance(parsed, exp.Column) else None


def lineage_of_sql(name: str, sql: str, schemas: dict[str, dict[str, str]]) -> list[OutputLineage]:
    """Parse, qualify (as the compiler does) and trace `sql`; `schemas` must hold every table it
    reads (lower-case table names, column -> Spark type string)."""
    lowered = {t.lower(): {c.lower(): ty for c, ty in cols.items()} for t, cols in schemas.items()}
    return column_lineage(qualified_query(name, parse(name, sql), lowered), lowered)
