"""Rows packed: a table's fixed-width columns, and its strings and binaries whose values are all
short, laid out row by row, each row's values and their validity bits side by side in one
fixed-size binary value, so that reading a few rows at random places touches about a page a row,
where columns, each a buffer of its own, touch a page a column a row (a string or binary column
two: its offsets and its bytes).

A local copy holds its file this way (local_copies.py): a keyed read of a copy that the page cache
lacks waits on a disk read for each page it touches, so with eight columns the rows of one key
cost eight reads (docs/performance.md). A string or binary column takes a slot of a length byte
and its widest value's bytes where that value takes at most SHORT_BYTES bytes and the slot at most
SLOT_SPREAD times what the column takes apart, a value's offset and its mean bytes (`packable`:
TPC-H's flags, names, addresses and comments, whose widest value is under twice the mean; a
column of NULLs and a rare long note would widen every row for it). Other strings, and other
layouts (nested, dictionaries), stay columns beside the packed rows. The packing moves the bytes
Arrow holds and nothing else, so what `unpacked` gives back is the same values of the same types,
whatever the type: no value is converted.
"""

from __future__ import annotations

import base64
import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from numpy.lib.stride_tricks import sliding_window_view

PACKED = "__epochal_packed_rows"  # the packed rows' column
_SCHEMA = b"epochal.table_schema"  # the table's own schema (serialized) in the stored schema's metadata
_SHORT = b"epochal.short_bytes"  # in the stored schema's metadata: each packed string column's widest value (JSON)
SHORT_BYTES = 128  # a string or binary column is packed where its values take at most this many bytes
SLOT_SPREAD = 2.0  # ... and its slot at most this many times its offsets' and mean value's bytes
_LENGTHS = 256  # a slot's length byte tells this many lengths apart


def value_bytes(type_: pa.DataType) -> int | None:
    """Bytes a value of `type_` takes in a packed row (a boolean a byte); None for a type that
    stays a column unless its values are short (strings and binaries: `Layout.of`), or always
    (nested, dictionary, intervals, NULL)."""
    if pa.types.is_boolean(type_):
        return 1
    if (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
            or pa.types.is_date(type_) or pa.types.is_time(type_) or pa.types.is_timestamp(type_)
            or pa.types.is_duration(type_) or pa.types.is_fixed_size_binary(type_)):
        return type_.bit_width // 8
    return None


def short_type(type_: pa.DataType) -> bool:
    """Whether `type_` is packed where its values are short: a string or binary."""
    return offsets_dtype(type_) is not None


def widest(batch: pa.RecordBatch | pa.Table) -> dict[str, int]:
    """The bytes of the widest value of each string or binary column of `batch` (0 where all
    are NULL or empty): whether it fits a layout's slots (`Layout.holds`)."""
    found = {}
    for field, column in zip(batch.schema, batch.columns):
        if short_type(field.type):
            largest = pc.max(pc.binary_length(column)).as_py() if len(column) else None
            found[field.name] = int(largest or 0)
    return found


