"""Rows held on the driver as Arrow, typed as Spark types them: which key types Arrow compares as
Spark does, key tuples and key codes (one int64 per row, equal where the keys are), the Arrow
types of a Spark schema, a Spark frame over Arrow rows made only when Spark needs it, and the rows
a frame carries with it (`Held`, `hold`). Shared by the driver-side evaluators, the operators,
the keyed reads and the state."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BooleanType, DataType, DateType, DecimalType, IntegralType, StringType, StructType

KEY_TYPES = (IntegralType, StringType, DateType, BooleanType, DecimalType)


def key_type(data_type: DataType) -> bool:
    if isinstance(data_type, StringType):
        return getattr(data_type, "collation", "UTF8_BINARY") in ("UTF8_BINARY", None)
    return isinstance(data_type, KEY_TYPES)


def key_tuples(rows: pa.Table, columns: list[str]) -> list[tuple]:
    """Each row's values of `columns` as a tuple (None equals None: a NULL-safe match)."""
    return list(zip(*[rows.column(c).to_pylist() for c in columns]))


def key_codes(*keyed: tuple[pa.Table, list[str]]) -> list[np.ndarray]:
    """Per (table, key columns), one int64 per row, equal across the tables exactly where the
    rows' key tuples are equal as Spark's grouping and NULL-safe joins compare them (NULL equals
    NULL, NaN equals NaN, -0.0 equals 0.0): the key columns dictionary encoded by Arrow, which
    leaves the GIL, rather than a Python tuple per row. Columns of one key kind (key_kind) are
    cast to one type first; columns of different kinds are matched as Python compares them."""
    try:
        return _codes_in_arrow(keyed)
    except (pa.ArrowException, TypeError, ValueError):
        seen: dict[tuple, int] = {}
        return [np.fromiter((seen.setdefault(tuple(_NAN if value != value else value for value in key), len(seen))
                             for key in key_tuples(rows, columns)), dtype=np.int64, count=rows.num_rows)
                for rows, columns in keyed]


_NAN = object()  # every float NaN, as one key value equal to no other value


_COMMON_TYPE = {"integer": pa.int64(), "string": pa.large_string(), "date": pa.date32(), "boolean": pa.bool_()}


def _codes_in_arrow(keyed) -> list[np.ndarray]:
    lengths = [rows.num_rows for rows, _ in keyed]
    combined = np.zeros(sum(lengths), dtype=np.int64)
    for i in range(len(keyed[0][1])):
        parts = [rows.column(columns[i]) for rows, columns in keyed]
        if len({part.type for part in parts}) > 1:
            kinds = {key_kind(part.type) for part in parts}
            if len(kinds) > 1:
                raise TypeError(f"key columns of different kinds: {kinds}")
            kind = kinds.pop()
            common = _COMMON_TYPE.get(kind) or (
                pa.decimal128(38, max(part.type.scale for part in parts)) if kind == "decimal" else None)
            if common is None:
                raise TypeError(f"no common type for key columns of {kind}")
            parts = [part.cast(common) for part in parts]
        chunks = [chunk for part in parts for chunk in part.chunks]
        values = pa.concat_arrays(chunks) if chunks else pa.array([], parts[0].type)
        if pa.types.is_floating(values.type):  # one NaN, one zero, as Spark normalizes them
            values = pc.if_else(pc.is_nan(values), pa.scalar(float("nan"), values.type),
                                pc.if_else(pc.equal(values, 0), pa.scalar(0.0, values.type), values))
        encoded = pc.dictionary_encode(values, null_encoding="encode")
        size = max(len(encoded.dictionary), 1)
        if len(combined) and int(combined.max()) >= 2 ** 62 // size:
            combined = np.unique(combined, return_inverse=True)[1].astype(np.int64)
        combined = combined * size + np.asarray(encoded.indices, dtype=np.int64)
    return np.split(combined, np.cumsum(lengths)[:-1])


def keys_in(rows: pa.Table, columns: list[str], among: pa.Table, among_columns: list[str]) -> np.ndarray:
    """Whether each row's key tuple is one of `among`'s (None equals None), as a boolean mask."""
    codes, wanted = key_codes((rows, columns), (among, among_columns))
    return np.isin(codes, wanted)


def first_of_each_key(rows: pa.Table, columns: list[str]) -> np.ndarray:
    """The positions, ascending, of each key tuple's first row (None equals None)."""
    return np.sort(np.unique(key_codes((rows, columns))[0], return_index=True)[1])


def positions_of(rows: pa.Table, columns: list[str], among: pa.Table, among_columns: list[str]) -> pa.Array:
    """For each row, the position of the row of `among` with the same key tuple (None equals
    None; `among`'s keys unique), or NULL where there is none."""
    codes, held = key_codes((rows, columns), (among, among_columns))
    if not len(held):
        return pa.nulls(len(codes), pa.int64())
    at, found = code_positions(codes, held)
    return pa.array(np.where(found, at, 0), mask=~found, type=pa.int64())


