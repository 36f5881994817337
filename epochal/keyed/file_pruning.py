"""Which files and row groups of a Delta version may hold some key values, from the statistics
Delta keeps per file and Parquet keeps per row group: the pruning under every keyed read on the
driver (the shared reads of a refresh and the arrangements)."""

from __future__ import annotations

import bisect
import collections
import threading
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from ..arrow_rows import key_kind
from .local_copies import expected_rows, integers_and_nulls, one_of, ranges_holding


def _admits(keys: list, smallest, largest) -> bool:
    """Whether a [smallest, largest] range (either end None: unknown) holds one of the sorted `keys`."""
    if smallest is None or largest is None:
        return True
    at = bisect.bisect_left(keys, smallest)
    return at < len(keys) and keys[at] <= largest


class FileBounds:
    """A Parquet data file's fragment with its footer read, and its row groups' statistics of
    one column as arrays, kept across reads: a keyed read of an arrangement otherwise parsed
    every file's footer and looped over tens of thousands of row groups' statistics in Python on
    every read, a large share of the read. A Delta data file is never rewritten in place and its
    name is unique within its table, so its path with its size (Delta's add action), or with its
    table's path, names its contents. Bounded by column chunks held (CACHED_CHUNKS)."""

    def __init__(self):
        self._files: collections.OrderedDict = collections.OrderedDict()
        self._chunks = 0
        self._guard = threading.Lock()

    def get(self, fragment, identity, column: str):
        """(fragment with its metadata, lows, highs, may hold NULL) for `column`, lows and highs
        as int64 (dates as days; a row group without statistics spans everything); None where
        the file has no such leaf column or its statistics are not integers or dates. `identity`
        (the file's size, or its table's path) with its path names its contents; None: not kept."""
        key = (fragment.path, identity, column) if identity is not None else None
        with self._guard:
            found = self._files.get(key) if key is not None else None
            if found is not None:
                self._files.move_to_end(key)
                return found[:-1]
        metadata = fragment.metadata
        leaf = next((j for j in range(metadata.num_columns) if metadata.schema.column(j).path == column), None)
        if leaf is None:
            return None
        count = metadata.num_row_groups
        lows = np.full(count, np.iinfo(np.int64).min, dtype=np.int64)
        highs = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
        nulls = np.ones(count, dtype=bool)
        for index in range(count):
            statistics = metadata.row_group(index).column(leaf).statistics
            if statistics is None:
                continue
            if statistics.has_min_max:
                low, high = _as_integer(statistics.min), _as_integer(statistics.max)
                if low is None or high is None:
                    return None
                lows[index], highs[index] = low, high
            nulls[index] = not statistics.has_null_count or statistics.null_count > 0
        found = (fragment, lows, highs, nulls)
        if key is None:
            return found
        with self._guard:
            self._files[key] = (*found, count * metadata.num_columns)
            self._chunks += count * metadata.num_columns
            while self._chunks > CACHED_CHUNKS and len(self._files) > 1:
                self._chunks -= self._files.popitem(last=False)[1][-1]
        return found


CACHED_CHUNKS = 2_000_000  # column chunks of cached footers (a few hundred bytes each)
FILE_BOUNDS = FileBounds()
EPOCH_DAY = date(1970, 1, 1)


def _as_integer(value) -> int | None:
    """A statistic as FileBounds holds it: an integer, or a date as days since 1970 (what
    date32 holds, so `as_integers` casts keys alike); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, date) and not isinstance(value, datetime):
        return (value - EPOCH_DAY).days
    return None


def as_integers(values: pa.Array) -> np.ndarray:
    """Sorted integer or date keys, none NULL, as int64 (dates as days since 1970), as FileBounds
    and the local copies' bounds hold them."""
    return integers_and_nulls(values)[0]


def row_groups_holding(fragment, column: str, keys: np.ndarray, nulls: bool, identity=None):
    """`fragment` cut to its row groups whose statistics of `column` admit one of `keys` (sorted
    int64, `as_integers`), or a NULL when `nulls`; None when it holds none; the fragment itself
    when it cannot tell."""
    found = FILE_BOUNDS.get(fragment, identity, column)
    if found is None:
        return fragment
    fragment, lows, highs, may_null = found
    admitted = ranges_holding(keys, lows, highs)
    if nulls:
        admitted |= may_null
    chosen = np.flatnonzero(admitted)
    if not len(chosen):
        return None
    return fragment if len(chosen) == len(lows) else fragment.subset(row_group_ids=chosen.tolist())


