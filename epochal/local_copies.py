"""Local copies: each arrangement data file that keyed reads use, copied once to the driver's
disk as an uncompressed Arrow IPC file sorted by the key (NULL keys last), in batches of up to
BATCH_ROWS rows, and read memory-mapped: the key column is its own index.

A keyed read of Parquet decodes every row group that may hold one of its keys, each column chunk
of it, at about 0.16 ms a chunk whatever its rows: lineitem by l_orderkey at scale 10 spends
1.1-1.4 s on 3,800 random keys (3,574 row groups of 2,000 rows; 1,000-row groups are no faster).
Random keys touch a row group each, so that read grows with the table. From a copy, a read
binary-searches each batch's key column for the keys and takes the rows between: it touches the
pages it needs and decodes nothing (`python -m bench.arrangement_reads`). Like Databricks' disk
cache, a copy is derived from an immutable file (a Delta data file is never rewritten, so its
path names its contents): a missing copy is made again by the next read that needs it, a damaged
one is deleted and its file read as Parquet, and the copies are bounded by COPY_BYTES on disk,
the least recently read dropped first. A copy is written under a temporary name and renamed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("epochal")

FORMAT = "sorted-1"  # part of every copy's name: a copy of another layout is never read as this one
BATCH_ROWS = 1 << 20  # rows per IPC batch (a batch is searched as one sorted array)
COPY_BYTES = 32 << 30  # the copies' disk budget, per directory
ABANDONED_SECONDS = 3_600  # a half-written copy this old was left by a process that died
# key types a copy serves, as the numpy type its values are searched as (dates: days since 1970)
_SEARCHED = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
             pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.date32(): np.int32}


def _values(column: pa.Array, rows: int) -> np.ndarray:
    """The first `rows` values of `column` (none of them NULL) as a numpy view of its buffer."""
    dtype = np.dtype(_SEARCHED[column.type])
    return np.frombuffer(column.buffers()[1], dtype=dtype, count=rows, offset=column.offset * dtype.itemsize)


def _ranges(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """The positions in [low, high) for each pair, in order."""
    lengths = highs - lows
    if not len(lengths):
        return np.empty(0, np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.repeat(lows - starts, lengths) + np.arange(lengths.sum())


class LocalCopies:
    """The copies under `directory` (a local folder; made when first needed)."""

    def __init__(self, directory: str, max_bytes: int = COPY_BYTES, batch_rows: int = BATCH_ROWS):
        self.directory = directory
        self.max_bytes = max_bytes
        self.batch_rows = batch_rows
        self._making: dict[str, threading.Lock] = {}
        self._failed: set[str] = set()  # files that could not be copied: read as Parquet, not tried again
        self._guard = threading.Lock()

    def _target(self, path: str, key: str) -> str:
        digest = hashlib.sha1(f"{path}\0{key.lower()}\0{FORMAT}\0{self.batch_rows}".encode()).hexdigest()
        return os.path.join(self.directory, f"{digest}.arrow")

    def make(self, path: str, fragment, key: str) -> str | None:
        """The copy of the Parquet file `fragment` (at `path`), made now unless one exists;
        None when it cannot be made (the file is then read as Parquet)."""
        target = self._target(path, key)
        if os.path.exists(target):
            return target
        if target in self._failed:
            return None
        with self._guard:
            making = self._making.setdefault(target, threading.Lock())
        with making:
            if os.path.exists(target):
                return target
            try:
                self._copy(fragment, key, target)
            except (OSError, ValueError, KeyError, pa.ArrowException) as error:
                log.warning("no local copy of %s (%s: %s); it is read as Parquet", path, type(error).__name__, error)
                self._failed.add(target)
                return None
        self._evict()
        return target

    def _copy(self, fragment, key: str, target: str) -> None:
        """Write the file's rows sorted by `key` (NULLs last) in batches of up to `batch_rows`,
        each sorted on its own: the file is read a few row groups at a time, and a file built
        sorted (as arrangements are) is written as it is."""
        import pyarrow.ipc as ipc
        import pyarrow.parquet as pq

        os.makedirs(self.directory, exist_ok=True)
        temporary = f"{target}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            with fragment.filesystem.open_input_file(fragment.path) as source:
                parquet = pq.ParquetFile(source)
                schema = parquet.schema_arrow
                field = schema.names[{n.lower(): i for i, n in enumerate(schema.names)}[key.lower()]]
                if schema.field(field).type not in _SEARCHED:
                    raise ValueError(f"key {field} of type {schema.field(field).type} is not copied")
                with pa.OSFile(temporary, "wb") as sink, ipc.new_file(sink, schema) as writer:
                    pending, held = [], 0
                    for group in range(parquet.num_row_groups + 1):
                        if group < parquet.num_row_groups:
                            rows = parquet.read_row_group(group)
                            pending.append(rows)
                            held += rows.num_rows
                            if held < self.batch_rows:
                                continue
                        if not held:
                            break
                        rows = pa.concat_tables(pending).combine_chunks()
                        for start in range(0, rows.num_rows, self.batch_rows):
                            batch = rows.slice(start, self.batch_rows)
                            order = pc.sort_indices(batch, sort_keys=[(field, "ascending", "at_end")])
                            if not np.array_equal(order.to_numpy(), np.arange(batch.num_rows)):
                                batch = batch.take(order)
                            for part in batch.combine_chunks().to_batches(max_chunksize=self.batch_rows):
                                writer.write_batch(part)
                        pending, held = [], 0
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)

    def rows(self, path: str, fragment, key: str, keys: np.ndarray, nulls: bool, columns: list[str]) -> pa.Table | None:
        """The file's rows whose key is one of `keys` (sorted int64, dates as days since 1970)
        or NULL (with `nulls`), with `columns`; None when there is no usable copy (read the file
        as Parquet)."""
        import pyarrow.ipc as ipc

        target = self.make(path, fragment, key)
        if target is None:
            return None
        try:
            with pa.memory_map(target) as source:
                reader = ipc.open_file(source)
                names = {n.lower(): n for n in reader.schema.names}
                field = reader.schema.get_field_index(names[key.lower()])
                selected = [names[c.lower()] for c in columns]
                searched = _SEARCHED[reader.schema.field(field).type]
                limits = np.iinfo(searched)
                wanted = np.unique(keys[(keys >= limits.min) & (keys <= limits.max)]).astype(searched)
                parts = []
                for index in range(reader.num_record_batches):
                    batch = reader.get_batch(index)
                    column = batch.column(field)
                    valid = len(column) - column.null_count
                    values = _values(column, valid)
                    inside = wanted[np.searchsorted(wanted, values[0]):np.searchsorted(wanted, values[-1], side="right")] \
                        if valid else wanted[:0]
                    lows = np.searchsorted(values, inside, side="left")
                    highs = np.searchsorted(values, inside, side="right")
                    found = highs > lows
                    positions = _ranges(lows[found], highs[found])
                    if nulls and column.null_count:
                        positions = np.concatenate([positions, np.arange(valid, len(column))])
                    if len(positions):  # take copies the rows out of the mapping
                        parts.append(batch.select(selected).take(pa.array(positions, pa.int64())))
                schema = pa.schema([reader.schema.field(name) for name in selected])
            os.utime(target)
            return pa.Table.from_batches(parts, schema=schema).combine_chunks()
        except (OSError, ValueError, KeyError, IndexError, pa.ArrowException) as error:
            log.warning("local copy %s of %s not read (%s: %s); the file is read as Parquet",
                        target, path, type(error).__name__, error)
            self._drop(target)
            return None

    def _drop(self, target: str) -> None:
        try:
            os.remove(target)
        except OSError:
            pass

    def _evict(self) -> None:
        """Drop the least recently read copies while they take more than `max_bytes`, and what
        a killed process left half written an hour ago or more."""
        try:
            entries = list(os.scandir(self.directory))
            sizes = {e.path: (e.stat().st_mtime, e.stat().st_size) for e in entries if e.name.endswith(".arrow")}
            for entry in entries:
                if entry.name.endswith(".tmp") and entry.stat().st_mtime < time.time() - ABANDONED_SECONDS:
                    os.remove(entry.path)
        except OSError:
            return
        total = sum(size for _, size in sizes.values())
        for target, (_, size) in sorted(sizes.items(), key=lambda item: item[1][0]):
            if total <= self.max_bytes:
                break
            self._drop(target)
            total -= size
