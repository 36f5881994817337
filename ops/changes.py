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
from datetime import date, datetime, timedelta
from decimal import Decimal

import numpy as np

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

CENT = Decimal("0.01")
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
    """One table's commit in a batch. Keys are tuples in the table's primary-key column order."""

    table: str
    version: int
    inserted_keys: tuple[tuple, ...]
    deleted_keys: tuple[tuple, ...]
    updated_keys: tuple[tuple, ...]

    @property
    def inserted(self) -> int:
        return len(self.inserted_keys)

    @property
    def deleted(self) -> int:
        return len(self.deleted_keys)

    @property
    def updated(self) -> int:
        return len(self.updated_keys)


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
class _TablePlan:
    inserts: list[dict] = field(default_factory=list)
    deletes: list[tuple] = field(default_factory=list)
    updates: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.inserts or self.deletes or self.updates)


def _other(rng: np.random.Generator, choices, current):
    """A value from `choices` different from `current` (so an update really changes the row)."""
    options = [c for c in choices if c != current]
    return options[int(rng.integers(len(options)))]


def _money(rng: np.random.Generator, low_cents: int, high_cents: int) -> Decimal:
    return (Decimal(int(rng.integers(low_cents, high_cents + 1))) * CENT).quantize(CENT)


def _percent(rng: np.random.Generator, low: int, high: int) -> Decimal:
    return (Decimal(int(rng.integers(low, high + 1))) * CENT).quantize(CENT)


def _comment(rng: np.random.Generator, min_length: int, max_length: int) -> str:
    target = int(rng.integers(min_length, max_length + 1))
    words: list[str] = []
    while len(" ".join(words)) < target:
        words.append(COMMENT_WORDS[int(rng.integers(len(COMMENT_WORDS)))])
    return " ".join(words)[:target].strip()


def _phone_in(nation_key: int, phone: str) -> str:
    """TPC-H phone numbers start with the nation key + 10; keep that when the nation changes."""
    return f"{nation_key + 10:02d}{phone[2:]}"


def _key(row: dict, table: str) -> tuple:
    return tuple(row[column] for column in PRIMARY_KEYS[table])


def _key_ranges(plan: "_TablePlan", table: str) -> list[tuple[int, int]]:
    """The leading-key ranges a MERGE can match: one for the deletes (old orders), one for the
    updates (recent ones). Only target rows in them can match; inserts carry fresh keys."""
    leading = PRIMARY_KEYS[table][0]
    first_keys = [[key[0] for key in plan.deletes], [row[leading] for row in plan.updates]]
    return [(min(keys), max(keys)) for keys in first_keys if keys]