def packable(batch: pa.RecordBatch | pa.Table) -> dict[str, int]:
    """`widest` of the string and binary columns of `batch` worth packing: their widest value
    takes at most SHORT_BYTES bytes, and a slot of it at most SLOT_SPREAD times what the column
    takes apart (a value's offset and the mean value's bytes, a NULL's none)."""
    found = {}
    for field, column in zip(batch.schema, batch.columns):
        if short_type(field.type) and len(column):
            lengths = pc.binary_length(column)
            largest = int(pc.max(lengths).as_py() or 0)
            apart = np.dtype(offsets_dtype(field.type)).itemsize + (pc.sum(lengths).as_py() or 0) / len(column)
            if largest <= SHORT_BYTES and 1 + largest <= SLOT_SPREAD * apart:
                found[field.name] = largest
    return found


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each packed column's value lies in a row (`offsets`, `widths`), and its validity bit
    (bit i of the bytes from `validity`, i its place in `packed`); `short`, each packed string or
    binary column's widest value in bytes (its slot is a length byte and that many bytes)."""

    schema: pa.Schema  # the table's own
    packed: tuple[str, ...]
    offsets: tuple[int, ...]
    widths: tuple[int, ...]
    validity: int
    row_bytes: int
    short: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, schema: pa.Schema, apart: tuple[str, ...] = (), short: dict[str, int] | None = None) -> "Layout":
        """The layout of `schema`'s fixed-width columns, and of its string and binary columns whose
        widest value in `short` (`packable` of the data to pack) is at most SHORT_BYTES (and tells
        its length in a byte), but those
        `apart` (kept columns: a local copy keeps its key apart, since a read scans the key of a
        block of rows for the few rows that hold a key, and the packed rows of those rows only)."""
        short = short or {}
        packed, offsets, widths, shorts, at = [], [], [], [], 0
        for field in schema:
            width = value_bytes(field.type)
            if short_type(field.type) and short.get(field.name, _LENGTHS) < min(SHORT_BYTES + 1, _LENGTHS):
                shorts.append((field.name, short[field.name]))
                width = 1 + short[field.name]
            if width and field.name not in apart:
                packed.append(field.name)
                offsets.append(at)
                widths.append(width)
                at += width
        shorts = tuple((name, bytes_) for name, bytes_ in shorts if name in packed)
        return cls(schema, tuple(packed), tuple(offsets), tuple(widths), at, at + (len(packed) + 7) // 8, shorts)

    @classmethod
    def stored(cls, stored_schema: pa.Schema) -> "Layout":
        """The layout of a table stored as `stored_schema` (what `stored_schema()` made: the
        table's own schema and its packed strings' widths in its metadata, and the columns kept
        apart after the packed rows)."""
        metadata = stored_schema.metadata or {}
        serialized = metadata.get(_SCHEMA)
        if serialized is None or stored_schema.names[:1] != [PACKED]:
            raise ValueError("not a table of packed rows")
        return cls.of(ipc.read_schema(pa.py_buffer(base64.b64decode(serialized))), tuple(stored_schema.names[1:]),
                      json.loads(metadata.get(_SHORT, b"{}")))

    def stored_schema(self) -> pa.Schema:
        """The schema the packed table is stored as: the packed rows, then the other columns."""
        others = [field for field in self.schema if field.name not in self.packed]
        serialized = base64.b64encode(self.schema.serialize().to_pybytes())
        metadata = {_SCHEMA: serialized}
        if self.short:
            metadata[_SHORT] = json.dumps(dict(self.short)).encode()
        return pa.schema([pa.field(PACKED, pa.binary(self.row_bytes), nullable=False), *others], metadata=metadata)

    def holds(self, batch: pa.RecordBatch) -> bool:
        """Whether every packed string or binary value of `batch` fits its slot."""
        found = widest(batch.select([name for name, _ in self.short])) if self.short else {}
        return all(found[name] <= bytes_ for name, bytes_ in self.short)

    def pack(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` (of `schema`) as the stored schema's batch."""
        rows = np.zeros((batch.num_rows, self.row_bytes), np.uint8)
        valid = np.ones((batch.num_rows, len(self.packed)), bool)
        short = dict(self.short)
        for place, (name, offset, width) in enumerate(zip(self.packed, self.offsets, self.widths)):
            column = batch.column(name)
            if name in short:
                rows[:, offset:offset + width] = _slots_of(column, short[name])
            else:
                rows[:, offset:offset + width] = _value_bytes_of(column, width)
            if column.null_count:
                valid[:, place] = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool)
        rows[:, self.validity:] = np.packbits(valid, axis=1, bitorder="little")
        packed = pa.Array.from_buffers(pa.binary(self.row_bytes), batch.num_rows, [None, pa.py_buffer(rows)])
        stored = self.stored_schema()
        return pa.record_batch([packed, *(batch.column(f.name) for f in stored if f.name != PACKED)], schema=stored)

    def unpacked(self, rows: np.ndarray, name: str) -> pa.Array:
        """Column `name` (a packed one) of `rows` (packed rows, a row of `row_bytes` bytes each)."""
        place = self.packed.index(name)
        type_ = self.schema.field(name).type
        offset, width = self.offsets[place], self.widths[place]
        valid = (rows[:, self.validity + place // 8] >> (place % 8)) & 1 == 1
        nulls = len(rows) - int(np.count_nonzero(valid))
        validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        values = rows[:, offset:offset + width]
        if name in dict(self.short):
            lengths = np.where(valid, values[:, 0], 0).astype(np.int64)
            data = values[:, 1:][np.arange(width - 1) < lengths[:, None]]
            offsets = np.concatenate(([0], np.cumsum(lengths))).astype(offsets_dtype(type_))
            return pa.Array.from_buffers(type_, len(rows), [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                         null_count=nulls)
        if pa.types.is_boolean(type_):
            data = np.packbits(values[:, 0] != 0, bitorder="little")
        else:
            data = np.ascontiguousarray(values)
        return pa.Array.from_buffers(type_, len(rows), [validity, pa.py_buffer(data)], null_count=nulls)


def row_bytes(packed: pa.Array) -> np.ndarray:
    """The packed rows of `packed` (a fixed-size binary array) as a matrix of bytes, a row a row."""
    width = packed.type.byte_width
    if not len(packed):
        return np.zeros((0, width), np.uint8)
    data = np.frombuffer(packed.buffers()[1], np.uint8)
    return data[packed.offset * width:(packed.offset + len(packed)) * width].reshape(len(packed), width)


def offsets_dtype(type_: pa.DataType):
    """The numpy type of a string or binary type's offsets; None for other layouts."""
    if pa.types.is_string(type_) or pa.types.is_binary(type_):
        return np.int32
    if pa.types.is_large_string(type_) or pa.types.is_large_binary(type_):
        return np.int64
    return None


def _slots_of(column: pa.Array, bytes_: int) -> np.ndarray:
    """`column`'s values (strings or binaries of at most `bytes_` bytes) as a matrix of slots, a
    row a row: its length in a byte, then its bytes, then zeros (a NULL's length 0)."""
    count = len(column)
    slots = np.zeros((count, 1 + bytes_), np.uint8)
    if not count:
        return slots
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], offsets_dtype(column.type))[column.offset:column.offset + count + 1]
    starts, lengths = offsets[:-1], np.diff(offsets)
    if column.null_count:
        lengths = np.where(np.asarray(column.is_valid().to_numpy(zero_copy_only=False), bool), lengths, 0)
    if int(lengths.max()) > bytes_:
        raise ValueError(f"a value of {int(lengths.max())} bytes in a slot of {bytes_}")
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    if bytes_:
        first = int(starts.min())
        padded = np.zeros(int(starts.max()) - first + bytes_, np.uint8)
        held = data[first:first + len(padded)]
        padded[:len(held)] = held
        slots[:, 1:] = sliding_window_view(padded, bytes_)[starts - first]
        slots[:, 1:] *= np.arange(bytes_) < lengths[:, None]
    slots[:, 0] = lengths
    return slots


def _value_bytes_of(column: pa.Array, width: int) -> np.ndarray:
    """`column`'s values as a matrix of bytes, `width` a row (a boolean 0 or 1; a NULL's bytes
    whatever the buffer holds)."""
    if pa.types.is_boolean(column.type):
        return np.asarray(column.fill_null(False).to_numpy(zero_copy_only=False), np.uint8).reshape(-1, 1)
    data = column.buffers()[1]
    if data is None:
        return np.zeros((len(column), width), np.uint8)
    flat = np.frombuffer(data, np.uint8)
    return flat[column.offset * width:(column.offset + len(column)) * width].reshape(len(column), width)
