"""Merge an inner join that reads another inner join into one n-ary join, so the join's delta
rule sees every input (and can start each term from the changed input)."""

from __future__ import annotations

from ...graph import Join, Node, conjoin, conjuncts, transform


def flatten_joins(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if not isinstance(node, Join) or not any(isinstance(part, Join) for part in node.parts):
            return node
        parts, condition = [], conjuncts(node.condition)
        for part in node.parts:
            if isinstance(part, Join):
                parts.extend(part.parts)
                condition = conjuncts(part.condition) + condition
            else:
                parts.append(part)
        return Join(columns=node.columns, parts=tuple(parts), condition=conjoin(condition))

    return transform(plan, rewrite)
