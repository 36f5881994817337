"""Small Delta tables of records (the remap and the ledgers), written with delta-rs.

Engine bookkeeping must not cost a Spark job: a noop epoch reads and writes only these tables.
delta-rs commits them atomically on the same storage as the data, Spark can read them like any
Delta table, and Delta's optimistic concurrency gives insert-if-absent: a record is written by an
overwrite restricted to its key, committed against the version in which the key was seen absent,
so of two concurrent writers of one key exactly one commits and the other re-reads the winner.
Every commit holds the table's commit lock on a local path (commit_lock.py).
"""

from __future__ import annotations

import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.schema import PrimitiveType
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from .commit_lock import commit_lock
from .deltalog import brought_forward, commit_stamp

CONFLICT_RETRIES = 50


def extends(records: list[dict], seen: list[dict]) -> bool:
    """Whether `records` (a `RecordTable.read`) begins with the very records `seen` (an earlier
    read): records are only ever added, and a read that found only added files keeps the objects
    it read before, so what was derived from `seen` holds and only the records after it are new.
    After a compaction every record is read again (new objects), and this is False."""
    return len(records) >= len(seen) and all(map(operator.is_, records, seen))


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"record keys must be strings, integers or booleans, not {type(value).__name__}")


def _delta_type(arrow: pa.DataType) -> PrimitiveType:
    """The Delta type of a record column (strings, integers, floats, booleans, timestamps)."""
    for test, name in ((pa.types.is_string, "string"), (pa.types.is_int64, "long"), (pa.types.is_float64, "double"),
                       (pa.types.is_boolean, "boolean"), (pa.types.is_timestamp, "timestamp")):
        if test(arrow):
            return PrimitiveType(name)
    raise TypeError(f"no Delta type for a record column of {arrow}")


def _local(uri: str) -> str | None:
    """The path of a data file's URI on a local file system, else None."""
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    return uri if "://" not in uri else None


@dataclass
class RecordTable:
    """A Delta table of records with a key; records are only ever added, never changed."""

    uri: str
    schema: pa.Schema
    key: tuple[str, ...]
    storage_options: dict[str, str] | None = None
    _cache: tuple[int, frozenset[str], list[dict], dict[tuple, dict]] | None = field(default=None, repr=False)
    _opened: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    def _open(self) -> DeltaTable | None:
        """The table at its latest version. Each thread keeps the table it opened and brings it
        forward by the commits since (deltalog.brought_forward) instead of replaying the log
        again, which grows with the ledger's versions, opening it afresh where it cannot. Not
        shared between threads: a record write commits against its table's version, which must
        be the one its reader saw."""
        held = getattr(self._opened, "table", None)
        self._opened.table = None
        if held is not None:
            table = brought_forward(self.uri, *held)
            if table is not None:
                self._keep(table)
                return table
        try:
            table = DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        table = self._evolved(table)
        self._keep(table)
        return table

    def _evolved(self, table: DeltaTable) -> DeltaTable:
        """`table` with the columns of `schema` it lacks added (nullable): records written by an
        older epochal read them as NULL."""
        stored = set(pa.schema(table.schema().to_arrow()).names)
        missing = [f for f in self.schema if f.name not in stored]
        if not missing:
            return table
        try:
            with commit_lock(self.uri):
                table.alter.add_columns([Field(f.name, _delta_type(f.type), nullable=True) for f in missing])
        except (CommitFailedError, DeltaError):  # another process added them first
            pass
        return DeltaTable(self.uri, storage_options=self.storage_options)

    def _keep(self, table: DeltaTable) -> None:
        version = table.version()
        self._opened.table = (table, version, commit_stamp(self.uri, version))

    def _create(self) -> DeltaTable:
        try:
            with commit_lock(self.uri):
                return DeltaTable.create(self.uri, self.schema, mode="ignore", storage_options=self.storage_options)
        except (CommitFailedError, DeltaError):
            table = self._open()  # a concurrent creator won the race to version 0
            if table is None:
                raise
            return table

    def version(self) -> int | None:
        table = self._open()
        return None if table is None else table.version()

    def read(self) -> list[dict]:
        """All records, read at the latest version (cached per version)."""
        table = self._open()
        return [] if table is None else self._rows(table)

    def _rows(self, table: DeltaTable) -> list[dict]:
        return self._indexed(table)[0]

    def _indexed(self, table: DeltaTable) -> tuple[list[dict], dict[tuple, dict]]:
        """The records at `table`'s version and, by key, the first record of each key, cached: a
        version that only added files to the cached one (every record write) reads just those
        files and indexes just their records, so a ledger's read and a record write cost what
        changed since, not the table's whole history (bench/ledger_reads.py); one that removed
        files (a compaction) reads all."""
        version = table.version()
        cache = self._cache
        if cache is not None and cache[0] == version:
            return cache[2], cache[3]
        files = frozenset(table.file_uris())  # the log's list; a dataset costs a listing of its own
        if cache is not None and cache[1] <= files and all(_local(uri) for uri in files):
            added = sorted(files - cache[1])
            schema = pa.schema(table.schema().to_arrow())
            new = ds.dataset([_local(uri) for uri in added], schema=schema, format="parquet").to_table().to_pylist() \
                if added else []
            rows, index = cache[2] + new, dict(cache[3])  # a copy: a reader of the cached version keeps its own
        else:
            new = table.to_pyarrow_dataset().to_table().to_pylist()
            rows, index = new, {}
        for row in new:
            index.setdefault(self._key_of(row), row)
        self._cache = (version, files, rows, index)
        return rows, index

    def _key_of(self, record: dict) -> tuple:
        return tuple(record[name] for name in self.key)

    def insert_if_absent(self, records: list[dict]) -> list[tuple[bool, dict]]:
        """Add each record whose key is not stored yet, in one commit. Returns, per record,
        (inserted, the stored record): the stored one is the earlier writer's where it existed."""
        for attempt in range(CONFLICT_RETRIES):
            table = self._open() or self._create()
            _, index = self._indexed(table)
            stored = [index.get(self._key_of(record)) for record in records]
            missing = [record for record, found in zip(records, stored) if found is None]
            if not missing:
                return [(False, found) for found in stored]
            predicate = " OR ".join(
                "(" + " AND ".join(f"{name} = {_literal(r[name])}" for name in self.key) + ")"
                for r in missing
            )
            try:
                with commit_lock(self.uri):
                    write_deltalake(table, pa.Table.from_pylist(missing, schema=self.schema), mode="overwrite",
                                    predicate=predicate, storage_options=self.storage_options)
            except CommitFailedError:
                time.sleep(min(0.5, 0.01 * (attempt + 1)))
                continue
            return [(found is None, found or record) for record, found in zip(records, stored)]
        raise RuntimeError(
            f"could not record {len(records)} record(s) in {self.uri}: "
            f"{CONFLICT_RETRIES} commit conflicts in a row"
        )
