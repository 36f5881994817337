"""Restrict co-generator scans to the change batch's keys (the co-generators of "How Pulley
Produces Incremental Output"; the inner join's semi-join reduction, docs/architecture.md, section 5).

A join term starts from one input's change batch and reads every other input in full as of the
epoch's start or end. Where the join condition equates a column of the changed input with a column
of another input, only the rows of that input holding one of the batch's values can match. The
pass marks those pairs on the Join (`Join.restrict`); at run time the join rule collects the
batch's values (if few) and filters the other input's read by them, which the Delta scan turns into
file skipping (min/max statistics), so a small change reads few files of a big table.

A pair is marked only when it can pay off: the changed input's batch is a scan's batch (persisted
once per epoch, so collecting its keys is cheap) and the other input reaches a table scan through
filters and plain column projections (so the filter lands on a Delta scan, not on state).
"""

from __future__ import annotations

from sqlglot import exp

from ...graph import (
    Aggregate,
    Filter,
    Join,
    Node,
    OuterJoin,
    Project,
    Scan,
    SemiJoin,
    SetOperation,
    Window,
    conjuncts,
    transform,
    walk,
)


def scan_field(node: Node, column: str, joins: bool = False) -> tuple[str, str] | None:
    """The scan (table, field) whose column reaches `node` as `column` through filters and plain
    column projections (with `joins`, also through the join input holding it and a semi-join's
    left input, as narrowing.restricted_snapshot reads some keys' rows), or None."""
    while True:
        if isinstance(node, Scan):
            return (node.table, node.fields[node.columns.index(column)]) if column in node.columns else None
        if isinstance(node, Filter):
            node = node.input
        elif isinstance(node, Project):
            expression = dict(zip(node.columns, node.exprs)).get(column)
            if not isinstance(expression, exp.Column):
                return None
            column, node = expression.name, node.input
        elif joins and isinstance(node, SemiJoin):
            node = node.left
        elif joins and isinstance(node, Join):
            node = next((part for part in node.parts if column in part.columns), None)
            if node is None:
                return None
        else:
            return None


def scan_column(node: Node, column: str) -> bool:
    """Whether `column` of `node` is a scan's column passed through filters and projections."""
    return scan_field(node, column) is not None


def _pairs(node: Join) -> list[tuple[int, str, int, str]]:
    owner = {c: i for i, part in enumerate(node.parts) for c in part.columns}
    pairs = []
    for part in conjuncts(node.condition):
        if not (isinstance(part, exp.EQ) and isinstance(part.left, exp.Column) and isinstance(part.right, exp.Column)):
            continue  # NULL-safe equality would match NULL keys, which a key filter drops
        a, b = part.left.name, part.right.name
        if a not in owner or b not in owner or owner[a] == owner[b]:
            continue
        for (x, i), (y, j) in (((a, owner[a]), (b, owner[b])), ((b, owner[b]), (a, owner[a]))):
            if scan_column(node.parts[i], x) and scan_column(node.parts[j], y):
                pairs.append((i, x, j, y))
    return sorted(set(pairs))


def restrict_cogenerators(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if not isinstance(node, Join):
            return node
        pairs = tuple(_pairs(node))
        return node if pairs == node.restrict else node.replace(restrict=pairs)

    return transform(plan, rewrite)


def keyed_partners(plan: Node) -> set[tuple[str, str]]:
    """The (table, field) pairs the plan's incremental steps may read for some keys' rows (what
    an arrangement serves, arrangements.py): a join input by each column its condition equates
    with another input's (a co-generator, or semi-join reduction from one), both sides of an
    outer or semi-join, a set operation or a window partition by their first key (affected-key
    recomputes, rules/keyed.py), and an aggregate's input by its first group key where a MIN or
    MAX may be recomputed. A superset: a term whose batch never changes reads none of its."""

    def _partner(node: Node, column: str) -> tuple[str, str] | None:
        return scan_field(node, column, joins=True)

    found: set[tuple[str, str] | None] = set()
    for node in walk(plan):
        if isinstance(node, Join):
            owner = {c: i for i, part in enumerate(node.parts) for c in part.columns}
            for condition in conjuncts(node.condition):
                if isinstance(condition, exp.EQ) and isinstance(condition.left, exp.Column) \
                        and isinstance(condition.right, exp.Column):
                    ends = [e.name for e in (condition.left, condition.right) if e.name in owner]
                    if len(ends) == 2 and owner[ends[0]] != owner[ends[1]]:
                        found.update(_partner(node.parts[owner[c]], c) for c in ends)
        elif isinstance(node, (OuterJoin, SemiJoin)) and node.pairs:
            a, b = node.pairs[0]
            found.update((_partner(node.left, a), _partner(node.right, b)))
        elif isinstance(node, SetOperation) and node.left.columns:
            found.update((_partner(node.left, node.left.columns[0]), _partner(node.right, node.right.columns[0])))
        elif isinstance(node, Window) and node.partition:
            found.add(_partner(node.input, node.partition[0]))
        elif isinstance(node, Aggregate) and node.keys and any(a.func in ("min", "max") for a in node.aggs):
            found.add(_partner(node.input, node.keys[0]))
    found.discard(None)
    return found  # type: ignore[return-value]
