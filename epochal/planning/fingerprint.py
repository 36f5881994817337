"""Definition fingerprints: a hash of the qualified, normalized SQL tree ("How Pulley Produces
Incremental Output"; docs/architecture.md, section 4).

Whitespace, comments, keyword case and the order of commutative parts (AND-ed and OR-ed terms, the
two sides of an equality, the inputs of an inner join, GROUP BY keys) do not change it; anything
that can change the result does, including the case of an output column's alias (it becomes the
table's column name). Because the tree is qualified against the input schemas, `SELECT *` expands
to the columns the query reads, so a new source column changes the fingerprint only where the query
would return it. Parts are put in order bottom-up, so a nested part is in its canonical form before
the part holding it is sorted by its text.
"""

from __future__ import annotations

import hashlib

from sqlglot import exp

from ..graph import conjuncts

SYMMETRIC = (exp.EQ, exp.NEQ, exp.NullSafeEQ)


def _disjuncts(expression: exp.Expression) -> list[exp.Expression]:
    if isinstance(expression, exp.Or):
        return _disjuncts(expression.left) + _disjuncts(expression.right)
    if isinstance(expression, exp.Paren) and isinstance(expression.this, exp.Or):
        return _disjuncts(expression.this)
    return [expression]


def _text(node: exp.Expression) -> str:
    return node.sql("spark")


def _sorted_and(parts: list[exp.Expression]) -> exp.Expression:
    return exp.and_(*sorted((p.copy() for p in parts), key=_text), copy=False)


def _fold_inner_joins(select: exp.Select) -> exp.Select:
    """An all-inner-join FROM becomes a sorted list of relations and one WHERE condition."""
    joins = select.args.get("joins") or []
    if not joins or any(join.side or join.kind.upper() not in ("", "INNER", "CROSS") for join in joins):
        return select
    if any(join.args.get("using") for join in joins):
        return select
    relations = [select.args["from_"].this] + [join.this for join in joins]
    condition = [c for join in joins for c in conjuncts(join.args.get("on"))]
    where = select.args.get("where")
    condition += conjuncts(where.this if where is not None else None)
    ordered = sorted(relations, key=_text)
    select.set("from_", exp.From(this=ordered[0].copy()))
    select.set("joins", [exp.Join(this=relation.copy()) for relation in ordered[1:]])
    select.set("where", exp.Where(this=_sorted_and(condition)) if condition else None)
    return select


def _canonical(node: exp.Expression) -> exp.Expression:
    """One node, its children already canonical."""
    node.comments = None
    if isinstance(node, exp.And) and not isinstance(node.parent, exp.And):
        return _sorted_and(conjuncts(node))
    if isinstance(node, exp.Or) and not isinstance(node.parent, exp.Or):
        return exp.or_(*sorted((p.copy() for p in _disjuncts(node)), key=_text), copy=False)
    if isinstance(node, SYMMETRIC) and _text(node.left) > _text(node.right):
        left, right = node.left.copy(), node.right.copy()
        node.set("this", right)
        node.set("expression", left)
        return node
    if isinstance(node, exp.Group) and not any(node.args.get(a) for a in ("rollup", "cube", "grouping_sets")):
        node.set("expressions", sorted(node.expressions, key=_text))
        return node
    if isinstance(node, exp.Select):
        return _fold_inner_joins(node)
    return node


def _bottom_up(node: exp.Expression) -> exp.Expression:
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _bottom_up(value))
        elif isinstance(value, list):
            node.set(key, [_bottom_up(v) if isinstance(v, exp.Expression) else v for v in value])
    return _canonical(node)


def canonical_sql(tree: exp.Expression) -> str:
    return _bottom_up(tree.copy()).sql(dialect="spark", identify=True, normalize=True)


def output_aliases(tree: exp.Expression) -> list[str]:
    """The aliases the query gives its output columns, as written (qualifying lower-cases them,
    but Spark keeps their case, and they become the table's column names)."""
    return [p.alias if isinstance(p, exp.Alias) else "" for p in getattr(tree, "selects", [])]


def fingerprint(tree: exp.Expression, aliases: list[str] | None = None) -> str:
    text = canonical_sql(tree) + ("\n" + "\x1f".join(aliases) if aliases and any(aliases) else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]
