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

from ..arrow_rows import column_first_values, key_type, positions_of
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
    grouped = grouped_in_arrow(node, change)
    return folded_groups(node, grouped) if grouped is not None else _group_in_python(node, change)


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


def grouped_in_arrow(node: Aggregate, change: pa.Table) -> tuple[pa.Table, dict[str, int | None]] | None:
    """_group_in_python's groups as an Arrow table, grouped by Arrow (NULL keys one group, as
    Spark's NULL-safe join on the state matches them): the keys (`__k<i>`, or one NULL `__k` for
    a global aggregate), COUNT, __neg, and per aggregate its change columns; a SUM's as int64
    digits, unscaled by the scale returned per column (None for an integer sum). Weights, and
    each value times its weight, are summed as int64 where no sum can pass 2**62. COUNT(*),
    COUNT, SUM and AVG of integers and decimals of up to 64 bits of digits, MIN and MAX; None for
    another aggregate (SUM of doubles: the loop's order), or larger values. TPC-H Q13's outer
    join recomputes every order of the customers it touched, a hundred thousand rows an epoch,
    and Q1, Q17 and Q18 sum tens of thousands."""
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
    columns[COUNT], columns["__neg"] = weights, (weights < 0).astype(np.int64)
    aggregations = [(COUNT, "sum"), ("__neg", "max")]
    scales = {}
    for agg in folded:
        if agg.func == "count_star":
            continue
        values = change.column(agg.arg)
        valid = np.asarray(values.is_valid(), dtype=bool)
        if agg.func in ("count", "sum", "avg"):
            columns[f"{agg.name}__n"] = np.where(valid, weights, 0)
            aggregations.append((f"{agg.name}__n", "sum"))
        if agg.func in ("sum", "avg"):
            unscaled = _unscaled(values)
            if unscaled is None:
                return None
            digits, _, scales[f"{agg.name}__s"] = unscaled
            largest = max(int(digits.max()), -int(digits.min())) if len(digits) else 0
            if largest * heaviest * change.num_rows >= 2 ** 62:
                return None
            columns[f"{agg.name}__s"] = pa.array(digits * weights, mask=~valid)
            aggregations.append((f"{agg.name}__s", "sum"))
        if agg.func in ("min", "max"):
            columns[f"{agg.name}__m"] = pc.if_else(pa.array(valid & (weights > 0)), values,
                                                   pa.scalar(None, values.type))
            columns[f"{agg.name}__neg"] = (valid & (weights < 0)).astype(np.int64)
            aggregations += [(f"{agg.name}__m", agg.func), (f"{agg.name}__neg", "max")]
    try:
        grouped = pa.table(columns).group_by(keys, use_threads=False).aggregate(aggregations)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    named = {f"{name}_{how}": name for name, how in aggregations}
    return grouped.rename_columns([named.get(name, name) for name in grouped.column_names]), scales


def folded_groups(node: Aggregate, found: tuple[pa.Table, dict[str, int | None]]) -> dict[tuple, dict]:
    """_group_in_python's groups from grouped_in_arrow's table and scales."""
    grouped, scales = found
    read = {name: grouped.column(name).to_pylist() for name in grouped.column_names}
    group_keys = list(zip(*[read[f"__k{i}"] for i in range(len(node.keys))])) if node.keys else [()]
    changed = [name for name in grouped.column_names if not name.startswith("__k")]
    groups: dict[tuple, dict] = {}
    for row, key in enumerate(group_keys):
        groups[key] = {name: read[name][row] for name in changed}
    for name, scale in scales.items():
        if scale is not None:
            for group in groups.values():
                if group[name] is not None:
                    group[name] = decimal.Decimal(group[name]).scaleb(-scale, EXACT)
    return groups


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
                 types: dict[str, DataType], recompute, distinct: dict[str, dict[tuple, int]] | None = None,
                 grouped: dict[tuple, dict] | None = None) -> tuple[pa.Table, StructType] | None:
    """AggregateRule._compute_touched in Python: per touched group, its keys, new state (n__*),
    old state (o__*, NULL for a new group) and the delete markers, as Arrow rows and their Spark
    schema; None where a value would overflow its type. `change` has the input's columns and
    WEIGHT; `old` maps a group key to its state row (state column -> value). A MIN/MAX of a group
    a delete touched is recomputed from `recompute(groups)`: the input's rows (Spark-typed Arrow)
    of at least those groups as of the epoch's end, or None (then Spark's to compute).
    `distinct`: per COUNT(DISTINCT) aggregate's name, each group's change in its number of
    distinct values (distinct_transitions; a group absent from it did not change). `grouped`:
    group_change's groups of `change` where the caller has them already."""
    distinct = distinct or {}
    columns = [COUNT] + [s for agg in node.aggs for s in state_columns_of(agg)]
    types = {COUNT: LongType(), **types}
    extremes = [agg for agg in node.aggs if agg.func in ("min", "max")]
    out: dict[str, list] = {name: [] for name in
                            [*node.keys, *["n__" + s for s in columns], *["o__" + s for s in columns], "__neg",
                             *[f"{agg.name}__neg" for agg in extremes]]}
    grouped = grouped if grouped is not None else group_change(node, change)
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


