"""Restrict co-generator scans to the change batch's keys (seed 000's co-generators; DESIGN.md
section 3, the inner join's semi-join reduction).

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

from ..graph import Filter, Join, Node, Project, Scan, conjuncts, transform


def scan_column(node: Node, column: str) -> bool:
    """Whether `column` of `node` is a scan's column passed through filters and projections."""
    while True:
        if isinstance(node, Scan):
            return column in node.columns
        if isinstance(node, Filter):
            node = node.input
        elif isinstance(node, Project):
            expression = dict(zip(node.columns, node.exprs)).get(column)
            if not isinstance(expression, exp.Column):
                return False
            column, node = expression.name, node.input
        else:
            return False


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
