"""A deterministic stream of hourly change batches over the TPC-H source tables.

Each batch is what an OLTP system would leave in the sources in an hour: new orders with their line
items (TPC-H refresh function 1), orders deleted with all their line items (refresh function 2), and
updates to line items, orders and the dimensions customer, part and supplier. Dimension updates are
in every batch on purpose: they change join results far from the changed row, which is where an
incremental engine goes wrong.

Each table's share of a batch is one MERGE (one Delta commit) driven by an action column, so the
change data feed shows `insert`, `delete`, `update_preimage` and `update_postimage`. The commit's
userMetadata carries the batch's logical time and index, so a day of hourly batches can be written
in a few minutes and still fall into the right hourly epochs.

A local warehouse's MERGEs are delta-rs's (`writer="delta-rs"`, the default there): a batch's five
MERGEs then cost no Spark job and a small fraction of Spark's time at the tests' small scale
(bench/RESULTS.md), and they are the operations whose change data feed
tests/test_driver_commits.py proves exact (matched delete, matched update of a unique key,
not-matched insert). A warehouse on an object store is written by Spark's MERGE, which
knows the cluster's credentials; `writer="spark"` asks for it anywhere.

Determinism: the batch is drawn from `numpy.random.default_rng([seed, index])` over keys collected to
the driver and sorted, so the same seed and the same starting tables give the same batch, row for row
(Spark's sampling depends on partitioning and is not used).

A batch is drawn and held as columns (numpy arrays, Arrow tables of the tables' own types; money in
integer cents, rounded half to even as Decimal's quantize rounds) and reaches Spark's MERGE as Arrow
batches: a tenth of scale 10's orders is 15 million changed rows, which as Python objects outgrew
the machine's memory.

Referential integrity holds at every batch boundary: keys are never updated to a missing key, new
rows reference existing customers, parts and partsupp (part, supplier) pairs, and a deleted order
takes its line items in the same batch. Between the commits of one batch it may not: those commits
share a logical time and so land in one epoch.

Deleted orders are drawn from the oldest keys and updated ones from the newest (see
CHANGE_WINDOW), so batches leave most of the range-partitioned files of orders and lineitem alone.

Order keys are never reused: the order with the largest key is never deleted, so the largest key only
grows and fresh keys (above it) were never seen before. The change feed then never shows one key for
two different orders.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
import uuid
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from pyspark.sql.pandas.types import to_arrow_type

from epochal.storage.clock import logical_time_metadata, parse_logical_time, utc
from epochal.storage.warehouse import Warehouse, is_local, local_path
from ops import deltalog
from ops.confs import USER_METADATA_CONF, session_confs
from ops.tpch import PRIMARY_KEYS, TPCH_TABLES

BATCH_KEY = "batch"
ACTION = "_epochal_action"
ALWAYS_CHANGED = ("supplier", "customer", "part", "orders", "lineitem")
MAX_FRACTION = 0.25  # orders to delete, update and line-update are drawn disjointly: 3n must fit
# Deletes purge old orders (the oldest 5% of keys), updates hit recent ones (the newest 5%), as in
# an OLTP system. A MERGE rewrites every file it touches and the rewritten rows lose their key
# order, so keeping changes at the two ends of the key range leaves the loader's range-partitioned
# files in between untouched: data skipping on order keys keeps working, and each MERGE rewrites a
# small part of the table instead of all of it.
CHANGE_WINDOW = 0.05

SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
ORDER_STATUSES = ("F", "O", "P")
SHIP_INSTRUCTIONS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
SHIP_MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
# TPC-H's dates: orders between STARTDATE and ENDDATE - 151 days; CURRENTDATE decides return
# flags and line status.
START_DATE = date(1992, 1, 1)
LAST_ORDER_DATE = date(1998, 8, 2)
CURRENT_DATE = date(1995, 6, 17)
START_DAY, LAST_ORDER_DAY, CURRENT_DAY = ((d - date(1970, 1, 1)).days for d in (START_DATE, LAST_ORDER_DATE, CURRENT_DATE))
COMMENT_POOL = 4096  # comments a batch draws from; a pool keeps a million-row batch columnar
ORDERS_PER_CLERK = 1500
COMMENT_WORDS = (
    "furiously", "carefully", "blithely", "quickly", "slyly", "fluffily", "final", "regular",
    "pending", "express", "ironic", "special", "bold", "even", "silent", "unusual", "deposits",
    "requests", "packages", "accounts", "instructions", "theodolites", "foxes", "pinto", "beans",
    "ideas", "dependencies", "platelets", "asymptotes", "sleep", "haggle", "nag", "wake", "cajole",
    "detect", "integrate", "use", "boost", "among", "above", "across", "along", "the",
)


MERGE_CONFS = {
    # Size the rewritten files by bytes rather than split them across every shuffle partition:
    # each small file would be touched, and rewritten, again by the next batch. (Turning off
    # MERGE's source materialization was measured too: slower, the source is then rebuilt from
    # Python rows in every phase.)
    "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
}


WRITERS = ("delta-rs", "spark")


class ChangeConflict(RuntimeError):
    """The sources are not in a state a batch can be applied to (or changed under the batch)."""


@dataclass(frozen=True)
class TableChange:
    """One table's commit in a batch. Keys are held as Arrow tables of the primary-key columns,
    sorted (a tenth of scale 10's orders is millions of keys); `*_keys` gives them as tuples in the
    table's primary-key column order."""

    table: str
    version: int
    inserted_key_table: pa.Table
    deleted_key_table: pa.Table
    updated_key_table: pa.Table

    @property
    def inserted_keys(self) -> tuple[tuple, ...]:
        return _key_tuples(self.inserted_key_table)

    @property
    def deleted_keys(self) -> tuple[tuple, ...]:
        return _key_tuples(self.deleted_key_table)

    @property
    def updated_keys(self) -> tuple[tuple, ...]:
        return _key_tuples(self.updated_key_table)

    @property
    def inserted(self) -> int:
        return self.inserted_key_table.num_rows

    @property
    def deleted(self) -> int:
        return self.deleted_key_table.num_rows

    @property
    def updated(self) -> int:
        return self.updated_key_table.num_rows


@dataclass(frozen=True)
class BatchReport:
    index: int
    logical_time: datetime
    tables: dict[str, TableChange]  # only the tables that got a commit
    seconds: float = field(default=0.0, compare=False)

    def counts(self, table: str) -> tuple[int, int, int]:
        """(inserted, deleted, updated) rows; zeros for a table the batch did not touch."""
        change = self.tables.get(table)
        return (change.inserted, change.deleted, change.updated) if change else (0, 0, 0)


@dataclass(frozen=True)
class ChangeHistory:
    """What earlier batches left in the sources' commit metadata."""

    batches: dict[str, int]  # table -> highest batch index committed to it (0: none)
    latest_time: datetime | None  # newest logical time stamped on any source commit

    @property
    def last_batch(self) -> int:
        return max(self.batches.values(), default=0)

    def incomplete(self) -> list[str]:
        """Tables every batch writes that lack the last batch: a batch stopped half-way."""
        return [t for t in ALWAYS_CHANGED if self.batches.get(t, 0) < self.last_batch]


def change_history(spark, warehouse_root: str) -> ChangeHistory:
    warehouse = Warehouse(warehouse_root)
    batches: dict[str, int] = {}
    latest: datetime | None = None
    for name in TPCH_TABLES:
        path = warehouse.source_path(name)
        if not deltalog.is_delta_table(spark, path):
            raise ChangeConflict(
                f"source table {name!r} is missing at {path}: load TPC-H first (ops.tpch.load_tpch, "
                f"the load_tpch job, or make demo)"
            )
        batches[name] = 0
        for commit in deltalog.history(spark, path):
            stamped = parse_logical_time(commit.user_metadata)
            if stamped is not None and (latest is None or stamped > latest):
                latest = stamped
            batch = _batch_of(commit.user_metadata)
            if batch is not None:
                batches[name] = max(batches[name], batch)
    return ChangeHistory(batches=batches, latest_time=latest)


def _batch_of(user_metadata: str | None) -> int | None:
    if not user_metadata:
        return None
    try:
        value = json.loads(user_metadata).get(BATCH_KEY)
    except (ValueError, AttributeError):
        return None
    return int(value) if value is not None else None


@dataclass
class TablePlan:
    """One table's share of a batch, as Arrow tables in the table's own column types: whole new
    rows, the primary keys of deleted rows, whole rows with their new values."""

    inserts: pa.Table | None = None
    deletes: pa.Table | None = None
    updates: pa.Table | None = None

    def rows(self, part: str) -> int:
        table = getattr(self, part)
        return 0 if table is None else table.num_rows

    def __bool__(self) -> bool:
        return any(self.rows(part) for part in ("inserts", "deletes", "updates"))


def _key_tuples(keys: pa.Table) -> tuple[tuple, ...]:
    return tuple(zip(*(column.to_pylist() for column in keys.columns)))


def _key_table(rows: pa.Table | None, table: str) -> pa.Table:
    """The primary keys of `rows`, sorted; an empty table of them when there are none."""
    keys = PRIMARY_KEYS[table]
    if rows is None:
        return pa.table({k: pa.array([], pa.int64()) for k in keys})
    return rows.select(keys).sort_by([(k, "ascending") for k in keys])


def _cents(column) -> np.ndarray:
    """A decimal(p, 2) column's unscaled values (cents) as int64; nulls read as 0."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    words = np.frombuffer(array.buffers()[1], dtype=np.int64).reshape(-1, 2)
    return words[array.offset:array.offset + len(array), 0].copy()


def _decimal(cents: np.ndarray, type_: pa.DataType = pa.decimal128(15, 2)) -> pa.Array:
    """Cents back to a decimal(p, 2) column (Arrow's decimal128: two's complement, 16 bytes)."""
    cents = np.asarray(cents, dtype=np.int64)
    words = np.stack([cents, np.where(cents < 0, -1, 0)], axis=1).astype(np.int64)
    return pa.Array.from_buffers(type_, len(cents), [None, pa.py_buffer(words.tobytes())])


def _days(column) -> np.ndarray:
    return pc.cast(column, pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)


def _date(days: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(days, dtype=np.int32)).cast(pa.date32())


def _divide_half_even(numerator: np.ndarray, denominator) -> np.ndarray:
    """numerator / denominator rounded half to even, as Decimal's quantize does (integers)."""
    quotient, remainder = np.divmod(numerator, denominator)
    twice = 2 * remainder
    up = (twice > denominator) | ((twice == denominator) & (quotient % 2 == 1))
    return quotient + up


def _others(rng: np.random.Generator, choices, current) -> np.ndarray:
    """For each value in `current`, one of `choices` different from it, uniformly (so an update
    really changes the row)."""
    choices = np.asarray(choices)
    current = np.asarray(current)
    order = np.argsort(choices, kind="stable")
    position = np.searchsorted(choices[order], current).clip(0, len(choices) - 1)
    found = choices[order][position] == current
    index = np.where(found, order[position], 0)
    shift = rng.integers(1, len(choices), size=len(current))
    return choices[(index + shift) % len(choices)]


def _comments(rng: np.random.Generator, count: int, min_length: int, max_length: int) -> pa.Array:
    """`count` comments of TPC-H's words, drawn from a pool of COMMENT_POOL made for the batch."""
    pool = []
    for _ in range(COMMENT_POOL):
        target = int(rng.integers(min_length, max_length + 1))
        words: list[str] = []
        while len(" ".join(words)) < target:
            words.append(COMMENT_WORDS[int(rng.integers(len(COMMENT_WORDS)))])
        pool.append(" ".join(words)[:target].strip())
    return pa.array(pool, pa.string()).take(pa.array(rng.integers(0, COMMENT_POOL, size=count)))


def _pick(rng: np.random.Generator, choices, count: int) -> pa.Array:
    return pa.array(np.asarray(choices, dtype=object)[rng.integers(0, len(choices), size=count)], pa.string())


def _phones_in(nation_keys: np.ndarray, phones) -> pa.Array:
    """TPC-H phone numbers start with the nation key + 10; keep that when the nation changes."""
    prefix = pc.utf8_lpad(pc.cast(pa.array(nation_keys + 10), pa.string()), width=2, padding="0")
    return pc.binary_join_element_wise(prefix, pc.utf8_slice_codeunits(phones, 2), "")


def _replaced(rows: pa.Table, **columns) -> pa.Table:
    for name, values in columns.items():
        index = rows.schema.get_field_index(name)
        type_ = rows.schema.field(index).type
        column = values.cast(type_) if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, type_)
        rows = rows.set_column(index, rows.schema.field(index), column)
    return rows


