"""Packed rows (epochal/keyed/packed_rows.py): every fixed-width type's values, short strings and
binaries, and NULLs come back from a packed row the same values of the same type, and a local copy
made of a Parquet file of every type serves the rows of its keys exactly as pyarrow's own filter of
that file does, whichever of its record batches holds its widest strings."""

from __future__ import annotations

import datetime
import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.keyed.file_pruning import as_integers
from epochal.keyed.local_copies import LocalCopies, MappedCopy
from epochal.keyed.packed_rows import (PACKED, SHORT_BYTES, Layout, packable, row_bytes, short_type, value_bytes,
                                       widest)

_EPOCH = datetime.datetime(2000, 1, 1)


def _values(type_: pa.DataType, n: int) -> st.SearchStrategy:
    """`n` values of `type_`, NULLs among them."""
    if pa.types.is_boolean(type_):
        base = st.booleans()
    elif pa.types.is_integer(type_):
        info = np.iinfo(type_.to_pandas_dtype())
        base = st.integers(int(info.min), int(info.max))
    elif pa.types.is_floating(type_):
        base = st.floats(width=type_.bit_width, allow_nan=True)
    elif pa.types.is_decimal(type_):
        largest = 10 ** type_.precision - 1
        base = st.integers(-largest, largest).map(lambda unscaled: _decimal(unscaled, type_.scale))
    elif pa.types.is_date(type_):
        base = st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))
    elif pa.types.is_timestamp(type_):
        base = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1))
    elif pa.types.is_time(type_):
        base = st.times()
    elif pa.types.is_duration(type_):
        base = st.timedeltas(-datetime.timedelta(days=9999), datetime.timedelta(days=9999))
    elif pa.types.is_fixed_size_binary(type_):
        base = st.binary(min_size=type_.byte_width, max_size=type_.byte_width)
    elif pa.types.is_list(type_):
        base = st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=3)
    elif pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        base = st.binary(max_size=SHORT_BYTES + 2)
    else:  # past SHORT_BYTES (in UTF-8) the column stays apart
        base = st.one_of(st.text(max_size=6), st.text(max_size=SHORT_BYTES // 2 + 2))
    return st.lists(st.one_of(st.none(), base), min_size=n, max_size=n)


TYPES = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.float32(),
         pa.float64(), pa.decimal128(5, 2), pa.decimal128(38, 10), pa.decimal256(50, 4), pa.date32(),
         pa.timestamp("us", "UTC"), pa.timestamp("ns"), pa.time64("us"), pa.duration("us"), pa.binary(3),
         pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.list_(pa.int32())]


def _decimal(unscaled: int, scale: int) -> str:
    """The decimal `unscaled` * 10^-`scale`, written out (decimal's context would round wide ones)."""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return ("-" if unscaled < 0 else "") + (f"{digits[:-scale]}.{digits[-scale:]}" if scale else digits)


def _array(values: list, type_: pa.DataType) -> pa.Array:
    if pa.types.is_decimal(type_):  # pyarrow infers a precision from the first decimal of the list
        return pa.array(values, pa.string()).cast(type_)
    return pa.array(values, type_)


@st.composite
def _tables(draw) -> pa.Table:
    n = draw(st.integers(0, 40))
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=8))
    columns = {f"c{i}": _array(draw(_values(t, n)), t) for i, t in enumerate(types)}
    columns["k"] = pa.array(draw(st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=n, max_size=n)),
                            pa.int64())
    return pa.table(columns)


@settings(max_examples=100, deadline=None)
@given(table=_tables(), offset=st.integers(0, 3), slack=st.integers(0, 2))
def test_packed_rows_unpack_to_the_same_values(table, offset, slack):
    """Whatever the types and NULLs, a batch sliced (an offset into its buffers), and string slots
    as wide as their widest value or wider."""
    batch = table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], table.schema)
    batch = batch.slice(min(offset, batch.num_rows))
    layout = Layout.of(batch.schema, short={name: bytes_ + slack for name, bytes_ in widest(batch).items()})
    assert layout.holds(batch)
    assert all(bytes_ <= SHORT_BYTES for _, bytes_ in layout.short)
    assert {name for name, _ in layout.short} == \
        {name for name in layout.packed if short_type(batch.schema.field(name).type)}
    stored = layout.pack(batch)
    assert stored.schema.equals(layout.stored_schema(), check_metadata=True)
    again = Layout.stored(stored.schema)
    assert again == layout
    rows = row_bytes(stored.column(PACKED))
    for field in batch.schema:
        column = batch.column(field.name)
        if field.name in layout.packed:
            assert value_bytes(field.type) or short_type(field.type)
            back = again.unpacked(rows, field.name)
        else:
            back = stored.column(field.name)
        assert back.type == field.type
        back.validate(full=True)
        assert back.to_pylist() == column.to_pylist() or _same_floats(back, column), field


