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


def expr(expression) -> "F.Column":
    return F.expr(sql(expression))


def union_all(frames: list[DataFrame]) -> DataFrame | None:
    frames = [frame for frame in frames if frame is not None]
    if not frames:
        return None
    return reduce(lambda a, b: a.unionByName(b), frames)


def with_weight(columns, frame: DataFrame) -> list:
    return [F.col(quoted(c)) for c in columns] + ([F.col(WEIGHT)] if WEIGHT in frame.columns else [])
