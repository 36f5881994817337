"""Key-restricted co-generator reads, at run time (the plan side is optimize/restrict_cogenerators).

In the join term that starts from input i's change batch, input j can only contribute rows whose
column b equals some value of a in the batch (`Join.restrict`). The batch's distinct values are
collected (one small job per changed input, on its persisted batch) and turned into a filter on
input j's read that Delta's data skipping understands: an OR of at most MAX_RANGES value ranges,
split where the sorted values have their widest gaps. Measured on Delta 4.4: an IN list skips no
files at all (even with two values; Parquet row groups skip only for ten values or fewer), while
an OR of ranges skips every file whose min/max statistics miss all ranges. The filter is a superset
of the matching rows; the join itself stays exact.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, IntegralType

from ..changes import quoted

MAX_RANGES = 32  # ranges in one filter: each is tested against every file's statistics
MAX_KEYS = 200_000  # distinct values collected to the driver; beyond, one range [min, max]


def _comparable(a: DataType, b: DataType) -> bool:
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


def _keys(change: DataFrame, columns: list[str]) -> dict[str, list | tuple]:
    """Per column, its sorted distinct non-NULL values in the batch, or (min, max) when more than
    MAX_KEYS (one job for all columns; a second only when some column has too many values)."""
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


def restrict_partners(node, ctx, start: int, frames: dict[int, DataFrame]) -> dict[int, DataFrame]:
    """`frames` (the term's inputs by position, frames[start] the change batch) with every
    co-generator the plan marked for `start` filtered to the batch's key ranges."""
    pairs = [(a, j, b) for i, a, j, b in node.restrict if i == start and j in frames]
    if not pairs:
        return frames
    change = frames[start]
    columns = sorted({a for a, _, _ in pairs})
    keys = ctx.memo(node.parts[start], "restrict_keys:" + ",".join(columns), lambda: _keys(change, columns))
    types = {f.name: f.dataType for f in change.schema.fields}
    restricted = dict(frames)
    for a, j, b in pairs:
        target = {f.name: f.dataType for f in restricted[j].schema.fields}
        if b in target and a in types and _comparable(types[a], target[b]):
            restricted[j] = restricted[j].filter(_condition(b, keys[a]))
    return restricted
