"""Fuse a window over a window of the same partitioning into one Window node, where the outer
functions do not read the inner ones' results. Spark's plan keeps one Window per window
specification, so `row_number() OVER (PARTITION BY g ORDER BY v), sum(v) OVER (PARTITION BY g)`
arrives as two nodes; fused, a change recomputes its touched partitions once, and over rows held
on the driver (the outer node's input would be the inner one's result, which is Spark's)."""

from __future__ import annotations

from sqlglot import exp

from ...graph import Node, Window, transform
from .fuse import reader_counts


def fuse_windows(plan: Node) -> Node:
    readers = reader_counts(plan)

    def rewrite(node: Node) -> Node:
        if not (isinstance(node, Window) and isinstance(node.input, Window)):
            return node
        inner = node.input
        computed = set(inner.columns[len(inner.input.columns):])
        read = {column.name for function in node.functions for column in function.find_all(exp.Column)}
        if readers.get(id(inner), 0) > 1 or set(node.partition) != set(inner.partition) or read & computed:
            return node
        return Window(columns=node.columns, input=inner.input, partition=inner.partition,
                      functions=inner.functions + node.functions)

    return transform(plan, rewrite)
