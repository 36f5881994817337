"""Delta rules, one operator a module (DBSP's operator library is the model): how the operator's
change batch follows from its inputs' change batches and snapshots, what state it keeps, and how
it reads its own contents as of an epoch's start or end.

Notation (docs/architecture.md, section 2): `old` = an input as of the epoch's start, `new` = as of its end,
`d` = its change batch.
"""

from __future__ import annotations

from ..graph import Node, walk
from .aggregate import AggregateRule
from .base import Rule
from .filter import FilterRule
from .integrate import IntegrateRule
from .join import JoinRule
from .outer_join import OuterJoinRule
from .project import ProjectRule
from .scan import ScanRule
from .semijoin import SemiJoinRule
from .set_operation import SetOperationRule
from .topk import TopKRule
from .union import UnionAllRule
from .window import WindowRule

RULES: dict[type, Rule] = {
    rule.operator: rule
    for rule in (
        ScanRule(), FilterRule(), ProjectRule(), JoinRule(), AggregateRule(), UnionAllRule(),
        OuterJoinRule(), SemiJoinRule(), SetOperationRule(), WindowRule(), TopKRule(), IntegrateRule(),
    )
}


class NoRule(KeyError):
    pass


def rule_for(node: Node) -> Rule:
    try:
        return RULES[type(node)]
    except KeyError:
        raise NoRule(node.kind) from None


def blocker(plan: Node) -> str | None:
    """The first construct in `plan` without a delta rule, if any."""
    for node in walk(plan):
        if type(node) not in RULES:
            return f"{node.kind} {node.describe()}".strip()
    return None
