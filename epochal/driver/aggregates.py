"""An aggregate's touched groups computed on the driver where its change batch is held there
exactly (rules/aggregate.py has the rule and the state; this is the same arithmetic in Python).

Through Spark, the touched groups of one step (the change grouped, the previous state of those
groups read and reduced to its latest rows, the two joined and added) cost a local checkpoint and
the four or five jobs AQE plans for it, and seconds of Catalyst over a plan of a few thousand rows.
Here they cost a pass over the change rows and a lookup of the state rows of the touched groups
(read by delta-rs: the whole state when it is small, else the rows of the touched keys), and Spark
receives them as a local relation: finalizing the visible values, the state write and the output
change are Spark's as before, so the types and the rounding of AVG stay Spark's.

Taken only where Python computes exactly what Spark does: COUNT(*), COUNT, SUM and AVG of
integers, decimals (with Spark's result types; not where Spark's product with the weight would
lose scale) and doubles (a sum in another order: within the suite's relative tolerance, as Spark's
own partial sums are), and MIN/MAX of integers, strings, dates and decimals for groups no delete
touched (those are recomputed from the input, by Spark). Group keys are integers, strings, dates,
decimals or booleans, matched NULL-safely as Spark's join on the state is. Everything else (DISTINCT
aggregates, other functions, floating-point keys, an overflow, a sum become NaN or infinite)
returns None: Spark's to compute (and, for the last two, to refuse).
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    IntegralType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ..arrow_rows import key_type
from ..graph import WEIGHT, AggCall, Aggregate

LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1
EXACT = decimal.Context(prec=100, rounding=decimal.ROUND_HALF_UP)


class _Unsupported(Exception):
    pass


def sum_type(input_type: DataType) -> DataType | None:
    """Spark's type of SUM over `input_type`, or None where it is Spark's to say."""
    if isinstance(input_type, DecimalType):
        return DecimalType(min(38, input_type.precision + 10), input_type.scale)
    if isinstance(input_type, IntegralType):
        return LongType()
    if isinstance(input_type, (DoubleType, FloatType)):
        return DoubleType()
    return None


def _summable(input_type: DataType) -> bool:
    """Whether Python sums the type as Spark does: exactly for integers and decimals of any
    width (a weight is a count of copies, never a rounding), as doubles for floating point."""
    return isinstance(input_type, (IntegralType, DoubleType, FloatType, DecimalType))


def weighs_exactly(input_type: DecimalType) -> bool:
    """Whether Spark's DECIMAL(p,s) * BIGINT (typed DECIMAL(p+21, s), its scale cut to at least 6
    past 38 digits) holds every product exactly."""
    return input_type.precision + 21 <= 38 or input_type.scale <= 6


def adds_exactly(total_type: DataType) -> bool:
    """Whether Spark's `+` of two values of `total_type` (a sum's type) keeps every digit: a
    DECIMAL(38,s) plus another is typed DECIMAL(38, max(s-1, min(s, 6))) and rounded."""
    if not isinstance(total_type, DecimalType):
        return True
    return total_type.precision < 38 or total_type.scale <= 6


def _ordered(input_type: DataType) -> bool:
    """Whether Python orders the values as Spark does (not floating point: NaN, -0.0; not strings
    of a collation other than UTF8_BINARY, which Spark orders by their collation)."""
    if isinstance(input_type, StringType):
        return getattr(input_type, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None)
    return isinstance(input_type, (IntegralType, DateType, DecimalType))


def _fit(value, data_type: DataType):
    """`value` as Spark's cast to `data_type` holds it; _Unsupported where Spark would overflow."""
    if value is None:
        return None
    if isinstance(data_type, DecimalType):
        quantized = value.quantize(decimal.Decimal(1).scaleb(-data_type.scale), context=EXACT)
        if quantized != value or len(quantized.as_tuple().digits) > data_type.precision:
            raise _Unsupported(f"{value} as {data_type}")
        return quantized
    if isinstance(data_type, LongType) and not LONG_MIN <= value <= LONG_MAX:
        raise _Unsupported(f"{value} as BIGINT")
    return value


def _add(a, b):
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return EXACT.add(decimal.Decimal(a), decimal.Decimal(b))
    return a + b