def _decimals(digits: np.ndarray, decimal_type: DecimalType) -> pa.Array:
    """DECIMAL(p, s) values from their int64 digits (unscaled by s): Arrow's 128-bit words, the
    high one the low one's sign."""
    words = np.empty(2 * len(digits), dtype=np.int64)
    words[0::2], words[1::2] = digits, digits >> 63
    return pa.Array.from_buffers(pa.decimal128(decimal_type.precision, decimal_type.scale), len(digits),
                                 [None, pa.py_buffer(words.tobytes())])


def touched_in_arrow(node: Aggregate, found: tuple[pa.Table, dict[str, int | None]] | None, read_state,
                     input_types: dict[str, DataType], types: dict[str, DataType]) -> tuple[pa.Table, StructType] | None:
    """touched_rows in Arrow, column by column rather than group by group, where no group needs
    a MIN/MAX recomputed and no COUNT(DISTINCT) is kept: `found`, the change grouped by
    grouped_in_arrow (None where Arrow does not group it), each group's state row found by its
    key, and every sum added as int64 digits. `read_state` gives, for the groups' first key
    values (column_first_values), the latest state rows of at least those groups (an Arrow table,
    delta-rs's types) or None. None where this is the loop's (touched_rows) to compute, which
    also decides what overflows: a sum past its type, a value past 64 bits of digits."""
    if found is None or any(agg.distinct or agg.func == "other" for agg in node.aggs):
        return None
    grouped, scales = found
    extremes = [agg for agg in node.aggs if agg.func in ("min", "max")]
    if any(pc.max(grouped.column(f"{agg.name}__neg")).as_py() for agg in extremes):
        return None  # a MIN/MAX a delete touched is recomputed from the input
    keys = [f"__k{i}" for i in range(len(node.keys))]
    old = read_state(column_first_values(grouped.column(keys[0])) if keys else None)
    if old is None:
        return None
    names = {name.lower(): name for name in old.column_names}
    if keys:
        index = positions_of(grouped, keys, old, [names[k.lower()] for k in node.keys])
    else:
        index = pa.array([0 if old.num_rows else None], pa.int64())
    before = old.take(index)
    present = np.asarray(index.is_valid(), dtype=bool)
    columns = [COUNT] + [s for agg in node.aggs for s in state_columns_of(agg)]
    types = {COUNT: LongType(), **types}
    schema = StructType([StructField(k, input_types[k]) for k in node.keys] +
                        [StructField("n__" + s, types[s]) for s in columns] +
                        [StructField("o__" + s, types[s]) for s in columns] +
                        [StructField(name, IntegerType()) for name in ["__neg", *[f"{a.name}__neg" for a in extremes]]])
    arrow = to_arrow_schema(schema)
    out = {k: grouped.column(key) for k, key in zip(node.keys, keys)}
    try:
        olds = {s: before.column(names[s.lower()]).cast(arrow.field("o__" + s).type) for s in columns}
        for column in columns:
            was, step = olds[column], grouped.column(column)
            if column.endswith("__m"):
                pick = pc.min_element_wise if column[:-len("__m")] in {a.name for a in extremes if a.func == "min"} \
                    else pc.max_element_wise
                after = pick(was, step.cast(was.type))
            elif column.endswith("__s"):
                count = np.asarray(pc.fill_null(olds[column[:-len("__s")] + "__n"], 0))
                if np.any(present & ~np.asarray(was.is_valid(), dtype=bool) & (count > 0)):
                    return None  # the sum overflowed before: Spark's path refuses the step
                total_type = types[column]
                if isinstance(total_type, DecimalType):
                    unscaled = _unscaled(was)
                    if unscaled is None or unscaled[2] != scales[column] or total_type.scale != scales[column]:
                        return None
                    digits = unscaled[0]
                    if len(digits) and max(int(digits.max()), -int(digits.min())) >= 2 ** 62:
                        return None
                    total = digits + np.asarray(pc.fill_null(step, 0))
                    if total_type.precision < 19 and len(total) and \
                            max(int(total.max()), -int(total.min())) >= 10 ** total_type.precision:
                        return None
                    after = _decimals(total, total_type)
                elif isinstance(total_type, LongType) and scales[column] is None:
                    after = pc.add_checked(pc.fill_null(was, 0), pc.fill_null(step.cast(pa.int64()), 0))
                else:
                    return None
            else:
                after = pc.add_checked(pc.fill_null(was, 0), step.cast(pa.int64()))
            out["n__" + column] = after
        out.update({"o__" + s: olds[s] for s in columns})
        out["__neg"] = grouped.column("__neg")
        out.update({f"{a.name}__neg": grouped.column(f"{a.name}__neg") for a in extremes})
        return pa.Table.from_arrays([pa.array(out[f.name]).cast(f.type, safe=True) if isinstance(out[f.name], np.ndarray)
                                     else out[f.name].cast(f.type, safe=True) for f in arrow], schema=arrow), schema
    except (pa.ArrowException, KeyError, TypeError, ValueError, OverflowError):
        return None


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


