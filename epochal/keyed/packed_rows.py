"""Rows packed: a table's fixed-width columns laid out row by row, each row's values and their
validity bits side by side in one fixed-size binary value, so that reading a few rows at random
places touches about a page a row, where columns, each a buffer of its own, touch a page a
column a row.

A local copy holds its file this way (local_copies.py): a keyed read of a copy that the page cache
lacks waits on a disk read for each page it touches, so with eight columns the rows of one key
cost eight reads (docs/performance.md). Columns of other layouts (strings, binary, nested,
dictionaries) stay columns beside the packed rows. The packing moves the bytes Arrow holds and
nothing else, so what `unpacked` gives back is the same values of the same types, whatever the
type: no value is converted.
"""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

PACKED = "__epochal_packed_rows"  # the packed rows' column
_SCHEMA = b"epochal.table_schema"  # the table's own schema (serialized) in the stored schema's metadata


def value_bytes(type_: pa.DataType) -> int | None:
    """Bytes a value of `type_` takes in a packed row (a boolean a byte); None for a type that
    stays a column (variable width, nested, dictionary, intervals, NULL)."""
    if pa.types.is_boolean(type_):
        return 1
    if (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
            or pa.types.is_date(type_) or pa.types.is_time(type_) or pa.types.is_timestamp(type_)
            or pa.types.is_duration(type_) or pa.types.is_fixed_size_binary(type_)):
        return type_.bit_width // 8
    return None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each packed column's value lies in a row (`offsets`, `widths`), and its validity bit
    (bit i of the bytes from `validity`, i its place in `packed`)."""

    schema: pa.Schema  # the table's own
    packed: tuple[str, ...]
    offsets: tuple[int, ...]
    widths: tuple[int, ...]
    validity: int
    row_bytes: int

    @classmethod
    def of(cls, schema: pa.Schema, apart: tuple[str, ...] = ()) -> "Layout":
        """The layout of `schema`'s fixed-width columns but those `apart` (kept columns: a local
        copy keeps its key apart, since a read scans the key of a block of rows for the few
        rows that hold a key, and the packed rows of those rows only)."""
        packed, offsets, widths, at = [], [], [], 0
        for field in schema:
            width = value_bytes(field.type)
            if width and field.name not in apart:
                packed.append(field.name)
                offsets.append(at)
                widths.append(width)
                at += width
        return cls(schema, tuple(packed), tuple(offsets), tuple(widths), at, at + (len(packed) + 7) // 8)

    @classmethod
    def stored(cls, stored_schema: pa.Schema) -> "Layout":
        """The layout of a table stored as `stored_schema` (what `stored_schema()` made: the
        table's own schema in its metadata, and the columns kept apart after the packed rows)."""
        serialized = (stored_schema.metadata or {}).get(_SCHEMA)
        if serialized is None or stored_schema.names[:1] != [PACKED]:
            raise ValueError("not a table of packed rows")
        return cls.of(ipc.read_schema(pa.py_buffer(base64.b64decode(serialized))), tuple(stored_schema.names[1:]))

    def stored_schema(self) -> pa.Schema:
        """The schema the packed table is stored as: the packed rows, then the other columns."""
        others = [field for field in self.schema if field.name not in self.packed]
        serialized = base64.b64encode(self.schema.serialize().to_pybytes())
        return pa.schema([pa.field(PACKED, pa.binary(self.row_bytes), nullable=False), *others],
                         metadata={_SCHEMA: serialized})

    def pack(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` (of `schema`) as the stored schema's batch."""
        rows = np.zeros((batch.num_rows, self.row_bytes), np.uint8)
        valid = np.ones((batch.num_rows, len(self.packed)), bool)
        for place, (name, offset, width) in enumerate(zip(self.packed, self.offsets, self.widths)):
            column = batch.column(name)
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
