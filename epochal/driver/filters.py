"""A scan's predicate applied to rows held on the driver as Arrow, where Arrow decides it exactly as
Spark does; None everywhere else, and Spark filters instead.

A change batch consolidated on the driver, or a co-generator's rows read there for some keys, is
filtered here so that its row count is exact (a batch the predicate empties counts as unchanged)
and the key values a join term reads its partners for are only those of rows that pass. Where the
rows go on to Spark, Spark applies the predicate to them too; where a join term or an aggregate is
computed on the driver (driver/joins.py, driver/aggregates.py), Arrow's answer is the answer. So
every supported form is held against Spark's filter (tests/test_driver_filters.py).

Supported: comparisons (=, <>, <, <=, >, >=) of a column with a literal of its own kind (a number
for integer and decimal columns, a string for strings, CAST('yyyy-mm-dd' AS DATE) for dates, a
boolean for booleans), with a column of the same type, or with a column of another integer or
decimal type (both cast to Spark's wider decimal type, rounded as Spark rounds past precision
38); AND, OR, NOT (SQL's three-valued logic); IS [NOT] NULL; [NOT] IN a list of such literals;
BETWEEN; LIKE with '%' anywhere (no '_', no escapes). Where a comparison, IN or LIKE takes a string
column, it also takes SUBSTRING/SUBSTR(column, pos[, len]) with integer literals (any pos and len:
Spark and Arrow both count code points). Not: floating point (Spark orders NaN above every number
and equal to itself, IEEE does not), timestamps, binary, other functions, arithmetic, and literals
that would need Spark's implicit casts.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import date
from decimal import Decimal, InvalidOperation

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import acero
from sqlglot import exp

from ..arrow_rows import key_kind

COMPARE = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.LT: "less", exp.LTE: "less_equal",
           exp.GT: "greater", exp.GTE: "greater_equal"}
MIRRORED = {"less": "greater", "less_equal": "greater_equal", "greater": "less", "greater_equal": "less_equal",
            "equal": "equal", "not_equal": "not_equal"}
INTEGER = re.compile(r"^\d+$")
DECIMAL = re.compile(r"^\d*\.\d+$|^\d+\.\d*$")
INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 20}  # Spark's DecimalType.forType of byte, short, int, long
INT32 = 2**31


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
        return "number", (-value if isinstance(value, int) else value.copy_negate()) if negative else value
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


def _int_literal(node: exp.Expression) -> int:
    """An integer literal Spark takes as an INT argument as it is (a larger one is a BIGINT; -2^31 may
    be a negated BIGINT, as -(2147483648) is)."""
    kind, value = _literal(node)
    if kind != "number" or not isinstance(value, int) or not -INT32 < value < INT32:
        raise _Unsupported(f"{value} as an INT argument")
    return value


def _slice(pos: int, length: int) -> tuple[int, int]:
    """Spark's substring (UTF8String.substringSQL: pos counts from 1, 0 is 1, a negative pos counts
    from the end, what falls before the first character is cut off, len <= 0 is '') as Arrow's
    (start, stop), whose negative values also count from the end and which also clamps at both ends."""
    if length <= 0:
        return 0, 0
    if pos >= 0:
        return max(pos - 1, 0), max(pos - 1, 0) + length
    return pos, pos + length if pos + length < 0 else sys.maxsize


def _substring(node: exp.Substring, types: dict[str, pa.DataType]) -> tuple[pc.Expression, pa.DataType]:
    """SUBSTRING of a string column (of binary, Spark slices bytes) as Arrow's code point slice."""
    column = _column(node.this, types)
    if column is None or _kind(types[column]) != "string":
        raise _Unsupported("SUBSTRING of an expression or of a non-string")
    length = node.args.get("length")
    start, stop = _slice(_int_literal(node.args["start"]), INT32 - 1 if length is None else _int_literal(length))
    return _call("utf8_slice_codeunits", [pc.field(column)], pc.SliceOptions(start, stop)), types[column]


def _operand(node: exp.Expression, types: dict[str, pa.DataType]) -> tuple[pc.Expression, pa.DataType] | None:
    """A column, or SUBSTRING of one, as an Arrow expression and its type; None for anything else."""
    node = _unparen(node)
    if isinstance(node, exp.Substring):
        return _substring(node, types)
    column = _column(node, types)
    return None if column is None else (pc.field(column), types[column])


def _digits(arrow_type: pa.DataType) -> tuple[int, int]:
    """(integer digits, scale) of an integer or decimal type, integers as Spark makes them decimals."""
    if pa.types.is_integer(arrow_type):
        return INTEGER_DIGITS[arrow_type.bit_width], 0
    if pa.types.is_decimal(arrow_type):
        return arrow_type.precision - arrow_type.scale, arrow_type.scale
    raise _Unsupported(str(arrow_type))


def _compared(left: tuple[pc.Expression, pa.DataType], right: tuple[pc.Expression, pa.DataType]) -> list:
    """Two operands Arrow compares as Spark does: of one type as they are; integers and decimals of
    different types both cast to Spark's wider decimal type (DecimalType.boundedPreferIntegralDigits):
    the larger scale and the integer digits of either; past precision 38 the integer digits are
    kept and the scale cut, an operand of a larger scale rounded half away from zero to it
    (TPC-H Q11 compares a DECIMAL(36,2) sum with a DECIMAL(38,6) share of the total as
    DECIMAL(38,4)). Every integer digit is kept, so no value overflows; were one to, Arrow's
    checked cast would raise and the filter be Spark's."""
    (left_value, left_type), (right_value, right_type) = left, right
    if left_type == right_type:
        return [left_value, right_value]
    (left_digits, left_scale), (right_digits, right_scale) = _digits(left_type), _digits(right_type)
    digits = max(left_digits, right_digits)
    scale = min(max(left_scale, right_scale), max(0, 38 - digits))
    common = pa.decimal128(min(digits + scale, 38), scale)
    return [_fitted(left_value, left_scale, common), _fitted(right_value, right_scale, common)]


