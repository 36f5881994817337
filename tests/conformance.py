"""The conformance suite's cases: a column type, the shapes of SQL over it, a change stream, an
execution path and session settings, run by the engine epoch after epoch and compared with Spark's
own full computation of the same SQL at the same versions.

A run is one column type under one path and one group of settings: two sources, t(id, k, x) and
u(id, k, y) with x and y of the type, every shape the type admits defined as a derived table over
them (each table is a case), then epochs of random changes (duplicate rows, keys moved to NULL and
back, deletes with re-inserts of the same row, updates to NULL, NaN and -0.0), every table compared
with its recompute after every epoch. Exact equality; the tolerances are for SUM and AVG over
FLOAT and DOUBLE (relative 1e-12, NaN equal to NaN), whose order of addition differs, and for AVG
over BIGINT, which Spark adds as doubles in its own order (BIGINT_AVERAGE_SLACK).

`test_conformance.py` draws runs with hypothesis; `make conformance` draws many, and writes each
case's outcome (EPOCHAL_CONFORMANCE_RESULTS, a JSON-lines file) for the README's matrix
(`python -m tests.conformance_matrix`).
"""

from __future__ import annotations

import datetime as datetime_module
import json
import math
import os
import re
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Context, Decimal
from pathlib import Path

import pyarrow as pa
from delta.tables import DeltaTable
from hypothesis import assume
from hypothesis import strategies as st
from pyspark.sql import functions as F

from epochal import Engine
from tests.support import Oracle, local_frame

TOLERANCE = 1e-12
# A double sum of n BIGINTs of at most 2^52 (_integers) has partial sums below n * 2^52 and rounds
# each addition by at most half their unit in the last place: for n up to 512, 2^61 and 2^8. So
# an average of them is off by at most 256 however Spark orders the addition.
BIGINT_AVERAGE_SLACK = 256.0


@dataclass(frozen=True)
class ColumnType:
    """A Spark type the suite draws columns of, and what SQL admits over it."""

    sql: str
    values: st.SearchStrategy
    numeric: bool = False
    floating: bool = False
    comparable: bool = True  # =, GROUP BY, DISTINCT, set operations (not MAP)
    orderable: bool = True  # MIN, MAX, ORDER BY

    @property
    def label(self) -> str:
        return self.sql.split("(")[0].split("<")[0].split(" ")[0].upper() if "collate" not in self.sql.lower() \
            else "STRING COLLATE UTF8_LCASE"


def _integers(bits: int) -> st.SearchStrategy:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if bits == 64:  # sums of a few hundred stay within BIGINT (overflow has a test of its own)
        low, high = -(2 ** 52), 2 ** 52
    return st.integers(low, high) | st.sampled_from([0, 1, -1, low, high])


def _decimals(precision: int, scale: int) -> st.SearchStrategy:
    """Values of DECIMAL(precision, scale) whose sums and averages fit their types (Spark's SUM
    is DECIMAL(p+10, s), its AVG DECIMAL(p+4, s+4), each at most 38 digits)."""
    digits = min(precision - scale, min(38, precision + 4) - min(38, scale + 4), min(38, precision + 10) - scale - 3)
    largest = 10 ** (max(digits, 0) + scale) - 1
    unscaled = st.integers(-largest, largest) | st.sampled_from([0, 1, -1, largest, -largest])
    # exact: Python's default context (28 digits) would round wider values, past the type's range too
    return unscaled.map(lambda n: Decimal(n).scaleb(-scale, Context(prec=80)))


def _floats(width: int) -> st.SearchStrategy:
    """Multiples of 1/4 below 2^20 (their sums are exact in any order), and NaN, -0.0, +-infinity."""
    nice = st.integers(-(2 ** 22), 2 ** 22).map(lambda n: n / 4)
    return nice | st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf])


TEXT = st.sampled_from(["", " ", "a", "A", "a ", "ab", "Ab", "ä", "Ä", "日本", "😀", "b\n", "z"]) | \
    st.text(alphabet="aAbBä😀 ", max_size=4)
