"""Push predicates toward the scans: through projections, into the inputs of joins they touch
alone, below aggregates when they test group keys only, and into the scans themselves, where they
filter the change batch and the snapshot reads alike (and Delta can skip files)."""

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
    Window,
    columns_in,
    conjoin,
    conjuncts,
    render,
    transform,
)
from .substitute import substitute

MAX_ROUNDS = 16


def _filter(node: Node, parts: list) -> Node:
    return Filter(columns=node.columns, input=node, predicate=conjoin(parts)) if parts else node


def _push_once(node: Node) -> Node:
    if isinstance(node, Join):
        pushed = {i: [] for i in range(len(node.parts))}
        kept = []
        for part in conjuncts(node.condition):
            used = columns_in(part)
            owners = [i for i, p in enumerate(node.parts) if used and used <= set(p.columns)]
            (pushed[owners[0]] if owners else kept).append(part)
        if not any(pushed.values()):
            return node
        parts = tuple(_filter(p, pushed[i]) for i, p in enumerate(node.parts))
        return Join(columns=node.columns, parts=parts, condition=conjoin(kept))
    if not isinstance(node, Filter):
        return node
    child = node.input
    if isinstance(child, Scan):
        return child.replace(predicate=conjoin(conjuncts(child.predicate) + conjuncts(node.predicate)))
    if isinstance(child, Project):
        mapping = dict(zip(child.columns, child.exprs))
        return child.replace(input=Filter(
            columns=child.input.columns, input=child.input, predicate=substitute(node.predicate, mapping)
        ))
    if isinstance(child, Join):
        return Join(columns=child.columns, parts=child.parts,
                    condition=conjoin(conjuncts(child.condition) + conjuncts(node.predicate)))
    if isinstance(child, SemiJoin):  # a semi- or anti-join keeps or drops left rows whole
        return child.replace(left=_filter(child.left, conjuncts(node.predicate)))
    if isinstance(child, OuterJoin) and child.side in ("left", "right"):
        preserved = child.left if child.side == "left" else child.right
        below = [p for p in conjuncts(node.predicate) if columns_in(p) <= set(preserved.columns)]
        above = [p for p in conjuncts(node.predicate) if p not in below]
        if below:
            side = "left" if child.side == "left" else "right"
            moved = child.replace(**{side: _filter(preserved, below)})
            return _filter(moved, above)
    if isinstance(child, Window):
        below = [p for p in conjuncts(node.predicate) if columns_in(p) <= set(child.partition)]
        above = [p for p in conjuncts(node.predicate) if p not in below]
        if below:
            return _filter(child.replace(input=_filter(child.input, below)), above)
    if isinstance(child, Aggregate) and child.keys:
        below = [p for p in conjuncts(node.predicate) if columns_in(p) <= set(child.keys)]
        above = [p for p in conjuncts(node.predicate) if p not in below]
        if below:
            moved = child.replace(input=_filter(child.input, below))
            return _filter(moved, above)
    return node


def push_predicates(plan: Node) -> Node:
    for _ in range(MAX_ROUNDS):
        before = render(plan)
        plan = transform(plan, _push_once)
        if render(plan) == before:
            break
    return plan
