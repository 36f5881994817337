"""Read only the columns the query uses: scans select them, projections and aggregates drop what
no reader needs. Besides reading less, a change batch over fewer columns consolidates better: an
update that only touched unread columns cancels out before any join or aggregate sees it."""

from __future__ import annotations

from ...graph import (
    Aggregate,
    Filter,
    Join,
    Node,
    OuterJoin,
    Project,
    Scan,
    SemiJoin,
    UnionAll,
    Window,
    columns_in,
    walk,
)


def _required(plan: Node) -> dict[int, set[str]]:
    order = list(walk(plan))
    required: dict[int, set[str]] = {id(node): set() for node in order}
    required[id(plan)] = set(plan.columns)
    for node in reversed(order):  # readers before what they read
        need = required[id(node)]
        if isinstance(node, Filter):
            required[id(node.input)] |= need | columns_in(node.predicate)
        elif isinstance(node, Project):
            for name, expression in zip(node.columns, node.exprs):
                if name in need:
                    required[id(node.input)] |= columns_in(expression)
        elif isinstance(node, Join):
            wanted = need | columns_in(node.condition)
            for part in node.parts:
                required[id(part)] |= wanted & set(part.columns)
        elif isinstance(node, Aggregate):
            wanted = set(node.keys)
            for agg in node.aggs:
                if agg.name in need or not node.keys:
                    wanted |= {agg.arg} if agg.arg else set()
                    wanted |= columns_in(agg.expression)
            required[id(node.input)] |= wanted
        elif isinstance(node, (OuterJoin, SemiJoin)):
            wanted = need | columns_in(node.residual) | {c for pair in node.pairs for c in pair}
            required[id(node.left)] |= wanted & set(node.left.columns)
            if isinstance(node, SemiJoin):
                wanted = columns_in(node.residual) | {c for pair in node.pairs for c in pair}
            required[id(node.right)] |= wanted & set(node.right.columns)
        elif isinstance(node, Window):
            wanted = need | set(node.partition) | {c for f in node.functions for c in columns_in(f)}
            required[id(node.input)] |= wanted & set(node.input.columns)
        else:
            for child in node.inputs:
                required[id(child)] |= set(child.columns)
    return required


def prune_columns(plan: Node) -> Node:
    required = _required(plan)
    done: dict[int, Node] = {}

    def rebuild(node: Node) -> Node:
        if id(node) in done:
            return done[id(node)]
        need = required[id(node)]
        inputs = tuple(rebuild(child) for child in node.inputs)
        if isinstance(node, Scan):
            keep = [i for i, name in enumerate(node.columns) if name in need or name in columns_in(node.predicate)]
            result: Node = node.replace(
                columns=tuple(node.columns[i] for i in keep), fields=tuple(node.fields[i] for i in keep)
            )
        elif isinstance(node, Project):
            keep = [i for i, name in enumerate(node.columns) if name in need]
            result = node.replace(
                columns=tuple(node.columns[i] for i in keep),
                exprs=tuple(node.exprs[i] for i in keep),
                input=inputs[0],
            )
        elif isinstance(node, Filter):
            result = node.replace(input=inputs[0], columns=inputs[0].columns)
        elif isinstance(node, Join):
            result = node.replace(parts=inputs, columns=tuple(c for part in inputs for c in part.columns))
        elif isinstance(node, Aggregate):
            aggs = tuple(agg for agg in node.aggs if agg.name in need or not node.keys)
            result = node.replace(input=inputs[0], aggs=aggs, columns=node.keys + tuple(a.name for a in aggs))
        elif isinstance(node, UnionAll):
            result = node.replace(parts=inputs)
        elif isinstance(node, OuterJoin):
            result = node.replace(left=inputs[0], right=inputs[1], columns=inputs[0].columns + inputs[1].columns)
        elif isinstance(node, SemiJoin):
            result = node.replace(left=inputs[0], right=inputs[1], columns=inputs[0].columns)
        elif isinstance(node, Window):
            added = node.columns[len(node.input.columns):]
            result = node.replace(input=inputs[0], columns=inputs[0].columns + added)
        else:
            result = node.with_inputs(inputs)
        done[id(node)] = result
        return result

    return rebuild(plan)