DATES = st.dates(date(1900, 1, 1), date(2100, 12, 31)) | st.sampled_from([date(1970, 1, 1), date(2000, 2, 29)])
NAIVE = st.datetimes(datetime(1900, 1, 1), datetime(2100, 1, 1)).map(lambda d: d.replace(microsecond=d.microsecond))
AWARE = NAIVE.map(lambda d: d.replace(tzinfo=timezone.utc))


def decimal_type(precision: int, scale: int) -> ColumnType:
    return ColumnType(f"decimal({precision},{scale})", _decimals(precision, scale), numeric=True)


# No STRING COLLATE UTF8_LCASE: Delta 4.4 refuses a collated column in a table (DELTA_UNSUPPORTED_DATA_TYPES),
# a source's or a derived table's; the comparison below still folds such a column where a table has one.
SCALAR_TYPES = [
    ColumnType("tinyint", _integers(8), numeric=True),
    ColumnType("smallint", _integers(16), numeric=True),
    ColumnType("int", _integers(32), numeric=True),
    ColumnType("bigint", _integers(64), numeric=True),
    ColumnType("float", _floats(32), numeric=True, floating=True),
    ColumnType("double", _floats(64), numeric=True, floating=True),
    ColumnType("string", TEXT),
    ColumnType("date", DATES),
    ColumnType("timestamp", AWARE),
    ColumnType("timestamp_ntz", NAIVE),
    ColumnType("boolean", st.booleans()),
    ColumnType("binary", st.binary(max_size=3)),
    ColumnType("array<int>", st.lists(st.none() | st.integers(-3, 3), max_size=3)),
    ColumnType("map<string,int>", st.dictionaries(st.sampled_from(["a", "b", "c"]), st.none() | st.integers(-3, 3),
                                                  max_size=2), comparable=False, orderable=False),
    ColumnType("struct<a:int,b:string>", st.tuples(st.none() | st.integers(-3, 3), st.none() | TEXT)),
]


def column_named(sql: str) -> ColumnType:
    """The suite's column type spelled `sql` (decimal(p,s) of any p and s)."""
    found = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", sql.strip().lower())
    if found:
        return decimal_type(int(found.group(1)), int(found.group(2)))
    for column in SCALAR_TYPES:
        if column.sql.lower() == sql.strip().lower():
            return column
    raise ValueError(f"no conformance type {sql!r}: one of {', '.join(c.sql for c in SCALAR_TYPES)} or decimal(p,s)")


@st.composite
def decimal_types(draw) -> ColumnType:
    """DECIMAL(p,s) of any width, the widths where Spark's arithmetic changes rule drawn often."""
    precision = draw(st.sampled_from([1, 5, 9, 15, 18, 19, 28, 30, 37, 38]) | st.integers(1, 38))
    scale = draw(st.integers(0, min(precision, 18)))
    return decimal_type(precision, scale)


@st.composite
def column_types(draw) -> ColumnType:
    if draw(st.integers(0, 3)) == 0:  # a decimal of any width a quarter of the time
        return draw(decimal_types())
    return draw(st.sampled_from(SCALAR_TYPES))


TYPE_NAMES = tuple(column.sql for column in SCALAR_TYPES) + ("decimal",)  # decimal: of a drawn width


def type_strategy(name: str | None) -> st.SearchStrategy:
    """The column types `name` stands for: one of TYPE_NAMES, decimal(p,s), or None (any type)."""
    if name is None:
        return column_types()
    if name == "decimal":
        return decimal_types()
    return st.just(column_named(name))


@dataclass(frozen=True)
class Shape:
    name: str
    sql: str
    approximate: tuple[str, ...] = ()  # output columns compared with TOLERANCE (sums of floating point)
    slack: float = 0.0  # and with this absolute difference besides (BIGINT_AVERAGE_SLACK)
    representative: bool = False  # its values of x stand for a group (GROUP BY, DISTINCT, a set operation, MIN)


