"""Turn a join with a one-row input whose columns nobody above reads into a semi-join: the filter
of an uncorrelated scalar subquery (`WHERE c_acctbal > (SELECT avg(c_acctbal) ...)`).

The planner decorrelates a scalar subquery into a join with its global aggregate. Kept as a join,
a change of the scalar joins every row of the other inputs with its old and new value, and the
two copies of a row whose predicate holds either way cancel only after the projection drops the
scalar: the step carries the whole input through the join. As a semi-join with a one-row right
input it is a filter (exactly one partner, so no multiplicity changes), and its delta rule
(rules/semijoin.py) reads only the rows whose predicate flips between the two values.
"""

from __future__ import annotations

from ...graph import Join, Node, Project, SemiJoin, columns_in, conjoin, conjuncts, one_row, transform


def _as_semijoin(join: Join, index: int) -> SemiJoin | None:
    scalar = join.parts[index]
    own = set(scalar.columns)
    rest = [part for i, part in enumerate(join.parts) if i != index]
    on = [c for c in conjuncts(join.condition) if columns_in(c) & own]
    kept = [c for c in conjuncts(join.condition) if not columns_in(c) & own]
    if not on:
        return None
    columns = tuple(c for c in join.columns if c not in own)
    if len(rest) == 1:
        left, on = rest[0], conjuncts(join.condition)
    else:
        left = Join(columns=columns, parts=tuple(rest), condition=conjoin(kept))
    return SemiJoin(columns=columns, left=left, right=scalar, residual=conjoin(on))


def filter_by_scalar(plan: Node) -> Node:
    def rewrite(node: Node) -> Node:
        if not isinstance(node, Project) or not isinstance(node.input, Join):
            return node
        join = node.input
        read = set().union(*(columns_in(e) for e in node.exprs))
        for index, part in enumerate(join.parts):
            if one_row(part) and not read & set(part.columns):
                semijoin = _as_semijoin(join, index)
                if semijoin is not None:
                    return node.with_inputs((semijoin,))
        return node

    return transform(plan, rewrite)
