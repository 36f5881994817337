"""What every delta rule provides."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changes import quoted
from ..graph import WEIGHT, Node, sql


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


def held_through(ctx, frame: DataFrame, below: DataFrame, node: Node) -> DataFrame:
    """Note `frame` (`node`, a filter or a projection, applied to `below`) as held on the driver
    where `below` is: filtered there where Arrow decides the predicate as Spark does (then exact
    when `below` is), renamed where the projection only picks columns. Over exact rows, what Arrow
    does not compute as Spark does is noted as Spark's rows of `frame`, collected only if an
    operator above asks for them (one job with no shuffle: `below` is a local relation)."""
    from sqlglot import exp

    from ..driver_filters import driver_filter
    from ..graph import Filter

    if not ctx.held_exactly(below):
        rows = ctx.rows_on_driver(below)
        if rows is not None and isinstance(node, Filter):
            passing = driver_filter(rows, node.predicate)
            return ctx.on_driver(frame, rows if passing is None else passing)
        return frame
    rows = ctx.computed_rows(below)
    if rows is None:  # Spark's rows: so are these
        pass
    elif isinstance(node, Filter):
        passing = driver_filter(rows, node.predicate)
        if passing is not None:
            return ctx.on_driver(frame, passing, exact=True)
    elif all(isinstance(e, exp.Column) and e.name in rows.column_names for e in node.exprs):
        weight = [WEIGHT] if WEIGHT in rows.column_names and WEIGHT in frame.columns else []
        picked = rows.select([e.name for e in node.exprs] + weight).rename_columns(list(node.columns) + weight)
        return ctx.on_driver(frame, picked, exact=True)
    return ctx.on_driver(frame, frame.toArrow, exact=True)


def expr(expression) -> "F.Column":
    return F.expr(sql(expression))


def union_all(frames: list[DataFrame]) -> DataFrame | None:
    frames = [frame for frame in frames if frame is not None]
    if not frames:
        return None
    return reduce(lambda a, b: a.unionByName(b), frames)


def with_weight(columns, frame: DataFrame) -> list:
    return [F.col(quoted(c)) for c in columns] + ([F.col(WEIGHT)] if WEIGHT in frame.columns else [])
