"""Local copies: each arrangement data file that keyed reads use, copied once to the driver's disk
as an Arrow IPC file (a few large record batches, their fixed-width columns and short strings
packed row by row: packed_rows.py), with the key bounds of every block of BATCH_ROWS rows (and its rows:
`certain_rows` refuses a read too large before it is made) beside it.

A keyed read of Parquet decodes every row group that may hold one of its keys, each column chunk of
it, at a fixed cost a chunk whatever its rows (so smaller row groups are no faster). Random keys
touch a row group each, so that read grows with the table. A copy is memory-mapped and not decoded:
a read gathers the key values of the blocks whose bounds admit a key, and takes the rows that hold
one (`python -m bench.arrangement_reads`; figures in bench/RESULTS.md). The blocks are ranges of
rows, not record batches: random keys admit most blocks of a large file, and a batch each cost a
call per block (`python -m bench.step_profile 1 $(seq 1 22) --together --by-self` showed those
calls and the copying of every admitted row as the largest cost of a TPC-H epoch's steps). Like
Databricks' disk cache, a copy is derived from an immutable file (a Delta data file is never
rewritten, so its path names its contents): a missing copy is made again by the next dense read that
needs it, a damaged one is deleted and its file read as Parquet, the copies are bounded by
COPY_BYTES on disk and by the free disk they leave (at most SHARE_OF_FREE of their bytes and the
free disk together, checked as each copy is made and at the start of every refresh, `give_way`: the
folder may share its disk with the warehouse, whose writes must not fail for a cache: in TPC-H at
scale 10 the copies took 31 GB after the first epoch, and at a tenth of the orders changed a
source's MERGE failed for want of disk in the third epoch, bench/RESULTS.md), the least recently
read dropped first, and an arrangement's rebuild deletes the copies of the files it replaced
(`prune`). A new copy does not displace those read densely in the latest PROTECTED_REFRESHES
refreshes, nor those made in the latest GRACE_REFRESHES and worth as much as it (their start times
are kept in the folder, for the next process; `worth`, the keys a file spans a row, weighs the
copies no read has weighed yet): where the rest would not make room for it, it is not made (counted
`over_budget`, its file read as Parquet until the next refresh). Keyed reads of random keys touch a
different share of an arrangement's files every epoch, and all of them within a few; once they
outgrow the budget, least-recently-read eviction drops copies the next epochs read, and their steps
make them again, a whole file each (a day at scale 10: 14 to 27 copies made an epoch, TPC-H Q17's
step many times slower; protecting the last two refreshes only, 11 evicted and 19 made in the
second hourly epoch, bench/RESULTS.md). Kept out this way, the files that do not fit are read as
Parquet, the row groups holding a key only, and the rest stay, as in a scan-resistant cache; a copy
unread for a day of hourly refreshes (an arrangement no table reads any more) gives way to new
ones. Only the refresh's start gives way past them, for the free disk the warehouse needs.
Which reads count is what a copy buys (`dense`): a read with a key per DENSE_ROWS of a file's rows
or more decodes much of the file as Parquet, and makes the copy and counts as its read (its
mtime); a sparser one (TPC-H's few changed suppliers looked up in lineitem by l_suppkey, a
row group or two a key) reads the copy if there is one and else those row groups, and neither
makes a copy nor keeps one. So the copies that an arrangement's build made ahead of its reads
(its bounds' mtime says when) and that no dense read has used since give way after
GRACE_REFRESHES: at scale 10 the copies of lineitem by l_suppkey and by l_partkey, read for a
few dozen keys an epoch, took 16 of the 28 GiB the copies had, and orders by o_orderkey, read
for 18,000 keys an epoch, was kept out for them (bench/RESULTS.md).
Each arrangement's copies live in a folder of their own. A copy and its bounds are each written
under a temporary name, flushed to disk and renamed, bounds first, so a
crash leaves either both, or no copy (an orphaned bounds file is overwritten by the next copy). A
copy is not made where less than MIN_FREE_BYTES would stay free (the folder may share its disk with
the warehouse), and one that failed is tried again after RETRY_SECONDS; each such fallback to
Parquet is counted (`take_counts`) for the refresh's reports.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import hashlib
import logging
import mmap
import os
import shutil
import threading
import time
import uuid
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .. import faults
from ..storage.warehouse import within
from .packed_rows import PACKED, Layout, offsets_dtype, packable, row_bytes, widest

log = logging.getLogger("epochal")

BATCH_ROWS = 256  # rows per block of bounds: a random key's read looks at about this many rows
COPY_BATCH_ROWS = 1 << 20  # a copy's record batches: row groups (an arrangement's are small) joined up to this many rows
FORMAT = "packed rows, short strings"  # in a copy's name: no engine reads copies of another layout (prune drops them)
COPY_BYTES = 32 << 30  # the copies' disk budget, per directory
ABANDONED_SECONDS = 3_600  # a half-written copy this old was left by a process that died
CACHED_BOUNDS = 4_096  # copies whose bounds are kept in memory (32 bytes a batch each)
RETRY_SECONDS = 600  # a file whose copy failed is read as Parquet this long, then copied again
MIN_FREE_BYTES = 2 << 30  # free disk a copy must leave (the folder may share its disk with the warehouse)
SHARE_OF_FREE = 0.5  # the copies take at most this share of their bytes and the free disk together
PROTECTED_REFRESHES = 24  # a new copy does not displace copies read densely since the start of this many refreshes
GRACE_REFRESHES = 2  # ... nor copies made since the start of this many, read densely or not yet
DENSE_ROWS = 16_000  # a read with a key per this many of a file's rows makes its copy (`dense`)
REFRESH_STARTS = "refresh_starts"  # in the folder: the latest refreshes' start times, one a line
_INT64 = np.iinfo(np.int64)


_this_thread = threading.local()


def making_seconds() -> float:
    """The seconds the calling thread has spent making local copies, or waiting for the thread
    making one it needs, since it began: a cache fill for later refreshes, which the cost model
    does not count against a step's budget (epochal.protocol.cost, "Budget")."""
    return getattr(_this_thread, "making_seconds", 0.0)