def _fitted(value: pc.Expression, scale: int, common: pa.DataType) -> pc.Expression:
    if scale > common.scale:  # Spark's cast to fewer decimal places rounds HALF_UP (away from zero)
        value = _call("round", [value], pc.RoundOptions(common.scale, "half_towards_infinity"))
    return value.cast(common, safe=True)


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
        left, right = _operand(node.left, types), _operand(node.right, types)
        if left is not None and right is not None:
            return _call(function, _compared(left, right))
        if left is not None:
            return _call(function, [left[0], _scalar(node.right, left[1])])
        if right is not None:
            return _call(MIRRORED[function], [right[0], _scalar(node.left, right[1])])
        raise _Unsupported("a comparison without a column")
    if isinstance(node, exp.Between):
        column = _column(node.this, types)
        if column is None:
            raise _Unsupported("BETWEEN over an expression")
        field = pc.field(column)
        return _call("and_kleene", [_call("greater_equal", [field, _scalar(node.args["low"], types[column])]),
                                    _call("less_equal", [field, _scalar(node.args["high"], types[column])])])
    if isinstance(node, exp.In) and not node.args.get("query"):
        operand = _operand(node.this, types)
        if operand is None or not node.expressions:
            raise _Unsupported("IN over an expression")
        value, arrow_type = operand
        values = pa.array([_scalar(item, arrow_type).as_py() for item in node.expressions], arrow_type)
        # NULL IN (...) is NULL, where is_in says false
        return _call("if_else", [value.is_null(), pa.scalar(None, pa.bool_()), value.isin(values)])
    if isinstance(node, exp.Like) and node.args.get("negate"):  # sqlglot's `x NOT LIKE p`
        return _call("invert", [_expression(exp.Like(this=node.this, expression=node.expression,
                                                     escape=node.args.get("escape")), types)])
    if isinstance(node, exp.Like) and not node.args.get("escape"):
        operand = _operand(node.this, types)
        kind, pattern = _literal(node.expression)
        if operand is None or kind != "string" or _kind(operand[1]) != "string" or "_" in pattern or "\\" in pattern:
            raise _Unsupported("LIKE")
        value, arrow_type = operand
        core = pattern.strip("%")
        if "%" in core:  # Arrow's LIKE: '%' matches any characters, newlines too, as Spark's
            return _call("match_like", [value], pc.MatchSubstringOptions(pattern))
        starts, ends = pattern.startswith("%"), pattern.endswith("%") and len(pattern) > 1
        if not starts and not ends:
            return _call("equal", [value, pa.scalar(core, arrow_type)])
        function = "match_substring" if starts and ends else ("ends_with" if starts else "starts_with")
        return _call(function, [value], pc.MatchSubstringOptions(core))
    if isinstance(node, exp.Boolean):
        return pc.scalar(bool(node.this))
    raise _Unsupported(type(node).__name__)


_UNDECIDED = (_Unsupported, pa.ArrowException, TypeError, ValueError, KeyError)


def _on_driver(rows: pa.Table, answer: Callable[[dict[str, pa.DataType]], object]):
    """`answer` given the Arrow type of each column of `rows`, or None where it raises: Arrow may
    not decide it as Spark does."""
    types = {field.name: field.type for field in rows.schema}
    try:
        return answer(types)
    except _UNDECIDED:
        return None


def driver_filter(rows: pa.Table, predicate: exp.Expression | None) -> pa.Table | None:
    """The rows of `rows` (columns named as the predicate names them) for which `predicate` is
    true, or None where Arrow may not decide it as Spark does."""
    if predicate is None:
        return rows
    return _on_driver(rows, lambda types: rows.filter(_expression(predicate, types)))


def _evaluated(rows: pa.Table, expression: pc.Expression) -> pa.ChunkedArray:
    """`expression`'s value per row of `rows`, in their order; string views read as strings
    (Arrow's string kernels take no views)."""
    for position, field in enumerate(rows.schema):
        if pa.types.is_string_view(field.type):
            rows = rows.set_column(position, field.name, rows.column(position).cast(pa.string()))
    plan = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(rows)),
        acero.Declaration("project", acero.ProjectNodeOptions([expression], ["value"])),
    ])
    return plan.to_table(use_threads=False).column("value")


def driver_truth(rows: pa.Table, predicate: exp.Expression) -> pa.ChunkedArray | None:
    """`predicate` per row of `rows`: true, false or NULL (SQL's three-valued logic), where Arrow
    decides it as Spark does (the forms driver_filter takes); None everywhere else."""
    return _on_driver(rows, lambda types: _evaluated(rows, _expression(predicate, types)))


def driver_substring(rows: pa.Table, node: exp.Substring) -> pa.ChunkedArray | None:
    """SUBSTRING of a string column of `rows` with integer literals, as Spark slices it; None for
    any other SUBSTRING."""
    return _on_driver(rows, lambda types: _evaluated(rows, _substring(node, types)[0]))