def shapes(column: ColumnType) -> list[Shape]:
    """Every shape of SQL the type admits, over t(id, k, x) and u(id, k, y)."""
    out = [
        Shape("filter_project", "SELECT id, k, x, x IS NULL AS missing, coalesce(k, -1) + 1 AS k1 FROM t "
                                "WHERE k IS NOT NULL OR x IS NOT NULL"),
        Shape("left_join_on_k", "SELECT t.id, t.x, u.y FROM t LEFT JOIN u ON t.k = u.k"),
        Shape("count_by_k", "SELECT k, count(*) AS n, count(x) AS nx FROM t GROUP BY k"),
        Shape("union_all", "SELECT k, x FROM t UNION ALL SELECT k, y FROM u"),
        # rank, not row_number: ids repeat (drawn rows, duplicates), and row_number breaks a tie
        # either way, so the SQL itself would have two answers
        Shape("window", "SELECT id, k, x, rank() OVER (PARTITION BY k ORDER BY id) AS rn, "
                        "count(x) OVER (PARTITION BY k) AS nk FROM t"),
        Shape("derived_of_derived", "SELECT k, count(*) AS n FROM c_filter_project GROUP BY k"),
    ]
    if column.comparable:
        out += [
            Shape("group_by_x", "SELECT x, count(*) AS n, sum(id) AS ids FROM t GROUP BY x", representative=True),
            Shape("distinct", "SELECT DISTINCT k, x FROM t", representative=True),
            Shape("count_distinct", "SELECT k, count(DISTINCT x) AS dx FROM t GROUP BY k"),
            Shape("inner_join_on_x", "SELECT t.id, u.id AS uid, t.x FROM t JOIN u ON t.x = u.y"),
            Shape("full_join_on_x", "SELECT t.id, u.id AS uid, u.y FROM t FULL OUTER JOIN u ON t.x = u.y"),
            Shape("semi_join", "SELECT id, x FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.y = t.x)"),
            Shape("anti_join", "SELECT id, x FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.y = t.x)"),
            Shape("in_subquery", "SELECT id, k FROM t WHERE x IN (SELECT y FROM u)"),
            Shape("not_in_subquery", "SELECT id, k FROM t WHERE x NOT IN (SELECT y FROM u)"),
            Shape("union", "SELECT x FROM t UNION SELECT y FROM u", representative=True),
            Shape("intersect", "SELECT x FROM t INTERSECT SELECT y FROM u", representative=True),
            Shape("except", "SELECT x FROM t EXCEPT SELECT y FROM u", representative=True),
        ]
    if column.orderable:
        out.append(Shape("min_max_by_k", "SELECT k, min(x) AS lo, max(x) AS hi FROM t GROUP BY k", representative=True))
        # an uncorrelated scalar subquery's filter (a semi-join with its one-row aggregate): when u's
        # max moves, the rows of t whose comparison flips; NULL (u empty, or all NULL) passes nothing
        out.append(Shape("at_least_scalar", "SELECT id, k, x FROM t WHERE x >= (SELECT max(y) FROM u)"))
    if column.numeric and not column.floating and column.sql != "bigint":
        # AVG is exact here (Spark adds as doubles; BIGINT and floating-point sums may round differently)
        out.append(Shape("above_average", "SELECT k, count(*) AS n FROM t WHERE x > (SELECT avg(y) FROM u) "
                                          "AND k IS NOT NULL GROUP BY k"))
    if column.numeric:
        # Spark's AVG adds the values as doubles (BIGINT too), in the order it reads them: a BIGINT
        # sum past 2^53 is rounded as it goes, differently in the recompute and in the engine (which
        # holds the exact sum and divides it once), so BIGINT averages are compared loosely; their
        # exact SUM and COUNT stand beside them in every shape but the join's
        big = column.sql == "bigint"
        sums = ("s", "a", "gs", "ga") if column.floating else ("", "a", "", "ga") if big else ()
        slack = BIGINT_AVERAGE_SLACK if big else 0.0
        # integers widened first: TINYINT + TINYINT is a TINYINT, which ANSI mode fails on at 127 + 127
        # in the recompute as in the engine (the user's SQL's error, not the engine's)
        v = "CAST(x AS BIGINT)" if column.sql in ("tinyint", "smallint", "int", "bigint") else "x"
        arithmetic = f"SELECT id, {v} + x AS twice, {v} * 3 AS thrice, -{v} AS negated, {v} - 1 AS less FROM t " \
                     "WHERE x IS NOT NULL"
        out += [
            Shape("arithmetic", arithmetic),
            Shape("sum_avg_by_k", "SELECT k, sum(x) AS s, avg(x) AS a, count(x) AS n FROM t GROUP BY k",
                  approximate=sums[:2], slack=slack),
            Shape("sum_avg_global", "SELECT sum(x) AS gs, avg(x) AS ga, count(*) AS n FROM t", approximate=sums[2:],
                  slack=slack),
            Shape("sum_over_join", "SELECT u.k, sum(t.x) AS s, avg(u.y) AS a FROM t JOIN u ON t.k = u.k GROUP BY u.k",
                  approximate=sums[:2], slack=slack),
        ]
    return out


