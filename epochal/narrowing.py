"""Narrowing a join term's partners to the keys that can match (semi-join reduction), at run time;
the plan side is planning/optimize/restrict_cogenerators, which marks the pairs to start from
(`Join.restrict`).

In the join term that starts from input i's change batch, input j can only contribute rows whose
column b equals some value of a in the batch. `narrow_partners` is the one mechanism: it reads
each partner for the values of the inputs read so far, hop by hop, seeded with the pairs the plan
marks. A read is on the driver where it can be (`restricted_snapshot`: each operator's
`held_snapshot`, a scan's through keyed.shared_reads.SharedReads, about one scan of each version
and key column for the whole refresh, shared by every term and table), and each read narrows the
rows of the input its keys came from, so later reads take fewer keys. Where a marked partner
cannot be read on the driver, its Spark read is filtered to the keys' ranges instead: an OR of at
most MAX_RANGES value ranges, split where the sorted values have their widest gaps, which Delta's
data skipping understands (on Delta 4.4 an IN list skips no files at all, while an OR of ranges
skips every file whose min/max statistics miss all ranges). A scalar subquery's term, where the
value is projected away above, reads its partner only for the span between the old value and the
new (`scalar_spans`). Every read is a superset of the matching rows; the join itself stays
exact. Affected-key recomputes (rules/keyed.py) read their inputs the same way.
"""

from __future__ import annotations

import logging
import math
from datetime import date, datetime
from decimal import Decimal
from functools import reduce
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    IntegralType,
    LongType,
    MapType,
    ShortType,
    StructType,
)
from sqlglot import exp

from .arrow_rows import column_first_values, exact_rows, held_rows, key_kind, key_type
from .changes import quoted
from .graph import WEIGHT, Filter, Join, Node, SemiJoin, columns_in, conjuncts, join_order, single_row, walk

log = logging.getLogger("epochal")

MAX_RANGES = 32  # ranges in one filter: each is tested against every file's statistics
MAX_KEYS = 200_000  # distinct values collected to the driver; beyond, one range [min, max]
OUTSIZED = 10  # a join's read expected to take this many times another's rows waits for it
SMALL_READ = 1_000  # rows a read takes at no cost worth reordering for


def comparable(a: DataType, b: DataType) -> bool:
    """Whether a range over a's values filters b exactly like the join's equality does."""
    return a == b or (isinstance(a, IntegralType) and isinstance(b, IntegralType))


def prunable(kind: DataType) -> bool:
    """Whether a read may be filtered to key ranges on a column of this type. Not FLOAT or DOUBLE:
    Spark prunes by the files' min/max statistics, and arrow-based writers (delta-rs, pandas,
    polars) leave NaN out of them while Spark orders NaN above every number, so the rows whose
    key is NaN would be skipped (tests/test_float_statistics.py). Not a struct, array or map:
    files keep no statistics of a whole one to prune by, Spark makes no literal of a struct,
    and Python orders them otherwise than Spark (or not at all, around NULL fields)."""
    return not isinstance(kind, (FloatType, DoubleType, StructType, ArrayType, MapType))


def spark_order(value):
    """A sort key ordering values as Spark does where Python would not: NaN above every number
    (Python's sort is undefined around NaN, and a range between misordered values misses some)."""
    return (1, 0.0) if isinstance(value, float) and math.isnan(value) else (0, value)


def _gap(low, high) -> float:
    if isinstance(low, float) and isinstance(high, float) and (math.isnan(low) or math.isnan(high)):
        return math.inf  # NaN apart from the numbers: a range of its own
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


def values_on_driver(rows, column: str) -> tuple[list, bool] | None:
    """`column`'s sorted distinct non-NULL values in Arrow `rows`, and whether it holds NULL; None
    for a type whose values Spark and Python may not order and compare alike."""
    array = rows.column(column)
    if key_kind(array.type) not in ("integer", "string", "date", "decimal", "boolean"):
        return None
    found = column_first_values(array)
    return None if found is None else (list(found[0]), found[1])


