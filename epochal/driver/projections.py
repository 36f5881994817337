"""A projection's arithmetic computed on the driver, in Arrow, where Arrow's answer is Spark's.

A projection over rows held on the driver (a change batch, a filtered batch) otherwise costs a
local relation handed to Spark, a select and a collect, a fixed cost paid on every step (as by
TPC-H Q6's `l_extendedprice * l_discount`). Here each output column is a column of the input,
a numeric literal, or `+`, `-`, `*` (and unary minus) over those, computed exactly:

- decimals: Arrow's sum, difference and product of decimal128 values are exact, of the type
  Spark gives them when no precision is lost (sum: max(s1, s2) + max(p1 - s1, p2 - s2) + 1
  digits, product: p1 + p2 + 1); an integer column takes part as Spark's DecimalType.forType
  (int: decimal(10,0)), an integer literal with its own digits (Spark's minimum-precision
  literal). The caller gives Spark's result types (analysed once over an empty relation): where
  a column's Arrow type differs from Spark's (Spark rounded to fit 38 digits, or typed it
  otherwise) the projection is left to Spark. The outermost operation alone may pass 38 digits
  (TPC-H Q1's `l_extendedprice * (1 - l_discount) * (1 + l_tax)`, decimal(40,6)): computed in
  decimal256 and fitted to Spark's decimal(38,6) when Spark kept the scale and every value fits;
- integers: checked arithmetic; an overflow is left to Spark (ANSI raises, legacy wraps);
- doubles: IEEE arithmetic, as the JVM's;
- unary minus of a decimal of more than 34 digits is left to Spark: it negates through Scala's
  BigDecimal, which rounds to 34 significant digits (found by tests/test_driver_projections.py).

Also, as TPC-H's projections use them (Q7, Q8, Q9's years, Q8, Q12, Q14's CASE, Q22's country
codes):

- EXTRACT(YEAR FROM a date column): the proleptic Gregorian year, as Spark 3 counts it;
- an output column that is a searched CASE (WHEN predicate THEN value ... [ELSE value]): each
  predicate decided by Arrow as driver_filter decides it (a NULL is not true), each value one of
  the forms above, a literal or a string column, cast to Spark's type of the CASE by a safe cast
  (an integer to a decimal or a double, a decimal to a decimal with at least its digits); where
  Spark's cast would round or overflow, the safe cast raises and the projection is Spark's.
  Decimals are never cast to doubles here (Arrow's conversion is not always the JVM's nearest
  double);
- an output column that is SUBSTRING of a string column with integer literals (driver_filter's).

Anything else (division, other functions, a CASE inside arithmetic, casts) returns None: Spark's
to compute.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from ..arrow_rows import key_kind
from .filters import INTEGER_DIGITS, driver_substring, driver_truth

_OPERATIONS = {exp.Add: "add_checked", exp.Sub: "subtract_checked", exp.Mul: "multiply_checked"}


class _Refused(Exception):
    """The expression is Spark's to compute."""


def _literal(node: exp.Literal) -> pa.Scalar:
    if node.is_string:
        raise _Refused
    text = node.this
    if text.isdigit():
        value = int(text)
        if value >= 2**63:
            raise _Refused  # Spark types it decimal(n, 0)
        return pa.scalar(value, pa.int32() if value < 2**31 else pa.int64())
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise _Refused
    if "e" in text.lower() or not value.is_finite():
        raise _Refused  # Spark reads 1e1 as a double
    sign, digits, exponent = value.as_tuple()
    scale = -exponent
    precision = max(len(digits), scale)
    if precision > 38:
        raise _Refused
    return pa.scalar(value, pa.decimal128(precision, scale))