# ---- changes ----------------------------------------------------------------------------------------
KEYS = st.none() | st.integers(0, 3)


def row_of(column: ColumnType) -> st.SearchStrategy:
    return st.tuples(st.integers(0, 10 ** 6), KEYS, st.none() | column.values)


def operations(column: ColumnType) -> st.SearchStrategy:
    row = row_of(column)
    return st.one_of(
        st.tuples(st.just("insert"), st.lists(row, min_size=1, max_size=4)),
        st.tuples(st.just("insert_duplicate"), st.integers(0, 50)),
        st.tuples(st.just("delete"), st.integers(0, 50)),
        st.tuples(st.just("update"), st.integers(0, 50), st.none() | column.values),
        st.tuples(st.just("key_to_null"), st.integers(0, 3)),
        st.tuples(st.just("key_from_null"), st.integers(0, 3)),
        st.tuples(st.just("reinsert"), st.integers(0, 50)),
    )


@dataclass
class Run:
    """One run's draw: its column type, path, settings and changes."""

    column: ColumnType
    path: str  # "driver" or "spark"
    arranged: bool  # arrangements forced (arrange_rows=0) or none
    ansi: bool
    precision_loss: bool
    zone_change: bool  # the session time zone changes before the last epoch
    initial: tuple[list, list]
    epochs: list[tuple[list, list]]
    large: bool = False  # one epoch inserts a few hundred rows
    only: tuple[str, ...] | None = None  # the shapes run (None: every shape the type admits)

    def shapes(self) -> list[Shape]:
        every = shapes(self.column)
        if self.only is None:
            return every
        wanted = set(self.only) | ({"filter_project"} if "derived_of_derived" in self.only else set())
        return [shape for shape in every if shape.name in wanted]

    def replay(self) -> str:
        """The run as text `replayed` rebuilds (its column by name, its rows and changes as Python
        literals): what a mismatch records, since a run that records instead of failing has no
        seed printed (`python -m tests.conformance_replay`)."""
        return repr({"column": self.column.sql, "path": self.path, "arranged": self.arranged, "ansi": self.ansi,
                     "precision_loss": self.precision_loss, "zone_change": self.zone_change,
                     "initial": self.initial, "epochs": self.epochs, "large": self.large, "only": self.only})

    def describe(self) -> str:
        return (f"{self.column.sql} ({', '.join(s.name for s in self.shapes())}) on the {self.path} path, arrangements {'forced' if self.arranged else 'off'}, "
                f"ANSI {'on' if self.ansi else 'off'}, precision loss {'on' if self.precision_loss else 'off'}"
                f"{', time zone changed' if self.zone_change else ''}")


def replayed(text: str) -> Run:
    """The Run that Run.replay wrote."""
    fields = eval(text, {"__builtins__": {}}, {"datetime": datetime_module, "Decimal": Decimal,  # noqa: S307
                                                 "nan": math.nan, "inf": math.inf})
    return Run(column_named(fields.pop("column")), **fields)


