"""Fold constant expressions (`1 + 1`, `DATE '1994-01-01' + INTERVAL '1' YEAR` stays as Spark
computes it; only what sqlglot can fold exactly) and drop filters that are always true."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.simplify import simplify

from ...graph import Filter, Join, Node, Project, Scan, transform


def _fold(expression: exp.Expression | None) -> exp.Expression | None:
    if expression is None:
        return None
    folded = simplify(expression.copy(), dialect="spark")
    return None if isinstance(folded, exp.Boolean) and folded.this is True else folded


def fold_constants(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if isinstance(node, Filter):
            predicate = _fold(node.predicate)
            return node.input if predicate is None else node.replace(predicate=predicate)
        if isinstance(node, Join):
            return node.replace(condition=_fold(node.condition))
        if isinstance(node, Scan) and node.predicate is not None:
            return node.replace(predicate=_fold(node.predicate))
        if isinstance(node, Project):
            return node.replace(exprs=tuple(simplify(e.copy(), dialect="spark") for e in node.exprs))
        return node

    return transform(plan, rewrite)
