"""Compile a derived table's SQL, in phases (Pulley's compiler is the model):

parse -> check (one deterministic query, known tables) -> qualify against the input schemas ->
build the naive operator graph -> rewrite it (`optimize`) -> the plan the delta rules run.

The recompute (the oracle, and every rescan) runs the user's own SQL text with only the table
names substituted, so it means exactly what the user wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError, SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.tokens import TokenType

from ..errors import DefinitionError, Unsupported
from ..graph import Node, Scan, walk
from ..rules import blocker
from .fingerprint import fingerprint, output_aliases
from .optimize import optimize
from .plan import Planner, TableInfo

NON_DETERMINISTIC = {
    "rand", "randn", "random", "uuid", "shuffle", "now", "current_timestamp", "current_date",
    "current_time", "localtimestamp", "current_timezone", "unix_timestamp",
    "monotonically_increasing_id", "spark_partition_id", "input_file_name",
    "input_file_block_start", "input_file_block_length", "current_user", "user", "session_user",
    "current_database", "current_schema", "current_catalog", "try_reflect", "reflect",
    "java_method", "random_uuid",
}
NON_DETERMINISTIC_TYPES = (exp.Rand, exp.Randn, exp.Uuid, exp.CurrentTimestamp, exp.CurrentDate,
                           exp.CurrentTime, exp.CurrentUser)


@dataclass(frozen=True)
class Compiled:
    name: str
    sql: str
    tree: exp.Expression  # qualified
    inputs: tuple[str, ...]  # tables read, as declared
    fingerprint: str
    recompute_sql: str  # the user's SQL with each input replaced by {placeholder}
    placeholders: dict[str, str]  # placeholder -> input table
    naive: Node | None = None
    plan: Node | None = None
    blocker: str | None = None  # construct without a delta rule
    passes: tuple[str, ...] = field(default_factory=tuple)


def _position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    for candidate in ([node] if node is not None else []) + (list(node.walk()) if node is not None else []):
        meta = getattr(candidate, "meta", None) or {}
        if "line" in meta:
            return meta["line"], meta["col"]
        if isinstance(candidate, exp.Expression) and isinstance(candidate.this, exp.Expression):
            inner = candidate.this.meta or {}
            if "line" in inner:
                return inner["line"], inner["col"]
    return None, None


def parse(name: str, sql: str) -> exp.Expression:
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        raise DefinitionError(
            name,
            f"syntax error: {first.get('description', str(error))}",
            line=first.get("line"),
            column=first.get("col"),
            construct=(first.get("highlight") or None),
            fix="Correct the SQL; it is parsed as Spark SQL",
        ) from None
    except SqlglotError as error:
        raise DefinitionError(name, f"cannot parse: {error}", fix="Correct the SQL") from None
    if len(statements) != 1:
        raise DefinitionError(
            name, f"expected one query, found {len(statements)} statements",
            fix="Put each derived table in its own SQL file",
        )
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        line, column = _position(tree)
        raise DefinitionError(
            name, f"a derived table is defined by a query (SELECT ...), not a {tree.key.upper()} statement",
            line=line, column=column, fix="Write the SELECT whose result the table should hold",
        )
    return tree


def cte_names(tree: exp.Expression) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def referenced_tables(tree: exp.Expression) -> list[exp.Table]:
    ctes = cte_names(tree)
    return [
        table for table in tree.find_all(exp.Table)
        if table.name and not (table.name.lower() in ctes and not table.args.get("db"))
    ]


def check_deterministic(name: str, tree: exp.Expression) -> None:
    for node in tree.walk():
        called = None
        if isinstance(node, NON_DETERMINISTIC_TYPES):
            called = node.sql("spark")
        elif isinstance(node, exp.Anonymous) and node.name.lower() in NON_DETERMINISTIC:
            called = node.sql("spark")
        elif isinstance(node, exp.TableSample):
            called = "TABLESAMPLE"
        if called:
            line, column = _position(node)
            raise DefinitionError(
                name,
                "uses a non-deterministic function: each epoch must be re-runnable exactly, and "
                "incremental and full results must agree",
                construct=called, line=line, column=column,
                fix="Compute the value in a source column instead, or pass a constant",
            )


def resolve_inputs(name: str, tree: exp.Expression, known: dict[str, TableInfo]) -> tuple[str, ...]:
    lowered = {table.lower(): table for table in known}
    found: list[str] = []
    for table in referenced_tables(tree):
        line, column = _position(table.this)
        if table.args.get("db") or table.args.get("catalog"):
            raise DefinitionError(
                name, f"table {table.sql('spark')} is qualified with a database or path",
                construct=table.sql("spark"), line=line, column=column,
                fix="Refer to sources and derived tables by their plain names",
            )
        if table.args.get("version") is not None:
            raise DefinitionError(
                name, "time travel in a definition", construct=table.sql("spark"), line=line, column=column,
                fix="A derived table always reads its inputs as of the epoch; drop VERSION/TIMESTAMP AS OF",
            )
        if table.name.lower() == name.lower():
            raise DefinitionError(name, "a table cannot read itself", construct=table.name, line=line, column=column,
                                  fix="Read the sources it is computed from; its previous contents are not an input")
        real = lowered.get(table.name.lower())
        if real is None:
            raise DefinitionError(
                name, f"unknown table {table.name!r}", construct=table.name, line=line, column=column,
                fix=f"Declare it with engine.source({table.name!r}) or define it; known tables: "
                + (", ".join(sorted(known)) or "none"),
            )
        if real not in found:
            found.append(real)
    return tuple(found)


def tie_breakers(sql: str, tree: exp.Expression, outputs: int) -> list[tuple[int, int, str]]:
    """For a top-level ORDER BY ... LIMIT, an edit appending every output column (by position,
    ascending) to the ORDER BY, so rows tied on the user's keys are chosen deterministically, the
    same way the incremental top-k chooses them."""
    if tree.args.get("limit") is None or tree.args.get("order") is None:
        return []
    depth, position = 0, None
    for token in sqlglot.tokenize(sql, read="spark"):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        elif token.token_type == TokenType.LIMIT and depth == 0:
            position = token.start
    if position is None:
        return []
    return [(position, position, ", " + ", ".join(str(i) for i in range(1, outputs + 1)) + " ")]


def recompute_text(sql: str, tree: exp.Expression, inputs: tuple[str, ...], outputs: int = 0) -> tuple[str, dict[str, str]]:
    """The user's SQL with every input table reference replaced by a `{placeholder}` for
    `SparkSession.sql(text, **dataframes)`; braces elsewhere are escaped."""
    lowered = {table.lower(): table for table in inputs}
    edits = tie_breakers(sql, tree, outputs)
    placeholders: dict[str, str] = {}
    for table in referenced_tables(tree):
        real = lowered[table.name.lower()]
        placeholder = f"input_{inputs.index(real)}"
        placeholders[placeholder] = real
        meta = table.this.meta
        replacement = "\0" + placeholder + "\1"
        if not table.alias:
            replacement += f" AS `{table.name}`"
        edits.append((meta["start"], meta["end"] + 1, replacement))
    text = sql
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    text = text.replace("{", "{{").replace("}", "}}").replace("\0", "{").replace("\1", "}")
    return text, placeholders


def qualified_query(name: str, tree: exp.Expression, schemas: dict[str, dict[str, str]]) -> exp.Expression:
    try:
        return qualify(tree.copy(), schema=schemas, dialect="spark", validate_qualify_columns=True,
                       quote_identifiers=True, identify=True)
    except OptimizeError as error:
        message = str(error)
        match = re.search(r"Line: (\d+), Col: (\d+)", message)
        line, column = (int(match.group(1)), int(match.group(2))) if match else (None, None)
        construct = re.search(r"'([^']+)'", message)
        raise DefinitionError(
            name, re.sub(r"\s*Line: \d+, Col: \d+", "", message).rstrip("."),
            construct=construct.group(1) if construct else None, line=line, column=column,
            fix="Check the column and table names against the inputs' schemas",
        ) from None


def map_columns(plan: Node, schemas: dict[str, dict[str, str]]) -> str | None:
    """The blocker of a plan that reads a MAP column (at any depth of its type): Spark cannot
    group, compare or diff maps, and a change batch is consolidated by grouping its rows."""
    lowered = {t.lower(): {c.lower(): ty for c, ty in cols.items()} for t, cols in schemas.items()}
    for node in walk(plan):
        if isinstance(node, Scan):
            for column in node.fields:
                kind = lowered.get(node.table.lower(), {}).get(column.lower(), "")
                if "map<" in kind.lower():
                    return (f"MAP column {node.table}.{column} ({kind}): Spark cannot group or compare maps, "
                            "which consolidating a change needs")
    return None


def floating_not_in(qualified: exp.Expression, schemas: dict[str, dict[str, str]]) -> str | None:
    """The blocker of a NOT IN subquery comparing floating point. Spark plans it as a null-aware
    anti join that holds -0.0 and 0.0 apart (`-0.0 NOT IN (SELECT 0.0)` and `-0.0 IN
    (SELECT 0.0)` both hold), where its `=`, IN and every delta rule hold them equal: its answer
    is recomputed rather than answered otherwise."""
    try:
        typed = annotate_types(qualified.copy(), schema=schemas, dialect="spark")
    except SqlglotError:
        return None
    for found in typed.find_all(exp.In):
        query = found.args.get("query")
        parent = found.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        if query is None or not isinstance(parent, exp.Not):
            continue
        select = query.this if isinstance(query, exp.Subquery) else query
        sides = [found.this] + list(getattr(select, "selects", []) or [])
        if any(side.type is not None and re.search(r"\b(FLOAT|DOUBLE)\b", side.type.sql("spark").upper())
               for side in sides):
            return (f"NOT IN over floating point ({found.this.sql('spark')}): Spark's NOT IN holds -0.0 and 0.0 "
                    "apart where its = holds them equal")
    return None


def compile_definition(
    name: str, sql: str, tables: dict[str, TableInfo], schemas: dict[str, dict[str, str]], rewrites=None,
) -> Compiled:
    """`tables`: every known table's kind and columns; `schemas`: their column types (Spark type
    strings), keyed by table name; `rewrites`: the optimizer passes to apply (default: all)."""
    tree = parse(name, sql)
    check_deterministic(name, tree)
    inputs = resolve_inputs(name, tree, tables)
    qualified = qualified_query(name, tree, {t.lower(): {c.lower(): ty for c, ty in cols.items()} for t, cols in schemas.items()})
    text, placeholders = recompute_text(sql, tree, inputs, len(qualified.selects))
    compiled = dict(
        name=name, sql=sql, tree=qualified, inputs=inputs, fingerprint=fingerprint(qualified, output_aliases(tree)),
        recompute_sql=text, placeholders=placeholders,
    )
    try:
        naive = Planner({t: tables[t] for t in inputs}).query(qualified, top=True).node
    except Unsupported as unsupported:
        return Compiled(**compiled, blocker=unsupported.construct)
    plan, passes = optimize(naive) if rewrites is None else optimize(naive, rewrites)
    ungroupable = map_columns(plan, schemas) or floating_not_in(qualified, schemas)  # the optimized plan's scans read only the columns used
    if ungroupable:
        return Compiled(**compiled, naive=naive, blocker=ungroupable)
    missing = blocker(plan)
    if missing is not None:
        return Compiled(**compiled, naive=naive, blocker=missing)
    return Compiled(**compiled, naive=naive, plan=plan, passes=passes)