def _same_floats(back: pa.Array, column: pa.Array) -> bool:
    """Equal as bits (NaN is not equal to itself)."""
    if not pa.types.is_floating(column.type):
        return False
    as_bits = {16: np.uint16, 32: np.uint32, 64: np.uint64}[column.type.bit_width]
    valid = np.asarray(column.is_valid())
    return bool((np.asarray(back.is_valid()) == valid).all()) and bool(
        (np.asarray(back.fill_null(0)).view(as_bits)[valid] == np.asarray(column.fill_null(0)).view(as_bits)[valid]).all())


@settings(max_examples=40, deadline=None)
@given(table=_tables(), wanted=st.lists(st.integers(-6, 6), max_size=6), nulls=st.booleans(),
       batch_rows=st.sampled_from([1, 4, 256]), copy_batch_rows=st.sampled_from([1, 7, 1 << 20]))
def test_a_copy_of_every_type_serves_exactly_the_rows_of_its_keys(tmp_path_factory, table, wanted, nulls, batch_rows,
                                                                   copy_batch_rows):
    """Record batches of one row group (7 rows) or of a few, so that a later batch's strings are
    often wider than the first's, whose widest values size the slots."""
    folder = str(tmp_path_factory.mktemp("copies"))
    table = table.sort_by([("k", "ascending")]).append_column("row", pa.array(range(table.num_rows), pa.int64()))
    path = os.path.join(folder, "part-0.parquet")
    pq.write_table(table, path, row_group_size=7)
    fragment = next(iter(ds.dataset(path, format="parquet").get_fragments()))
    values = pa.array(wanted, pa.int64())
    condition = ds.field("k").isin(values)
    if nulls:
        condition = condition | ds.field("k").is_null()
    expected = ds.dataset(path, format="parquet").to_table(filter=condition).sort_by("row")
    columns = list(reversed(expected.column_names))
    found = LocalCopies(os.path.join(folder, "copies"), batch_rows=batch_rows, copy_batch_rows=copy_batch_rows).rows(
        path, fragment, "K", np.unique(as_integers(values)), nulls, [c.upper() for c in columns])
    assert found is not None
    assert found.schema.equals(expected.select(columns).schema)
    found = found.sort_by("row")
    for name in columns:
        assert found.column(name).to_pylist() == expected.column(name).to_pylist() \
            or _same_floats(found.column(name).combine_chunks(), expected.column(name).combine_chunks()), name


def test_a_copy_whose_later_batch_holds_wider_strings_sizes_its_slots_by_them(tmp_path):
    """The first record batch's widest values size the slots; a later, wider one makes the copy
    again, wide enough for it, and one past SHORT_BYTES leaves its column apart."""
    path = str(tmp_path / "part-0.parquet")
    table = pa.table({"k": pa.array(range(6), pa.int64()),
                      "mode": ["a", "b", "ship by air", "rail", "é" * 5, None],
                      "comment": ["x", "y", "z", "w" * (SHORT_BYTES + 1), "v", "u"]})
    pq.write_table(table, path, row_group_size=2)
    fragment = next(iter(ds.dataset(path, format="parquet").get_fragments()))
    copies = LocalCopies(str(tmp_path / "copies"), copy_batch_rows=2)
    found = copies.rows(path, fragment, "k", np.arange(6, dtype=np.int64), False, ["k", "mode", "comment"])
    assert found.sort_by("k").equals(table)
    stored = Layout.stored(MappedCopy(copies.existing(path, "k")).reader().schema)
    assert stored.short == (("mode", 11),)
    assert "comment" not in stored.packed


def test_strings_are_packed_only_where_a_slot_of_the_widest_costs_at_most_twice_the_column():
    """Flags and comments of about even lengths take slots; a column of NULLs and one long note
    would widen every row for it and stays apart, as does one past SHORT_BYTES."""
    rows = 100
    batch = pa.record_batch({
        "flag": pa.array(["R", "A"] * (rows // 2)),
        "comment": pa.array([("x" * (40 + i % 30)).encode() for i in range(rows)], pa.large_binary()),
        "note": pa.array(["n" * 60] + [None] * (rows - 1)),
        "essay": pa.array(["e" * (SHORT_BYTES + 1)] * rows)})
    assert packable(batch) == {"flag": 1, "comment": 69}
    layout = Layout.of(batch.schema, short=packable(batch))
    assert layout.packed == ("flag", "comment")
    back = layout.unpacked(row_bytes(layout.pack(batch).column(PACKED)), "comment")
    assert back.equals(batch.column("comment"))
