"""Drop passthrough nodes (Tremor RFC 0011): projections that pass their input through unchanged
and unions of a single input."""

from __future__ import annotations

from sqlglot import exp

from ...graph import Node, Project, UnionAll, transform


def _is_identity(node: Project) -> bool:
    return node.columns == node.input.columns and all(
        isinstance(e, exp.Column) and e.name == name for e, name in zip(node.exprs, node.columns)
    )


def drop_passthrough(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if isinstance(node, Project) and _is_identity(node):
            return node.input
        if isinstance(node, UnionAll) and len(node.parts) == 1 and node.parts[0].columns == node.columns:
            return node.parts[0]
        return node

    return transform(plan, rewrite)