def expected_rows_in_row_groups(fragment, column: str, keys: np.ndarray, identity=None) -> float | None:
    """local_copies.expected_rows over the file's row groups' statistics of `column` (a file
    with no local copy yet: an arrangement's append of this epoch); None where it has none."""
    found = FILE_BOUNDS.get(fragment, identity, column)
    if found is None:
        return None
    fragment, lows, highs, _ = found
    counts = np.array([fragment.metadata.row_group(i).num_rows for i in range(len(lows))], dtype=np.int64)
    return expected_rows(keys, lows, highs, counts)


def key_span(fragment, column: str, identity=None) -> tuple[int, int, int] | None:
    """(lowest key, highest key, rows) of a Parquet file by its row groups' statistics of
    `column` (a row group without them spans every int64), as local_copies.dense weighs a read;
    None where it has none."""
    found = FILE_BOUNDS.get(fragment, identity, column)
    if found is None or not len(found[1]):
        return None
    fragment, lows, highs, _ = found
    return int(lows.min()), int(highs.max()), fragment.metadata.num_rows


def certain_rows_in_row_groups(fragment, column: str, keys: np.ndarray, identity=None) -> int:
    """How many of a Parquet file's rows surely hold one of `keys` (sorted int64): those of its
    row groups whose statistics of `column` are one of them, low and high, with no NULL (as
    local_copies.certain_rows tells from a copy's blocks); 0 where it has no such statistics."""
    found = FILE_BOUNDS.get(fragment, identity, column)
    if found is None or not len(keys):
        return 0
    fragment, lows, highs, may_null = found
    whole = np.flatnonzero((lows == highs) & one_of(keys, lows) & ~may_null)
    return sum(fragment.metadata.row_group(int(i)).num_rows for i in whole)


def files_holding(table, dataset, column: str, values: pa.Array, nulls: bool, row_groups: bool = True):
    """`dataset` cut to the files whose min/max statistics of `column` admit one of `values`
    (sorted), or a NULL when `nulls`, and within them (with `row_groups`) to the row groups whose
    statistics do (that reads each file's footer: not wanted where local copies, with bounds of
    their own, serve the files).
    pyarrow skips neither for an `isin` filter, and Delta keeps every file's statistics: changes
    to recent or old keys (an OLTP table's usual pattern) then read a few files instead of all,
    and a table sorted by the key in small row groups (a join's keyed state) is read for random
    keys in about (keys x row group) rows, at any size, several times faster than with `isin`
    alone (`python -m bench.keyed_reads` measures both).
    Only for integers and dates, whose statistics are exact (a string's are truncated); a file
    or row group without statistics is kept. No values and `nulls`: the files holding a NULL."""
    if key_kind(values.type) not in ("integer", "date") or not (len(values) or nulls):
        return dataset
    actions = table.get_add_actions(flatten=True)
    low, high, null_count = (f"min.{column}", f"max.{column}", f"null_count.{column}")
    if low not in actions.column_names or high not in actions.column_names:
        return dataset
    keys = sorted(values.to_pylist())
    kept = {}
    counts = actions.column(null_count).to_pylist() if null_count in actions.column_names \
        else [None] * actions.num_rows
    for path, size, smallest, largest, count in zip(
            actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(),
            actions.column(low).to_pylist(), actions.column(high).to_pylist(), counts):
        if _admits(keys, smallest, largest) or (nulls and count != 0):
            kept[path] = size
    fragments = list(dataset.get_fragments())
    chosen = [f for f in fragments if f.path in kept]
    if len(chosen) != len(kept):  # paths spelled otherwise (encoded): read every file
        chosen = fragments
    if not row_groups:
        cut = chosen
    else:
        cut = row_groups_cut(chosen, column, keys, values.type, nulls, kept)
    cut = [f for f in cut if f is not None]
    if len(cut) == len(fragments) and all(a is b for a, b in zip(cut, fragments)):
        return dataset
    return ds.FileSystemDataset(cut, dataset.schema, dataset.format, dataset.filesystem)


def row_groups_cut(chosen: list, column: str, keys: list, kind: pa.DataType, nulls: bool, sizes: dict) -> list:
    """Each of `chosen` cut by `row_groups_holding` (None: holds none), or all of them as they
    are where they are not Parquet fragments or their statistics are unlike."""
    try:
        integers = as_integers(pa.array(keys, kind))
        return [row_groups_holding(f, column, integers, nulls, sizes.get(f.path)) for f in chosen]
    except (AttributeError, TypeError, pa.ArrowException):  # not Parquet fragments, or unlike statistics
        return chosen
