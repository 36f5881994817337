"""Which output columns form a unique key, so the derived table can be merged on it.

GROUP BY keys (and DISTINCT rows) are unique in the aggregate's output; if the projections and
filters above pass every key column through unchanged, those output positions are a key. A global
aggregate has the empty key (one row). Anything else is a multiset: rows are matched whole.
"""

from __future__ import annotations

from sqlglot import exp

from ..graph import Aggregate, Filter, Node, Project


def output_key(plan: Node | None) -> tuple[int, ...] | None:
    if plan is None:
        return None
    origin = {name: name for name in plan.columns}  # root column -> column of the current node
    node = plan
    while isinstance(node, (Project, Filter)):
        if isinstance(node, Project):
            passes = {
                name: e.name for name, e in zip(node.columns, node.exprs) if isinstance(e, exp.Column)
            }
            origin = {root: passes[current] for root, current in origin.items() if current in passes}
        node = node.input
    if not isinstance(node, Aggregate):
        return None
    positions = []
    for key in node.keys:
        found = [i for i, root in enumerate(plan.columns) if origin.get(root) == key]
        if not found:
            return None
        positions.append(found[0])
    return tuple(sorted(positions))