@st.composite
def runs(draw, columns: st.SearchStrategy | None = None, epochs: tuple[int, int] = (2, 3),
         most_shapes: int | None = None, named: tuple[str, ...] = ()) -> Run:
    """A drawn run of a column type drawn from `columns` (None: any); `most_shapes`: at most that
    many of the type's shapes, drawn (None: all); `named`: only these shapes (the first shape where
    the type has none of them). Hypothesis tries its simplest example first, the same every time (a
    one-digit decimal, one shape, no changes to speak of): rejected, every example is a random one."""
    assume(draw(st.integers(0, 2 ** 31)) != 0)
    column = draw(columns if columns is not None else column_types())
    names = [shape.name for shape in shapes(column)]
    if named:
        names = [name for name in names if name in named] or names[:1]
    only = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=most_shapes, unique=True))) \
        if most_shapes is not None else (tuple(names) if named else None)
    initial = (draw(st.lists(row_of(column), min_size=3, max_size=12)), draw(st.lists(row_of(column), min_size=2, max_size=8)))
    ops = operations(column)
    drawn = draw(st.lists(st.tuples(st.lists(ops, min_size=1, max_size=4), st.lists(ops, max_size=2)),
                          min_size=epochs[0], max_size=epochs[1]))
    return Run(column, draw(st.sampled_from(["driver", "spark"])), draw(st.booleans()), draw(st.booleans()),
               draw(st.booleans()), draw(st.integers(0, 4)) == 0, initial, drawn, large=draw(st.integers(0, 3)) == 0,
               only=only)


