"""Key-restricted co-generator reads, at run time (the plan side is planning/optimize/restrict_cogenerators).

In the join term that starts from input i's change batch, input j can only contribute rows whose
column b equals some value of a in the batch (`Join.restrict`). The batch's distinct values are
collected (one small job per changed input, on its persisted batch) and turned into a filter on
input j's read that Delta's data skipping understands: an OR of at most MAX_RANGES value ranges,
split where the sorted values have their widest gaps. Measured on Delta 4.4: an IN list skips no
files at all (even with two values; Parquet row groups skip only for ten values or fewer), while
an OR of ranges skips every file whose min/max statistics miss all ranges. The filter is a superset
of the matching rows; the join itself stays exact.

Random keys touch every file, though, so where it can the term reads input j's rows for those keys
on the driver instead (`restricted_snapshot`, shared_reads.SharedReads.restricted): about one scan
of each version and key column for the whole refresh, shared by every term and table, instead of a
Spark scan per term. Affected-key recomputes (keyed.py) read their inputs the same way.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegralType
from sqlglot import exp

from ..arrow_rows import KEY_TYPES, key_kind
from ..changes import NEW, quoted
from ..graph import Aggregate, Filter, Join, Node, Project, Scan, SemiJoin, conjuncts, join_order
from .base import expr, held_through

MAX_RANGES = 32  # ranges in one filter: each is tested against every file's statistics
MAX_KEYS = 200_000  # distinct values collected to the driver; beyond, one range [min, max]


def comparable(a: DataType, b: DataType) -> bool:
    """Whether a range over a's values filters b exactly like the join's equality does."""
    return a == b or (isinstance(a, IntegralType) and isinstance(b, IntegralType))


def _gap(low, high) -> float:
    if isinstance(low, (int, float, Decimal)):
        return float(high - low)
    if isinstance(low, (date, datetime)):
        return (high - low).total_seconds()
    return 1.0  # no distance between strings: split evenly


def ranges(values: list) -> list[tuple[object, object]]:
    """At most MAX_RANGES (low, high) ranges covering the sorted distinct `values`, split at the
    widest gaps."""
    if len(values) <= MAX_RANGES:
        return [(v, v) for v in values]
    gaps = sorted(range(1, len(values)), key=lambda i: (-_gap(values[i - 1], values[i]), i))[:MAX_RANGES - 1]
    bounds = [0] + sorted(gaps) + [len(values)]
    return [(values[start], values[end - 1]) for start, end in zip(bounds, bounds[1:])]


def _values_on_driver(rows, column: str) -> tuple[list, bool] | None:
    """`column`'s sorted distinct non-NULL values in Arrow `rows`, and whether it holds NULL; None
    for a type whose values Spark and Python may not order and compare alike (DRIVER_KEY_TYPES)."""
    array = rows.column(column)
    if key_kind(array.type) not in ("integer", "string", "date", "decimal", "boolean"):
        return None
    unique = pc.unique(array)
    return sorted(v for v in unique.to_pylist() if v is not None), unique.null_count > 0


def _keys(change: DataFrame, columns: list[str], rows=None) -> dict[str, list | tuple]:
    """Per column, its sorted distinct non-NULL values in the batch, or (min, max) when more than
    MAX_KEYS (one job for all columns; a second only when some column has too many values). With
    `rows` (Arrow rows holding every row of the batch, Context.rows_on_driver) the values are
    taken there, without a job: a superset where Spark filters the batch further, which is as
    good (every use of the keys is a superset of the matching rows, the join itself is exact)."""
    if rows is not None:
        found = {c: _values_on_driver(rows, c) for c in columns}
        if all(values is not None and len(values[0]) <= MAX_KEYS for values in found.values()):
            return {c: values[0] for c, values in found.items()}
    figures = change.agg(*[F.array_sort(F.collect_set(F.col(quoted(c)))).alias(f"k{i}") for i, c in enumerate(columns)]).first()
    found: dict[str, list | tuple] = {}
    wide = []
    for i, column in enumerate(columns):
        values = list(figures[f"k{i}"] or [])
        if len(values) > MAX_KEYS:
            wide.append(column)
        else:
            found[column] = values
    if wide:
        bounds = change.agg(*[F.min(quoted(c)).alias(f"lo{i}") for i, c in enumerate(wide)],
                            *[F.max(quoted(c)).alias(f"hi{i}") for i, c in enumerate(wide)]).first()
        for i, column in enumerate(wide):
            found[column] = (bounds[f"lo{i}"], bounds[f"hi{i}"])
    return found


def _condition(column: str, keys: list | tuple):
    spans = [keys] if isinstance(keys, tuple) else ranges(keys)
    if not spans:
        return F.lit(False)  # the batch holds only NULLs: nothing can match
    col = F.col(quoted(column))
    parts = [col == F.lit(low) if low == high else col.between(F.lit(low), F.lit(high)) for low, high in spans]
    return reduce(lambda x, y: x | y, parts)


# key types whose equality pyarrow's is_in decides as Spark's `=` does (not floating point: -0.0
# and NaN; not timestamps: time zones between Python, Arrow and Spark)
DRIVER_KEY_TYPES = KEY_TYPES


def restricted_snapshot(ctx, node: Node, side: str, column: str, keys) -> DataFrame | None:
    """`node` as of `side`, holding at least its rows whose `column` is one of the keys, read on
    the driver and shared by the refresh's steps; None where it cannot be (then read it through
    Spark). `node` is a scan under filters, plain column projections, inner joins and semi-joins,
    or an aggregate read for some groups (AggregateRule.held_snapshot).
    `keys` is (values, nulls),
    or a function giving it, called only when the driver read is possible: `values` sorted,
    distinct and non-NULL, `nulls` whether the rows where `column` is NULL are wanted too (None:
    too many keys)."""
    if ctx.reads is None:
        return None
    if isinstance(node, (Aggregate, Join, SemiJoin)):  # each rule reads its own for some keys
        return ctx.rule_for(node).held_snapshot(node, ctx, side, column, keys)
    if isinstance(node, Filter):
        below = restricted_snapshot(ctx, node.input, side, column, keys)
        return None if below is None else held_through(ctx, lambda frame: frame.filter(expr(node.predicate)), below, node)
    if isinstance(node, Project):
        expression = dict(zip(node.columns, node.exprs)).get(column)
        if not isinstance(expression, exp.Column):
            return None
        below = restricted_snapshot(ctx, node.input, side, expression.name, keys)
        return None if below is None else held_through(
            ctx, lambda frame: frame.select(*ctx.rule_for(node).output_columns(node)), below, node)
    if not isinstance(node, Scan) or column not in node.columns:
        return None
    source = ctx.inputs[node.table]
    version = source.version(side if ctx.changed(node) else NEW)
    field = node.fields[node.columns.index(column)]
    types = {f.name.lower(): f.dataType for f in source.schema.fields}
    if version < 0 or not isinstance(types.get(field.lower()), DRIVER_KEY_TYPES):
        return None
    wanted = keys() if callable(keys) else keys
    if wanted is None or len(wanted[0]) > MAX_KEYS:
        return None
    values, nulls = wanted
    found = ctx.memo(node, ("restricted", version, field, values, nulls), lambda: ctx.reads.restricted_with_rows(
        ctx.spark, source.path, version, source.schema, field, values, nulls))
    if found is None:
        return None
    frame, data = found
    held = ctx.rule_for(node).held_read(node, ctx, data, frame, source.schema)  # filtered: fewer keys onward
    if held is not None:
        ctx.meter.note_read("restricted version", node.table, version)
    return held


def distinct_values(frame: DataFrame, column: str, rows=None) -> tuple[tuple, bool] | None:
    """`column`'s distinct non-NULL values in `frame`, sorted, and whether it holds NULL (one
    small job, or none with `rows`, Arrow rows holding every row of `frame`: then a superset);
    None when more than MAX_KEYS (too many for a driver read)."""
    found = _values_on_driver(rows, column) if rows is not None else None
    if found is not None:
        return None if len(found[0]) > MAX_KEYS else (tuple(found[0]), found[1])
    values = [row[0] for row in frame.select(F.col(quoted(column))).distinct().limit(MAX_KEYS + 2).collect()]
    present = [v for v in values if v is not None]
    return None if len(present) > MAX_KEYS else (tuple(sorted(present)), len(present) < len(values))


def matching_keys(ctx, frame: DataFrame, column: str, nulls: bool, rows=None) -> tuple[tuple, bool] | None:
    """The keys to read a partner for: `column`'s values in `frame` (or in `rows`, Arrow rows
    holding every row of it that can join), with the partner's NULLs when `nulls` (a NULL-safe
    correlation matches them)."""
    found = distinct_values(frame, column, rows if rows is not None else ctx.rows_on_driver(frame))
    return None if found is None else (found[0], nulls)


def reduce_partners(ctx, node: Join, start: int, frames: dict[int, DataFrame], reduced: set[int], sides: dict[int, str],
            held_only: bool = False, narrowed: dict | None = None) -> None:
    """Semi-join reduction, hop by hop: read each input not in `frames` (as of `sides[j]`) for the
    values its equality to an input read so far (in `reduced`) can match, on the driver; in full
    where it cannot be. Inputs are tried in the join's order from `start`, those that filter their
    rows first, again while a pass reads one (a read refused for too many rows through one partner
    may succeed through another read later). Each read narrows the Arrow rows of the input its
    keys came from to those it matches (`_semi_joined`), so later reads take fewer keys;
    `narrowed`: such rows to start from, by input. `held_only`: reduce from inputs whose rows are
    on the driver only (no Spark job to collect their values)."""
    narrowed = dict(narrowed or {})

    def rows(index: int):
        return narrowed[index] if index in narrowed else ctx.rows_on_driver(frames[index])

    def partners(index: int):
        for condition in conjuncts(node.condition):
            if not (isinstance(condition, exp.EQ) and isinstance(condition.left, exp.Column)
                    and isinstance(condition.right, exp.Column)):
                continue
            ends = {condition.left.name, condition.right.name}
            mine = ends & set(node.parts[index].columns)
            if len(mine) != 1:
                continue
            (y,) = mine
            for p in sorted(reduced):
                for x in ends - mine:
                    if x in node.parts[p].columns and (not held_only or ctx.rows_on_driver(frames[p]) is not None):
                        yield p, x, y

    order = sorted((index for index, _ in join_order(node, start) if index >= 0 and index not in frames),
                   key=lambda index: not _filtered(node.parts[index]))
    tried: set[tuple] = set()
    progress = True
    while progress:
        progress = False
        for index in [i for i in order if i not in frames]:
            for p, x, y in partners(index):
                if (index, p, x, y) in tried:
                    continue
                tried.add((index, p, x, y))
                frame = restricted_snapshot(ctx, node.parts[index], sides[index], y,
                                            lambda p=p, x=x: matching_keys(ctx, frames[p], x, False, rows(p)))
                if frame is not None and comparable(frames[p].schema[x].dataType, frame.schema[y].dataType):
                    frames[index] = frame
                    reduced.add(index)
                    kept = _semi_joined(rows(p), x, ctx.rows_on_driver(frame), y)
                    if kept is not None:
                        narrowed[p] = kept
                    progress = True
                    break
    for index in order:
        if index not in frames:
            frames[index] = ctx.snapshot(node.parts[index], sides[index])  # whole: no reduction to pass on


def _filtered(node: Node) -> bool:
    """Whether `node` filters its input's rows: a partner read first narrows the change batch."""
    return isinstance(node, (Filter, SemiJoin)) or any(_filtered(child) for child in node.inputs)