def code_positions(codes: np.ndarray, among: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each code, a position in `among` holding the same code, and whether there is one."""
    if not len(among):
        return np.zeros(len(codes), np.int64), np.zeros(len(codes), bool)
    order = np.argsort(among, kind="stable")
    at = order[np.minimum(np.searchsorted(among[order], codes), len(among) - 1)]
    return at, among[at] == codes


def first_values(keys) -> tuple[tuple, bool] | None:
    """The sorted distinct non-NULL first values of key tuples, and whether one is NULL (the
    keys a driver read takes); None where the values do not sort."""
    first = {key[0] for key in keys}
    return _sorted_and_null(first - {None}, None in first)


def column_first_values(*columns: pa.ChunkedArray) -> tuple[tuple, bool] | None:
    """first_values of key tuples given their first columns as Arrow (each the first key column
    of one table): the sorted distinct non-NULL values and whether one is NULL, without a Python
    tuple per row; None where the values do not sort."""
    values, null = set(), False
    for column in columns:
        if pa.types.is_string_view(column.type):  # Arrow's unique gives a view's NULL as ""
            column = column.cast(pa.large_string())
        distinct = pc.unique(column)
        null = null or distinct.null_count > 0
        values.update(distinct.drop_null().to_pylist())
    return _sorted_and_null(values, null)


def _sorted_and_null(values: set, null: bool) -> tuple[tuple, bool] | None:
    try:
        return tuple(sorted(values)), null
    except TypeError:
        return None


def spark_typed(rows: pa.Table, schema: StructType) -> pa.Table | None:
    """`rows` with `schema`'s columns, in its order and with the Arrow types Spark gives them
    (delta-rs reads string views and its own time zones); None where a column is missing."""
    if any(name not in rows.column_names for name in schema.names):
        return None
    return rows.select(schema.names).cast(to_arrow_schema(schema))


def key_kind(arrow_type: pa.DataType) -> str:
    for kind, test in (("integer", pa.types.is_integer), ("string", pa.types.is_string),
                       ("string", pa.types.is_large_string), ("string", pa.types.is_string_view),
                       ("date", pa.types.is_date), ("decimal", pa.types.is_decimal),
                       ("boolean", pa.types.is_boolean)):
        if test(arrow_type):
            return kind
    return str(arrow_type)


class Held:
    """Arrow rows on the driver holding every row of the frame that carries them (`hold`), so the
    frame's key values are taken there without a Spark job; `exact` when they are the frame's rows,
    no more, so the operators above may compute on them instead of Spark. The rows may be given as
    a function, called when first asked for (once: steps share frames)."""

    __slots__ = ("_rows", "exact", "_computing")

    def __init__(self, rows: pa.Table | Callable[[], pa.Table], exact: bool):
        self._rows = rows
        self.exact = exact
        self._computing = threading.Lock()

    @property
    def computed(self) -> bool:
        """Whether the rows are there already (not a function still to call)."""
        return not callable(self._rows)

    def rows(self) -> pa.Table:
        if callable(self._rows):
            with self._computing:
                if callable(self._rows):
                    self._rows = self._rows()
        return self._rows


HELD = "epochal_held"  # the attribute of a frame carrying its Held rows


def hold(frame: DataFrame, rows: pa.Table | Callable[[], pa.Table], exact: bool = False) -> DataFrame:
    """`frame`, carrying `rows` (an Arrow table with the frame's columns, read or computed on the
    driver, or a function computing it) as rows holding every row of it; `exact` when they are
    its rows, no more. The rows travel with the frame object (a frame Spark derives from it is a
    new object, carrying none)."""
    frame.__dict__[HELD] = Held(rows, exact)
    return frame


def held(frame: DataFrame | None) -> Held | None:
    return frame.__dict__.get(HELD) if frame is not None else None


def held_rows(frame: DataFrame | None) -> pa.Table | None:
    """The Arrow rows `frame` carries (a superset of its rows), or None."""
    found = held(frame)
    return found.rows() if found is not None else None


def exact_rows(frame: DataFrame | None) -> pa.Table | None:
    """The Arrow rows `frame` carries as exactly its own (delta-rs's or Spark's Arrow types), or None."""
    found = held(frame)
    return found.rows() if found is not None and found.exact else None


def computed_rows(frame: DataFrame | None) -> pa.Table | None:
    """exact_rows where they are computed already (not a function still to call), else None."""
    found = held(frame)
    return found.rows() if found is not None and found.exact and found.computed else None


def held_exactly(frame: DataFrame | None) -> bool:
    """Whether `frame` carries exactly its rows, without computing rows given as a function."""
    found = held(frame)
    return found is not None and found.exact


class LocalFrame(ClassicDataFrame):
    """A local relation of Arrow rows, handed to Spark only when Spark first needs it.

    Most rows read or computed on the driver stay there (a join term, an aggregate, a write
    computed in Arrow), yet each is a DataFrame in case a rule above gives it to Spark, and
    createDataFrame has a fixed cost that a step creating dozens of them pays dozens of times
    (TPC-H Q21's did). Until a method needs the Java DataFrame, only the schema is known; the
    first attribute that needs it creates it (once, under a lock: steps share frames), and from
    then on this is that DataFrame."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, session, create, schema: StructType):
        self.__dict__.update(_session=session, _create=create, _creating=threading.Lock(), schema=schema)

    @property
    def created(self) -> bool:
        return "_jdf" in self.__dict__

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_create", "_creating"):
            raise AttributeError(name)
        with self.__dict__["_creating"]:
            if "_jdf" not in self.__dict__:
                frame = self.__dict__["_create"]()
                self.__dict__.update({k: v for k, v in frame.__dict__.items() if k not in ("schema", HELD)})
        if name in self.__dict__:
            return self.__dict__[name]
        return super().__getattr__(name)  # DataFrame's: a column by name


def is_connect(spark) -> bool:
    """A Spark Connect session (`sc://`): no JVM in this process, and its frames are not classic."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def lazy_frame(spark, create, schema: StructType) -> DataFrame:
    """`create()`'s frame, of `schema`, created only when Spark first needs it (a LocalFrame);
    Spark Connect's frames are not classic: created now."""
    if is_connect(spark):
        return create()
    return LocalFrame(spark, create, schema)
