"""Evaluating a plan within one epoch: each node's change batch (`delta`) and its contents as of
the epoch's start or end (`snapshot`), dispatched to the node's rule and memoized, so a subplan used
by several join terms is planned once."""

from __future__ import annotations

import time
from functools import cached_property
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from .. import settings
from ..arrow_rows import held_exactly, held_rows
from ..changes import NEW, InputRange
from ..graph import Node, Scan, walk
from ..keyed.local_copies import making_seconds
from ..keyed.shared_reads import SharedReads
from ..keyed.state import StateStore
from ..metrics import Meter
from ..reasons import refusals
from ..rules import rule_for
from ..storage.schemas import AnalysedSchemas


def state_names(plan: Node, stateful: Callable[[Node], bool]) -> dict[int, str]:
    """Stable names for the state of each stateful node: its kind and position in the plan."""
    names = {}
    for position, node in enumerate(walk(plan)):
        if stateful(node):
            names[id(node)] = f"{node.kind.lower()}{position}"
    return names


TYPING_CONFS = ("spark.sql.ansi.enabled", "spark.sql.decimalOperations.allowPrecisionLoss",
                "spark.sql.legacy.literal.pickMinimumPrecision")


class Context:
    def __init__(
        self,
        spark: SparkSession,
        plan: Node,
        inputs: dict[str, InputRange],
        state: StateStore,
        *,
        rescan: bool = False,
        broadcast_rows: int = 200_000,
        meter: Meter | None = None,
        reads: SharedReads | None = None,
        schemas: AnalysedSchemas | None = None,
    ):
        self.spark = spark
        self.plan = plan
        self.inputs = inputs
        self.state = state
        self.rescan = rescan
        self.broadcast_rows = broadcast_rows
        self.meter = meter or Meter()
        self.reads = reads
        self.schemas = schemas  # analysed schemas remembered across processes (rules.base.analysed_schema)
        self.rule_for = rule_for
        self.state_names = state_names(plan, lambda node: rule_for(node).stateful(node))
        self._deltas: dict[int, DataFrame | None] = {}
        self._snapshots: dict[tuple[int, str], DataFrame] = {}
        self._changed: dict[int, bool] = {}
        self._full_states: dict[tuple[int, str], tuple[DataFrame, bool]] = {}  # full_state: frame, persisted
        self.scratch: dict[tuple[int, str], object] = {}
        self.rows_read = 0
        self.spark_changes: list[str] = []  # inputs whose change batch is Spark's, not held on the driver
        self.persisted: list[DataFrame] = []
        self._deadline: float | None = None
        self._give_up: Callable[[], Exception] | None = None
        self._making_from = making_seconds()

    def budget(self, deadline: float, give_up: Callable[[], Exception]) -> None:
        """Give up computing the change once `deadline` (time.monotonic), put off by the seconds
        spent making local copies (`copying_seconds`), has passed: the change batch of the next
        node begun or finished raises `give_up()` instead (the cost model's budget)."""
        self._deadline, self._give_up = deadline, give_up

    @property
    def copying_seconds(self) -> float:
        """The seconds this step's thread has spent making local copies since the step began
        (keyed.local_copies.making_seconds): not counted against its budget."""
        return making_seconds() - self._making_from

    @cached_property
    def typing_confs(self) -> tuple:
        """The confs that decide Spark's result types (ANSI mode, decimal precision), read once per
        step: the driver's computations must type their columns as Spark would."""
        return tuple(self.spark.conf.get(name, None) for name in TYPING_CONFS)

    @cached_property
    def ansi(self) -> bool:
        """Whether the step's session has ANSI mode on (an overflow is an error, not a NULL)."""
        return settings.ansi(self.spark)

    def read_changes(self) -> int:
        """Read every changed scan's change batch once and count it (on the driver where the
        batch was consolidated there, else persisted and counted by one Spark job); a scan whose
        batch consolidates to nothing (updates of unread columns, changes filtered out) counts as
        unchanged, so the join terms and aggregates above it are never planned. A batch counted
        on the driver is counted after its scan's predicate where Arrow decides that
        (driver/filters.py), else before it: then one the predicate empties still counts as
        changed, and its terms run over no rows and add nothing."""
        for node in walk(self.plan):
            if isinstance(node, Scan) and self.changed(node):
                rng = self.inputs[node.table]
                with refusals(f"the change data of {rng.kind} {rng.name!r} versions {rng.before + 1}..{rng.after}"):
                    batch = self.rule_for(node).delta(node, self)
                    held = held_rows(batch)  # consolidated on the driver: its rows are counted
                    rows = held.num_rows if held is not None else None
                    if rows is None:
                        batch = batch.persist()  # a short plan: no cut needed
                        self.persisted.append(batch)
                        rows = batch.count()  # fills the cache: one job
                        if rows:
                            self.spark_changes.append(node.table)
                self.rows_read += rows
                self._deltas[id(node)] = batch if rows else None
                self._changed[id(node)] = bool(rows)
        return self.rows_read

    def materialize(self, frame: DataFrame) -> DataFrame:
        """Compute `frame` now and cut its lineage (a local checkpoint): what reads it later plans
        against the result, not against the whole subplan again. Without these cuts a join term
        over an aggregate over a join repeats every subplan below it, and plans grow into
        megabytes that take Catalyst seconds to optimize. Only change-sized frames are
        materialized; released when the step ends. A frame held exactly on the driver is a local
        relation under a few narrow operators already: it is returned as it is."""
        if held_exactly(frame):
            return frame
        done = frame.localCheckpoint(eager=True)
        self.persisted.append(done)
        return done

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()
        self.persisted.clear()

    def changed(self, node: Node) -> bool:
        """Whether any input below `node` changed in this epoch (decided without Spark)."""
        if id(node) not in self._changed:
            if isinstance(node, Scan):
                self._changed[id(node)] = self.inputs[node.table].changed
            else:
                self._changed[id(node)] = any(self.changed(child) for child in node.inputs)
        return self._changed[id(node)]

    def delta(self, node: Node) -> DataFrame | None:
        """The node's consolidated-or-not change batch; None when nothing below it changed."""
        if id(node) not in self._deltas:
            self._within_budget()
            rule = self.rule_for(node)
            change = rule.delta(node, self) if self.changed(node) else None
            if change is not None and rule.materialize_delta:
                change = self.materialize(change)
            self._deltas[id(node)] = change
            self._within_budget()  # the work is done as the plan is walked back up: checked after each node too
        return self._deltas[id(node)]

    def _within_budget(self) -> None:
        if self._deadline is not None and time.monotonic() - self.copying_seconds > self._deadline:
            raise self._give_up()

    def snapshot(self, node: Node, side: str) -> DataFrame:
        if not self.changed(node):
            side = NEW  # old and new are the same; share one plan
        key = (id(node), side)
        if key not in self._snapshots:
            self._snapshots[key] = self.rule_for(node).snapshot(node, self, side)
        return self._snapshots[key]

    def schema(self, node: Node) -> StructType:
        return self.snapshot(node, NEW).schema

    def memo(self, node: Node, what: str, compute: Callable[[], object]):
        key = (id(node), what)
        if key not in self.scratch:
            self.scratch[key] = compute()
        return self.scratch[key]

    def full_state(self, node: Node, side: str, compute: Callable[[], DataFrame]) -> DataFrame:
        """A rescan's full state of a stateful node, planned once: its write (`build_state`) and
        the full states of the operators above it read the same frame. Asked for a second time
        (an operator above reads it), the frame is persisted, so the write that computes it first
        (lower states are written first: `walk` order) leaves it for the ones above, and an
        aggregate over an aggregate does not compute the lower one's whole input again. Spark
        uses a cache from the execution of a plan on, so frames planned over it before it was
        persisted read it too. Released when the step ends."""
        key = (id(node), side)
        if key in self._full_states:
            frame, shared = self._full_states[key]
            if not shared:
                frame.persist()
                self.persisted.append(frame)
                self._full_states[key] = (frame, True)
            return frame
        frame = compute()
        self._full_states[key] = (frame, False)
        return frame

    def state_name(self, node: Node) -> str:
        return self.state_names[id(node)]

    def build_states(self) -> None:
        """Queue full state tables for every stateful node, computed at the epoch's end."""
        for node in walk(self.plan):
            rule = self.rule_for(node)
            if rule.stateful(node):
                rule.build_state(node, self)