def integers_and_nulls(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """`column` (integers or dates) as int64, dates as days since 1970; and where it is NULL."""
    if pa.types.is_date(column.type):
        column = column.cast(pa.date32()).cast(pa.int32())
    column = column.cast(pa.int64())
    missing = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    values = np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, missing


def _joined_groups(metadata, rows: int) -> list[list[int]]:
    """The file's non-empty row groups, in order, joined into runs of about `rows` rows: one
    decode call a run, not a call per row group (an arrangement's row groups are small)."""
    runs, run, held = [], [], 0
    for group in range(metadata.num_row_groups):
        size = metadata.row_group(group).num_rows
        if not size:
            continue
        run.append(group)
        held += size
        if held >= rows:
            runs.append(run)
            run, held = [], 0
    return runs + [run] if run else runs


def _block_starts(metadata, groups: list[int], block_rows: int) -> np.ndarray:
    """Where each block of bounds starts among the rows of `groups` read together: every
    `block_rows` rows from each row group's first, so no block spans two row groups."""
    sizes = np.array([metadata.row_group(group).num_rows for group in groups], np.int64)
    firsts = np.cumsum(sizes) - sizes
    return np.concatenate([first + np.arange(0, size, block_rows) for first, size in zip(firsts, sizes)])


def _rows_of_blocks(starts: np.ndarray, counts: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """The row numbers (ascending int64) of the blocks `chosen` (a mask), block i holding
    counts[i] rows from starts[i]."""
    starts, counts = starts[chosen], counts[chosen]
    total = int(counts.sum())
    if not total:
        return np.empty(0, np.int64)
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def ranges_holding(keys: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Which ranges [low, high] hold at least one of `keys` (sorted int64): the blocks, row
    groups or files a read of those keys must look at."""
    if not len(keys):
        return np.zeros(len(lows), dtype=bool)
    at = np.searchsorted(keys, lows, side="left")
    return (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] <= highs)


def expected_rows(keys: np.ndarray, lows: np.ndarray, highs: np.ndarray, counts: np.ndarray) -> float:
    """About how many rows of blocks (key bounds [low, high], counts rows each, sorted by the key)
    hold one of `keys` (sorted int64), before reading them: a block of one key value counts
    whole, a block spanning several its rows in the share of its span's values that are keys (the
    values spread evenly over the span). Exact for a key many rows share (a nation key's 60,000
    customers at TPC-H scale 10); for a key of a row or a few, low by the key's sparsity in its
    span (TPC-H's order keys: a fourth of the values), where ranges_holding's blocks would count
    a block per key. A block without bounds (its lowest and highest int64) counts whole."""
    admitted = ranges_holding(keys, lows, highs)
    if not admitted.any():
        return 0.0
    lows, highs, counts = lows[admitted], highs[admitted], counts[admitted]
    inside = np.searchsorted(keys, highs, side="right") - np.searchsorted(keys, lows, side="left")
    span = highs.astype(np.float64) - lows.astype(np.float64) + 1.0
    unbounded = (lows == _INT64.min) | (highs == _INT64.max)  # no statistics: all of it may match
    return float(np.sum(counts * np.where(unbounded, 1.0, np.minimum(1.0, inside / span))))


def one_of(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which `values` are one of `keys` (sorted int64)."""
    if not len(keys):
        return np.zeros(len(values), dtype=bool)
    return keys[np.minimum(np.searchsorted(keys, values), len(keys) - 1)] == values


def dense(keys: np.ndarray, low: int, high: int, rows: int) -> bool:
    """Whether a read of `keys` (sorted int64) is dense in a file of `rows` rows whose keys lie
    in [low, high]: at least one key in that range per DENSE_ROWS rows. A dense read decodes
    a large share of the file's row groups as Parquet, and its copy repays itself; a sparse one
    (a few changed suppliers looked up in lineitem by l_suppkey) decodes a row group or two a
    key, and a whole copy would buy it little."""
    inside = int(np.searchsorted(keys, high, side="right") - np.searchsorted(keys, low, side="left"))
    return inside > 0 and inside * DENSE_ROWS >= rows


def worth(span: tuple[int, int, int] | None) -> float | None:
    """What a copy of a file of (lowest key, highest key, rows) `span` is worth before any read
    says: the keys it spans a row. A change batch's keys fall in a file about in proportion to
    the keys it spans, and a read repays a copy by the keys it asks a row (`dense`); so a file of
    lineitem by l_suppkey (thousands of rows a supplier) is worth a fraction of one by
    l_orderkey (a few rows an order). None where `span` is."""
    if span is None:
        return None
    low, high, rows = span
    return max(high - low + 1, 0) / rows if rows > 0 else 0.0


def _used(read: float, made: float) -> bool:
    """Whether a dense read has used a copy, last read densely at `read`, since it was made at
    `made` (a copy's mtime starts at its making)."""
    return read > made


def _protected(read: float, made: float, protection: tuple[float, float],
               kept_worth: Callable[[], float | None] = lambda: None, new_worth: float | None = None) -> bool:
    """Whether a copy last read densely at `read` (made at `made`) stays against a new one:
    read densely since the first of `protection`'s times, or made since the second (a copy
    is read after it is made, by the next refresh at the latest: one made ahead of its reads,
    by an arrangement's build, that no dense read has touched since, gives way after
    GRACE_REFRESHES refreshes) and worth no less than the new one (`worth`, where both are
    known; `kept_worth` is asked only then: the builds of a warehouse's arrangements, copied one
    after the other, would otherwise fill the budget in the order they were built, and at scale
    10 the sparse lineitem's kept out the copies of orders by o_custkey that every changed
    customer's read needs)."""
    protected_since, grace_since = protection
    if _used(read, made) and read >= protected_since:
        return True
    if made < grace_since:
        return False
    kept = kept_worth() if new_worth is not None else None
    return kept is None or kept >= new_worth


class MappedCopy:
    """A copy memory-mapped for reads at random places.

    The mapping is advised MADV_RANDOM: a page fault then reads that page, not a window of the
    device's read-ahead around it (`read_ahead_kb`, megabytes on a virtual disk), which made a
    read of some keys spread over copies larger than the page cache read gigabytes. Each page a
    read needs and the page cache lacks is still a major fault, one synchronous read of the disk
    at a time (`python -m bench.copy_reads`). So before it touches them, a read asks for the pages
    holding its rows that the page cache lacks (`prefetch`, MADV_WILLNEED): the kernel queues
    those reads at once, and the faults that follow find them in the page cache or in flight
    (`willneed`: beside other steps' Python, only with the advice in few calls and a short switch
    interval, docs/performance.md). The advice never changes what is read (`prefetching=False`,
    for the benchmark, leaves it out). The mapping lives as long as the buffers sliced from it."""

    def __init__(self, path: str, prefetching: bool = True):
        with open(path, "rb") as handle:
            self.mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.advises = hasattr(self.mapping, "madvise") and hasattr(mmap, "MADV_RANDOM")
        self.prefetching = prefetching and self.advises and hasattr(mmap, "MADV_WILLNEED")
        if self.advises:
            self.mapping.madvise(mmap.MADV_RANDOM)
        self.buffer = pa.py_buffer(self.mapping)

    def reader(self) -> ipc.RecordBatchFileReader:
        return ipc.open_file(pa.BufferReader(self.buffer))

    def prefetch(self, arrays: list[pa.Array], rows: np.ndarray) -> None:
        """Ask the kernel for the pages holding `rows` (ascending) of each of `arrays` (slices of
        this mapping): their validity, values and offsets first, then, with the offsets read,
        their strings' bytes. Types of other layouts are left to their page faults. The offsets
        are read by Arrow's take, which lets go of the interpreter's lock, so a page fault on
        them does not hold up the other steps' Python."""
        if not self.prefetching or not len(rows):
            return
        ranges, strings = [], []
        for array in arrays:
            ranges += self._fixed_ranges(array, rows)
            if offsets_dtype(array.type) is not None:
                strings.append(array)
        self._advise(ranges)
        ranges = []
        for array in strings:
            buffers = array.buffers()
            if len(buffers) < 3 or buffers[2] is None or not buffers[2].size:
                continue
            offsets = pa.Array.from_buffers(pa.from_numpy_dtype(offsets_dtype(array.type)), len(array) + 1,
                                            [None, buffers[1]], offset=array.offset)
            ranges.append((buffers[2].address, offsets.take(rows).to_numpy(), offsets.take(rows + 1).to_numpy()))
        self._advise(ranges)

    @staticmethod
    def _fixed_ranges(array: pa.Array, rows: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(buffer address, start byte, end byte) per row of `rows` in `array`'s validity bitmap
        and values or offsets buffer, where its layout is one of those."""
        buffers = array.buffers()
        at = rows + array.offset
        found = []
        if buffers[0] is not None and array.null_count:
            found.append((buffers[0].address, at // 8, at // 8 + 1))
        offsets, width = offsets_dtype(array.type), _value_bytes(array.type)
        if offsets is not None:
            size = np.dtype(offsets).itemsize
            found.append((buffers[1].address, at * size, (at + 2) * size))
        elif width == 0:
            found.append((buffers[1].address, at // 8, at // 8 + 1))
        elif width is not None:
            found.append((buffers[1].address, at * width, (at + 1) * width))
        return found

    def _advise(self, ranges: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """MADV_WILLNEED each run of consecutive pages that the byte ranges fall in and the page
        cache lacks (`absent_pages`: a warm read makes no call), where they lie in this mapping (a
        buffer Arrow made elsewhere is skipped)."""
        base, size = self.buffer.address, self.buffer.size
        pages = []
        for address, starts, ends in ranges:
            if not base <= address < base + size or not len(starts):
                continue
            first = (address - base + np.asarray(starts, np.int64)) // mmap.PAGESIZE
            last = (address - base + np.maximum(np.asarray(ends, np.int64), np.asarray(starts, np.int64) + 1) - 1) \
                // mmap.PAGESIZE
            last = np.minimum(last, (size - 1) // mmap.PAGESIZE)
            within = first <= last
            first, last = first[within], last[within]
            if not len(first):
                continue
            if len(first) > 1 and (np.any(first[1:] < first[:-1]) or np.any(last[1:] < last[:-1])):
                spans = last - first + 1
                holding = np.unique(np.repeat(first, spans) + _within_spans(spans))
                pages.append(absent_pages(base, holding))
            else:
                pages.append(absent_in_spans(base, first, last))
        if not pages:
            return
        pages = np.unique(np.concatenate(pages))
        if not len(pages):
            return
        firsts = np.concatenate(([0], np.flatnonzero(np.diff(pages) != 1) + 1))
        lengths = np.diff(np.append(firsts, len(pages)))
        self.willneed(pages[firsts] * mmap.PAGESIZE, lengths * mmap.PAGESIZE)

    def willneed(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """MADV_WILLNEED the byte ranges (`starts` in this mapping, `lengths`), a thousand to a
        call where the kernel takes a list (process_madvise(2)), else one call each.

        The calls are few because each lets go of the interpreter's lock and must take it back:
        beside a thread running Python (the epoch's other steps), that waits up to Python's switch
        interval, and a call per range made thousands of such waits (`python -m bench.copy_reads
        --beside`). `mmap.madvise`, the fallback, holds the lock through the call instead."""
        ranges = np.empty(len(starts), dtype=[("base", np.uint64), ("length", np.uint64)])
        ranges["base"] = np.asarray(starts, np.uint64) + np.uint64(self.buffer.address)
        ranges["length"] = np.asarray(lengths, np.uint64)
        done = _advised_in_lists(ranges)
        self.willneed_each(starts[done:], lengths[done:])

    def willneed_each(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        """MADV_WILLNEED the byte ranges one `mmap.madvise` call each."""
        for start, length in zip(starts.tolist(), lengths.tolist()):
            self.mapping.madvise(mmap.MADV_WILLNEED, start, length)


_IOV_MAX = 1024  # ranges a process_madvise(2) call takes


def _advised_in_lists(ranges: np.ndarray) -> int:
    """MADV_WILLNEED `ranges` (addresses and lengths, struct iovec's layout) of this process's
    memory by process_madvise(2); how many of them were advised (the rest are the caller's: all
    of them where the call is not at hand or refused)."""
    if _process_madvise is None or not len(ranges):
        return 0
    own = _own_pidfd()
    if own is None:
        return 0
    done = 0
    while done < len(ranges):
        batch = np.ascontiguousarray(ranges[done:done + _IOV_MAX])
        advised = _process_madvise(own, batch.ctypes.data, len(batch), mmap.MADV_WILLNEED, 0)
        if advised < 0:
            return done
        whole = np.cumsum(batch["length"]) <= np.uint64(advised)
        if not whole.any():
            return done
        done += int(np.flatnonzero(whole)[-1]) + 1
    return done


_pidfd: tuple[int, int] | None = None


def _own_pidfd() -> int | None:
    """A pidfd of this process (opened again in a forked child); None where there is none."""
    global _pidfd
    if _pidfd is None or _pidfd[0] != os.getpid():
        try:
            _pidfd = (os.getpid(), os.pidfd_open(os.getpid()))
        except (AttributeError, OSError):
            return None
    return _pidfd[1]


def absent_pages(base: int, pages: np.ndarray) -> np.ndarray:
    """Which of `pages` (ascending page numbers of a file mapped at `base`, a page boundary)
    the page cache does not hold, by one mincore(2) over their span; all of them where mincore
    is not at hand or refuses (Linux reports the page cache of files the caller owns or may
    write, as the copies' own process does)."""
    if not len(pages) or _mincore is None:
        return pages
    first, span = int(pages[0]), int(pages[-1] - pages[0]) + 1
    held = np.zeros(span, np.uint8)
    if _mincore(base + first * mmap.PAGESIZE, span * mmap.PAGESIZE, held.ctypes.data) != 0:
        return pages
    return pages[(held[pages - first] & 1) == 0]


def absent_in_spans(base: int, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """absent_pages of the pages [first[i], last[i]] of every i (both ascending, as the ranges of
    ascending rows are), by one mincore(2) over their span, without listing every page of every
    row first: a read's rows each fall in a page or two, mostly the same ones."""
    low, high = int(first[0]), int(last[-1])
    span = high - low + 1
    marks = np.bincount(first - low, minlength=span + 1) - np.bincount(last - low + 1, minlength=span + 1)
    wanted = np.cumsum(marks[:span]) > 0
    if _mincore is not None:
        held = np.zeros(span, np.uint8)
        if _mincore(base + low * mmap.PAGESIZE, span * mmap.PAGESIZE, held.ctypes.data) == 0:
            wanted &= (held & 1) == 0
    return np.flatnonzero(wanted) + low


def _libc(name: str, argtypes: list, restype=ctypes.c_int):
    """libc's `name` through ctypes (which lets go of the interpreter's lock during the call);
    None where it is not at hand."""
    try:
        call = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    call.argtypes = argtypes
    call.restype = restype
    return call


_mincore = _libc("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
_process_madvise = _libc("process_madvise", [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_uint], restype=ctypes.c_ssize_t) \
    if hasattr(mmap, "MADV_WILLNEED") else None


def _value_bytes(type_: pa.DataType) -> int | None:
    """Bytes per value of a fixed-width type's values buffer (0: bits, a boolean); None for
    other layouts (nested, dictionary, strings)."""
    if pa.types.is_boolean(type_):
        return 0
    if (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
            or pa.types.is_temporal(type_) or pa.types.is_fixed_size_binary(type_)):
        return type_.bit_width // 8
    return None


def _within_spans(spans: np.ndarray) -> np.ndarray:
    """0, 1, ..., n - 1 for each n of `spans`, concatenated."""
    total = int(spans.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(spans) - spans, spans)


def rows_in_copy(source: MappedCopy, bounds: np.ndarray, key: str, keys: np.ndarray, nulls: bool,
                 columns: list[str]) -> pa.Table:
    """A copy's rows whose `key` is one of `keys` (sorted int64, dates as days) or NULL (with
    `nulls`), with `columns`: only the blocks whose `bounds` admit a key are looked at, and only
    the rows holding one are copied out of `source`, their pages asked for before they are read:
    the key column (kept apart from the packed rows) at the rows of the admitted blocks, then the
    packed rows and other columns of the rows that hold a key."""
    if bounds.shape[0] < 4:
        raise ValueError(f"bounds of {bounds.shape[0]} rows, no block sizes")
    lows, highs, null_counts, counts = bounds
    admitted = ranges_holding(keys, lows, highs)
    if nulls:
        admitted |= null_counts > 0
    looked_at = _rows_of_blocks(np.cumsum(counts) - counts, counts, admitted)
    reader = source.reader()
    layout = Layout.stored(reader.schema)
    names = {n.lower(): n for n in layout.schema.names}
    selected = [names[c.lower()] for c in columns]
    key_name = names[key.lower()]
    schema = pa.schema([layout.schema.field(n) for n in selected])
    packing = any(n in layout.packed for n in selected)
    apart = [n for n in selected if n not in layout.packed]
    parts, offset = [], 0
    for index in range(reader.num_record_batches):
        batch = reader.get_batch(index)
        lo, hi = np.searchsorted(looked_at, [offset, offset + batch.num_rows])
        if hi > lo:
            at_rows = looked_at[lo:hi] - offset
            key_column = batch.column(key_name)
            source.prefetch([key_column], at_rows)
            values, missing = integers_and_nulls(key_column.take(at_rows))
            kept = one_of(keys, values) & ~missing
            if nulls:
                kept |= missing
            at_rows = at_rows[kept]
            packed = batch.column(PACKED)
            source.prefetch([batch.column(n) for n in apart] + ([packed] if packing else []), at_rows)
            rows = row_bytes(packed.take(at_rows)) if packing else None
            parts.append(pa.record_batch(
                [layout.unpacked(rows, n) if n in layout.packed else batch.column(n).take(at_rows) for n in selected],
                schema=schema))
        offset += batch.num_rows
    if offset != int(counts.sum()):
        raise ValueError(f"{offset} rows against {int(counts.sum())} in the bounds' blocks")
    return pa.Table.from_batches(parts, schema).combine_chunks()


class _WiderValues(Exception):
    """A copy's record batch holds a string wider than its slot: write the copy again with
    `short`, the slots' widths that hold it."""

    def __init__(self, short: dict[str, int]):
        super().__init__(short)
        self.short = short


def _durable(path: str) -> None:
    """Flush `path`'s contents to disk before it is renamed into place: after a machine crash a
    copy is whole or absent, not a name over blocks never written."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class LocalCopies:
    """The copies under `directory` (a local folder; made when first needed), named by their
    files' paths within `warehouse`, so a warehouse copied or moved keeps them."""

    def __init__(self, directory: str, max_bytes: int = COPY_BYTES, batch_rows: int = BATCH_ROWS,
                 min_free_bytes: int = MIN_FREE_BYTES, retry_seconds: float = RETRY_SECONDS,
                 warehouse: str | None = None, copy_batch_rows: int = COPY_BATCH_ROWS,
                 share_of_free: float = SHARE_OF_FREE):
        self.directory = directory
        self.share_of_free = share_of_free
        self.warehouse = warehouse
        self.retry_seconds = retry_seconds
        self.max_bytes = max_bytes
        self.batch_rows = batch_rows
        self.copy_batch_rows = copy_batch_rows
        self.min_free_bytes = min_free_bytes
        self._bounds: collections.OrderedDict = collections.OrderedDict()  # copy -> (lows, highs, nulls, rows) per block
        self._making: dict[str, threading.Lock] = {}
        self._failed: dict[str, float] = {}  # copies that could not be made -> when (read as Parquet meanwhile)
        self._counts: collections.Counter = collections.Counter()  # since take_counts: made, failed, no_room, ...
        self._guard = threading.Lock()
        self._over_budget: set[str] = set()  # copies not made in this refresh (`_admits`)

    def take_counts(self) -> dict[str, int]:
        """Copies made, failed, not made for want of free disk (`no_room`) or of room in their
        budget beside the protected copies (`_protected`; `over_budget`, once a file a
        refresh), and dropped for the budget (`evicted`) since the last call: a read falls back
        to Parquet where there is no copy, slower but the same rows, and a dropped copy is made
        again by the next dense read that needs it, so each is counted for the refresh's reports rather
        than shown in a log line only."""
        with self._guard:
            counts, self._counts = dict(self._counts), collections.Counter()
        return counts

    def _count(self, what: str) -> None:
        with self._guard:
            self._counts[what] += 1

    def _room(self) -> bool:
        """Whether the copies' disk has `min_free_bytes` free."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            return shutil.disk_usage(self.directory).free >= self.min_free_bytes
        except OSError:
            return False

    def _folder(self, table: str) -> str:
        """Where the copies of the files of `table` (an arrangement's path) live."""
        return os.path.join(self.directory, hashlib.sha1(within(table, self.warehouse).encode()).hexdigest()[:16])

    def _target(self, path: str, key: str) -> str:
        """The copy of the file at `path` (`<table>/<file>`)."""
        named = f"{within(path, self.warehouse)}\0{key.lower()}\0{self.batch_rows}\0{FORMAT}"
        digest = hashlib.sha1(named.encode()).hexdigest()
        return os.path.join(self._folder(path.rsplit("/", 1)[0]), f"{digest}.arrow")

    def prune(self, table: str, live: list[str], key: str) -> int:
        """Delete the copies of `table`'s files that are not among `live` (its files' paths now,
        `<table>/<file>`): a rebuilt arrangement's old files are read no more. Returns how many."""
        keep = {self._target(path, key) for path in live}
        dropped = 0
        try:
            entries = {e.path.removesuffix(".bounds.npy") for e in os.scandir(self._folder(table))
                       if e.name.endswith((".arrow", ".bounds.npy"))}
        except OSError:
            return 0
        for target in entries:
            if target not in keep:
                self._drop(target)
                dropped += 1
        return dropped

    def make(self, path: str, fragment, key: str, span: tuple[int, int, int] | None = None) -> str | None:
        """The copy of the Parquet file `fragment` (at `path`), made now unless one exists;
        None when it cannot be made (the file is then read as Parquet). `span`, the file's
        (lowest key, highest key, rows) where known, weighs it against the copies there are
        (`worth`)."""
        target = self.existing(path, key)
        if target is not None:
            return target
        target = self._target(path, key)
        failed_at = self._failed.get(target)
        if failed_at is not None and time.monotonic() - failed_at < self.retry_seconds:
            return None
        if not self._room():
            log.warning("no local copy of %s: less than %d MB free under %s; it is read as Parquet", path,
                        self.min_free_bytes >> 20, self.directory)
            self._count("no_room")
            return None
        if target in self._over_budget:
            return None
        new_worth = worth(span)
        if not self._admits(fragment, new_worth):
            log.info("no local copy of %s in this refresh: the copies read densely in the latest %d refreshes, or "
                     "made in the latest %d and worth as much, fill their budget under %s; it is read as Parquet",
                     path, PROTECTED_REFRESHES, GRACE_REFRESHES, self.directory)
            with self._guard:
                self._over_budget.add(target)
            self._count("over_budget")
            return None
        started = time.monotonic()
        try:
            return self._made(path, fragment, key, target, new_worth)
        finally:
            _this_thread.making_seconds = making_seconds() + time.monotonic() - started

    def _made(self, path: str, fragment, key: str, target: str, new_worth: float | None) -> str | None:
        """`make`'s copy, made by this thread or awaited from the one making it."""
        with self._guard:
            making = self._making.setdefault(target, threading.Lock())
        with making:
            if os.path.exists(target) and os.path.exists(target + ".bounds.npy"):
                return target
            try:
                self._copy(fragment, key, target)
            except (OSError, ValueError, KeyError, pa.ArrowException) as error:
                log.warning("no local copy of %s (%s: %s); it is read as Parquet for %g s, then copied again", path,
                            type(error).__name__, error, self.retry_seconds)
                self._failed[target] = time.monotonic()
                self._count("failed")
                return None
            self._failed.pop(target, None)
            self._count("made")
        self._evict(protection=self._protection(), new_worth=new_worth)
        return target

    def _admits(self, fragment, new_worth: float | None = None) -> bool:
        """Whether a copy of `fragment`, worth `new_worth`, fits in the budget beside the copies
        protected against it (`_protected`), its size taken as the file's uncompressed bytes;
        always before any refresh was marked."""
        protection = self._protection()
        if protection is None:
            return True
        try:
            sizes = self._sizes()
            budget = self._budget(sum(size for _, size, _ in sizes.values()))
            expected = sum(group.total_byte_size for group in
                           (fragment.metadata.row_group(i) for i in range(fragment.metadata.num_row_groups)))
        except (OSError, AttributeError, pa.ArrowException):
            return True
        kept = sum(size for target, (read, size, made) in sizes.items()
                   if _protected(read, made, protection, functools.partial(self._worth_of, target), new_worth))
        return kept + expected <= budget

    def _protection(self) -> tuple[float, float] | None:
        """(the start of the oldest of the latest PROTECTED_REFRESHES refreshes, the start of the
        oldest of the latest GRACE_REFRESHES), which `_protected` holds a copy's times against;
        None before any refresh was marked (`give_way` marks them)."""
        starts = self._refresh_starts()
        if not starts:
            return None
        return starts[-PROTECTED_REFRESHES:][0], starts[-GRACE_REFRESHES:][0]

    def _refresh_starts(self) -> list[float]:
        try:
            with open(os.path.join(self.directory, REFRESH_STARTS)) as marks:
                return [float(line) for line in marks if line.strip()]
        except (OSError, ValueError):
            return []

    def _mark_refresh(self) -> None:
        """Record that a refresh starts now, among the latest PROTECTED_REFRESHES."""
        starts = (self._refresh_starts() + [time.time()])[-PROTECTED_REFRESHES:]
        marks = os.path.join(self.directory, REFRESH_STARTS)
        temporary = f"{marks}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(temporary, "w") as out:
                out.write("".join(f"{start!r}\n" for start in starts))
            os.replace(temporary, marks)
        except OSError as error:
            log.warning("the start of this refresh was not recorded under %s (%s); copies read in the last "
                        "refresh may give way to new ones", self.directory, error)

    def _copy(self, fragment, key: str, target: str) -> None:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            with fragment.filesystem.open_input_file(fragment.path) as source:
                parquet = pq.ParquetFile(source)
                short = None
                while True:
                    try:
                        bounds = self._written(parquet, key, temporary + ".arrow.tmp", short)
                        break
                    except _WiderValues as wider:
                        short = wider.short
            with open(temporary + ".npy.tmp", "wb") as out:
                np.save(out, bounds)
            _durable(temporary + ".arrow.tmp")
            _durable(temporary + ".npy.tmp")
            os.replace(temporary + ".npy.tmp", target + ".bounds.npy")
            faults.point("in_local_copy")
            os.replace(temporary + ".arrow.tmp", target)
        finally:
            for leftover in (temporary + ".arrow.tmp", temporary + ".npy.tmp"):
                if os.path.exists(leftover):
                    os.remove(leftover)

    def _written(self, parquet: pq.ParquetFile, key: str, out: str, short: dict[str, int] | None) -> np.ndarray:
        """Write `parquet`'s rows packed (packed_rows.Layout, its short strings' slots as wide as
        `short` says, else as the first record batch's, `packable`) to `out`; their blocks'
        bounds. A later batch with a wider value raises _WiderValues, to write it again with it
        (the batch that sized the slots holds by construction)."""
        schema = parquet.schema_arrow
        field = {n.lower(): i for i, n in enumerate(schema.names)}[key.lower()]
        lows, highs, nulls, counts = [], [], [], []
        layout = Layout.of(schema, apart=(schema.names[field],), short=short) if short is not None else None
        with pa.OSFile(out, "wb") as sink:
            writer = None
            try:
                for groups in _joined_groups(parquet.metadata, self.copy_batch_rows):
                    rows = parquet.read_row_groups(groups, use_threads=False)
                    sized = layout is None
                    if sized:
                        layout = Layout.of(schema, apart=(schema.names[field],), short=packable(rows))
                    values, missing = integers_and_nulls(rows.column(field).combine_chunks())
                    starts = _block_starts(parquet.metadata, groups, self.batch_rows)
                    lows.append(np.minimum.reduceat(np.where(missing, _INT64.max, values), starts))
                    highs.append(np.maximum.reduceat(np.where(missing, _INT64.min, values), starts))
                    nulls.append(np.add.reduceat(missing.astype(np.int64), starts))
                    counts.append(np.diff(np.append(starts, rows.num_rows)))
                    writer = writer or ipc.new_file(sink, layout.stored_schema())
                    for batch in rows.combine_chunks().to_batches():
                        if not sized and not layout.holds(batch):
                            found = widest(batch)
                            raise _WiderValues({name: max(bytes_, found[name]) for name, bytes_ in layout.short})
                        writer.write_batch(layout.pack(batch))
                writer = writer or ipc.new_file(sink, Layout.of(schema, apart=(schema.names[field],)).stored_schema())
            finally:
                if writer is not None:
                    writer.close()
        return np.stack([np.concatenate(part).astype(np.int64) if part else np.empty(0, np.int64)
                         for part in (lows, highs, nulls, counts)])

    def existing(self, path: str, key: str) -> str | None:
        """The copy of the file at `path` for reads by `key`, if it has one (none is made)."""
        target = self._target(path, key)
        return target if os.path.exists(target) and os.path.exists(target + ".bounds.npy") else None

    def span(self, path: str, key: str) -> tuple[int, int, int] | None:
        """(lowest key, highest key, rows) of the file's copy, from its blocks' bounds (a
        block without bounds spans every int64); None where it has no readable copy."""
        target = self.existing(path, key)
        return None if target is None else self._span_of(target)

    def _worth_of(self, target: str) -> float | None:
        """`worth` of the copy `target`."""
        return worth(self._span_of(target))

    def _span_of(self, target: str) -> tuple[int, int, int] | None:
        """`span` of the copy `target`; None where its bounds cannot be read or hold no block."""
        try:
            lows, highs, _, counts = self._bounds_of(target)
        except (OSError, ValueError):
            return None
        if not len(counts):
            return None
        return int(lows.min()), int(highs.max()), int(counts.sum())

    def rows(self, path: str, fragment, key: str, keys: np.ndarray, nulls: bool, columns: list[str],
             dense: bool = True, span: tuple[int, int, int] | None = None) -> pa.Table | None:
        """The file's rows whose `key` is one of `keys` (sorted int64, dates as days) or NULL (with
        `nulls`), with `columns`; None when there is no usable copy (read the file as Parquet).
        Only the blocks whose bounds admit a key are looked at, and only the rows holding one are
        copied out of the memory-mapped file (the caller still filters by its values, as it does
        Parquet's rows). A dense read (`dense`: the module's function) makes the copy if there is
        none, and counts as the copy's read (its mtime) for the budget; a sparse one reads a copy
        that exists, as it is, and otherwise returns None for the file's few row groups to be read
        as Parquet. `span` is `make`'s."""
        target = self.make(path, fragment, key, span) if dense else self.existing(path, key)
        if target is None:
            return None
        try:
            found = rows_in_copy(MappedCopy(target), self._bounds_of(target), key, keys, nulls, columns)
            if dense:
                os.utime(target)
            return found
        except (OSError, ValueError, KeyError, pa.ArrowException) as error:
            log.warning("local copy %s of %s not read (%s: %s); the file is read as Parquet",
                        target, path, type(error).__name__, error)
            self._drop(target)
            return None

    def certain_rows(self, path: str, key: str, keys: np.ndarray) -> int | None:
        """How many of the file's rows surely hold one of `keys` (sorted int64): those of its
        copy's blocks whose bounds are one of them, low and high (0 where a copy made before the
        copies counted their blocks' rows cannot tell); None where the file has no copy (none
        is made for it: its row groups' statistics tell, file_pruning)."""
        target = self.existing(path, key)
        if target is None:
            return None
        if not len(keys):
            return 0
        try:
            bounds = self._bounds_of(target)
        except (OSError, ValueError):
            return None
        if bounds.shape[0] < 4:
            return 0
        lows, highs, null_counts, counts = bounds
        return int(counts[(lows == highs) & one_of(keys, lows) & (null_counts == 0)].sum())

    def expected_rows(self, path: str, key: str, keys: np.ndarray) -> float | None:
        """expected_rows of the file's copy for `keys` (sorted int64), from its blocks' bounds
        alone; None where the file has no copy (none is made for the estimate)."""
        target = self.existing(path, key)
        if target is None:
            return None
        try:
            bounds = self._bounds_of(target)
        except (OSError, ValueError):
            return None
        if bounds.shape[0] < 4:
            return None
        lows, highs, _, counts = bounds
        return expected_rows(keys, lows, highs, counts)

    def _bounds_of(self, target: str) -> np.ndarray:
        with self._guard:
            found = self._bounds.get(target)
            if found is not None:
                self._bounds.move_to_end(target)
                return found
        bounds = np.load(target + ".bounds.npy", allow_pickle=False)
        if bounds.ndim != 2 or bounds.shape[0] != 4 or bounds.dtype != np.int64:
            raise ValueError(f"bounds of shape {bounds.shape} and type {bounds.dtype}")
        with self._guard:
            self._bounds[target] = bounds
            while len(self._bounds) > CACHED_BOUNDS:
                self._bounds.popitem(last=False)
        return bounds

    def _drop(self, target: str) -> None:
        with self._guard:
            self._bounds.pop(target, None)
        for name in (target, target + ".bounds.npy"):
            try:
                os.remove(name)
            except OSError:
                pass

    def give_way(self) -> None:
        """Keep the copies within their budget as the free disk shrinks under them (the
        warehouse's writes; the module's docstring), the least recently read first whenever they
        were read, and mark a refresh's start: called at the start of every refresh."""
        self._evict()
        self._mark_refresh()
        with self._guard:
            self._over_budget.clear()

    def _sizes(self) -> dict[str, tuple[float, int, float]]:
        """Each copy's last dense read (its mtime), bytes, and when it was made (its bounds'
        mtime, written after it and never touched); and what a killed process left half
        written an hour ago or more is deleted."""
        if not os.path.isdir(self.directory):
            return {}
        entries = [e for folder in os.scandir(self.directory) if folder.is_dir() for e in os.scandir(folder.path)]
        made = {e.path.removesuffix(".bounds.npy"): e.stat().st_mtime for e in entries
                if e.name.endswith(".bounds.npy")}
        sizes = {e.path: (stat.st_mtime, stat.st_size, made.get(e.path, stat.st_mtime))
                 for e in entries if e.name.endswith(".arrow") for stat in (e.stat(),)}
        for entry in entries:
            if entry.name.endswith(".tmp") and entry.stat().st_mtime < time.time() - ABANDONED_SECONDS:
                os.remove(entry.path)
        return sizes

    def _budget(self, total: int) -> int:
        """The copies' budget with `total` bytes of them: `max_bytes`, or `share_of_free` of
        their bytes and the free disk together where that is less."""
        return min(self.max_bytes, int(self.share_of_free * (total + shutil.disk_usage(self.directory).free)))

    def _evict(self, protection: tuple[float, float] | None = None, new_worth: float | None = None) -> None:
        """Drop copies while they exceed their budget (`_budget`), the protected ones
        (`_protected`, under `protection`, against a new copy worth `new_worth`) excepted: those
        last read in the earliest refresh first, and among them those no dense read has used
        yet, the least worth first (`worth`: a build's copies are all made in one refresh, and
        least recently read alone would drop them in the order they were built)."""
        try:
            sizes = self._sizes()
            total = sum(size for _, size, _ in sizes.values())
            budget = self._budget(total) if sizes else 0
        except OSError:
            return
        if total <= budget:
            return
        starts = self._refresh_starts()
        worths = {target: self._worth_of(target) for target in sizes}

        def victim_order(item):
            target, (read, _, made) = item
            known = worths[target]
            return bisect.bisect_right(starts, read), _used(read, made), -1.0 if known is None else known, read

        for target, (read, size, made) in sorted(sizes.items(), key=victim_order):
            if total <= budget:
                break
            if protection is not None and _protected(read, made, protection, functools.partial(worths.get, target),
                                                     new_worth):
                continue
            self._drop(target)
            self._count("evicted")
            total -= size
