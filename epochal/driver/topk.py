"""Top-k and use-count arithmetic on the driver, in Arrow, for inputs held there exactly.

A top-k over a small maintained input (an Integrate node's use counts, an aggregate's state) is a
sort of a few thousand rows. Through Spark it cost a local checkpoint, a sort job per side and the
jobs reading and reducing the use-count table (TPC-H Q2: Catalyst's planning and about ten jobs a
step, for a few thousand rows). Here it is pyarrow's sort over the rows delta-rs read.

Arrow orders only what it orders as Spark does: integers, strings of the binary collation, dates,
decimals and booleans (arrow_rows.key_type). Floating point (NaN, -0.0) and timestamps are
Spark's (None).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from ..arrow_rows import key_type
from ..graph import WEIGHT


def orderable(schema: StructType) -> bool:
    """Whether Arrow orders and matches every column of `schema` as Spark does."""
    return all(key_type(field.dataType) for field in schema.fields)


def top_rows(rows: pa.Table, order: list[tuple[str, bool, bool]], limit: int) -> pa.Table:
    """The first `limit` rows of `rows` by `order` ((column, descending, nulls first)), ties
    broken by every column ascending with NULLs first (topk.ordering). Each key's NULLs are
    placed by a flag column sorted before it, as Arrow places NULLs once for every key."""
    keys = list(order) + [(name, False, True) for name in rows.column_names]
    flags, sort_keys = [], []
    for i, (name, descending, nulls_first) in enumerate(keys):
        flag = f"__null{i}"
        flags.append((flag, pc.is_null(rows.column(name))))
        sort_keys.append((flag, "descending" if nulls_first else "ascending"))
        sort_keys.append((name, "descending" if descending else "ascending"))
    keyed = rows
    for flag, values in flags:
        keyed = keyed.append_column(flag, values)
    if keyed.num_rows == 0:
        return rows
    indices = pc.sort_indices(keyed, sort_keys=sort_keys)
    return rows.take(indices.slice(0, limit))


def expanded(counts: pa.Table, count: str) -> pa.Table:
    """Each row of `counts` (columns and a use count `count`) repeated `count` times, without
    `count`: the multiset the use counts stand for."""
    times = counts.column(count).to_numpy(zero_copy_only=False)
    indices = np.repeat(np.arange(counts.num_rows, dtype=np.int64), np.maximum(times, 0))
    return counts.drop_columns([count]).take(pa.array(indices))


def weighted_difference(new: pa.Table, old: pa.Table) -> pa.Table:
    """`new` with weight +1 and `old` with weight -1, one table (unconsolidated)."""
    plus = new.append_column(WEIGHT, pa.array(np.ones(new.num_rows, dtype=np.int64)))
    minus = old.cast(new.schema).append_column(WEIGHT, pa.array(-np.ones(old.num_rows, dtype=np.int64)))
    return pa.concat_tables([plus, minus])
