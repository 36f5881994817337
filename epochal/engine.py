"""The engine's public API (docs/architecture.md, section 8). Tests, benchmarks, the Dagster assets and any
outside tool drive the engine through this class; it imports nothing from Dagster.

    engine = Engine(spark, warehouse="/path/or/uri")
    engine.source("orders", clock="logical")       # Delta table at <warehouse>/sources/orders
    engine.define("revenue_by_nation", sql)         # other tables are referenced by name
    reports = engine.refresh()                      # one on-demand epoch over all tables
    reports = engine.refresh(["revenue_by_nation"], until=ts)  # the epoch ending at source time ts
    engine.read("revenue_by_nation")                # the table's visible columns
    engine.recompute("revenue_by_nation")           # full recompute at its current frontier (oracle)
    print(engine.explain("revenue_by_nation"))
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import re
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from . import faults, settings
from .arrow_rows import is_connect
from .changes import InputRange, empty_frame, read_snapshot
from .errors import DefinitionError, EpochalError
from .explain import explain
from .graph import Scan, walk
from .invalidation import Invalidation
from .invalidation import compute as compute_invalidation
from .keyed.arrangements import ARRANGE_ROWS, Arrangements, what_was_done
from .keyed.keyed_files import KeyedFiles
from .keyed.local_copies import LocalCopies
from .keyed.shared_reads import SharedReads
from .keyed.upkeep import Upkeep
from .memory import FreedMemory
from .metrics import scheduler_pool
from .planning.compile import Compiled, compile_definition, parse, referenced_tables
from .planning.keys import output_key
from .planning.optimize import passes_named
from .planning.optimize.restrict_cogenerators import keyed_partners
from .planning.plan import TableInfo
from .protocol import epoch as protocol
from .protocol.epoch import Report
from .protocol.environment import Environment, Triggers
from .protocol.writes import written_on_driver
from .sessions import engine_confs, session_confs, warn_if_fifo
from .storage.access import check_warehouse
from .storage.clock import clock_named
from .storage.deltalog import DeltaLog
from .storage.ledger import RESCAN, Ledger, Step
from .storage.reclock import Epoch, Remap, Source
from .storage.schemas import AnalysedSchemas
from .storage.warehouse import Warehouse, check_name
from .switching import STEP_SWITCH_INTERVAL, switch_interval

log = logging.getLogger("epochal")

LOCAL_RELATION_ROWS = 10_000  # an input a full recompute reads as a local relation; see output_frame
DRIVER_ROWS = 500_000  # see storage/commits.py; measured in bench/RESULTS.md (driver commits, and the driver's rows)
DELTA_FORBIDDEN = re.compile(r"[ ,;{}()\n\t=]")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def output_frame(spark: SparkSession, table: "Table", inputs: dict[str, InputRange], side: str,
                 reads: SharedReads | None = None) -> DataFrame:
    """A table's SQL run in full over its inputs at the given side's versions. With `reads`, an
    input of at most LOCAL_RELATION_ROWS rows is a local relation of its rows read on the driver
    (shared by the refresh's steps): Delta's snapshot of a version through Spark costs jobs of its
    own (the log replayed), most of a small table's rescan. A larger input is Spark's to scan:
    a local relation's rows cross from Python to the JVM and are planned and shipped whole, which
    costs more than the scan (bench/rescan_phases.py; bench/RESULTS.md, rescans' phases)."""
    def read(name: str) -> DataFrame:
        found = inputs[name]
        version = found.before if side == "before" else found.after
        if reads is not None and version >= 0 and found.schema is not None and \
                written_on_driver(found.schema) and _few_rows(reads.rows_at(found.path, version)):
            local = reads.snapshot(spark, found.path, version)
            if local is not None and [(f.name, f.dataType) for f in local.schema.fields] == \
                    [(f.name, f.dataType) for f in found.schema.fields]:
                return local
        return read_snapshot(spark, found.path, version, found.schema)

    frames = {placeholder: read(name) for placeholder, name in table.compiled.placeholders.items()}
    return spark.sql(table.compiled.recompute_sql, **frames)


def _run_in_pool(env: Environment, table: "Table", epoch: Epoch, full_refresh: bool) -> Report:
    """One step of a parallel refresh, its jobs in its worker thread's scheduler pool
    (metrics.scheduler_pool): steps at once share the cores rather than queue."""
    with scheduler_pool(env.spark, threading.current_thread().name):
        return protocol.run(env, table, epoch, full_refresh=full_refresh)


def _few_rows(rows: int | None) -> bool:
    return rows is not None and rows <= LOCAL_RELATION_ROWS


@dataclass
class Table:
    """A derived table as the engine runs it."""

    name: str
    compiled: Compiled
    path: str
    state_root: str
    ledger: Ledger
    schema: StructType
    key: tuple[int, ...] | None
    strict: bool = False


class Engine:
    def __init__(
        self,
        spark: SparkSession,
        warehouse: str,
        *,
        storage_options: dict[str, str] | None = None,
        strict: bool = False,
        broadcast_rows: int = 200_000,
        driver_rows: int = DRIVER_ROWS,
        parallelism: int = 2,
        rescan_fraction: float | None = None,
        cost_model: bool = True,
        passes: Sequence[str] | None = None,
        arrange_rows: int | None = ARRANGE_ROWS,
        upkeep: Upkeep = Upkeep(),
        switch_interval: float | None = STEP_SWITCH_INTERVAL,
    ):
        """`rescan_fraction`: rescan (reason COST) when an epoch changes more than this fraction
        of a table's input rows (None: never for cost). `cost_model`: rescan (reason COST) when
        the table's own history says a rescan is cheaper than this incremental step (cost.py;
        never for strict tables). `driver_rows`: changes of at most this
        many rows are committed on the driver through delta-rs (storage/commits.py), larger ones
        by Spark (0: always Spark). `passes`: the optimizer passes to apply
        (names from epochal.optimize.PASSES; None: all, (): the naive plan), to compare plans.
        `arrange_rows`: an input of at least this many rows that a refresh reads by key (a join
        term's partner) is arranged by that key after the refresh (arrangements.py), so later
        refreshes read a bounded number of its rows, and so is each input a table computed in
        full will read by key in its incremental steps (built in the epoch that computes it);
        None: never. `upkeep`: when state tables are compacted and arrangements built again
        (keyed/upkeep.py; tests lower it so the rewrites run within a few epochs).
        `switch_interval`: Python's switch interval, in seconds, while steps run in parallel
        (switching.py; None: Python's own).
        A warehouse on an object store is checked first (StorageUnreachable names what to fix)."""
        check_warehouse(Warehouse(warehouse).root, storage_options)
        self.spark = spark
        self.triggers = Triggers(rescan_fraction)
        self.cost_model = cost_model
        self.passes = passes_named(passes)
        self.invalidation = Invalidation()
        self.parallelism = parallelism
        self.warehouse = Warehouse(warehouse)
        self.storage_options = storage_options
        self.strict = strict
        self.broadcast_rows = broadcast_rows
        self.driver_rows = driver_rows
        self.upkeep = upkeep
        self.switch_interval = switch_interval
        self.run_id = uuid.uuid4().hex
        self.freed_memory = FreedMemory()
        self.remap = Remap(self.warehouse.engine_path("remap"), storage_options, self.run_id)
        self.sources: dict[str, Source] = {}
        self._tables: dict[str, Table] = {}
        self.arranged: list[tuple[str, str, int, str, float]] = []  # the last refresh's: path, key, version, what (Arrangements.advance), s
        self.arranged_reads: dict[tuple[str, str], dict[str, int]] = {}  # the last refresh's (Arrangements.take_served)
        self.arrangement_failures: collections.Counter = collections.Counter()  # (path, key) -> refreshes failed in a row
        self.schemas = AnalysedSchemas(self.warehouse.local_folder("schemas"))
        self.keyed_files = KeyedFiles(storage_options, LocalCopies(self.warehouse.local_folder("local_copies"),
                                                                  warehouse=self.warehouse.root)) \
            if arrange_rows is not None else None  # keyed reads of arrangements and state tables
        self.arrangements = Arrangements(self.warehouse.engine_path("arrangements"), storage_options, arrange_rows,
                                         files=self.keyed_files, upkeep=upkeep, warehouse=self.warehouse.root) \
            if arrange_rows is not None else None

    # ---- declaring ---------------------------------------------------------------------------
    def source(self, name: str, path: str | None = None, clock: str = "commit") -> Source:
        """Declare a source Delta table (default location <warehouse>/sources/<name>). `clock`
        is "commit" (commit timestamps) or "logical" (a time writers put in userMetadata)."""
        check_name(name, "source")
        if name in self._tables:
            raise DefinitionError(name, "is already defined as a derived table")
        path = path.rstrip("/") if path else self.warehouse.source_path(name)
        log = DeltaLog.open(path, self.storage_options)
        if log is None:
            raise EpochalError(
                f"source {name!r}: no Delta table at {path}; create it first (or pass path=...)"
            )
        if str(log.properties().get("delta.enableChangeDataFeed", "false")).lower() != "true":
            raise EpochalError(
                f"source {name!r}: the Delta table at {path} does not record a change data feed, so "
                "every epoch would have to recompute the tables reading it. Enable it with ALTER TABLE "
                f"delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true) (changes are "
                "recorded from then on), then declare the source"
            )
        source = Source(name, path, clock_named(clock))
        self.sources[name] = source
        return source

    def define(self, name: str, sql: str, *, strict: bool | None = None) -> Table:
        """Define (or redefine) a derived table by its SQL. Inputs must be declared or defined
        first; errors name the table, the construct and the position in the SQL."""
        check_name(name)
        if name in self.sources:
            raise DefinitionError(name, "is already declared as a source")
        found = {n: self.schema_of(n) for n in self.sources}  # each source's log opened once
        found.update({n: t.schema for n, t in self._tables.items() if n != name})
        fields = {n: schema.fields for n, schema in found.items()}
        known = {n: TableInfo("source" if n in self.sources else "derived", tuple(f.name for f in found))
                 for n, found in fields.items()}
        schemas = {n: {f.name: f.dataType.simpleString() for f in found} for n, found in fields.items()}
        compiled = compile_definition(name, sql, known, schemas, self.passes)
        self._check_cycle(name, compiled.inputs)
        schema = self._analyze(name, compiled, found)
        if compiled.plan is not None and any("map<" in f.dataType.simpleString() for f in schema.fields):
            compiled = dataclasses.replace(compiled, plan=None, blocker=(
                "a MAP output column: Spark cannot group or compare maps, which consolidating a change needs"))
        table = Table(
            name=name,
            compiled=compiled,
            path=self.warehouse.table_path(name),
            state_root=self.warehouse.engine_path("tables", name, "state"),
            ledger=Ledger(self.warehouse.engine_path("tables", name, "ledger"), self.storage_options),
            schema=schema,
            key=output_key(compiled.plan),
            strict=self.strict if strict is None else strict,
        )
        self._tables[name] = table
        self.invalidation = compute_invalidation(self, self.invalidation, name)
        return table

    def define_all(self, definitions: dict[str, str]) -> list[Table]:
        """Define several tables in an order that puts every table after the tables it reads."""
        pending = dict(definitions)
        reads = {}
        for name, sql in pending.items():
            reads[name] = {t.name.lower() for t in referenced_tables(parse(name, sql))}
        defined = []
        while pending:
            ready = [n for n in sorted(pending) if not (reads[n] & {p.lower() for p in pending if p != n})]
            if not ready:
                cycle = " -> ".join(sorted(pending))
                raise DefinitionError(sorted(pending)[0], f"definitions read each other in a cycle ({cycle})",
                                      fix="A derived table cannot depend on itself through other tables")
            for name in ready:
                defined.append(self.define(name, pending.pop(name)))
        return defined

    def _check_cycle(self, name: str, inputs: tuple[str, ...]) -> None:
        stack, seen = list(inputs), set()
        while stack:
            current = stack.pop()
            if current == name:
                raise DefinitionError(name, f"reading {', '.join(inputs)} would make a cycle back to {name!r}",
                                      construct=", ".join(inputs),
                                      fix="A derived table cannot depend on itself through other tables; read "
                                          "the sources it needs directly")
            if current in seen or current not in self._tables:
                continue
            seen.add(current)
            stack.extend(self._tables[current].compiled.inputs)

    def _analyze(self, name: str, compiled: Compiled, schemas: dict[str, StructType]) -> StructType:
        frames = {p: empty_frame(self.spark, schemas[t]) for p, t in compiled.placeholders.items()}
        try:
            schema = self.spark.sql(compiled.recompute_sql, **frames).schema
        except (AnalysisException, ParseException) as error:
            raise DefinitionError(name, f"Spark rejects the query: {error.getMessage() if hasattr(error, 'getMessage') else error}",
                                  fix="Correct the SQL") from None
        names = [f.name for f in schema.fields]
        for position, column in enumerate(names):
            if column.lower() in [n.lower() for n in names[:position]]:
                raise DefinitionError(name, f"two output columns are named {column!r}", construct=column,
                                      fix="Give them distinct aliases (... AS other_name)")
            if DELTA_FORBIDDEN.search(column):
                raise DefinitionError(
                    name, f"output column {column!r} has characters Delta does not allow in column names",
                    construct=column, fix=f"Give the expression an alias (... AS {re.sub(r'[^A-Za-z0-9_]+', '_', column).strip('_') or 'col'})",
                )
        return schema

    # ---- looking up --------------------------------------------------------------------------
    def table(self, name: str) -> Table:
        try:
            return self._tables[name]
        except KeyError:
            raise EpochalError(f"no derived table named {name!r}; defined: {', '.join(sorted(self._tables)) or 'none'}") from None

    def tables(self) -> list[str]:
        """Derived tables, every table after the tables it reads."""
        order: list[str] = []

        def visit(name: str) -> None:
            if name in order or name not in self._tables:
                return
            for upstream in self._tables[name].compiled.inputs:
                visit(upstream)
            order.append(name)

        for name in sorted(self._tables):
            visit(name)
        return order

    def readers(self, name: str) -> list[str]:
        """The derived tables that read `name` (a source or a derived table)."""
        return sorted(other for other, table in self._tables.items() if name in table.compiled.inputs)

    def schema_of(self, name: str) -> StructType:
        if name in self.sources:
            log = DeltaLog.open(self.sources[name].path, self.storage_options)
            if log is None:
                raise EpochalError(f"source {name!r}: no Delta table at {self.sources[name].path}")
            return log.spark_schema()
        return self.table(name).schema

    def _schema_in(self, reads: SharedReads | None, name: str) -> StructType:
        """`schema_of`, a source's read once per refresh (`reads`): every step of every table
        asked again, each ask an open of the source's log."""
        if reads is None or name not in self.sources:
            return self.schema_of(name)
        return reads.remembered(("schema", name), functools.partial(self.schema_of, name))

    def leaf_sources(self, name: str) -> list[str]:
        if name in self.sources:
            return [name]
        return sorted({s for upstream in self.table(name).compiled.inputs for s in self.leaf_sources(upstream)})

    def ledger(self, name: str) -> list[Step]:
        """The table's ledger, oldest record first: copies, the caller's to change."""
        return [step.copied() for step in self.table(name).ledger.steps()]

    # ---- running -----------------------------------------------------------------------------
    def epoch(self, until: datetime | None = None, tables: list[str] | None = None) -> Epoch:
        """The remap entry for the epoch ending at `until` (or a new on-demand epoch)."""
        names = tables or self.tables()
        sources = [self.sources[s] for s in sorted({s for n in names for s in self.leaf_sources(n)})]
        return self.remap.window(until, sources) if until is not None else self.remap.on_demand(sources)

    def refresh(
        self,
        tables: list[str] | None = None,
        until: datetime | None = None,
        *,
        full_refresh: bool = False,
        upstream: bool = True,
    ) -> list[Report]:
        """Run one epoch over `tables` (default: all), in dependency order. With `until`, the epoch
        is the time window ending at that source time; without, an on-demand epoch covering every
        source's latest version. With `upstream`, derived tables the named ones read are brought
        to the epoch too; without, they must already have applied it."""
        wanted = set(tables) if tables else set(self.tables())
        for name in wanted:
            self.table(name)
        if upstream:
            stack = list(wanted)
            while stack:
                for up in self.table(stack.pop()).compiled.inputs:
                    if up in self._tables and up not in wanted:
                        wanted.add(up)
                        stack.append(up)
        names = [n for n in self.tables() if n in wanted]
        epoch = self.epoch(until, names)
        faults.point("after_remap")
        return self._run(names, epoch, full_refresh)

    def _run(self, names: list[str], epoch: Epoch, full_refresh: bool) -> list[Report]:
        """Apply `epoch` to `names`, each table as soon as the tables it reads are done, up to
        `parallelism` at a time (each in its own child session, whose settings are its own), with
        the settings the steps depend on (sessions.engine_confs). After
        a failure no new table starts; the first error is raised once the running ones finish."""
        reads = SharedReads(self.storage_options, self.driver_rows, self._columns_read(names),
                            arrangements=self.arrangements, files=self.keyed_files)
        if self.arrangements is not None:
            self.arrangements.take_served()  # a failed refresh's reads are not this one's
            self.arrangements.begin_refresh({self.sources[name].path: table_id for name, table_id
                                             in epoch.table_ids.items() if name in self.sources})
        if self.keyed_files is not None and self.keyed_files.copies is not None:
            self.keyed_files.copies.take_counts()
            self.keyed_files.copies.give_way()  # its evictions count in this refresh's reports
        try:
            reports = self._run_steps(names, epoch, full_refresh, reads)
            self._arrange(reads, self._hydrating(reports))
            upkeep = self.arrangement_outcome()
            if upkeep is not None:
                for report in reports:
                    report.detail["arrangements"] = upkeep
            return reports
        finally:
            reads.clear()
            self.freed_memory.after_refresh()

    def _hydrating(self, reports: list[Report]) -> dict[tuple[str, str], int]:
        """Per (input path, key) that the incremental steps of a table computed in full by this
        refresh will read by key (restrict_cogenerators.keyed_partners) and that has no
        arrangement yet, the input version the table was computed at: arranged now, in the
        epoch that computes the table from scratch anyway, so that its first incremental epoch
        does not pay for the build (a large input's Spark builds cost more than many incremental
        epochs together)."""
        wanted: dict[tuple[str, str], int] = {}
        if self.arrangements is None:
            return wanted
        for report in reports:
            plan = self.table(report.table).compiled.plan
            if report.technique != RESCAN or plan is None:
                continue
            for name, field in keyed_partners(plan):
                version = report.frontier.get(name, -1)
                path = self.path_of(name)
                if version >= 0 and not self.arrangements.chain(path, field):
                    wanted[(path, field)] = max(version, wanted.get((path, field), -1))
        return wanted

    def _arrange(self, reads: SharedReads, hydrating: dict[tuple[str, str], int] | None = None) -> None:
        """Arrange (or bring up to date) every large input this refresh read by key, by that key,
        as of the latest version it read, and each of `hydrating` (`_hydrating`) at its version,
        with the columns every defined table reads from the input: a refresh of some tables (a
        Dagster asset refreshes its own table alone) would otherwise build an arrangement with
        its tables' columns, and the next refresh reading another column build it again.
        An arrangement is a cache: a failure here is logged and costs later refreshes their
        speed only, never a result."""
        self.arranged = []
        if self.arrangements is None:
            return
        self.arranged_reads = self.arrangements.take_served()
        every_column = self._columns_read(self.tables())
        wanted = dict(hydrating or {})
        for pair, version in reads.keyed.items():
            wanted[pair] = max(version, wanted.get(pair, -1))
        for (path, key), version in sorted(wanted.items()):
            chain = self.arrangements.chain(path, key)
            if not chain and not self.arrangements.worth_arranging(path, version, key):
                continue
            began = time.perf_counter()
            try:
                done = self.arrangements.advance(self.spark, path, version, key, sorted(every_column.get(path, ())),
                                                 lambda before, after: reads.keyed_change_rows(path, before, after))
                self.arranged.append((path, key, version, done, time.perf_counter() - began))
                self.arrangement_failures.pop((path, key), None)
                log.debug("arrangement of %s by %s at version %d: %s", path, key, version, done)
            except Exception as error:  # noqa: BLE001 - a cache; the next refresh tries again
                log.warning("could not arrange %s by %s as of version %d (%s: %s); its readers scan it instead",
                            path, key, version, type(error).__name__, error)
                self.arrangements.distrust(path, key)
                self.arrangement_failures[(path, key)] += 1
                self.arranged.append((path, key, version, f"failed: {type(error).__name__}: {error}",
                                      time.perf_counter() - began))

    def arrangement_outcome(self) -> dict | None:
        """What the last refresh did to the arrangements and their local copies, for its reports
        (`detail["arrangements"]`) and Dagster's metadata: how many were built, appended to or
        current, each that failed (its readers then read the input itself: slower, the same
        rows), with how many refreshes in a row it has failed in this process, and the copies
        made, failed, not made for want of disk or dropped for their disk budget. None without
        arrangements."""
        if self.arrangements is None:
            return None
        done = collections.Counter(what_was_done(what) for _, _, _, what, _ in self.arranged
                                   if not what.startswith("failed"))
        failed = [f"{path} by {key}: {what.removeprefix('failed: ')} "
                  f"({_times(self.arrangement_failures[(path, key)])} in a row)"
                  for path, key, _, what, _ in self.arranged if what.startswith("failed")]
        files = self.keyed_files
        copies = files.copies.take_counts() if files is not None and files.copies is not None else {}
        return {"arranged": dict(done), "failed": failed, "copies": copies}

    def path_of(self, name: str) -> str:
        """Where the source or derived table `name` is stored."""
        return self.sources[name].path if name in self.sources else self.table(name).path

    def _columns_read(self, names: list[str]) -> dict[str, set[str]]:
        """Per input table path, the columns the plans of `names` read from it (what a shared
        restricted read fetches, once for all of them)."""
        columns: dict[str, set[str]] = {}
        for name in names:
            plan = self.table(name).compiled.plan
            for node in walk(plan) if plan is not None else ():
                if isinstance(node, Scan):
                    columns.setdefault(self.path_of(node.table), set()).update(node.fields)
        return columns

    def _run_steps(self, names: list[str], epoch: Epoch, full_refresh: bool, reads: SharedReads) -> list[Report]:
        confs = engine_confs(self.spark)
        # a Connect client has no child sessions: its steps run one after another on the server
        if self.parallelism <= 1 or len(names) == 1 or is_connect(self.spark):
            with session_confs(self.spark, confs):
                env = self._environment(self.spark, reads, settings.current(self.spark))
                return [protocol.run(env, self.table(name), epoch, full_refresh=full_refresh) for name in names]
        warn_if_fifo(self.spark)
        reports: dict[str, Report] = {}
        pending, running, errors = list(names), {}, []
        caller_settings = settings.current(self.spark)
        step_settings = {**caller_settings, **{k: v for k, v in confs.items() if k in settings.RESULT_SETTINGS}}
        defaults = settings.current(self.spark.newSession())  # what every child session starts from
        differing = {k: v for k, v in caller_settings.items() if v != defaults.get(k)}
        with switch_interval(self.switch_interval), \
                ThreadPoolExecutor(max_workers=self.parallelism, thread_name_prefix="epochal") as pool:
            while (pending and not errors) or running:
                busy = set(pending) | set(running.values())
                ready = [n for n in pending if not (set(self.table(n).compiled.inputs) & busy)] if not errors else []
                for name in ready:
                    pending.remove(name)
                    session = self.spark.newSession()
                    settings.apply(differing, session)  # a setting at its default is left as it is
                    for key, value in confs.items():
                        session.conf.set(key, value)
                    env = self._environment(session, reads, step_settings)
                    running[pool.submit(_run_in_pool, env, self.table(name), epoch, full_refresh)] = name
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    if future.exception() is not None:
                        errors.append(future.exception())
                    else:
                        reports[name] = future.result()
        if errors:
            raise errors[0]
        return [reports[name] for name in names]

    def _environment(self, spark: SparkSession, reads: SharedReads | None,
                     step_settings: dict | None = None) -> Environment:
        """What one table's step sees of the engine: `spark`, its own session, `reads`, shared by
        the steps of its refresh, and `step_settings`, the result settings `spark` was given
        (read once per refresh, not per step)."""
        return Environment(
            spark=spark, reads=reads, storage_options=self.storage_options, driver_rows=self.driver_rows,
            broadcast_rows=self.broadcast_rows, cost_model=self.cost_model, run_id=self.run_id,
            arrangements=self.arrangements, keyed_files=self.keyed_files, triggers=self.triggers,
            invalidation=self.invalidation, remap=self.remap, sources=self.sources, table=self.table,
            readers=self.readers,
            schema_of=functools.partial(self._schema_in, reads), path_of=self.path_of, upkeep=self.upkeep,
            settings=step_settings, schemas=self.schemas,
            output_frame=lambda table, inputs, side: output_frame(spark, table, inputs, side, reads))

    def output_frame(self, table: Table, inputs: dict[str, InputRange], side: str) -> DataFrame:
        """The table's SQL run in full over its inputs at the given side's versions."""
        return output_frame(self.spark, table, inputs, side)

    def read(self, name: str, *, local: bool = False) -> DataFrame:
        """The table's visible rows as of its last committed epoch.

        With `local`, a table of at most `driver_rows` rows (by its files' statistics) is read by
        delta-rs into a local relation, as the refresh reads small inputs: a process's first read
        through Spark's Delta reader loads and compiles it, seconds of the JVM's time that a
        process whose refresh ran on the driver would pay for its checks alone. A table Spark
        must read (larger, or of types delta-rs does not read alike) is read by Spark."""
        table = self.table(name)
        last = table.ledger.last_committed()
        if last is None:
            raise EpochalError(f"table {name!r} has not been refreshed yet; call refresh() first")
        if local and self._read_locally(table):
            found = SharedReads(self.storage_options, self.driver_rows).snapshot(
                self.spark, table.path, last.output_version, table.schema)
            if found is not None:
                return found
        return read_snapshot(self.spark, table.path, last.output_version, table.schema)

    def inserted(self, name: str, first: int, last: int, *, local: bool = False) -> DataFrame:
        """The rows versions `first`..`last` of the table inserted (its change data feed's inserts
        and update post-images), as the table's columns; with `local`, read as `read` reads."""
        table = self.table(name)
        columns = [f.name for f in table.schema.fields]
        if local and self._read_locally(table):
            reads = SharedReads(self.storage_options, self.driver_rows)
            changes = reads.change_rows(table.path, first - 1, last)
            if changes is not None:
                inserted = pc.is_in(pc.cast(changes.column("_change_type"), pa.string()),
                                    pa.array(["insert", "update_postimage"]))
                # as Spark's Arrow types first: pyarrow filters no string views, which delta-rs reads
                rows = pa.Table.from_arrays([changes.column(c) for c in columns], names=columns)
                return reads.local(self.spark, rows.cast(to_arrow_schema(table.schema)).filter(inserted), table.schema)
        return (self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", first)
                .option("endingVersion", last)
                .load(table.path)
                .filter("_change_type IN ('insert', 'update_postimage')")
                .select(*[f"`{c}`" for c in columns]))

    def _read_locally(self, table: Table) -> bool:
        return not is_connect(self.spark) and written_on_driver(table.schema)

    def recompute(self, name: str) -> DataFrame:
        """The full recompute of the table's SQL at the input versions of its last epoch."""
        table = self.table(name)
        last = table.ledger.last_committed()
        if last is None:
            raise EpochalError(f"table {name!r} has not been refreshed yet; call refresh() first")
        inputs = {
            n: InputRange(n, self.path_of(n), "source" if n in self.sources else "derived", v["from"], v["to"],
                          self.schema_of(n))
            for n, v in last.inputs.items()
        }
        return self.output_frame(table, inputs, "after")

    def explain(self, name: str) -> str:
        return explain(self, self.table(name))
