"""What every delta rule provides."""

from __future__ import annotations

import threading
from functools import reduce
from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType
from sqlglot import exp

from ..arrow_rows import computed_rows, held_exactly, held_rows, hold, lazy_frame
from ..changes import empty_frame, quoted
from ..driver.filters import driver_filter
from ..driver.projections import driver_project
from ..graph import WEIGHT, Filter, Node, sql


class Rule:
    operator: type = Node
    rule: str = ""  # the delta rule, for explain
    state: str = "none"  # the state kept, for explain
    materialize_delta: bool = False  # compute the change batch once and cut its lineage (context.py)

    def stateful(self, node: Node) -> bool:
        return False

    def delta(self, node: Node, ctx) -> DataFrame | None:
        raise NotImplementedError

    def snapshot(self, node: Node, ctx, side: str) -> DataFrame:
        raise NotImplementedError

    def build_state(self, node: Node, ctx) -> None:
        """Queue this node's full state as of the epoch's end (rescans)."""

    def explain(self, node: Node) -> tuple[str, str]:
        return self.rule, self.state

    def held_snapshot(self, node: Node, ctx, side: str, column: str, keys) -> DataFrame | None:
        """`node` as of `side`, holding at least its rows whose `column` is one of the keys, read
        on the driver (narrowing.restricted_snapshot); None where the operator cannot."""
        return None

    def expected_rows(self, node: Node, ctx, side: str, column: str, keys: tuple[tuple, bool]) -> float | None:
        """About how many rows `held_snapshot` would read for the keys, before reading them
        (narrowing.expected_rows); None where the operator cannot tell."""
        return None

    def held_range(self, node: Node, ctx, side: str, column: str, low, high) -> DataFrame | None:
        """`node` as of `side`, holding at least its rows whose `column` lies in [low, high],
        read on the driver (narrowing.scalar_spans); None where the operator cannot."""
        return None


def held_through(ctx, apply: Callable[[DataFrame], DataFrame], below: DataFrame, node: Node,
                 weighted: bool = False) -> DataFrame:
    """`apply(below)` (`node`, a filter or a projection, applied to `below`), noted as held on the
    driver where `below` is: filtered there where Arrow decides the predicate as Spark does (then
    exact when `below` is), renamed where the projection only picks columns, computed where
    Arrow's arithmetic is Spark's (driver/projections.py). What the driver computes is a frame
    Spark builds only if an operator above hands it to Spark: a change held on the driver through
    its scan, filter, projection and aggregate never becomes a Spark plan. Over exact rows, what
    Arrow does not compute as Spark does is noted as Spark's rows of the frame, collected only if
    an operator above asks for them (one job with no shuffle: `below` is a local relation).
    `weighted`: a projection `apply` keeps the weight column of a change batch."""
    if not held_exactly(below):
        frame = apply(below)
        rows = held_rows(below)
        if rows is not None and isinstance(node, Filter):
            passing = driver_filter(rows, node.predicate)
            return hold(frame, rows if passing is None else passing)
        return frame
    rows = computed_rows(below)
    weight = [WEIGHT] if weighted and rows is not None and WEIGHT in rows.column_names else []
    if rows is None:  # Spark's rows: so are these
        pass
    elif isinstance(node, Filter):
        passing = driver_filter(rows, node.predicate)
        if passing is not None:
            return hold(lazy_frame(ctx.spark, lambda: apply(below), below.schema), passing, exact=True)
    elif all(isinstance(e, exp.Column) and e.name in rows.column_names for e in node.exprs):
        fields = {f.name: f for f in below.schema.fields}
        schema = StructType([StructField(name, fields[e.name].dataType, fields[e.name].nullable)
                             for name, e in zip(node.columns, node.exprs)] + [fields[w] for w in weight])
        picked = rows.select([e.name for e in node.exprs] + weight).rename_columns(list(node.columns) + weight)
        return hold(lazy_frame(ctx.spark, lambda: apply(below), schema), picked, exact=True)
    else:
        schema = projected_schema(ctx, apply, below.schema, node, weighted)
        computed = driver_project(rows, node.exprs, node.columns, list(to_arrow_schema(schema).types), keep=tuple(weight))
        if computed is not None:
            return hold(lazy_frame(ctx.spark, lambda: apply(below), schema), computed, exact=True)
    frame = apply(below)
    return hold(frame, frame.toArrow, exact=True)


_ANALYSED: dict[tuple, StructType] = {}
_ANALYSED_LOCK = threading.Lock()


def projected_schema(ctx, apply, schema: StructType, node: Node, weighted: bool) -> StructType:
    """The schema of the projection `apply` (of `node`, keeping the weight or not) over rows of `schema`."""
    key = ("project", tuple(sql(e) for e in node.exprs), tuple(node.columns), weighted)
    return analysed_schema(ctx, key, apply, schema)


def analysed_schema(ctx, key: tuple, apply: Callable[[DataFrame], DataFrame], schema: StructType) -> StructType:
    """The schema of `apply` over rows of `schema`, as Spark's analysis types it: analysed once
    over an empty relation per `key` (what `apply` computes), input schema and the step's typing
    confs (`Context.typing_confs`), then remembered: the same operator runs every epoch, and a
    frame computed on the driver needs its schema but not its Spark plan. Remembered by the
    process, and on the machine's disk (`Context.schemas`, storage/schemas.py) for the next
    process (a Dagster run is one), which would otherwise ask again for every operator."""
    key = (key, schema.json(), ctx.typing_confs)
    found = _ANALYSED.get(key)
    if found is None:
        remembered = ctx.schemas
        question = (key, ctx.spark.version)
        found = remembered.get(question) if remembered is not None else None
        if found is None:
            found = apply(empty_frame(ctx.spark, schema)).schema
            if remembered is not None:
                remembered.put(question, found)
        with _ANALYSED_LOCK:
            if len(_ANALYSED) >= 4096:
                _ANALYSED.clear()
            _ANALYSED[key] = found
    return found


def expr(expression) -> "F.Column":
    return F.expr(sql(expression))


def union_all(frames: list[DataFrame]) -> DataFrame | None:
    frames = [frame for frame in frames if frame is not None]
    if not frames:
        return None
    return reduce(lambda a, b: a.unionByName(b), frames)


def with_weight(columns, frame: DataFrame) -> list:
    return [F.col(quoted(c)) for c in columns] + ([F.col(WEIGHT)] if WEIGHT in frame.columns else [])