def _key_ranges(plan: TablePlan, table: str) -> list[tuple[int, int]]:
    """The leading-key ranges a MERGE can match: one for the deletes (old orders), one for the
    updates (recent ones). Only target rows in them can match; inserts carry fresh keys."""
    leading = PRIMARY_KEYS[table][0]
    ranges = []
    for part in (plan.deletes, plan.updates):
        if part is not None and part.num_rows:
            bounds = pc.min_max(part.column(leading))
            ranges.append((bounds["min"].as_py(), bounds["max"].as_py()))
    return ranges


def _merge_condition(plan: TablePlan, table: str, quote) -> str:
    """The MERGE's condition: the primary key, and the leading key within the ranges the batch
    touches (target-only: the writer skips the files outside them). `quote` quotes a column name
    in the writer's SQL."""
    keys = PRIMARY_KEYS[table]
    condition = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    key_ranges = _key_ranges(plan, table)
    if key_ranges:
        condition += " AND (" + " OR ".join(
            f"t.{quote(keys[0])} BETWEEN {low} AND {high}" for low, high in key_ranges) + ")"
    return condition


def _merge_source(plan: TablePlan, schema: pa.Schema) -> pa.Table:
    """The MERGE's source: every row of the plan in the target's column order and types, each
    with its action; a deleted row carries only its key."""
    nullable = pa.schema([f.with_nullable(True) for f in schema])
    parts = []
    for action, rows in (("insert", plan.inserts), ("delete", plan.deletes), ("update", plan.updates)):
        if rows is None or not rows.num_rows:
            continue
        columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
                   else pa.nulls(rows.num_rows, f.type) for f in nullable]
        columns.append(pa.array([action] * rows.num_rows, pa.string()))
        parts.append(pa.Table.from_arrays(columns, schema=nullable.append(pa.field(ACTION, pa.string()))))
    return pa.concat_tables(parts)


