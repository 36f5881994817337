"""A scan's predicate applied to rows held on the driver as Arrow, where Arrow decides it exactly as
Spark does; None everywhere else, and Spark filters instead.

A change batch consolidated on the driver, or a co-generator's rows read there for some keys, is
filtered here so that its row count is exact (a batch the predicate empties counts as unchanged)
and the key values a join term reads its partners for are only those of rows that pass. Where the
rows go on to Spark, Spark applies the predicate to them too; where a join term or an aggregate is
computed on the driver (driver_joins.py, driver_aggregates.py), Arrow's answer is the answer. So
every supported form is held against Spark's filter (tests/test_driver_filters.py).

Supported: comparisons (=, <>, <, <=, >, >=) of a column with a literal of its own kind (a number
for integer and decimal columns, a string for strings, CAST('yyyy-mm-dd' AS DATE) for dates, a
boolean for booleans) or with a column of the same type; AND, OR, NOT (SQL's three-valued logic);
IS [NOT] NULL; [NOT] IN a list of such literals; BETWEEN; LIKE with '%' only at either end. Not:
floating point (Spark orders NaN above every number and equal to itself, IEEE does not),
timestamps, functions, arithmetic, and literals that would need Spark's implicit casts.
"""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal, InvalidOperation

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from .shared_reads import key_kind

COMPARE = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.LT: "less", exp.LTE: "less_equal",
           exp.GT: "greater", exp.GTE: "greater_equal"}
MIRRORED = {"less": "greater", "less_equal": "greater_equal", "greater": "less", "greater_equal": "less_equal",
            "equal": "equal", "not_equal": "not_equal"}
INTEGER = re.compile(r"^\d+$")
DECIMAL = re.compile(r"^\d*\.\d+$|^\d+\.\d*$")


class _Unsupported(Exception):
    pass


def _kind(arrow_type: pa.DataType) -> str:
    """The kind of literal a column compares with (integers and decimals are both numbers)."""
    kind = key_kind(arrow_type)
    if kind not in ("integer", "decimal", "string", "date", "boolean"):
        raise _Unsupported(kind)
    return "number" if kind in ("integer", "decimal") else kind


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _literal(node: exp.Expression):
    """(kind, Python value) of a literal as Spark reads it."""
    node = _unparen(node)
    negative = isinstance(node, exp.Neg)
    if negative:
        node = _unparen(node.this)
    if isinstance(node, exp.Literal) and not node.is_string:
        text = str(node.this)
        if INTEGER.match(text):
            value = int(text)
        elif DECIMAL.match(text):
            value = Decimal(text)
        else:
            raise _Unsupported(f"number {text}")  # 1e3 is a DOUBLE in Spark
        return "number", -value if negative else value
    if negative:
        raise _Unsupported("negation")
    if isinstance(node, exp.Literal):
        return "string", str(node.this)
    if isinstance(node, exp.Boolean):
        return "boolean", bool(node.this)
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE:
        inner = _unparen(node.this)
        if isinstance(inner, exp.Literal) and inner.is_string and re.match(r"^\d{4}-\d{2}-\d{2}$", str(inner.this)):
            return "date", date.fromisoformat(str(inner.this))
    raise _Unsupported(type(node).__name__)


def _scalar(node: exp.Expression, target: pa.DataType) -> pa.Scalar:
    """A literal as a scalar of the column's type, refused where that would change its value."""
    kind, value = _literal(node)
    if kind != _kind(target):
        raise _Unsupported(f"{kind} literal for {target}")
    if pa.types.is_decimal(target) and isinstance(value, int):
        value = Decimal(value)  # an int64 scalar casts to a decimal only of precision 21 or more
    try:
        return pa.scalar(value).cast(target)  # safe cast: raises on truncation or overflow
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, InvalidOperation) as refused:
        raise _Unsupported(str(refused)) from refused


def _column(node: exp.Expression, types: dict[str, pa.DataType]) -> str | None:
    node = _unparen(node)
    if isinstance(node, exp.Column) and not node.table and node.name in types:
        _kind(types[node.name])
        return node.name
    return None


def _call(function: str, arguments: list, options=None) -> pc.Expression:
    return pc.Expression._call(function, arguments, options)


def _expression(node: exp.Expression, types: dict[str, pa.DataType]) -> pc.Expression:
    node = _unparen(node)
    if isinstance(node, exp.And):
        return _call("and_kleene", [_expression(node.left, types), _expression(node.right, types)])
    if isinstance(node, exp.Or):
        return _call("or_kleene", [_expression(node.left, types), _expression(node.right, types)])
    if isinstance(node, exp.Not):
        return _call("invert", [_expression(node.this, types)])
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        column = _column(node.this, types)
        if column is None:
            raise _Unsupported("IS NULL of an expression")
        return pc.field(column).is_null()
    if type(node) in COMPARE:
        function = COMPARE[type(node)]
        left, right = _column(node.left, types), _column(node.right, types)
        if left is not None and right is not None:
            if types[left] != types[right]:
                raise _Unsupported(f"{types[left]} compared with {types[right]}")
            return _call(function, [pc.field(left), pc.field(right)])
        if left is not None:
            return _call(function, [pc.field(left), _scalar(node.right, types[left])])
        if right is not None:
            return _call(MIRRORED[function], [pc.field(right), _scalar(node.left, types[right])])
        raise _Unsupported("a comparison without a column")
    if isinstance(node, exp.Between):
        column = _column(node.this, types)
        if column is None:
            raise _Unsupported("BETWEEN over an expression")
        field = pc.field(column)
        return _call("and_kleene", [_call("greater_equal", [field, _scalar(node.args["low"], types[column])]),
                                    _call("less_equal", [field, _scalar(node.args["high"], types[column])])])
    if isinstance(node, exp.In) and not node.args.get("query"):
        column = _column(node.this, types)
        if column is None or not node.expressions:
            raise _Unsupported("IN over an expression")
        values = pa.array([_scalar(item, types[column]).as_py() for item in node.expressions], types[column])
        field = pc.field(column)  # NULL IN (...) is NULL, where is_in says false
        return _call("if_else", [field.is_null(), pa.scalar(None, pa.bool_()), field.isin(values)])
    if isinstance(node, exp.Like) and not node.args.get("escape"):
        column = _column(node.this, types)
        kind, pattern = _literal(node.expression)
        if column is None or kind != "string" or _kind(types[column]) != "string" or "_" in pattern or "\\" in pattern:
            raise _Unsupported("LIKE")
        core = pattern.strip("%")
        if "%" in core:
            raise _Unsupported("LIKE with an inner %")
        starts, ends = pattern.startswith("%"), pattern.endswith("%") and len(pattern) > 1
        if not starts and not ends:
            return _call("equal", [pc.field(column), pa.scalar(core, types[column])])
        function = "match_substring" if starts and ends else ("ends_with" if starts else "starts_with")
        return _call(function, [pc.field(column)], pc.MatchSubstringOptions(core))
    if isinstance(node, exp.Boolean):
        return pc.scalar(bool(node.this))
    raise _Unsupported(type(node).__name__)


def driver_filter(rows: pa.Table, predicate: exp.Expression | None) -> pa.Table | None:
    """The rows of `rows` (columns named as the predicate names them) for which `predicate` is
    true, or None where Arrow may not decide it as Spark does."""
    if predicate is None:
        return rows
    types = {name: rows.schema.field(name).type for name in rows.column_names}
    try:
        return rows.filter(_expression(predicate, types))
    except (_Unsupported, pa.ArrowException, TypeError, ValueError, KeyError):
        return None