def batch_keys(change: DataFrame, columns: list[str], rows=None) -> dict[str, list | tuple]:
    """Per column, its sorted distinct non-NULL values in the batch, or (min, max) when more than
    MAX_KEYS (one job for all columns; a second only when some column has too many values). With
    `rows` (Arrow rows holding every row of the batch, arrow_rows.held_rows) the values are
    taken there, without a job: a superset where Spark filters the batch further, which is as
    good (every use of the keys is a superset of the matching rows, the join itself is exact)."""
    if rows is not None:
        found = {c: values_on_driver(rows, c) for c in columns}
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


def ranges_filter(column: str, keys: list | tuple):
    """A filter keeping the rows whose `column` is in the keys' ranges (`keys`: sorted values, or
    a (min, max) range), which Delta's file statistics can skip on."""
    spans = [keys] if isinstance(keys, tuple) else ranges(keys)
    if not spans:
        return F.lit(False)  # the batch holds only NULLs: nothing can match
    col = F.col(quoted(column))
    parts = [col == F.lit(low) if low == high else col.between(F.lit(low), F.lit(high)) for low, high in spans]
    return reduce(lambda x, y: x | y, parts)


def restricted_snapshot(ctx, node: Node, side: str, column: str, keys) -> DataFrame | None:
    """`node` as of `side`, holding at least its rows whose `column` is one of the keys, read on
    the driver and shared by the refresh's steps: each operator's `held_snapshot` (a scan's
    reads the keys' rows; a filter, a projection, a join, a semi-join or an aggregate reads its
    inputs' for them); None where it cannot be (then read it through Spark). `keys` is
    (values, nulls), or a function giving it, called only when the driver read is possible:
    `values` sorted, distinct and non-NULL, `nulls` whether the rows where `column` is NULL are
    wanted too (None: too many keys)."""
    if ctx.reads is None:
        return None
    return ctx.rule_for(node).held_snapshot(node, ctx, side, column, keys)


def expected_rows(ctx, node: Node, side: str, column: str, keys: tuple[tuple, bool]) -> float | None:
    """About how many rows restricted_snapshot would read for `keys` ((values, nulls)), told
    before reading (an arrangement's local copies' block bounds); None where no operator below
    can tell."""
    if ctx.reads is None:
        return None
    return ctx.rule_for(node).expected_rows(node, ctx, side, column, keys)


def distinct_values(frame: DataFrame, column: str, rows=None) -> tuple[tuple, bool] | None:
    """`column`'s distinct non-NULL values in `frame`, sorted, and whether it holds NULL (one
    small job, or none with `rows`, Arrow rows holding every row of `frame`: then a superset);
    None when more than MAX_KEYS (too many for a driver read)."""
    found = values_on_driver(rows, column) if rows is not None else None
    if found is not None:
        return None if len(found[0]) > MAX_KEYS else (tuple(found[0]), found[1])
    values = [row[0] for row in frame.select(F.col(quoted(column))).distinct().limit(MAX_KEYS + 2).collect()]
    present = [v for v in values if v is not None]
    return None if len(present) > MAX_KEYS else (tuple(sorted(present, key=spark_order)), len(present) < len(values))


def matching_keys(ctx, frame: DataFrame, column: str, nulls: bool, rows=None) -> tuple[tuple, bool] | None:
    """The keys to read a partner for: `column`'s values in `frame` (or in `rows`, Arrow rows
    holding every row of it that can join), with the partner's NULLs when `nulls` (a NULL-safe
    correlation matches them)."""
    found = distinct_values(frame, column, rows if rows is not None else held_rows(frame))
    return None if found is None else (found[0], nulls)


def outsized_reads(ctx, node: Join, reads: list[tuple[int, str, tuple[tuple, bool] | None]],
                   sides: dict[int, str]) -> list[bool]:
    """Which of the reads a join's reduction could make now ((input, its column, the keys to read
    it for), in the join's order) are expected (`expected_rows`) to take more than OUTSIZED
    times the rows of the smallest read known, and at least OUTSIZED x SMALL_READ rows: those
    wait, so the read made first narrows the keys of the others. A read no estimate tells of
    neither waits nor makes others wait, so the join's order stands where nothing is known. TPC-H
    Q5's supplier change read every customer of its suppliers' nations (1.5 million at scale 10,
    25 keys) before the line items of its suppliers (60,000), which reach the customers that
    join by c_custkey (a few thousand)."""
    if len(reads) < 2:
        return [False] * len(reads)
    estimates = [expected_rows(ctx, node.parts[index], sides[index], column, keys) if keys is not None else None
                 for index, column, keys in reads]
    known = [e for e in estimates if e is not None]
    if not known:
        return [False] * len(reads)
    bound = OUTSIZED * max(min(known), SMALL_READ)
    outsized = [e is not None and e > bound for e in estimates]
    if any(outsized):
        log.debug("join reads waiting for smaller ones: %s", ", ".join(
            f"{node.parts[index].describe()} by {column}: about {e:.0f} rows"
            for (index, column, _), e, late in zip(reads, estimates, outsized) if late))
    return outsized