def _as_decimal(value, arrow_type: pa.DataType):
    """An integer operand as the decimal Spark widens it to beside a decimal."""
    if isinstance(value, pa.Scalar) and pa.types.is_integer(arrow_type):
        digits = len(str(abs(value.as_py())))
        return pa.scalar(Decimal(value.as_py()), pa.decimal128(digits, 0))
    if pa.types.is_integer(arrow_type):
        return pc.cast(value, pa.decimal128(INTEGER_DIGITS[arrow_type.bit_width], 0))
    return value


def _kind(arrow_type: pa.DataType) -> str:
    if pa.types.is_decimal128(arrow_type):
        return "decimal"
    if pa.types.is_integer(arrow_type) and arrow_type.bit_width in INTEGER_DIGITS:
        return "integer"
    if pa.types.is_float64(arrow_type):
        return "double"
    raise _Refused


def _wide(value):
    """A decimal128 operand as decimal256 of the same precision and scale."""
    wide = pa.decimal256(value.type.precision, value.type.scale)
    return value.cast(wide) if isinstance(value, pa.Scalar) else pc.cast(value, wide)


def _evaluate(node: exp.Expression, rows: pa.Table, top: bool = False):
    """(values, Arrow type): a ChunkedArray for a column's values, a Scalar for a literal. Only
    the `top` operation may go past 38 digits (a decimal256 the caller fits to Spark's type): an
    operand Spark had fitted to 38 digits would be rounded, or null, or raise."""
    if isinstance(node, exp.Paren):
        return _evaluate(node.this, rows, top)
    if isinstance(node, exp.Column):
        if node.name not in rows.column_names:
            raise _Refused
        values = rows.column(node.name)
        _kind(values.type)
        return values, values.type
    if isinstance(node, exp.Literal):
        value = _literal(node)
        return value, value.type
    if isinstance(node, exp.Extract):
        return _year(node, rows)
    if isinstance(node, exp.Neg):
        values, arrow_type = _evaluate(node.this, rows)
        if isinstance(values, pa.Scalar):
            raise _Refused  # Spark folds -1 into a literal of its own type
        if _kind(arrow_type) == "decimal" and arrow_type.precision > 34:
            raise _Refused  # Spark negates a large decimal through Scala's BigDecimal: 34 digits
        try:
            result = pc.negate_checked(values)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise _Refused
        return result, result.type
    operation = _OPERATIONS.get(type(node))
    if operation is None:
        raise _Refused
    (left, left_type), (right, right_type) = _evaluate(node.left, rows), _evaluate(node.right, rows)
    kinds = {_kind(left_type), _kind(right_type)}
    if "double" in kinds and kinds != {"double"}:
        raise _Refused  # Spark's implicit casts to double: left to Spark
    if kinds == {"decimal", "integer"}:
        left, right = _as_decimal(left, left_type), _as_decimal(right, right_type)
    if isinstance(left, pa.Scalar) and isinstance(right, pa.Scalar):
        raise _Refused  # constant folding: Spark's literal typing
    try:
        result = getattr(pc, operation)(left, right)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not (top and pa.types.is_decimal128(left.type) and pa.types.is_decimal128(right.type)):
            raise _Refused  # an overflow, or an operation Arrow does not have for these types
        try:  # a result type past 38 digits: computed exactly, then fitted by the caller
            result = getattr(pc, operation)(_wide(left), _wide(right))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise _Refused
    if isinstance(result, pa.Scalar):
        raise _Refused
    return result, result.type


def _year(node: exp.Extract, rows: pa.Table):
    """EXTRACT(YEAR FROM a date column): Spark's YearOfDate, an INT."""
    column = node.expression.unnest() if isinstance(node.expression, exp.Paren) else node.expression
    if node.this.name.upper() != "YEAR" or not isinstance(column, exp.Column) or column.name not in rows.column_names:
        raise _Refused
    values = rows.column(column.name)
    if not pa.types.is_date32(values.type):
        raise _Refused
    return pc.cast(pc.year(values), pa.int32()), pa.int32()


