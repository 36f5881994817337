"""Plan rewrites, each a small pure function from graph to graph in its own module (the sqlglot
optimizer is the model). `optimize` applies them in order and reports which changed the plan."""

from __future__ import annotations

from ...graph import Node, render
from .drop_passthrough import drop_passthrough
from .flatten_joins import flatten_joins
from .fold_constants import fold_constants
from .fuse import fuse_filters, fuse_projections
from .fuse_windows import fuse_windows
from .prune_columns import prune_columns
from .push_predicates import push_predicates
from .restrict_cogenerators import restrict_cogenerators

PASSES = (
    flatten_joins,
    fold_constants,
    push_predicates,
    fuse_filters,
    fuse_projections,
    fuse_windows,
    drop_passthrough,
    prune_columns,
    restrict_cogenerators,
)


def passes_named(names) -> tuple:
    """The passes with the given names, in PASSES order (None: all of them). The engine's option
    to run fewer passes, for comparing plans and measuring what a pass buys."""
    if names is None:
        return PASSES
    known = {rewrite.__name__: rewrite for rewrite in PASSES}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown optimizer pass(es) {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(rewrite for rewrite in PASSES if rewrite.__name__ in set(names))


MAX_ROUNDS = 4


def optimize(plan: Node, passes=PASSES) -> tuple[Node, tuple[str, ...]]:
    """Apply the passes in order, again while a round changes the plan (one pass can open the
    way for another: a pushed-down filter can leave a join directly under a join)."""
    applied: list[str] = []
    rendered = render(plan)
    for _ in range(MAX_ROUNDS):
        start = rendered
        for rewrite in passes:
            before, plan = rendered, rewrite(plan)
            rendered = render(plan)
            if rendered != before and rewrite.__name__ not in applied:
                applied.append(rewrite.__name__)
        if rendered == start:
            break
    return plan, tuple(applied)
