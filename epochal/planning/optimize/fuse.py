"""Fuse adjacent filters into one, and a projection over a projection into one."""

from __future__ import annotations

from ...graph import Filter, Node, Project, conjoin, conjuncts, transform, walk
from .substitute import substitute


def fuse_filters(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if isinstance(node, Filter) and isinstance(node.input, Filter):
            inner = node.input
            return Filter(
                columns=node.columns,
                input=inner.input,
                predicate=conjoin(conjuncts(inner.predicate) + conjuncts(node.predicate)),
            )
        return node

    return transform(plan, rewrite)


def fuse_projections(plan: Node) -> Node:
    readers = reader_counts(plan)

    def rewrite(node: Node) -> Node:
        if isinstance(node, Project) and isinstance(node.input, Project) and readers.get(id(node.input), 0) <= 1:
            inner = node.input
            mapping = dict(zip(inner.columns, inner.exprs))
            return Project(
                columns=node.columns,
                input=inner.input,
                exprs=tuple(substitute(e, mapping) for e in node.exprs),
            )
        return node

    return transform(plan, rewrite)


def reader_counts(plan: Node) -> dict[int, int]:
    counts: dict[int, int] = {}
    for node in walk(plan):
        for child in node.inputs:
            counts[id(child)] = counts.get(id(child), 0) + 1
    return counts