def _semi_joined(rows, a: str, partner, b: str):
    """Of an input's Arrow `rows`, those whose `a` is one of the partner's values of `b`: in an
    inner join a row without a partner yields nothing, so the inputs read after it need only the
    keys of the rows that remain (TPC-H Q9: lineitem's changes keep about one part in eighteen,
    `p_name LIKE '%green%'`, before partsupp and orders are read for them). None where either
    side is not on the driver or their types do not compare in Arrow."""
    if rows is None or partner is None:
        return None
    try:
        found = pc.is_in(rows.column(a), value_set=pc.unique(partner.column(b)).cast(rows.schema.field(a).type))
    except (KeyError, pa.ArrowException):
        return None
    return rows.filter(pc.fill_null(found, False))


def _driver_keys(values: list | tuple) -> tuple | None:
    """The batch's key values as the driver read takes them, or None for a (min, max) range."""
    return tuple(values) if isinstance(values, list) else None


def restrict_partners(node, ctx, start: int, change: DataFrame, sides: dict[int, str]) -> dict[int, DataFrame]:
    """The term's inputs by position (`change` at `start`, every other input j as of `sides[j]`),
    each co-generator the plan marked for `start` read for the batch's keys only: on the driver
    where it can be, else filtered to the keys' ranges. An input read on the driver is never
    opened through Spark (a time-travel read rebuilds the version's snapshot from the Delta log
    before any job)."""
    frames = {start: change}
    pairs = [(a, j, b) for i, a, j, b in node.restrict if i == start and j in sides]
    keys = {}
    if pairs:
        columns = sorted({a for a, _, _ in pairs})
        keys = ctx.memo(node.parts[start], "restrict_keys:" + ",".join(columns), lambda: _keys(change, columns, ctx.rows_on_driver(change)))
    types = {f.name: f.dataType for f in change.schema.fields}
    surviving = held = ctx.rows_on_driver(change)
    for a, j, b in sorted(pairs, key=lambda pair: not _filtered(node.parts[pair[1]])):
        values = _driver_keys(keys[a])
        if j in frames or values is None or a not in types:
            continue
        if surviving is not None and surviving.num_rows < held.num_rows:
            narrowed = _values_on_driver(surviving, a)
            values = tuple(narrowed[0]) if narrowed is not None else values
        read = restricted_snapshot(ctx, node.parts[j], sides[j], b, (values, False))
        if read is not None and comparable(types[a], read.schema[b].dataType):
            frames[j] = read  # only the rows of some keys; the join matches the rest exactly
            surviving = _semi_joined(surviving, a, ctx.rows_on_driver(read), b)
    read = set(frames)
    # further inputs read for the values of the inputs read so far (the change: of its rows that remain)
    reduce_partners(ctx, node, start, frames, {j for j in frames if ctx.rows_on_driver(frames[j]) is not None}, sides,
            held_only=True, narrowed={start: surviving} if surviving is not None else None)
    filtered = set(frames) - read - {j for j in frames if ctx.rows_on_driver(frames[j]) is not None}
    for a, j, b in pairs:
        if j in filtered and ctx.rows_on_driver(frames[j]) is None:  # a local relation skips no files
            target = {f.name: f.dataType for f in frames[j].schema.fields}
            if b in target and a in types and comparable(types[a], target[b]):
                frames[j] = frames[j].filter(_condition(b, keys[a]))
    return frames