def _times(value, weight: int):
    return EXACT.multiply(value, weight) if isinstance(value, decimal.Decimal) else value * weight


def state_types(node: Aggregate, input_types: dict[str, DataType]) -> dict[str, DataType] | None:
    """Each state column's Spark type (AggregateRule._state_type), or None where an aggregate is
    not computed here."""
    types = {}
    for agg in node.aggs:
        if agg.func == "other":
            return None
        if agg.func == "count_star":
            continue
        arg_type = input_types[agg.arg]
        if agg.distinct:  # the number of distinct values, from use counts matched as Spark's join matches
            if not key_type(arg_type):
                return None
            types[f"{agg.name}__n"] = LongType()
        elif agg.func in ("sum", "avg"):
            total = sum_type(arg_type)
            if total is None or not _summable(arg_type):
                return None
            types[f"{agg.name}__s"], types[f"{agg.name}__n"] = total, LongType()
        elif agg.func == "count":
            types[f"{agg.name}__n"] = LongType()
        elif agg.func in ("min", "max"):
            if not _ordered(arg_type):
                return None
            types[f"{agg.name}__m"] = arg_type
        assert set(state_columns_of(agg)) <= set(types)
    return types


def group_change(node: Aggregate, change: pa.Table) -> dict[tuple, dict]:
    """AggregateRule._grouped_change on the driver: per group key, COUNT (the weights' sum),
    __neg, and each aggregate's change columns; grouped by Arrow where it is exact, else a loop."""
    folded = _folded_in_arrow(node, change)
    return folded if folded is not None else _group_in_python(node, change)


def _group_in_python(node: Aggregate, change: pa.Table) -> dict[tuple, dict]:
    key_columns = [change.column(k).to_pylist() for k in node.keys]
    weights = change.column(WEIGHT).to_pylist()
    folded = [agg for agg in node.aggs if not agg.distinct]
    args = {agg.arg: change.column(agg.arg).to_pylist() for agg in folded if agg.arg is not None}
    groups: dict[tuple, dict] = {}
    for i, weight in enumerate(weights):
        key = tuple(column[i] for column in key_columns)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {COUNT: 0, "__neg": 0}
            for agg in folded:
                if agg.func in ("sum", "avg"):
                    group[f"{agg.name}__s"], group[f"{agg.name}__n"] = None, 0
                elif agg.func == "count":
                    group[f"{agg.name}__n"] = 0
                elif agg.func in ("min", "max"):
                    group[f"{agg.name}__m"], group[f"{agg.name}__neg"] = None, 0
        group[COUNT] += weight
        if weight < 0:
            group["__neg"] = 1
        for agg in folded:
            if agg.func == "count_star":
                continue
            value = args[agg.arg][i]
            if value is None:
                continue
            if agg.func in ("sum", "avg"):
                product = _times(value, weight)
                total = group[f"{agg.name}__s"]
                group[f"{agg.name}__s"] = product if total is None else _add(total, product)
            if agg.func in ("sum", "avg", "count"):
                group[f"{agg.name}__n"] += weight
            if agg.func in ("min", "max"):
                if weight > 0:
                    held = group[f"{agg.name}__m"]
                    pick = min if agg.func == "min" else max
                    group[f"{agg.name}__m"] = value if held is None else pick(held, value)
                elif weight < 0:
                    group[f"{agg.name}__neg"] = 1
    return groups