def _keys_held(rows, column: str) -> tuple[tuple, bool] | None:
    """The values of `column` in Arrow `rows` to read a partner for, or None (not held, or too many)."""
    found = values_on_driver(rows, column) if rows is not None else None
    return None if found is None or len(found[0]) > MAX_KEYS else (tuple(found[0]), False)


def semi_joined(rows, a: str, partner, b: str):
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


_DIGITS = {ByteType: 3, ShortType: 5, IntegerType: 10, LongType: 20}  # Spark's DecimalType.forType
_COMPARISONS = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ)


def exactly_ordered(a: DataType, b: DataType) -> bool:
    """Whether Spark compares values of types a and b exactly as numbers or dates (integers, or
    decimals whose common type keeps every digit: past 38 Spark rounds the finer operand; doubles
    with doubles or with integers of at most 32 bits)."""
    if isinstance(a, DateType) and isinstance(b, DateType):
        return True
    if {type(a), type(b)} <= {DoubleType, IntegerType, ShortType, ByteType}:
        return True  # an INT is exact as a DOUBLE; scalar_spans refuses NaN and infinities
    digits = []
    for kind in (a, b):
        if isinstance(kind, DecimalType):
            digits.append((kind.precision, kind.scale))
        elif type(kind) in _DIGITS:
            digits.append((_DIGITS[type(kind)], 0))
        else:
            return False
    (p1, s1), (p2, s2) = digits
    return max(s1, s2) + max(p1 - s1, p2 - s2) <= 38


def scalar_spans(node: Join, start: int, change: DataFrame) -> dict[int, tuple[str, str, object, object]]:
    """For the join term of a scalar subquery's change (`start`, a single-row input whose old and
    new rows `change` holds exactly on the driver, weights -1 and +1) whose value the operators
    above project away (`mark_dropped_scalars`): the partner j, its column, the scalar's, and the
    span [min(old, new), max(old, new)] outside which j's rows need not be read.

    With the scalar compared by one conjunct `x op s` (op one of > >= < <= =), a partner row whose
    x compares alike with the old and the new value joins both or neither; once s is projected
    away its two copies are equal rows of weights -1 and +1, and cancel (TPC-H Q22: the customers
    whose balance lies between the old and the new average, out of 42,000). Any superset of the
    rows in the span gives the same consolidated change. Empty where the shape differs, a value
    is NULL (a NULL compares with nothing) or not finite, or the types are not ordered exactly alike."""
    rows = exact_rows(change)
    if rows is None or rows.num_rows != 2 or WEIGHT not in rows.column_names or \
            sorted(rows.column(WEIGHT).to_pylist()) != [-1, 1]:
        return {}
    mine = set(node.parts[start].columns)
    touching = [c for c in conjuncts(node.condition) if columns_in(c) & mine]
    if len(touching) != 1 or not isinstance(touching[0], _COMPARISONS):
        return {}
    left, right = touching[0].left, touching[0].right
    if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
        return {}
    scalar, other = (left, right) if left.name in mine else (right, left)
    owners = [j for j, part in enumerate(node.parts) if j != start and other.name in part.columns]
    if other.name in mine or len(owners) != 1 or scalar.name not in rows.column_names:
        return {}
    values = rows.column(scalar.name).to_pylist()
    if any(v is None or (isinstance(v, float) and not math.isfinite(v)) for v in values):
        return {}
    try:
        low, high = min(values), max(values)
    except TypeError:
        return {}
    return {owners[0]: (other.name, scalar.name, low, high)}


DROPPED_SCALARS = "dropped scalars"