def _merge_condition(plan: "_TablePlan", table: str, quote) -> str:
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
        plans = self._plan(np.random.default_rng([self.seed, index]))
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

    def _rows(self, table: str, column: str, keys) -> list[dict]:
        """Full rows whose `column` is in `keys`, sorted by primary key."""
        wanted = sorted({int(k) for k in keys})
        if not wanted:
            return []
        path = self.warehouse.source_path(table)
        rows = deltalog.read_arrow(self.spark, path, key_column=column, keys=wanted).to_pylist()
        return sorted(rows, key=lambda row: _key(row, table))

    def _count(self, size: int) -> int:
        return min(size, max(1, round(self.fraction * size)))

    # ---- drawing a batch ------------------------------------------------------------------

    def _plan(self, rng: np.random.Generator) -> dict[str, _TablePlan]:
        """Every random draw happens here, in a fixed order over sorted inputs."""
        plans = defaultdict(_TablePlan)
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
        nation_keys = [int(k) for k in self._keys("nation", "n_nationkey")]
        customer_keys = self._keys("customer", "c_custkey")
        self._plan_customer_updates(rng, plans["customer"], customer_keys, nation_keys)
        part_keys = self._keys("part", "p_partkey")
        self._plan_part_updates(rng, plans["part"], part_keys)
        self._plan_supplier_updates(rng, plans["supplier"], nation_keys)
        self._plan_new_orders(rng, plans, n, int(order_keys[-1]), len(order_keys), customer_keys,
                              part_keys)
        return plans

    def _plan_order_updates(self, rng, plan: _TablePlan, keys) -> None:
        for row in self._rows("orders", "o_orderkey", keys):
            row["o_orderstatus"] = _other(rng, ORDER_STATUSES, row["o_orderstatus"])
            row["o_orderpriority"] = _other(rng, PRIORITIES, row["o_orderpriority"])
            plan.updates.append(row)

    def _plan_deletes_and_line_updates(self, rng, plans, deleted_orders, line_updated_orders):
        deleted = {int(k) for k in deleted_orders}
        plans["orders"].deletes.extend((k,) for k in sorted(deleted))
        lines_by_order = defaultdict(list)
        for row in self._rows("lineitem", "l_orderkey", [*deleted_orders, *line_updated_orders]):
            lines_by_order[row["l_orderkey"]].append(row)
        for key in sorted(deleted):
            plans["lineitem"].deletes.extend(_key(r, "lineitem") for r in lines_by_order[key])
        for key in line_updated_orders:
            lines = lines_by_order.get(int(key))
            if not lines:
                continue
            row = dict(lines[int(rng.integers(len(lines)))])
            old_quantity = row["l_quantity"]
            new_quantity = Decimal(_other(rng, range(1, 51), int(old_quantity))).quantize(CENT)
            if old_quantity:
                unit_price = row["l_extendedprice"] / old_quantity
                row["l_extendedprice"] = (unit_price * new_quantity).quantize(CENT)
            row["l_quantity"] = new_quantity
            row["l_discount"] = _percent(rng, 0, 10)
            if row["l_receiptdate"] <= CURRENT_DATE:
                row["l_returnflag"] = ("R", "A")[int(rng.integers(2))]
            plans["lineitem"].updates.append(row)

    def _plan_customer_updates(self, rng, plan, customer_keys, nation_keys) -> None:
        chosen = rng.choice(customer_keys, size=self._count(len(customer_keys)), replace=False)
        for row in self._rows("customer", "c_custkey", chosen):
            row["c_acctbal"] = _money(rng, -99_999, 999_999)
            if rng.random() < 0.5 or len(nation_keys) < 2:
                row["c_mktsegment"] = _other(rng, SEGMENTS, row["c_mktsegment"])
            else:
                nation = _other(rng, nation_keys, row["c_nationkey"])
                row["c_nationkey"], row["c_phone"] = nation, _phone_in(nation, row["c_phone"])
            plan.updates.append(row)

    def _plan_part_updates(self, rng, plan, part_keys) -> None:
        chosen = rng.choice(part_keys, size=self._count(len(part_keys)), replace=False)
        for row in self._rows("part", "p_partkey", chosen):
            factor = Decimal(int(rng.integers(90, 111))) / 100
            price = (row["p_retailprice"] * factor).quantize(CENT)
            row["p_retailprice"] = price if price != row["p_retailprice"] else price + CENT
            plan.updates.append(row)

    def _plan_supplier_updates(self, rng, plan, nation_keys) -> None:
        if len(nation_keys) < 2:
            return
        supplier_keys = self._keys("supplier", "s_suppkey")
        chosen = rng.choice(supplier_keys, size=self._count(len(supplier_keys)), replace=False)
        for row in self._rows("supplier", "s_suppkey", chosen):
            nation = _other(rng, nation_keys, row["s_nationkey"])
            row["s_nationkey"], row["s_phone"] = nation, _phone_in(nation, row["s_phone"])
            plan.updates.append(row)

    def _plan_new_orders(self, rng, plans, count, largest_key, order_count, customer_keys,
                         part_keys) -> None:
        """TPC-H refresh function 1: orders with 1-7 lines priced from the part's retail price,
        supplied by one of the part's partsupp suppliers, to customers TPC-H gives orders to."""
        ordering_customers = customer_keys[customer_keys % 3 != 0]
        if len(ordering_customers) == 0:
            ordering_customers = customer_keys
        clerks = max(1, order_count // ORDERS_PER_CLERK)
        parts_per_order = [rng.choice(part_keys, size=int(rng.integers(1, 8))) for _ in range(count)]
        needed = np.unique(np.concatenate(parts_per_order)) if parts_per_order else []
        prices = {r["p_partkey"]: r["p_retailprice"] for r in self._rows("part", "p_partkey", needed)}
        suppliers = defaultdict(list)
        for r in self._rows("partsupp", "ps_partkey", needed):
            suppliers[r["ps_partkey"]].append(r["ps_suppkey"])
        date_span = (LAST_ORDER_DATE - START_DATE).days

        for offset, parts in enumerate(parts_per_order, start=1):
            order_key = largest_key + offset
            order_date = START_DATE + timedelta(days=int(rng.integers(0, date_span + 1)))
            lines = []
            for line_number, part_key in enumerate(int(p) for p in parts):
                if not suppliers.get(part_key):
                    raise ChangeConflict(f"part {part_key} has no partsupp rows: cannot supply it")
                quantity = Decimal(int(rng.integers(1, 51))).quantize(CENT)
                ship_date = order_date + timedelta(days=int(rng.integers(1, 122)))
                receipt_date = ship_date + timedelta(days=int(rng.integers(1, 31)))
                lines.append({
                    "l_orderkey": order_key,
                    "l_partkey": part_key,
                    "l_suppkey": suppliers[part_key][int(rng.integers(len(suppliers[part_key])))],
                    "l_linenumber": line_number + 1,
                    "l_quantity": quantity,
                    "l_extendedprice": (quantity * prices[part_key]).quantize(CENT),
                    "l_discount": _percent(rng, 0, 10),
                    "l_tax": _percent(rng, 0, 8),
                    "l_returnflag": ("R", "A")[int(rng.integers(2))]
                    if receipt_date <= CURRENT_DATE else "N",
                    "l_linestatus": "O" if ship_date > CURRENT_DATE else "F",
                    "l_shipdate": ship_date,
                    "l_commitdate": order_date + timedelta(days=int(rng.integers(30, 91))),
                    "l_receiptdate": receipt_date,
                    "l_shipinstruct": SHIP_INSTRUCTIONS[int(rng.integers(len(SHIP_INSTRUCTIONS)))],
                    "l_shipmode": SHIP_MODES[int(rng.integers(len(SHIP_MODES)))],
                    "l_comment": _comment(rng, 10, 43),
                })
            statuses = {line["l_linestatus"] for line in lines}
            total = sum(
                line["l_extendedprice"] * (1 + line["l_tax"]) * (1 - line["l_discount"])
                for line in lines
            )
            plans["orders"].inserts.append({
                "o_orderkey": order_key,
                "o_custkey": int(ordering_customers[int(rng.integers(len(ordering_customers)))]),
                "o_orderstatus": statuses.pop() if len(statuses) == 1 else "P",
                "o_totalprice": Decimal(total).quantize(CENT),
                "o_orderdate": order_date,
                "o_orderpriority": PRIORITIES[int(rng.integers(len(PRIORITIES)))],
                "o_clerk": f"Clerk#{int(rng.integers(1, clerks + 1)):09d}",
                "o_shippriority": 0,
                "o_comment": _comment(rng, 19, 78),
            })
            plans["lineitem"].inserts.extend(lines)

    # ---- writing --------------------------------------------------------------------------

    def _merge_with_delta_rs(self, table: str, plan: _TablePlan, meta: str) -> TableChange:
        """`_merge` through delta-rs: the same source rows, condition and clauses."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable

        path = local_path(self.warehouse.source_path(table))
        target = DeltaTable(path)
        schema = pa.schema([f.with_nullable(True) for f in pa.schema(target.schema().to_arrow())])
        names = schema.names
        keys = PRIMARY_KEYS[table]
        rows = (
            [{**row, ACTION: "insert"} for row in plan.inserts]
            + [{**dict(zip(keys, key)), ACTION: "delete"} for key in plan.deletes]
            + [{**row, ACTION: "update"} for row in plan.updates]
        )
        source = pa.Table.from_pylist(
            [{c: row.get(c) for c in [*names, ACTION]} for row in rows],
            schema=schema.append(pa.field(ACTION, pa.string(), nullable=False)),
        )
        every_column = {f'"{c}"': f's."{c}"' for c in names}
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

    def _merge(self, table: str, plan: _TablePlan, meta: str) -> TableChange:
        """One MERGE: source rows carry an action; deletes and updates match on the primary key,
        inserts carry fresh keys and never match. The caller has set the userMetadata conf."""
        import uuid

        from pyspark.sql.types import StringType, StructField, StructType

        from ops.deltalog import delta_path

        path = self.warehouse.source_path(table)
        columns = self.spark.read.format("delta").load(path).schema.fields
        names = [f.name for f in columns]
        keys = PRIMARY_KEYS[table]
        source_schema = StructType(
            [StructField(f.name, f.dataType, True) for f in columns]
            + [StructField(ACTION, StringType(), False)]
        )
        rows = (
            [tuple(row[c] for c in names) + ("insert",) for row in plan.inserts]
            + [
                tuple(dict(zip(keys, key)).get(c) for c in names) + ("delete",)
                for key in plan.deletes
            ]
            + [tuple(row[c] for c in names) + ("update",) for row in plan.updates]
        )
        source = self.spark.createDataFrame(rows, source_schema)
        condition = _merge_condition(plan, table, lambda name: f"`{name}`")
        # Spark SQL's MERGE (Delta's SQL extension), which a Spark Connect server runs as well
        view = f"epochal_batch_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        try:
            metrics = self.spark.sql(
                f"MERGE INTO {delta_path(path)} AS t USING {view} AS s ON {condition} "
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

    def _checked(self, table: str, plan: _TablePlan, meta: str, written: dict) -> TableChange:
        """The commit's change, once its rows are the plan's and it is the table's latest commit."""
        expected = {
            "num_inserted_rows": len(plan.inserts),
            "num_deleted_rows": len(plan.deletes),
            "num_updated_rows": len(plan.updates),
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
            inserted_keys=tuple(sorted(_key(row, table) for row in plan.inserts)),
            deleted_keys=tuple(sorted(plan.deletes)),
            updated_keys=tuple(sorted(_key(row, table) for row in plan.updates)),
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
