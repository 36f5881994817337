"""Plan rewrites, each a small pure function from graph to graph in its own module (the sqlglot
optimizer is the model). `optimize` applies them in order and reports which changed the plan."""

from __future__ import annotations

from ..graph import Node, render
from .drop_passthrough import drop_passthrough
from .flatten_joins import flatten_joins
from .fold_constants import fold_constants
from .fuse import fuse_filters, fuse_projections
from .prune_columns import prune_columns
from .push_predicates import push_predicates

PASSES = (
    flatten_joins,
    fold_constants,
    push_predicates,
    fuse_filters,
    fuse_projections,
    drop_passthrough,
    prune_columns,
)


def optimize(plan: Node, passes=PASSES) -> tuple[Node, tuple[str, ...]]:
    applied = []
    for rewrite in passes:
        before = render(plan)
        plan = rewrite(plan)
        if render(plan) != before:
            applied.append(rewrite.__name__)
    return plan, tuple(applied)