_CASTS = {("integer", "integer"), ("integer", "decimal"), ("integer", "double"), ("decimal", "decimal"),
          ("double", "double")}


def _branch(node: exp.Expression | None, rows: pa.Table, spark_type: pa.DataType):
    """A CASE branch's values as Spark's type of the CASE, or _Refused."""
    if node is None or isinstance(node, exp.Null):
        return pa.scalar(None, spark_type)
    if pa.types.is_string(spark_type):
        if isinstance(node, exp.Literal) and node.is_string:
            return pa.scalar(node.this, spark_type)
        if isinstance(node, exp.Column) and node.name in rows.column_names and \
                key_kind(rows.schema.field(node.name).type) == "string":
            return pc.cast(rows.column(node.name), spark_type)
        raise _Refused
    values, arrow_type = _evaluate(node, rows, top=False)
    if (_kind(arrow_type), _kind(spark_type)) not in _CASTS:
        raise _Refused
    try:
        return values.cast(spark_type) if isinstance(values, pa.Scalar) else pc.cast(values, spark_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _Refused  # Spark's cast would round or overflow


def _case(node: exp.Case, rows: pa.Table, spark_type: pa.DataType) -> pa.ChunkedArray:
    """A searched CASE, evaluated from its last branch to its first, each WHEN taking the rows
    its predicate is true for."""
    if node.this is not None:
        raise _Refused  # CASE x WHEN v: the simple form
    values = _branch(node.args.get("default"), rows, spark_type)
    for branch in reversed(node.args.get("ifs") or []):
        truth = driver_truth(rows, branch.this)
        if truth is None:
            raise _Refused
        values = pc.if_else(pc.fill_null(truth, False), _branch(branch.args.get("true"), rows, spark_type), values)
    if isinstance(values, pa.Scalar) or values.type != spark_type:
        raise _Refused
    return values


def _fitted(values: pa.ChunkedArray, arrow_type: pa.DataType, spark_type: pa.DataType) -> pa.ChunkedArray | None:
    """An exact result of more than 38 digits as Spark's decimal(38, s): where Spark kept the scale
    its value is the exact one when it fits (Spark computes exactly, then fits without rounding);
    None where Spark rounds (a smaller scale) or the value does not fit (ANSI raises, legacy
    mode gives NULL: Spark's to say)."""
    if not pa.types.is_decimal128(spark_type) or spark_type.scale != arrow_type.scale:
        return None
    try:
        return pc.cast(values, spark_type)  # a safe cast: raises where a value does not fit
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def driver_project(rows: pa.Table, exprs, names, spark_types: list[pa.DataType],
                   keep: tuple[str, ...] = ()) -> pa.Table | None:
    """`rows` projected to `exprs` (sqlglot expressions) named `names`, plus the `keep` columns as
    they are, or None where one expression is Spark's to compute or its Arrow type would not be
    Spark's (`spark_types`, the Arrow types of Spark's result columns)."""
    columns = []
    for node, spark_type in zip(exprs, spark_types):
        if isinstance(node, exp.Column) and node.name in rows.column_names:
            columns.append(rows.column(node.name))  # as it is, whatever its type
            continue
        if isinstance(node, exp.Substring):
            values = driver_substring(rows, node)
            if values is None or not pa.types.is_string(spark_type):
                return None
            columns.append(pc.cast(values, spark_type))
            continue
        try:
            if isinstance(node, exp.Case):
                columns.append(_case(node, rows, spark_type))
                continue
            values, arrow_type = _evaluate(node, rows, top=True)
        except _Refused:
            return None
        if isinstance(values, pa.Scalar):
            return None
        if pa.types.is_decimal256(arrow_type):
            values = _fitted(values, arrow_type, spark_type)
            if values is None:
                return None
        elif arrow_type != spark_type:
            return None
        columns.append(values)
    columns += [rows.column(name) for name in keep]
    return pa.Table.from_arrays(columns, names=[*names, *keep])
