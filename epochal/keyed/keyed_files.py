"""Keyed reads of Delta tables' files on the driver: the rows of some key values, from each file's
local copy (local_copies) where one is made, else from the Parquet row groups whose statistics
may hold them (file_pruning), keeping the row groups decoded for the next reads. Below both the
arrangements (arrangements.py), which keep only their chain of builds and appends, and the
shared reads of a refresh (shared_reads.py), which read state tables this way too; see
docs/architecture.md, "Keyed reads"."""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from ..arrow_rows import key_kind
from .file_pruning import (as_integers, certain_rows_in_row_groups, expected_rows_in_row_groups, key_span,
                           row_groups_holding)
from .local_copies import LocalCopies, dense

log = logging.getLogger("epochal")

DECODED_BYTES = 1 << 30  # decoded row groups kept for later reads (KeyedFiles.rows_of)


def filtered_batches(dataset: ds.Dataset, columns: list[str], condition: ds.Expression):
    """The batches of a delta-rs dataset's `columns` (the condition's among them), each filtered
    after it is read, never by the scanner. pyarrow simplifies a scan's filter against each
    fragment's guarantee, which delta-rs builds from the Delta statistics; where those hold a
    column's null count but no min/max (Spark's Delta keeps none for a BOOLEAN column) the guarantee
    reads `x >= null and x <= null`, under which every filter on x is false, and the scan of a
    version for some BOOLEAN keys found no rows (tests/test_shared_reads.py)."""
    for batch in dataset.scanner(columns=columns).to_batches():
        yield batch.filter(condition)