def _unscaled(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, int] | None:
    """An integer or decimal column as int64 numbers (a decimal's unscaled digits), whether each
    is set, and the scale (None for an integer); None for another type or a decimal past 64 bits."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = np.asarray(array.is_valid(), dtype=bool) if array.null_count else np.ones(len(array), dtype=bool)
    if pa.types.is_integer(array.type):
        return np.asarray(pc.fill_null(array.cast(pa.int64()), 0)), valid, None
    if not pa.types.is_decimal128(array.type):
        return None
    words = np.frombuffer(array.buffers()[1], dtype=np.int64, count=2 * (array.offset + len(array)))
    low, high = words[2 * array.offset::2], words[2 * array.offset + 1::2]
    low = np.where(valid, low, 0)
    if not np.array_equal(np.where(valid, high, 0), low >> 63):  # a value past 64 bits
        return None
    return low, valid, array.type.scale


def _folded_in_arrow(node: Aggregate, change: pa.Table) -> dict[tuple, dict] | None:
    """_group_in_python's groups, grouped by Arrow (NULL keys one group, as Spark's NULL-safe join
    on the state matches them): weights, and each value times its weight, summed as int64 where
    no sum can pass 2**62. COUNT(*), COUNT, SUM and AVG of integers and decimals of up to 64 bits
    of digits, MIN and MAX; None for another aggregate (SUM of doubles: the loop's order), or
    larger values. TPC-H Q13's outer join recomputes every order of the customers it touched, a
    hundred thousand rows an epoch, and Q1, Q17 and Q18 sum tens of thousands."""
    folded = [agg for agg in node.aggs if not agg.distinct]
    if change.num_rows == 0 or any(agg.func not in ("count_star", "count", "sum", "avg", "min", "max")
                                   for agg in folded):
        return None
    weights = np.asarray(pc.fill_null(change.column(WEIGHT).cast(pa.int64()), 0))
    heaviest = int(np.abs(weights).max())
    if heaviest * change.num_rows >= 2 ** 62:
        return None
    keys = [f"__k{i}" for i in range(len(node.keys))] or ["__k"]
    columns = {key: change.column(name) for key, name in zip(keys, node.keys)} if node.keys else \
        {"__k": pa.nulls(change.num_rows, pa.int8())}
    columns["__w"], columns["__neg"] = weights, (weights < 0).astype(np.int64)
    aggregations = [("__w", "sum"), ("__neg", "max")]
    scales = {}
    for i, agg in enumerate(folded):
        if agg.func == "count_star":
            continue
        values = change.column(agg.arg)
        valid = np.asarray(values.is_valid(), dtype=bool)
        if agg.func in ("count", "sum", "avg"):
            columns[f"__n{i}"] = np.where(valid, weights, 0)
            aggregations.append((f"__n{i}", "sum"))
        if agg.func in ("sum", "avg"):
            unscaled = _unscaled(values)
            if unscaled is None:
                return None
            digits, _, scales[i] = unscaled
            largest = max(int(digits.max()), -int(digits.min())) if len(digits) else 0
            if largest * heaviest * change.num_rows >= 2 ** 62:
                return None
            columns[f"__s{i}"] = pa.array(digits * weights, mask=~valid)
            aggregations.append((f"__s{i}", "sum"))
        if agg.func in ("min", "max"):
            columns[f"__m{i}"] = pc.if_else(pa.array(valid & (weights > 0)), values, pa.scalar(None, values.type))
            columns[f"__mneg{i}"] = (valid & (weights < 0)).astype(np.int64)
            aggregations += [(f"__m{i}", agg.func), (f"__mneg{i}", "max")]
    try:
        grouped = pa.table(columns).group_by(keys, use_threads=False).aggregate(aggregations)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    read = {f"{column}_{how}": grouped.column(f"{column}_{how}").to_pylist() for column, how in aggregations}
    group_keys = list(zip(*[grouped.column(k).to_pylist() for k in keys])) if node.keys else [()]
    found: dict[tuple, dict] = {}
    for row, key in enumerate(group_keys):
        group = found[key] = {COUNT: read["__w_sum"][row], "__neg": read["__neg_max"][row]}
        for i, agg in enumerate(folded):
            if agg.func in ("count", "sum", "avg"):
                group[f"{agg.name}__n"] = read[f"__n{i}_sum"][row]
            if agg.func in ("sum", "avg"):
                total = read[f"__s{i}_sum"][row]
                group[f"{agg.name}__s"] = total if total is None or scales[i] is None else \
                    decimal.Decimal(total).scaleb(-scales[i], EXACT)
            if agg.func in ("min", "max"):
                group[f"{agg.name}__m"] = read[f"__m{i}_{agg.func}"][row]
                group[f"{agg.name}__neg"] = read[f"__mneg{i}_max"][row]
    return found


def use_count_changes(keys: list[str], arg: str, change: pa.Table) -> dict[tuple, int]:
    """AggregateRule._distinct_changes' first half in Python: per (group keys..., value) of the
    change's non-NULL `arg` values, the sum of the weights, where it is not zero."""
    columns = [change.column(k).to_pylist() for k in keys] + [change.column(arg).to_pylist()]
    sums: dict[tuple, int] = {}
    for i, weight in enumerate(change.column(WEIGHT).to_pylist()):
        key = tuple(column[i] for column in columns)
        if key[-1] is not None:
            sums[key] = sums.get(key, 0) + weight
    return {key: total for key, total in sums.items() if total}


def distinct_transitions(counted: dict[tuple, int], old: dict[tuple, dict], count: str
                         ) -> tuple[dict[tuple, int], dict[tuple, int]]:
    """Each changed (group..., value)'s use count after the change (`old`: its state row before,
    absent for a value not held), and per group the change in its number of distinct values: a
    value counts while its use count is positive."""
    after, per_group = {}, {}
    for key, change in counted.items():
        state = old.get(key)
        before = (state.get(count) or 0) if state is not None else 0
        after[key] = before + change
        step = 1 if before <= 0 < after[key] else -1 if after[key] <= 0 < before else 0
        per_group[key[:-1]] = per_group.get(key[:-1], 0) + step
    return after, per_group


def extremes_of(node: Aggregate, rows: pa.Table, groups: set[tuple]) -> dict[tuple, dict]:
    """Per group of `groups`, each MIN/MAX over `rows` (the input's rows of at least those
    groups): AggregateRule._recompute in Python."""
    extremes = [agg for agg in node.aggs if agg.func in ("min", "max")]
    key_columns = [rows.column(k).to_pylist() for k in node.keys]
    args = {agg.arg: rows.column(agg.arg).to_pylist() for agg in extremes}
    found: dict[tuple, dict] = {key: {f"{agg.name}__m": None for agg in extremes} for key in groups}
    for i in range(rows.num_rows):
        key = tuple(column[i] for column in key_columns)
        group = found.get(key)
        if group is None:
            continue
        for agg in extremes:
            value, held = args[agg.arg][i], group[f"{agg.name}__m"]
            if value is not None:
                group[f"{agg.name}__m"] = value if held is None else (min if agg.func == "min" else max)(held, value)
    return found


def _pick(column: str, extremes: list, values: list):
    agg = next(a for a in extremes if column == f"{a.name}__m")
    return (min if agg.func == "min" else max)(values) if values else None


def touched_rows(node: Aggregate, change: pa.Table, old: dict[tuple, dict], input_types: dict[str, DataType],
                 types: dict[str, DataType], recompute, distinct: dict[str, dict[tuple, int]] | None = None
                 ) -> tuple[pa.Table, StructType] | None:
    """AggregateRule._compute_touched in Python: per touched group, its keys, new state (n__*),
    old state (o__*, NULL for a new group) and the delete markers, as Arrow rows and their Spark
    schema; None where a value would overflow its type. `change` has the input's columns and
    WEIGHT; `old` maps a group key to its state row (state column -> value). A MIN/MAX of a group
    a delete touched is recomputed from `recompute(groups)`: the input's rows (Spark-typed Arrow)
    of at least those groups as of the epoch's end, or None (then Spark's to compute).
    `distinct`: per COUNT(DISTINCT) aggregate's name, each group's change in its number of
    distinct values (distinct_transitions; a group absent from it did not change)."""
    distinct = distinct or {}
    columns = [COUNT] + [s for agg in node.aggs for s in state_columns_of(agg)]
    types = {COUNT: LongType(), **types}
    extremes = [agg for agg in node.aggs if agg.func in ("min", "max")]
    out: dict[str, list] = {name: [] for name in
                            [*node.keys, *["n__" + s for s in columns], *["o__" + s for s in columns], "__neg",
                             *[f"{agg.name}__neg" for agg in extremes]]}
    grouped = group_change(node, change)
    deleted = {key for key, group in grouped.items() if any(group[f"{agg.name}__neg"] for agg in extremes)}
    recomputed = {}
    if deleted:
        rows = recompute(deleted)
        if rows is None:
            return None
        recomputed = extremes_of(node, rows, deleted)
    try:
        for key, group in grouped.items():
            state = old.get(key)
            for name, value in zip(node.keys, key):
                out[name].append(value)
            for column in columns:
                before = state.get(column) if state is not None else None
                if column[:-len("__n")] in distinct and column.endswith("__n"):
                    after = (before or 0) + distinct[column[:-len("__n")]].get(key, 0)
                elif column.endswith("__m"):
                    neg = group[column[:-len("__m")] + "__neg"]
                    after = recomputed[key][column] if neg else \
                        _pick(column, extremes, [v for v in (before, group[column]) if v is not None])
                else:
                    if column.endswith("__s") and before is None and state is not None and \
                            (state.get(column[:-len("__s")] + "__n") or 0) > 0:
                        raise _Unsupported(f"{column} overflowed its type")  # Spark's path refuses the step
                    zero = decimal.Decimal(0) if isinstance(types[column], DecimalType) else 0
                    after = _add(before if before is not None else zero,
                                 group[column] if group[column] is not None else zero)
                    if isinstance(types[column], DoubleType):
                        after = float(after)
                        if not math.isfinite(after):  # Spark's path refuses the step (NOT_EXACT)
                            raise _Unsupported(f"{column} holds {after}")
                out["n__" + column].append(_fit(after, types[column]))
                out["o__" + column].append(before)
            out["__neg"].append(group["__neg"])
            for agg in extremes:
                out[f"{agg.name}__neg"].append(group[f"{agg.name}__neg"])
    except (_Unsupported, decimal.InvalidOperation, TypeError):
        return None
    fields = [StructField(k, input_types[k]) for k in node.keys]
    fields += [StructField("n__" + s, types[s]) for s in columns] + [StructField("o__" + s, types[s]) for s in columns]
    fields += [StructField(name, IntegerType()) for name in ["__neg", *[f"{a.name}__neg" for a in extremes]]]
    schema = StructType(fields)
    arrow = to_arrow_schema(schema)
    try:
        rows = pa.table({f.name: pa.array(out[f.name], type=arrow.field(f.name).type) for f in fields})
    except (pa.ArrowException, TypeError, ValueError):
        return None
    return rows, schema


def decimal_average(total: decimal.Decimal, count: int, result: DecimalType) -> decimal.Decimal:
    """AVG of a decimal as Spark's Average evaluates it from its buffer (DecimalDivideWithOverflowCheck):
    the sum divided by the count (Decimal division, 39 significant digits cut), rounded half-up to
    the average's type, DECIMAL(p + 4, s + 4). The half-up rounding of the cut quotient is that of
    the exact one (the cut never reaches the rounding digit), so Python divides exactly here.
    _Unsupported where the average does not fit its precision (NULL, or ANSI's error: Spark's to say).
    Not the expression `sum / CAST(count AS DECIMAL(20,0))`: Spark types that division by its
    precision rules, which for a DECIMAL(38,10) sum keep 10 places of the 14, and round twice."""
    quotient = decimal.Context(prec=120, rounding=decimal.ROUND_DOWN).divide(total, decimal.Decimal(count))
    fitted = quotient.quantize(decimal.Decimal(1).scaleb(-result.scale), rounding=decimal.ROUND_HALF_UP, context=EXACT)
    if fitted.adjusted() >= result.precision - result.scale:
        raise _Unsupported(f"{fitted} as {result}")
    return fitted


def _averages(total: list, count: list, result: DataType) -> list:
    """AVG's visible values from its sums and counts: of doubles as Spark divides them (IEEE, as
    Python does), of decimals as Spark's Average does (decimal_average)."""
    if isinstance(result, DoubleType):
        if any(isinstance(t, decimal.Decimal) for t in total):
            raise _Unsupported
        return [None if not n else float(t) / float(n) for t, n in zip(total, count)]
    if not isinstance(result, DecimalType):
        raise _Unsupported
    return [None if not n else decimal_average(t, n, result) for t, n in zip(total, count)]


def _visible(node: Aggregate, rows: pa.Table, prefix: str, schema: StructType) -> list[list] | None:
    """Each aggregate's visible values from the state columns named `prefix + state column` of
    `rows` (AggregateRule._finalize in Python), typed as `schema` says; None where an aggregate is
    Spark's to finalize, _Unsupported where a value is."""
    columns = []
    for agg in node.aggs:
        if agg.func == "count_star":
            columns.append(rows.column(prefix + COUNT).to_pylist())
        elif agg.func == "count":
            columns.append(rows.column(f"{prefix}{agg.name}__n").to_pylist())
        elif agg.func in ("sum", "avg"):
            total = rows.column(f"{prefix}{agg.name}__s").to_pylist()
            count = rows.column(f"{prefix}{agg.name}__n").to_pylist()
            columns.append(_averages(total, count, schema[agg.name].dataType) if agg.func == "avg" else
                           [None if not n else t for t, n in zip(total, count)])
        elif agg.func in ("min", "max"):
            columns.append(rows.column(f"{prefix}{agg.name}__m").to_pylist())
        else:
            return None
    return columns


def _typed(columns: list[list], schema: StructType) -> pa.Table | None:
    arrow = to_arrow_schema(schema)
    try:
        return pa.table([pa.array(column, type=field.type) for column, field in zip(columns, arrow)], schema=arrow)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def finalized_state(node: Aggregate, state: pa.Table, schema: StructType) -> pa.Table | None:
    """An aggregate's rows from its state (keys and state columns, Spark-typed), as
    AggregateRule._finalize computes them over the state, with `schema` (the keys and the
    aggregates' visible types); None where Spark's to finalize. Columnar but for AVG: a
    snapshot holds every group, a change only the touched ones."""
    arrow = to_arrow_schema(schema)
    columns = [state.column(k) for k in node.keys]
    try:
        for agg in node.aggs:
            if agg.func == "count_star":
                columns.append(state.column(COUNT))
            elif agg.func == "count":
                columns.append(state.column(f"{agg.name}__n"))
            elif agg.func == "sum":
                total = state.column(f"{agg.name}__s")
                columns.append(pc.if_else(pc.greater(state.column(f"{agg.name}__n"), 0), total,
                                          pa.scalar(None, total.type)))
            elif agg.func == "avg":
                total = state.column(f"{agg.name}__s").to_pylist()
                count = state.column(f"{agg.name}__n").to_pylist()
                columns.append(pa.array(_averages(total, count, schema[agg.name].dataType),
                                        type=arrow.field(agg.name).type))
            elif agg.func in ("min", "max"):
                columns.append(state.column(f"{agg.name}__m"))
            else:
                return None
        return pa.Table.from_arrays([column.cast(field.type, safe=True) for column, field in zip(columns, arrow)],
                                    schema=arrow)
    except (_Unsupported, pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def finalized_rows(node: Aggregate, touched: pa.Table, schema: StructType) -> pa.Table | None:
    """AggregateRule.delta over touched groups (touched_rows' columns) in Arrow: per group
    -finalize(old state) where it existed, +finalize(new state) where it exists, with `schema`
    (the keys, the aggregates' visible types, WEIGHT). COUNT, SUM, MIN and MAX are read off the
    state; AVG of doubles as Spark divides them (IEEE, as Python does), of decimals as Spark's
    Average does (decimal_average); another function is Spark's (None)."""
    try:
        old, new = _visible(node, touched, "o__", schema), _visible(node, touched, "n__", schema)
    except _Unsupported:
        return None
    if old is None or new is None:
        return None
    counts_before = touched.column("o__" + COUNT).to_pylist()
    counts_after = touched.column("n__" + COUNT).to_pylist()
    keys = [touched.column(k).to_pylist() for k in node.keys]
    out: list[list] = [[] for _ in schema.names]
    for i in range(touched.num_rows):
        existed = counts_before[i] is not None and (counts_before[i] > 0 or not node.keys)
        exists = counts_after[i] > 0 or not node.keys
        for values, weight, present in ((old, -1, existed), (new, 1, exists)):
            if not present:
                continue
            row = [key[i] for key in keys] + [column[i] for column in values] + [weight]
            for column, value in zip(out, row):
                column.append(value)
    return _typed(out, schema)


COUNT = "__count"


def state_columns_of(agg: AggCall) -> list[str]:
    if agg.func == "count_star":
        return []
    if agg.func in ("sum", "avg"):
        return [f"{agg.name}__s", f"{agg.name}__n"]
    if agg.func == "count":
        return [f"{agg.name}__n"]
    if agg.func in ("min", "max"):
        return [f"{agg.name}__m"]
    return [f"{agg.name}__v"]
