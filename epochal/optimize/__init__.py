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


MAX_ROUNDS = 4


def optimize(plan: Node, passes=PASSES) -> tuple[Node, tuple[str, ...]]:
    """Apply the passes in order, again while a round changes the plan (one pass can open the
    way for another: a pushed-down filter can leave a join directly under a join)."""
    applied: list[str] = []
    for _ in range(MAX_ROUNDS):
        start = render(plan)
        for rewrite in passes:
            before = render(plan)
            plan = rewrite(plan)
            if render(plan) != before and rewrite.__name__ not in applied:
                applied.append(rewrite.__name__)
        if render(plan) == start:
            break
    return plan, tuple(applied)
