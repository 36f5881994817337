"""Definition fingerprints (seed 000 section 5.2): a hash of the qualified, normalized SQL tree.

Whitespace, comments, keyword case, the order of AND-ed predicates and the order of inner-join
inputs do not change it; anything that can change the result does. Because the tree is qualified
against the input schemas, `SELECT *` expands to the columns the query reads, so a new source column
changes the fingerprint only where the query would return it.
"""

from __future__ import annotations

import hashlib

from sqlglot import exp

from .graph import conjuncts


def _canonical_and(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.And) and not isinstance(node.parent, exp.And):
        parts = sorted(conjuncts(node), key=lambda part: part.sql("spark"))
        return exp.and_(*[part.copy() for part in parts], copy=False)
    return node


def _canonical_inner_joins(select: exp.Expression) -> exp.Expression:
    """An all-inner-join FROM becomes a sorted list of relations and one sorted condition."""
    if not isinstance(select, exp.Select):
        return select
    joins = select.args.get("joins") or []
    if not joins or any(join.side or join.kind.upper() not in ("", "INNER", "CROSS") for join in joins):
        return select
    if any(join.args.get("using") for join in joins):
        return select
    from_ = select.args.get("from_")
    relations = [from_.this] + [join.this for join in joins]
    condition = [c for join in joins for c in conjuncts(join.args.get("on"))]
    where = select.args.get("where")
    condition += conjuncts(where.this if where is not None else None)
    ordered = sorted(relations, key=lambda relation: relation.sql("spark"))
    select = select.copy()
    select.set("from_", exp.From(this=ordered[0].copy()))
    select.set("joins", [exp.Join(this=relation.copy()) for relation in ordered[1:]])
    select.set("where", exp.Where(this=exp.and_(*condition)) if condition else None)
    return select


def canonical_sql(tree: exp.Expression) -> str:
    canonical = tree.copy()
    for node in canonical.walk():
        node.comments = None
    canonical = canonical.transform(_canonical_inner_joins)
    canonical = canonical.transform(_canonical_and)
    return canonical.sql(dialect="spark", identify=True, normalize=True)


def fingerprint(tree: exp.Expression) -> str:
    return hashlib.sha256(canonical_sql(tree).encode()).hexdigest()[:16]