class Source:
    """A source Delta table of (id, k, value) with a change data feed, changed by real commits:
    appends, DELETE, and MERGE for updates (Delta records update pre- and post-images)."""

    def __init__(self, spark, path: str, value: str, column: ColumnType, rows: list):
        self.spark, self.path, self.column = spark, path, column
        self.schema = spark.createDataFrame([], f"id bigint, k int, {value} {column.sql}").schema
        self.value = value
        self._frame(rows).write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)

    def _frame(self, rows: list):
        return local_frame(self.spark, [self._typed(r) for r in rows], self.schema)

    def _typed(self, row):
        value = row[2]
        if value is not None and self.column.sql.startswith("struct"):
            value = {"a": value[0], "b": value[1]}
        return (row[0], row[1], value)

    def ids(self) -> list[int]:
        """The rows' ids, by delta-rs (a Spark read of a version just written costs jobs)."""
        from deltalake import DeltaTable as DeltaRs

        try:
            return sorted(DeltaRs(self.path).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
        except Exception:  # noqa: BLE001 - a table feature delta-rs lacks
            return sorted(r["id"] for r in self.spark.read.format("delta").load(self.path).select("id").collect())

    def apply(self, op) -> None:
        table = DeltaTable.forPath(self.spark, self.path)
        ids = self.ids()
        pick = (lambda n: ids[n % len(ids)]) if ids else (lambda n: None)
        kind = op[0]
        if kind == "insert":
            self._frame(op[1]).write.format("delta").mode("append").save(self.path)
        elif kind == "insert_duplicate" and ids:
            table.toDF().filter(F.col("id") == pick(op[1])).limit(1).write.format("delta").mode("append").save(self.path)
        elif kind == "delete" and ids:
            table.delete(F.col("id") == pick(op[1]))
        elif kind == "update" and ids:
            new = self._frame([(pick(op[1]), None, op[2])]).select("id", self.value)
            table.alias("t").merge(new.alias("s"), "t.id = s.id").whenMatchedUpdate(
                set={self.value: f"s.`{self.value}`"}).execute()
        elif kind == "key_to_null":
            table.update(F.col("k") == op[1], {"k": F.lit(None).cast("int")})
        elif kind == "key_from_null":
            table.update(F.col("k").isNull(), {"k": F.lit(op[1])})
        elif kind == "reinsert" and ids:  # delete rows and insert the same rows again, in one epoch
            held = table.toDF().filter(F.col("id") == pick(op[1])).toArrow()
            table.delete(F.col("id") == pick(op[1]))
            if held.num_rows:
                self.spark.createDataFrame(held, schema=self.schema).write.format("delta").mode("append").save(self.path)


# ---- comparison ------------------------------------------------------------------------------------
def freeze(value):
    """A value as a hashable, comparable key: NaN equal to NaN, -0.0 equal to 0.0 (as Spark's
    grouping holds them), instants in UTC, collections as tuples."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value + 0.0
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, dict):
        return tuple(sorted((freeze(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def bag(data: pa.Table, names: list[str], folded: frozenset = frozenset()) -> Counter:
    """The rows as a multiset, values as Spark compares them: the `folded` columns (strings of a
    case-insensitive collation, where Spark's GROUP BY or DISTINCT keeps any one spelling of a
    group) in lower case."""
    columns = [data.column(n).to_pylist() for n in names]
    columns = [[v.lower() if isinstance(v, str) else v for v in column] if n in folded else column
               for n, column in zip(names, columns)]
    return Counter(tuple(freeze(v) for v in row) for row in zip(*columns))


def folded_columns(schema, shape: "Shape") -> frozenset:
    """The columns compared case-insensitively: strings of a case-insensitive collation where
    the shape's values stand for a group (elsewhere a table must hold the very spelling)."""
    if not shape.representative:
        return frozenset()
    return frozenset(f.name for f in schema.fields
                     if getattr(f.dataType, "collation", "UTF8_BINARY") not in ("UTF8_BINARY", None))


def _close(a, b, slack: float = 0.0) -> bool:
    if a == b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        if math.isinf(a) or math.isinf(b):
            return False
        return abs(a - b) <= max(TOLERANCE * max(abs(a), abs(b)), slack)
    return False


def differences(got: Counter, want: Counter, names: list[str], approximate: tuple[str, ...],
                slack: float = 0.0) -> str | None:
    """None when the bags are equal (the `approximate` columns within TOLERANCE, or `slack`);
    else a readable difference."""
    if got == want:
        return None
    extra, missing = list((got - want).elements()), list((want - got).elements())
    if approximate and len(extra) == len(missing):
        loose = [i for i, n in enumerate(names) if n in approximate]
        exact = lambda row: tuple(v for i, v in enumerate(row) if i not in loose)  # noqa: E731
        unmatched = list(missing)
        for row in extra:
            match = next((m for m in unmatched if exact(m) == exact(row) and
                          all(_close(row[i], m[i], slack) for i in loose)), None)
            if match is None:
                break
            unmatched.remove(match)
        else:
            return None
    return f"{len(extra)} rows too many: {extra[:4]}; {len(missing)} missing: {missing[:4]}"


def stored(engine, name: str) -> pa.Table:
    """The table as of its last epoch: by delta-rs, or by Spark where delta-rs cannot read it."""
    from deltalake import DeltaTable as DeltaRs

    table = engine.table(name)
    version = table.ledger.last_committed().output_version
    try:
        return DeltaRs(table.path, version=version).to_pyarrow_table()
    except Exception:  # noqa: BLE001 - a table feature delta-rs lacks (collations)
        return engine.spark.read.format("delta").option("versionAsOf", version).load(table.path).toArrow()


# ---- a run -----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """Per table (case) of a run: every epoch's technique and reason, and the first mismatch."""

    run: Run
    cases: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    # tables whose SQL fails in its recompute with the error the refresh failed with (an AVG past
    # its type under ANSI): the user's SQL's error, which the engine raises as a rebuild would; the
    # run ends at that epoch
    failing_sql: dict[str, str] = field(default_factory=dict)
    seconds: Counter = field(default_factory=Counter)  # per phase: sources, refresh, oracle, stored

    def records(self, shapes_by_table: dict[str, Shape]) -> list[dict]:
        out = []
        for name, steps in self.cases.items():
            incremental = [s for s in steps[1:] if s[0] != "noop"]
            reasons = sorted({reason.split(":")[0] for technique, reason in incremental if technique == "rescan"})
            out.append({"type": self.run.column.label, "sql_type": self.run.column.sql,
                        "shape": shapes_by_table[name].name, "path": self.run.path, "arranged": self.run.arranged,
                        "ansi": self.run.ansi, "precision_loss": self.run.precision_loss,
                        "zone_change": self.run.zone_change,
                        "steps": len(incremental), "rescans": reasons,
                        "mismatch": [m for m in self.mismatches if m.startswith(name + ":")],
                        "error": self.errors.get(name), "failing_sql": self.failing_sql.get(name),
                        "run_seconds": {phase: round(value, 2) for phase, value in self.seconds.items()}})
            if out[-1]["mismatch"] or out[-1]["error"]:
                out[-1]["replay"] = self.run.replay()
        return out


SETTINGS = {"ansi": "spark.sql.ansi.enabled", "precision_loss": "spark.sql.decimalOperations.allowPrecisionLoss",
            "zone": "spark.sql.session.timeZone"}


ERROR_CLASS = re.compile(r"\[([A-Z][A-Z_]+(?:\.[A-Z_]+)*)\]")
WRAPPING = {"TASK_WRITE_FAILED"}  # names the write a cause failed, not the cause


class SqlFailsInFull(Exception):
    """The refresh failed, and so do the recomputes of `outcome.failing_sql`, with the same error."""


def failing_in_full(oracle, names: list[str], error: Exception) -> dict[str, str]:
    """The tables whose recompute fails with an error class the refresh's `error` names."""
    raised = set(ERROR_CLASS.findall(str(error))) - WRAPPING
    found = {}
    for name in names:
        try:
            oracle.frame(name).toArrow()
        except Exception as recomputing:  # noqa: BLE001 - the recompute's own error is the finding
            shared = raised & set(ERROR_CLASS.findall(str(recomputing)))
            if shared:
                found[name] = ", ".join(sorted(shared))
    return found


def run_case(spark, warehouse: str, run: Run) -> tuple[Outcome, dict[str, Shape]]:
    """Run `run` and compare every table with its recompute after every epoch. The session's
    settings are the run's for its duration."""
    before = {key: spark.conf.get(name) for key, name in SETTINGS.items()}
    spark.conf.set(SETTINGS["ansi"], str(run.ansi).lower())
    spark.conf.set(SETTINGS["precision_loss"], str(run.precision_loss).lower())
    spark.conf.set(SETTINGS["zone"], "UTC")
    try:
        return _run(spark, warehouse, run)
    finally:
        for key, value in before.items():
            spark.conf.set(SETTINGS[key], value)


def _run(spark, warehouse: str, run: Run) -> tuple[Outcome, dict[str, Shape]]:
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    outcome = Outcome(run)
    began = time.perf_counter()
    t = Source(spark, f"{root}/sources/t", "x", run.column, run.initial[0])
    u = Source(spark, f"{root}/sources/u", "y", run.column, run.initial[1])
    outcome.seconds["sources"] += time.perf_counter() - began
    # arrangements forced on the driver path: a version of more than 4 rows is not held whole but
    # read by key, from the arrangements (a version held whole needs none, and would test none)
    driver_rows = (4 if run.arranged else 50_000) if run.path == "driver" else 0
    engine = Engine(spark, root, cost_model=False, driver_rows=driver_rows,
                    arrange_rows=0 if run.arranged else None)
    engine.source("t")
    engine.source("u")
    by_table = {f"c_{shape.name}": shape for shape in run.shapes()}
    for name, shape in by_table.items():
        sql = shape.sql
        try:
            engine.define(name, sql)
        except Exception as error:  # noqa: BLE001 - a refusal at definition time is a finding
            outcome.errors[name] = f"{type(error).__name__}: {error}"
    defined = [n for n in by_table if n not in outcome.errors]
    outcome.cases = {name: [] for name in defined}

    def timed(phase: str, work):
        began = time.perf_counter()
        try:
            return work()
        finally:
            outcome.seconds[phase] += time.perf_counter() - began

    def epoch(context: str) -> None:
        try:
            reports = timed("refresh", lambda: engine.refresh(defined))
        except Exception as error:
            outcome.failing_sql.update(failing_in_full(Oracle(engine), defined, error))
            if not outcome.failing_sql:
                raise
            raise SqlFailsInFull(context) from error
        for report in reports:
            outcome.cases[report.table].append((report.technique, report.reason or ""))
        oracle = Oracle(engine)
        for name in defined:
            schema = engine.table(name).schema
            names, folded = [f.name for f in schema.fields], folded_columns(schema, by_table[name])
            got = bag(timed("stored", lambda: stored(engine, name)), names, folded)
            want = bag(timed("oracle", lambda: oracle.frame(name).toArrow()), names, folded)
            problem = differences(got, want, names, by_table[name].approximate, by_table[name].slack)
            if problem:
                outcome.mismatches.append(f"{name}: {context}: {problem}")
            if run.column.floating:
                problem = timed("stored", lambda: nan_rows_read_by_spark(engine, name, oracle.frame(name), names, folded,
                                                                         by_table[name]))
                if problem:
                    outcome.mismatches.append(f"{name}: {context}: Spark's filtered read: {problem}")

    try:
        epochs(spark, run, t, u, epoch, outcome)
    except SqlFailsInFull:
        pass
    return outcome, by_table


def epochs(spark, run: Run, t, u, epoch, outcome: Outcome) -> None:
    """The run's epochs: the first, then each batch of changes applied and refreshed."""
    epoch("after the first epoch")
    for number, (t_ops, u_ops) in enumerate(run.epochs, start=2):
        began = time.perf_counter()
        for op in t_ops:
            t.apply(op)
        for op in u_ops:
            u.apply(op)
        if run.large and number == 2:
            t.apply(("insert", [(10 ** 7 + i, i % 4, None) for i in range(300)]))
        outcome.seconds["sources"] += time.perf_counter() - began
        if run.zone_change and number == len(run.epochs) + 1:
            spark.conf.set(SETTINGS["zone"], "America/Los_Angeles")
        epoch(f"after epoch {number}: t {t_ops} u {u_ops}")


def code_under_test() -> str | None:
    """The git trees of the engine and of this suite (`epochal/`, `tests/conformance.py`), as
    committed: results recorded under the same trees are of the same code, whichever commit or
    invocation wrote them (None outside a git checkout, or with either changed and uncommitted)."""
    root = Path(__file__).resolve().parent.parent
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "epochal", "tests/conformance.py"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        trees = [subprocess.run(["git", "rev-parse", f"HEAD:{part}"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()[:12] for part in ("epochal", "tests/conformance.py")]
    except (OSError, subprocess.CalledProcessError):
        return None
    return None if dirty else "+".join(trees)


def nan_rows_read_by_spark(engine, name: str, recomputed, names: list[str], folded, shape: "Shape") -> str | None:
    """The table's rows whose floating columns hold NaN, read by Spark as a user reads them (`x =
    NaN`, which Spark pushes down to Parquet's statistics and Delta's), against the same filter over
    the recompute; None when they agree. Spark skips files and row groups whose statistics leave NaN
    out (arrow-based writers do), so the stored table can be right and its filtered read wrong."""
    schema = engine.table(name).schema
    columns = [f for f in schema.fields if f.dataType.typeName() in ("float", "double")]
    if not columns:
        return None
    condition = None
    for f in columns:
        part = F.col(f"`{f.name}`") == F.lit(float("nan")).cast(f.dataType)
        condition = part if condition is None else condition | part
    version = engine.table(name).ledger.last_committed().output_version
    held = engine.spark.read.format("delta").option("versionAsOf", version).load(engine.table(name).path)
    got = bag(held.filter(condition).toArrow(), names, folded)
    want = bag(recomputed.filter(condition).toArrow(), names, folded)
    return differences(got, want, names, shape.approximate, shape.slack)


def record(outcome: Outcome, by_table: dict[str, Shape]) -> None:
    """Append the run's cases to EPOCHAL_CONFORMANCE_RESULTS, where it is set, each with the code
    it ran (`code_under_test`)."""
    target = os.environ.get("EPOCHAL_CONFORMANCE_RESULTS")
    if not target:
        return
    code = code_under_test()
    with open(target, "a") as out:
        for entry in outcome.records(by_table):
            out.write(json.dumps({**entry, "code": code}) + "\n")


def expected_rescans(run: Run, step_number: int) -> set[str]:
    """The rescan reasons a run may show at an epoch besides NOT_INCREMENTAL: a changed time zone;
    NOT_EXACT where a floating-point sum holds NaN or an infinity; and where a table carrying a MAP is rewritten whole every epoch, its readers' SOURCE_REWRITTEN."""
    expected = {"SETTINGS_CHANGED"} if run.zone_change and step_number == len(run.epochs) else set()
    if run.column.floating:  # a running sum holding NaN or an infinity: refused, recomputed
        expected.add("NOT_EXACT")
    return expected | ({"SOURCE_REWRITTEN"} if not run.column.comparable else set())