def mark_dropped_scalars(ctx, node: Node, kept: set[str]) -> None:
    """Note, for the join below `node` (a projection keeping the columns `kept`, over filters),
    the changed single-row inputs whose columns nothing above reads before the projection drops
    them: their join terms may read partners for scalar_spans. Only where the join and the
    filters have no other reader (a plan may share a node), whose change would keep the rows."""
    readers = ctx.memo(ctx.plan, "readers", lambda: _readers(ctx.plan))
    below, read = node.input, set(kept)
    while isinstance(below, Filter):
        if readers.get(id(below), 0) != 1:
            return
        read |= columns_in(below.predicate)
        below = below.input
    if not isinstance(below, Join) or readers.get(id(below), 0) != 1:
        return
    ctx.scratch[(id(below), DROPPED_SCALARS)] = frozenset(
        i for i, part in enumerate(below.parts)
        if single_row(part) and ctx.changed(part) and not read & set(part.columns))


def dropped_scalars(ctx, node: Join) -> frozenset[int]:
    return ctx.scratch.get((id(node), DROPPED_SCALARS), frozenset())


def _readers(root: Node) -> dict[int, int]:
    """How many times each node is an input of another (a shared node more than once)."""
    counts: dict[int, int] = {}
    for node in walk(root):
        for child in node.inputs:
            counts[id(child)] = counts.get(id(child), 0) + 1
    return counts


def _held_count(rows) -> float:
    return rows.num_rows if rows is not None else math.inf


def _filters(node: Node) -> bool:
    """Whether `node` filters its input's rows: a partner read first narrows the change batch."""
    return isinstance(node, (Filter, SemiJoin)) or any(_filters(child) for child in node.inputs)