class ChangeGenerator:
    """Applies hourly change batches to the TPC-H sources of a warehouse.

    `fraction` is taken of the current number of orders for the order-level changes (new orders,
    deleted orders, order updates, line-item updates: n of each, at least 1) and of each dimension's
    row count for its updates (at least 1), so a batch's size follows the data.
    """

    def __init__(self, spark, warehouse_root: str, seed: int = 7, fraction: float = 0.001,
                 writer: str | None = None):
        if not 0 < fraction <= MAX_FRACTION:
            raise ValueError(f"fraction must be in (0, {MAX_FRACTION}], got {fraction}")
        if writer not in (None, *WRITERS):
            raise ValueError(f"writer must be one of {', '.join(WRITERS)}, got {writer!r}")
        self.spark = spark
        self.warehouse = Warehouse(warehouse_root)
        if writer == "delta-rs" and not is_local(self.warehouse.root):
            raise ValueError(f"writer 'delta-rs' writes local warehouses only; {self.warehouse.root} is "
                             f"Spark's to write (writer='spark')")
        self.writer = writer or ("delta-rs" if is_local(self.warehouse.root) else "spark")
        self.seed = seed
        self.fraction = fraction
        self._history: ChangeHistory | None = None

    def history(self) -> ChangeHistory:
        if self._history is None:
            self._history = change_history(self.spark, self.warehouse.root)
        return self._history

    def apply_batch(self, index: int, logical_time: datetime) -> BatchReport:
        """Draw batch `index` from the current tables and commit it: one MERGE per changed table
        (supplier, customer, part, orders, lineitem), each stamped with `logical_time` and the
        batch index in its userMetadata (Spark's MERGE: through the session conf, which MERGE
        honours; delta-rs's: in the commit's properties)."""
        started = time.monotonic()
        logical_time = utc(logical_time)
        self._check_order(index, logical_time)
        plans = self.draw(index)
        meta = logical_time_metadata(logical_time, **{BATCH_KEY: index})
        changed = [name for name in TPCH_TABLES if plans.get(name)]
        # The MERGEs touch different tables and share one userMetadata, so they run side by side:
        # most of a small MERGE's time is driver-side bookkeeping that overlaps well.
        merge = self._merge_with_delta_rs if self.writer == "delta-rs" else self._merge
        confs = {USER_METADATA_CONF: meta, **MERGE_CONFS} if self.writer == "spark" else {}
        try:
            with session_confs(self.spark, confs):
                with ThreadPoolExecutor(max_workers=len(changed)) as pool:
                    futures = {n: pool.submit(merge, n, plans[n], meta) for n in changed}
                    tables = {name: future.result() for name, future in futures.items()}
        except BaseException:
            self._history = None  # some tables may hold the batch now: read the logs again
            raise
        history = self.history()
        self._history = ChangeHistory(
            batches={**history.batches, **{name: index for name in tables}},
            latest_time=max(filter(None, [history.latest_time, logical_time])),
        )
        return BatchReport(index, logical_time, tables, seconds=time.monotonic() - started)

    def draw(self, index: int) -> dict[str, TablePlan]:
        """Batch `index` as it would be committed now, per table, drawn but not written."""
        return self._plan(np.random.default_rng([self.seed, index]))

    def _check_order(self, index: int, logical_time: datetime) -> None:
        history = self.history()
        if history.incomplete():
            raise ChangeConflict(
                f"batch {history.last_batch} was committed only in part (missing in "
                f"{', '.join(history.incomplete())}): the sources of {self.warehouse.root} are not "
                f"at a batch boundary. Start again from a fresh warehouse"
            )
        if index <= history.last_batch:
            raise ChangeConflict(
                f"batch {index} cannot be applied to {self.warehouse.root}: batches up to "
                f"{history.last_batch} are already there (applying it again would duplicate "
                f"changes); continue with batch {history.last_batch + 1}"
            )
        if history.latest_time is not None and logical_time < history.latest_time:
            raise ChangeConflict(
                f"batch {index} at logical time {logical_time.isoformat()} is earlier than the "
                f"newest source commit ({history.latest_time.isoformat()}); source time must not "
                f"go backwards"
            )

    # ---- reading the current state -------------------------------------------------------

    def _keys(self, table: str, column: str) -> np.ndarray:
        path = self.warehouse.source_path(table)
        values = deltalog.read_arrow(self.spark, path, columns=[column]).column(0)
        return np.sort(values.to_numpy())

    def _rows(self, table: str, column: str, keys, columns: list[str] | None = None) -> pa.Table:
        """Rows (or their `columns`) whose `column` is in `keys`, sorted by primary key."""
        wanted = np.unique(np.asarray(keys, dtype=np.int64))
        path = self.warehouse.source_path(table)
        rows = deltalog.read_arrow(self.spark, path, columns=None if columns is None else list(columns),
                                   key_column=column, keys=wanted)
        sort_keys = [k for k in PRIMARY_KEYS[table] if k in rows.column_names]
        return rows.sort_by([(k, "ascending") for k in sort_keys]).combine_chunks()

    def _count(self, size: int) -> int:
        return min(size, max(1, round(self.fraction * size)))

    # ---- drawing a batch ------------------------------------------------------------------

    def _plan(self, rng: np.random.Generator) -> dict[str, TablePlan]:
        """Every random draw happens here, in a fixed order over sorted inputs."""
        plans = defaultdict(TablePlan)
        order_keys = self._keys("orders", "o_orderkey")
        if len(order_keys) < 4:
            raise ChangeConflict(f"orders holds {len(order_keys)} rows: too few to change")
        n = self._count(len(order_keys))
        candidates = order_keys[:-1]
        n = min(n, len(candidates) // 3)
        window = max(int(len(candidates) * CHANGE_WINDOW), 2 * n)
        if 2 * window <= len(candidates):
            deleted_orders = np.sort(rng.choice(candidates[:window], size=n, replace=False))
            recent = rng.choice(candidates[-window:], size=2 * n, replace=False)
        else:  # too few orders for separate windows: draw from all of them
            picked = rng.choice(candidates, size=3 * n, replace=False)
            deleted_orders, recent = np.sort(picked[:n]), picked[n:]
        updated_orders = np.sort(recent[:n])
        line_updated_orders = np.sort(recent[n:])

        self._plan_order_updates(rng, plans["orders"], updated_orders)
        self._plan_deletes_and_line_updates(rng, plans, deleted_orders, line_updated_orders)
        nation_keys = self._keys("nation", "n_nationkey")
        customer_keys = self._keys("customer", "c_custkey")
        self._plan_customer_updates(rng, plans["customer"], customer_keys, nation_keys)
        part_keys = self._keys("part", "p_partkey")
        self._plan_part_updates(rng, plans["part"], part_keys)
        self._plan_supplier_updates(rng, plans["supplier"], nation_keys)
        self._plan_new_orders(rng, plans, n, int(order_keys[-1]), len(order_keys), customer_keys,
                              part_keys)
        return plans

    def _plan_order_updates(self, rng, plan: TablePlan, keys) -> None:
        rows = self._rows("orders", "o_orderkey", keys)
        plan.updates = _replaced(
            rows,
            o_orderstatus=_others(rng, ORDER_STATUSES, rows.column("o_orderstatus").to_numpy(zero_copy_only=False)),
            o_orderpriority=_others(rng, PRIORITIES, rows.column("o_orderpriority").to_numpy(zero_copy_only=False)),
        )

    def _plan_deletes_and_line_updates(self, rng, plans, deleted_orders, line_updated_orders):
        plans["orders"].deletes = pa.table({"o_orderkey": pa.array(deleted_orders, pa.int64())})
        plans["lineitem"].deletes = self._rows("lineitem", "l_orderkey", deleted_orders, PRIMARY_KEYS["lineitem"])
        lines = self._rows("lineitem", "l_orderkey", line_updated_orders)
        if not lines.num_rows:
            return
        _, first_line, line_count = np.unique(lines.column("l_orderkey").to_numpy(), return_index=True,
                                              return_counts=True)
        rows = lines.take(pa.array(first_line + rng.integers(0, line_count)))
        old_quantity = _cents(rows.column("l_quantity")) // 100
        new_quantity = _others(rng, np.arange(1, 51), old_quantity)
        price = _cents(rows.column("l_extendedprice"))
        repriced = _divide_half_even(price * new_quantity, np.where(old_quantity == 0, 1, old_quantity))
        receipt = _days(rows.column("l_receiptdate"))
        flags = np.array(["R", "A"], dtype=object)[rng.integers(0, 2, size=rows.num_rows)]
        old_flags = rows.column("l_returnflag").to_numpy(zero_copy_only=False)
        plans["lineitem"].updates = _replaced(
            rows,
            l_quantity=_decimal(new_quantity * 100),
            l_extendedprice=_decimal(np.where(old_quantity == 0, price, repriced)),
            l_discount=_decimal(rng.integers(0, 11, size=rows.num_rows)),
            l_returnflag=np.where(receipt <= CURRENT_DAY, flags, old_flags),
        )

    def _plan_customer_updates(self, rng, plan, customer_keys, nation_keys) -> None:
        chosen = rng.choice(customer_keys, size=self._count(len(customer_keys)), replace=False)
        rows = self._rows("customer", "c_custkey", chosen)
        count = rows.num_rows
        balance = rng.integers(-99_999, 1_000_000, size=count)
        segment_changes = (rng.random(count) < 0.5) | (len(nation_keys) < 2)
        segments = rows.column("c_mktsegment").to_numpy(zero_copy_only=False)
        nations = rows.column("c_nationkey").to_numpy()
        new_segments = _others(rng, SEGMENTS, segments)
        new_nations = _others(rng, nation_keys, nations) if len(nation_keys) >= 2 else nations
        phones = rows.column("c_phone")
        plan.updates = _replaced(
            rows,
            c_acctbal=_decimal(balance),
            c_mktsegment=np.where(segment_changes, new_segments, segments),
            c_nationkey=np.where(segment_changes, nations, new_nations),
            c_phone=pc.if_else(pa.array(segment_changes), phones, _phones_in(new_nations, phones)),
        )

    def _plan_part_updates(self, rng, plan, part_keys) -> None:
        chosen = rng.choice(part_keys, size=self._count(len(part_keys)), replace=False)
        rows = self._rows("part", "p_partkey", chosen)
        price = _cents(rows.column("p_retailprice"))
        repriced = _divide_half_even(price * rng.integers(90, 111, size=rows.num_rows), 100)
        plan.updates = _replaced(rows, p_retailprice=_decimal(np.where(repriced == price, price + 1, repriced)))

    def _plan_supplier_updates(self, rng, plan, nation_keys) -> None:
        if len(nation_keys) < 2:
            return
        supplier_keys = self._keys("supplier", "s_suppkey")
        chosen = rng.choice(supplier_keys, size=self._count(len(supplier_keys)), replace=False)
        rows = self._rows("supplier", "s_suppkey", chosen)
        nations = _others(rng, nation_keys, rows.column("s_nationkey").to_numpy())
        plan.updates = _replaced(rows, s_nationkey=nations, s_phone=_phones_in(nations, rows.column("s_phone")))

    def _plan_new_orders(self, rng, plans, count, largest_key, order_count, customer_keys,
                         part_keys) -> None:
        """TPC-H refresh function 1: orders with 1-7 lines priced from the part's retail price,
        supplied by one of the part's partsupp suppliers, to customers TPC-H gives orders to."""
        ordering_customers = customer_keys[customer_keys % 3 != 0]
        if len(ordering_customers) == 0:
            ordering_customers = customer_keys
        clerks = max(1, order_count // ORDERS_PER_CLERK)
        lines_per_order = rng.integers(1, 8, size=count)
        first_line = np.concatenate([[0], np.cumsum(lines_per_order)[:-1]])
        line_count = int(lines_per_order.sum())
        line_order = np.repeat(np.arange(count), lines_per_order)
        parts = rng.choice(part_keys, size=line_count)
        needed = np.unique(parts)
        priced = self._rows("part", "p_partkey", needed, ["p_partkey", "p_retailprice"])
        price = _cents(priced.column("p_retailprice"))[np.searchsorted(priced.column("p_partkey").to_numpy(), parts)]
        supplied = self._rows("partsupp", "ps_partkey", needed, ["ps_partkey", "ps_suppkey"])
        supplied_parts, first_supplier, suppliers = np.unique(supplied.column("ps_partkey").to_numpy(),
                                                              return_index=True, return_counts=True)
        unsupplied = np.setdiff1d(needed, supplied_parts)
        if len(unsupplied):
            raise ChangeConflict(f"part {int(unsupplied[0])} has no partsupp rows: cannot supply it")
        position = np.searchsorted(supplied_parts, parts)
        supplier = supplied.column("ps_suppkey").to_numpy()[first_supplier[position] + rng.integers(0, suppliers[position])]

        order_day = START_DAY + rng.integers(0, LAST_ORDER_DAY - START_DAY + 1, size=count)
        quantity = rng.integers(1, 51, size=line_count)
        line_day = order_day[line_order]
        ship = line_day + rng.integers(1, 122, size=line_count)
        receipt = ship + rng.integers(1, 31, size=line_count)
        commit = line_day + rng.integers(30, 91, size=line_count)
        discount = rng.integers(0, 11, size=line_count)
        tax = rng.integers(0, 9, size=line_count)
        flags = np.array(["R", "A"], dtype=object)[rng.integers(0, 2, size=line_count)]
        open_line = ship > CURRENT_DAY
        extended = quantity * price
        order_keys = largest_key + 1 + np.arange(count)
        plans["lineitem"].inserts = pa.table({
            "l_orderkey": pa.array(order_keys[line_order], pa.int64()),
            "l_partkey": pa.array(parts, pa.int64()),
            "l_suppkey": pa.array(supplier, pa.int64()),
            "l_linenumber": pa.array(np.arange(line_count) - first_line[line_order] + 1, pa.int32()),
            "l_quantity": _decimal(quantity * 100),
            "l_extendedprice": _decimal(extended),
            "l_discount": _decimal(discount),
            "l_tax": _decimal(tax),
            "l_returnflag": pa.array(np.where(receipt <= CURRENT_DAY, flags, "N"), pa.string()),
            "l_linestatus": pa.array(np.where(open_line, "O", "F"), pa.string()),
            "l_shipdate": _date(ship),
            "l_commitdate": _date(commit),
            "l_receiptdate": _date(receipt),
            "l_shipinstruct": _pick(rng, SHIP_INSTRUCTIONS, line_count),
            "l_shipmode": _pick(rng, SHIP_MODES, line_count),
            "l_comment": _comments(rng, line_count, 10, 43),
        })
        # o_totalprice: sum(extendedprice * (1 + tax) * (1 - discount)), exact in cents times the
        # two percentages, then rounded to cents
        charged = extended * (100 + tax) * (100 - discount)
        open_lines = np.add.reduceat(open_line.astype(np.int64), first_line)
        status = np.where(open_lines == lines_per_order, "O", np.where(open_lines == 0, "F", "P"))
        plans["orders"].inserts = pa.table({
            "o_orderkey": pa.array(order_keys, pa.int64()),
            "o_custkey": pa.array(ordering_customers[rng.integers(0, len(ordering_customers), size=count)], pa.int64()),
            "o_orderstatus": pa.array(status, pa.string()),
            "o_totalprice": _decimal(_divide_half_even(np.add.reduceat(charged, first_line), 10_000)),
            "o_orderdate": _date(order_day),
            "o_orderpriority": _pick(rng, PRIORITIES, count),
            "o_clerk": pc.binary_join_element_wise(
                "Clerk#", pc.utf8_lpad(pc.cast(pa.array(rng.integers(1, clerks + 1, size=count)), pa.string()),
                                       width=9, padding="0"), ""),
            "o_shippriority": pa.array(np.zeros(count, dtype=np.int32), pa.int32()),
            "o_comment": _comments(rng, count, 19, 78),
        })

    # ---- writing --------------------------------------------------------------------------

    def _merge_with_delta_rs(self, table: str, plan: TablePlan, meta: str) -> TableChange:
        """`_merge` through delta-rs: the same source rows, condition and clauses."""
        path = local_path(self.warehouse.source_path(table))
        target = DeltaTable(path)
        schema = pa.schema(target.schema().to_arrow())
        source = _merge_source(plan, schema)
        every_column = {f'"{c}"': f's."{c}"' for c in schema.names}
        condition = _merge_condition(plan, table, lambda name: f'"{name}"')
        metrics = (
            target.merge(source, condition, source_alias="s", target_alias="t", streamed_exec=False,
                         commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))
            .when_matched_delete(predicate=f"s.{ACTION} = 'delete'")
            .when_matched_update(updates=every_column, predicate=f"s.{ACTION} = 'update'")
            .when_not_matched_insert(updates=every_column, predicate=f"s.{ACTION} = 'insert'")
            .execute()
        )
        return self._checked(table, plan, meta, {
            "num_inserted_rows": metrics.get("num_target_rows_inserted"),
            "num_deleted_rows": metrics.get("num_target_rows_deleted"),
            "num_updated_rows": metrics.get("num_target_rows_updated"),
        })

    def _merge(self, table: str, plan: TablePlan, meta: str) -> TableChange:
        """One MERGE: source rows carry an action; deletes and updates match on the primary key,
        inserts carry fresh keys and never match. The caller has set the userMetadata conf. The
        source reaches Spark as Arrow batches (createDataFrame of a pyarrow Table)."""
        path = self.warehouse.source_path(table)
        target = self.spark.read.format("delta").load(path)
        names = target.columns
        schema = pa.schema([pa.field(f.name, to_arrow_type(f.dataType)) for f in target.schema.fields])
        source = self.spark.createDataFrame(_merge_source(plan, schema))
        condition = _merge_condition(plan, table, lambda name: f"`{name}`")
        # Spark SQL's MERGE (Delta's SQL extension), which a Spark Connect server runs as well
        view = f"epochal_batch_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            metrics = self.spark.sql(
                f"MERGE INTO {deltalog.delta_path(path)} AS t USING {view} AS s ON {condition} "
                f"WHEN MATCHED AND s.{ACTION} = 'delete' THEN DELETE "
                f"WHEN MATCHED AND s.{ACTION} = 'update' THEN UPDATE SET "
                + ", ".join(f"t.`{c}` = s.`{c}`" for c in names)
                + f" WHEN NOT MATCHED AND s.{ACTION} = 'insert' THEN INSERT ("
                + ", ".join(f"`{c}`" for c in names) + ") VALUES (" + ", ".join(f"s.`{c}`" for c in names) + ")"
            ).first().asDict()
        finally:
            self.spark.catalog.dropTempView(view)
        return self._checked(table, plan, meta, {
            name: metrics.get(name) for name in ("num_inserted_rows", "num_deleted_rows", "num_updated_rows")})

    def _checked(self, table: str, plan: TablePlan, meta: str, written: dict) -> TableChange:
        """The commit's change, once its rows are the plan's and it is the table's latest commit."""
        expected = {
            "num_inserted_rows": plan.rows("inserts"),
            "num_deleted_rows": plan.rows("deletes"),
            "num_updated_rows": plan.rows("updates"),
        }
        commit = deltalog.latest_commit(self.spark, self.warehouse.source_path(table))
        if written != expected:
            raise ChangeConflict(
                f"{table}: MERGE (version {commit.version}) wrote {written}, the batch planned "
                f"{expected}; the table changed while the batch was drawn"
            )
        if commit.user_metadata != meta:
            raise ChangeConflict(
                f"{table}: the latest commit (version {commit.version}) is not this batch's; "
                f"another writer committed concurrently"
            )
        return TableChange(
            table=table,
            version=commit.version,
            inserted_key_table=_key_table(plan.inserts, table),
            deleted_key_table=_key_table(plan.deletes, table),
            updated_key_table=_key_table(plan.updates, table),
        )


REPORTED_TABLES = ALWAYS_CHANGED


def batch_table(reports: list[BatchReport], markdown: bool = False) -> str:
    """One line per batch: inserted/deleted/updated rows per source table (+i -d ~u)."""
    header = ["batch", "logical time", *REPORTED_TABLES]
    lines = [
        [
            str(report.index),
            report.logical_time.strftime("%Y-%m-%d %H:%M"),
            *("+{} -{} ~{}".format(*report.counts(name)) for name in REPORTED_TABLES),
        ]
        for report in reports
    ]
    if markdown:
        rows = [header, ["---"] * len(header), *lines]
        return "\n".join("| " + " | ".join(row) + " |" for row in rows)
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in [header, *lines]
    )