class KeyedFiles:
    """Reads of some keys' rows from the files of Delta tables (arrangements and state tables),
    through `copies` (None: no local copies, Parquet row groups only) and a cache of decoded row
    groups of at most `decoded_bytes`. Shared by every refresh of an engine: a Delta data file is
    never rewritten in place, so what it held once it holds for good."""

    def __init__(self, storage_options: dict[str, str] | None = None, copies: LocalCopies | None = None,
                 decoded_bytes: int = DECODED_BYTES):
        self.storage_options = storage_options
        self.copies = copies
        self.decoded_bytes = decoded_bytes
        self._guard = threading.Lock()
        # (file, row group, columns) -> its decoded rows, least recently used first (decoded_bytes)
        self._decoded: collections.OrderedDict = collections.OrderedDict()
        self._decoded_bytes = 0

    def copied(self, key_type: pa.DataType) -> bool:
        """Whether reads by a key of `key_type` go through local copies: an integer or date key,
        copies on (their batch bounds are exact for such keys only)."""
        return self.copies is not None and key_kind(key_type) in ("integer", "date")

    def expected_rows(self, path: str, holding, values: pa.Array, field: str) -> float | None:
        """About how many of `holding`'s rows (files of the table at `path`) have `field` in
        `values`, from the local copies' block bounds (local_copies.expected_rows) without reading
        a row, or a file without a copy from its row groups' statistics; None where a file has
        neither or the key is not an integer or a date."""
        if key_kind(values.type) not in ("integer", "date"):
            return None
        integers = np.sort(as_integers(values))
        total = 0.0
        try:
            for fragment in holding.get_fragments():
                found = self.copies.expected_rows(f"{path}/{fragment.path}", field, integers) \
                    if self.copies is not None else None
                if found is None:
                    found = expected_rows_in_row_groups(fragment, field, integers, path)
                if found is None:
                    return None
                total += found
        except (AttributeError, OSError, ValueError, pa.ArrowException):
            return None
        return total

    def _certain_rows(self, path: str, fragment, field: str, integers: np.ndarray) -> int:
        """Rows of `fragment` (a file of the table at `path`) that surely hold one of `integers`:
        from its local copy's blocks, else from its row groups' statistics (0 where it has none)."""
        found = self.copies.certain_rows(f"{path}/{fragment.path}", field, integers)
        if found is not None:
            return found
        try:
            return certain_rows_in_row_groups(fragment, field, integers, path)
        except (OSError, pa.ArrowException):
            return 0

    def _span(self, path: str, fragment, field: str) -> tuple[int, int, int] | None:
        """(lowest key, highest key, rows) of `fragment` (a file of the table at `path`), by its
        copy's bounds or else its row groups' statistics; None where it tells neither."""
        span = self.copies.span(f"{path}/{fragment.path}", field)
        if span is None:
            try:
                span = key_span(fragment, field, path)
            except (OSError, pa.ArrowException):
                span = None
        return span

    def rows_of(self, path: str, holding, selected: list[str], field: str, values: pa.Array, nulls: bool,
                condition, at_most: int | None = None) -> tuple[pa.Table | None, int, int]:
        """`holding`'s rows (files of the table at `path`, an arrangement or a state table, that
        may hold the keys; without local copies, cut to such row groups too) whose `field` is one
        of `values` (or NULL, with `nulls`): from each file's local copy (local_copies), else from
        its Parquet row groups that may hold them. Row groups decoded by earlier reads are taken
        from memory: the join terms of one refresh read the same changed orders' row groups again
        and again (lineitem by l_orderkey: a dozen reads of the same row groups an epoch). Also
        returns how many files were read from their local copies, and how many Parquet row
        groups were read (decoded or from memory). A file's copy is made by a dense read
        (local_copies.dense), and a sparse one reads the few row groups it needs as Parquet where
        there is no copy. No rows (None) when the copies' bounds or the row groups' statistics
        alone show more than `at_most` of them: a read too large for the driver is refused before
        it is made (TPC-H Q5's supplier changes ask customer for every customer of their nations,
        660,000 rows at scale 10, which the join then reaches by c_custkey instead)."""
        parts, copied_files, row_groups = [], 0, 0
        integers = np.sort(as_integers(values)) if self.copies is not None else None
        wanted = pa.schema([holding.schema.field(name) for name in selected])
        try:
            fragments = list(holding.get_fragments())
            if integers is not None and at_most is not None:
                if sum(self._certain_rows(path, f, field, integers) for f in fragments) > at_most:
                    return None, 0, 0
            for fragment in fragments:
                if integers is not None:
                    within = f"{path}/{fragment.path}"
                    span = self._span(path, fragment, field)
                    copied = self.copies.rows(within, fragment, field, integers, nulls, selected,
                                              dense=span is None or dense(integers, *span), span=span)
                    if copied is not None:
                        parts.append(copied.rename_columns(selected).cast(wanted))
                        copied_files += 1
                        continue
                    try:  # not cut by files_holding, which left that to the copies
                        fragment = row_groups_holding(fragment, field, integers, nulls, path)
                    except pa.ArrowException:
                        pass
                    if fragment is None:
                        continue
                ids = [group.id for group in fragment.row_groups]
                row_groups += len(ids)
                found, missing = {}, []
                with self._guard:
                    for group in ids:
                        key = (f"{path}/{fragment.path}", group, tuple(selected))
                        hit = self._decoded.get(key)
                        if hit is None:
                            missing.append(group)
                        else:
                            self._decoded.move_to_end(key)
                            found[group] = hit
                if missing:
                    decoded = fragment.subset(row_group_ids=missing).to_table(schema=holding.schema, columns=selected)
                    offset = 0
                    for group in missing:
                        rows = fragment.metadata.row_group(group).num_rows
                        found[group] = decoded.slice(offset, rows)
                        offset += rows
                    if offset != decoded.num_rows:
                        raise ValueError(f"{fragment.path}: row groups of {offset} rows decoded as {decoded.num_rows}")
                    self._remember(f"{path}/{fragment.path}", selected, {g: found[g] for g in missing})
                parts.extend(found[group] for group in ids)
        except (AttributeError, TypeError):  # not Parquet fragments: scan them as they are
            return pa.Table.from_batches(list(filtered_batches(holding, selected, condition)), wanted), 0, 0
        if not parts:
            return holding.schema.empty_table().select(selected), copied_files, row_groups
        rows = pa.concat_tables(parts)
        mask = pc.is_in(rows.column(field), value_set=values)
        if nulls:
            mask = pc.or_(mask, pc.is_null(rows.column(field)))
        return rows.filter(pc.fill_null(mask, False)), copied_files, row_groups

    def _remember(self, path: str, selected: list[str], groups: dict[int, pa.Table]) -> None:
        with self._guard:
            for group, rows in groups.items():
                key = (path, group, tuple(selected))
                if key not in self._decoded:
                    self._decoded[key] = rows
                    self._decoded_bytes += rows.nbytes
            while self._decoded and self._decoded_bytes > self.decoded_bytes:
                _, old = self._decoded.popitem(last=False)
                self._decoded_bytes -= old.nbytes

    def copy_table(self, path: str, key: str) -> None:
        """Make the local copies of the files of the Delta table at `path` (an arrangement, or a
        state table just replaced) for reads by `key`, an integer or date column, and delete the
        copies of its files that are gone."""
        if self.copies is None:
            return
        try:
            dataset = DeltaTable(path, storage_options=self.storage_options).to_pyarrow_dataset()
            field = {n.lower(): dataset.schema.field(n) for n in dataset.schema.names}[key.lower()]
            if key_kind(field.type) not in ("integer", "date"):
                return
            fragments = list(dataset.get_fragments())
        except Exception as error:  # noqa: BLE001 - copies are a cache; reads make what is missing
            log.warning("local copies of %s not made now (%s); its first reads make them", path, error)
            return
        live = [f"{path}/{fragment.path}" for fragment in fragments]
        self.copies.prune(path, live, key)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="epochal-copy") as pool:
            list(pool.map(lambda pair: self.copies.make(pair[0], pair[1], key, self._span(path, pair[1], field.name)),
                          zip(live, fragments)))