def narrow_partners(ctx, node: Join, start: int, frames: dict[int, DataFrame], sides: dict[int, str],
                    marked: Sequence[tuple[str, int, str]] = (), held_only: bool = False,
                    spans: dict[int, tuple[str, str, object, object]] | None = None) -> dict[int, DataFrame]:
    """Fill `frames` (by input position, holding `start`'s frame) with every other input j of
    `node` as of `sides[j]`, each read for the keys it can match where it can be.

    First the pairs the plan marks for a change batch at `start` (`marked`, (a, j, b): j's column
    b equals the batch's a), partners that filter their rows first: the batch's keys are collected
    once for all of them (on the driver where its rows are held there, else in one Spark job), and
    j is read on the driver for those of the batch's rows that still have a partner. Then hop by
    hop, in the join's order from `start`: each input not read yet, for the values its equality
    conjuncts can match in an input read so far (again while a pass reads one: a read refused for
    too many rows through one partner may succeed through another read later). A read expected
    to take far more rows than another one possible at that point waits for it
    (`outsized_reads`). `held_only`: hop
    only from inputs whose rows are on the driver (no Spark job to collect their values). Each read
    narrows the Arrow rows of the input its keys came from to those it matches (`semi_joined`).
    What cannot be read for keys is read whole; a marked partner read whole by Spark is filtered
    to the batch's key ranges (`ranges_filter`), a local relation being one no file skipping helps.
    `spans` (scalar_spans): partners read on the driver for a span of one column's values, before
    the hops, which may then start from them."""
    narrowed: dict[int, object] = {}

    def rows(index: int):
        return narrowed[index] if index in narrowed else held_rows(frames[index])

    def read(index: int, column: str, keys, partner: int, partner_column: str) -> bool:
        frame = restricted_snapshot(ctx, node.parts[index], sides[index], column, keys)
        if frame is None or not comparable(frames[partner].schema[partner_column].dataType, frame.schema[column].dataType):
            return False
        frames[index] = frame
        kept = semi_joined(rows(partner), partner_column, held_rows(frame), column)
        if kept is not None:
            narrowed[partner] = kept
        return True

    change = frames[start]
    marked = [(a, j, b) for a, j, b in marked if j in sides and a in change.columns] if marked else []
    keys: dict[str, list | tuple] = {}
    if marked:
        columns = sorted({a for a, _, _ in marked})
        keys = ctx.memo(node.parts[start], "restrict_keys:" + ",".join(columns),
                        lambda: batch_keys(change, columns, held_rows(change)))
    held = held_rows(change)
    marked = sorted(marked, key=lambda pair: not _filters(node.parts[pair[1]]))
    if held is not None:  # a read expected far larger than another is left to the hops
        late = outsized_reads(ctx, node, [(j, b, (tuple(keys[a]), False) if isinstance(keys[a], list) else None)
                                          for a, j, b in marked], sides)
        early = [pair for pair, wait in zip(marked, late) if not wait]
    else:
        early = marked
    for a, j, b in early:
        if j in frames or not isinstance(keys[a], list):  # a (min, max) range: too many keys to read for
            continue
        values = tuple(keys[a])
        surviving = narrowed.get(start)
        if surviving is not None and surviving.num_rows < held.num_rows:
            remaining = values_on_driver(surviving, a)
            values = tuple(remaining[0]) if remaining is not None else values
        read(j, b, (values, False), start, a)
    read_for_marks = set(frames)

    def hops(index: int, reduced: set[int]) -> list[tuple[int, str, str]]:
        """(partner read so far, its column, index's column) for each equality reaching `index`,
        partners holding fewer rows on the driver first: fewer values to read for, and a read
        more likely to fit (TPC-H Q5's supplier change reaches orders through 100,000 customers
        of its nations, refused for its rows, and through 6,000 of its line items)."""
        found = list(_hops(index, reduced))
        return sorted(found, key=lambda hop: _held_count(rows(hop[0])))

    def _hops(index: int, reduced: set[int]):
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
                    if x in node.parts[p].columns and (not held_only or held_rows(frames[p]) is not None):
                        yield p, x, y

    def take_held_whole() -> bool:
        """An input no read for keys reaches, but held whole on the driver (a small aggregate's
        every group, joined on a value column: TPC-H Q15's suppliers of the maximum revenue),
        taken before the hops end and narrowed there to the rows matching an input read so far,
        so the inputs joined through it are read for those rows' keys, not whole."""
        for index in [i for i in order if i not in frames]:
            for p, x, y in hops(index, reduced):
                whole = ctx.snapshot(node.parts[index], sides[index])
                whole_rows = held_rows(whole)
                if whole_rows is None:
                    break
                mine, theirs = whole.schema[y].dataType, frames[p].schema[x].dataType
                if not (mine == theirs and key_type(mine)):
                    continue
                kept = semi_joined(whole_rows, y, rows(p), x)
                if kept is None:
                    continue
                frames[index], narrowed[index] = whole, kept
                reduced.add(index)
                return True
        return False

    for j, (column, scalar, low, high) in (spans or {}).items():
        if j in frames:
            continue
        frame = ctx.rule_for(node.parts[j]).held_range(node.parts[j], ctx, sides[j], column, low, high)
        if frame is not None and exactly_ordered(change.schema[scalar].dataType, frame.schema[column].dataType):
            frames[j] = frame
    reduced = {j for j in frames if not held_only or held_rows(frames[j]) is not None}
    order = sorted((index for index, _ in join_order(node, start) if index >= 0 and index not in frames),
                   key=lambda index: not _filters(node.parts[index]))
    tried: set[tuple] = set()
    while True:
        candidates = [(index, *hop) for index in order if index not in frames
                      for hop in hops(index, reduced) if (index, *hop) not in tried]
        if not candidates:
            if take_held_whole():
                continue
            break
        if len(candidates) > 1:  # a lone read is made whatever its size: no partner's keys listed for it
            late = outsized_reads(ctx, node, [(index, y, _keys_held(rows(p), x)) for index, p, x, y in candidates], sides)
            candidates = [c for c, wait in zip(candidates, late) if not wait]
        index, p, x, y = candidates[0]
        tried.add((index, p, x, y))
        if read(index, y, lambda p=p, x=x: matching_keys(ctx, frames[p], x, False, rows(p)), p, x):
            reduced.add(index)
    for index in order:
        if index not in frames:
            frames[index] = ctx.snapshot(node.parts[index], sides[index])  # whole: no reduction to pass on
    types = {f.name: f.dataType for f in change.schema.fields} if marked else {}
    for a, j, b in marked:
        if j not in read_for_marks and held_rows(frames[j]) is None:
            target = {f.name: f.dataType for f in frames[j].schema.fields}
            if b in target and comparable(types[a], target[b]) and prunable(target[b]):
                frames[j] = frames[j].filter(ranges_filter(b, keys[a]))
    return frames