def _decimal_averages(total: pa.ChunkedArray, count: pa.ChunkedArray, result: DecimalType) -> pa.Array | None:
    """decimal_average over whole columns in int64 digits: each sum, scaled to the average's
    scale, divided by its count with the remainder rounding half away from zero (Java's
    HALF_UP); NULL where the count is 0. None where a value would pass 2**62 (then the loop
    decides, with Python's exact decimals), and _Unsupported where an average does not fit."""
    unscaled = _unscaled(total)
    if unscaled is None:
        return None
    digits, valid, scale = unscaled
    counts = np.asarray(pc.fill_null(count.cast(pa.int64()), 0))
    shift = result.scale - (scale or 0)
    if shift < 0 or shift > 18 or np.any(~valid & (counts > 0)) or np.any(counts < 0):
        return None
    magnitude = np.abs(digits)
    if len(digits) and int(magnitude.max()) >= 2 ** 62 // 10 ** shift:
        return None
    numerator, present = magnitude * 10 ** shift, counts > 0
    divisor = np.where(present, counts, 1)
    quotient, remainder = np.divmod(numerator, divisor)
    rounded = np.where(digits < 0, -1, 1) * (quotient + (2 * remainder >= divisor))
    if result.precision <= 18 and np.any(present & (np.abs(rounded) >= 10 ** result.precision)):
        raise _Unsupported(f"an average past {result}")
    averages = _decimals(np.where(present, rounded, 0), result)
    return pc.if_else(pa.array(present), averages, pa.scalar(None, averages.type))


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
                result = schema[agg.name].dataType
                averages = _decimal_averages(state.column(f"{agg.name}__s"), state.column(f"{agg.name}__n"), result) \
                    if isinstance(result, DecimalType) else None
                if averages is None:
                    averages = pa.array(_averages(state.column(f"{agg.name}__s").to_pylist(),
                                                  state.column(f"{agg.name}__n").to_pylist(), result),
                                        type=arrow.field(agg.name).type)
                columns.append(averages)
            elif agg.func in ("min", "max"):
                columns.append(state.column(f"{agg.name}__m"))
            else:
                return None
        return pa.Table.from_arrays([column.cast(field.type, safe=True) for column, field in zip(columns, arrow)],
                                    schema=arrow)
    except (_Unsupported, pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def finalized_rows(node: Aggregate, touched: pa.Table, schema: StructType) -> pa.Table | None:
    """AggregateRule.delta over touched groups (touched_rows' columns) in Arrow: finalized_state
    of the old state of the groups that existed, weighted -1, and of the new state of those that
    exist, weighted +1, with `schema` (the keys, the aggregates' visible types, WEIGHT); None
    where an aggregate is Spark's to finalize."""
    columns = [COUNT] + [s for agg in node.aggs for s in state_columns_of(agg)]
    visible = StructType(schema.fields[:-1])
    if node.keys:
        existed = pc.fill_null(pc.greater(touched.column("o__" + COUNT), 0), False)
        exists = pc.fill_null(pc.greater(touched.column("n__" + COUNT), 0), False)
    else:  # a global aggregate's one row is always there
        existed = pc.is_valid(touched.column("o__" + COUNT))
        exists = pa.array([True] * touched.num_rows, pa.bool_())
    parts = []
    for prefix, weight, present in (("o__", -1, existed), ("n__", 1, exists)):
        state = touched.filter(present).select([*node.keys, *[prefix + s for s in columns]]) \
            .rename_columns([*node.keys, *columns])
        rows = finalized_state(node, state, visible)
        if rows is None:
            return None
        parts.append(rows.append_column(pa.field(WEIGHT, pa.int64()), pa.array([weight] * rows.num_rows, pa.int64())))
    arrow = to_arrow_schema(schema)
    try:
        return pa.concat_tables(parts).cast(arrow)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


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
