"""Build the naive operator graph from a qualified SQL tree (Pulley/Tremor: naive first, rewrite
after). Every construct without a delta rule raises `Unsupported` naming it; the caller then keeps
the table on rescans (NOT_INCREMENTAL) instead of answering wrongly.

Subqueries are decorrelated here: [NOT] EXISTS and [NOT] IN become semi- and anti-joins on the
correlation equalities, and a scalar subquery compared with a column becomes a join with the
subquery grouped by its correlation columns (one row per key; uncorrelated: one row).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from sqlglot import exp

from ..errors import Unsupported
from ..graph import (
    AggCall,
    Aggregate,
    Filter,
    Integrate,
    Join,
    Node,
    OuterJoin,
    Project,
    Scan,
    SemiJoin,
    SetOperation,
    TopK,
    UnionAll,
    Window,
    col,
    columns_in,
    conjoin,
    conjuncts,
)

Scope = dict[str, dict[str, str]]  # relation alias -> SQL column name -> internal name
COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
NULL_ON_EMPTY = (exp.Sum, exp.Avg, exp.Min, exp.Max)
NULL_PROPAGATING = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Paren, exp.Cast, exp.Neg)


class Names:
    """Unique internal column names (Spark resolves names case-insensitively: compare lower)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^a-z0-9_]", "_", hint.lower()).strip("_") or "c"
        if base[0].isdigit() or base.startswith("__"):
            base = "c_" + base
        name, n = base, 1
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name


@dataclass
class Relation:
    """A planned query: its node and, per output column, (SQL name, internal name)."""

    node: Node
    outputs: list[tuple[str, str]]


@dataclass(frozen=True)
class TableInfo:
    kind: str  # "source" | "derived"
    columns: tuple[str, ...]  # real column names, in table order


SIMPLE_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}


def _unparen(expression: exp.Expression) -> exp.Expression:
    while isinstance(expression, exp.Paren):
        expression = expression.this
    return expression


def _has_subquery(expression: exp.Expression | None) -> bool:
    return expression is not None and any(
        isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.In) and node.args.get("query"))
        for node in expression.walk()
    )


def _defined_aliases(tree: exp.Expression) -> set[str]:
    """Every relation alias a (sub)query tree defines, at any depth."""
    aliases = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for select in tree.find_all(exp.Select):
        from_ = select.args.get("from_")
        items = ([from_.this] if from_ is not None else []) + [j.this for j in select.args.get("joins") or []]
        aliases |= {item.alias_or_name.lower() for item in items}
    return aliases


def factor_disjunction(expression: exp.Expression) -> list[exp.Expression]:
    """(A and B) or (A and C) -> [A, B or C]: pulls conjuncts common to every branch of an OR out
    of it, so a join equality written inside each branch (TPC-H Q19) becomes a join key."""
    expression = _unparen(expression)
    if not isinstance(expression, exp.Or):
        return [expression]
    branches = []

    def collect(node: exp.Expression) -> None:
        node = _unparen(node)
        if isinstance(node, exp.Or):
            collect(node.left)
            collect(node.right)
        else:
            branches.append(conjuncts(node))

    collect(expression)
    texts = [{part.sql("spark"): part for part in branch} for branch in branches]
    common = [text for text in texts[0] if all(text in other for other in texts[1:])]
    if not common:
        return [expression]
    rests = [[part for text, part in branch.items() if text not in common] for branch in texts]
    factored = [texts[0][text] for text in common]
    if all(rests):
        factored.append(exp.or_(*[exp.paren(conjoin([p.copy() for p in rest]), copy=False) for rest in rests]))
    return factored


class Planner:
    def __init__(self, tables: dict[str, TableInfo]):
        self.tables = {name.lower(): (name, info) for name, info in tables.items()}
        self.names = Names()

    # ---- queries ---------------------------------------------------------------------------
    def query(self, tree: exp.Expression, ctes: dict[str, Relation] | None = None, top: bool = False) -> Relation:
        ctes = dict(ctes or {})
        with_ = tree.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise Unsupported("WITH RECURSIVE")
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self.query(cte.this, ctes)
        if isinstance(tree, exp.Subquery):
            relation = self.query(tree.this, ctes)
        elif isinstance(tree, exp.Union):
            relation = self.union(tree, ctes)
        elif isinstance(tree, (exp.Intersect, exp.Except)):
            relation = self.set_operation(tree, ctes)
        elif isinstance(tree, exp.Select):
            relation = self.select(tree, ctes)
        else:
            raise Unsupported(f"query of type {type(tree).__name__}")
        return self._order_limit(tree, relation, top)

    def _order_limit(self, tree: exp.Expression, relation: Relation, top: bool) -> Relation:
        limit, order = tree.args.get("limit"), tree.args.get("order")
        if tree.args.get("offset") is not None:
            raise Unsupported("OFFSET")
        if limit is None:
            return relation  # ORDER BY alone: a table has no order
        if not top:
            raise Unsupported("LIMIT inside a subquery")
        if order is None:
            raise Unsupported("LIMIT without ORDER BY")
        count = limit.expression if isinstance(limit, exp.Limit) else limit
        if not isinstance(count, exp.Literal) or not count.is_int:
            raise Unsupported("LIMIT with a non-constant count")
        outputs = {name: internal for name, internal in relation.outputs}
        projections = {}
        if isinstance(tree, exp.Select):
            projections = {p.unalias().sql("spark"): internal for p, (_, internal) in zip(tree.expressions, relation.outputs)}
        keys = []
        for ordered in order.expressions:
            target = ordered.this
            if isinstance(target, exp.Column) and not target.table and target.name.lower() in outputs:
                column = outputs[target.name.lower()]
            elif target.sql("spark") in projections:
                column = projections[target.sql("spark")]
            else:
                raise Unsupported(f"ORDER BY {target.sql('spark')}, which is not in the SELECT list")
            descending = bool(ordered.args.get("desc"))
            nulls_first = ordered.args.get("nulls_first")
            keys.append((column, descending, (not descending) if nulls_first is None else bool(nulls_first)))
        node = relation.node
        if not _stateful_below(node):
            node = Integrate(columns=node.columns, input=node)
        topk = TopK(columns=node.columns, input=node, order=tuple(keys), limit=int(count.this))
        return Relation(topk, relation.outputs)

    def union(self, tree: exp.Union, ctes: dict[str, Relation]) -> Relation:
        parts = [self.query(tree.left, ctes), self.query(tree.right, ctes)]
        outputs, inputs = self._aligned(parts)
        node: Node = UnionAll(columns=tuple(internal for _, internal in outputs), parts=inputs)
        if tree.args.get("distinct"):
            node = Aggregate(columns=node.columns, input=node, keys=node.columns, aggs=())
        return Relation(node, outputs)

    def set_operation(self, tree: exp.Expression, ctes: dict[str, Relation]) -> Relation:
        parts = [self.query(tree.left, ctes), self.query(tree.right, ctes)]
        outputs, (left, right) = self._aligned(parts, fresh_right=True)
        operation = "intersect" if isinstance(tree, exp.Intersect) else "except"
        node = SetOperation(
            columns=left.columns, left=left, right=right, operation=operation,
            all=not tree.args.get("distinct", True),
        )
        return Relation(node, outputs)

    def _aligned(self, parts: list[Relation], fresh_right: bool = False):
        if len({len(part.outputs) for part in parts}) != 1:
            raise Unsupported("set operation over inputs with different numbers of columns")
        outputs = [(name, self.names.fresh(name)) for name, _ in parts[0].outputs]
        names = [[internal for _, internal in outputs]]
        if fresh_right:
            names.append([self.names.fresh(name) for name, _ in outputs])
        else:
            names.append(names[0])
        inputs = tuple(
            Project(columns=tuple(n), input=part.node, exprs=tuple(col(i) for _, i in part.outputs))
            for part, n in zip(parts, names)
        )
        return outputs, inputs

    def select(self, tree: exp.Select, ctes: dict[str, Relation]) -> Relation:
        for arg in ("qualify", "laterals", "pivots", "connect", "match", "prewhere"):
            if tree.args.get(arg):
                raise Unsupported(arg.upper())
        for clause in ("expressions", "group"):
            value = tree.args.get(clause)
            for part in value if isinstance(value, list) else [value]:
                if _has_subquery(part):
                    raise Unsupported(f"subquery in {'SELECT' if clause == 'expressions' else 'GROUP BY'}")
        node, scope = self.from_(tree, ctes)
        where = tree.args.get("where")
        node = self.where(node, scope, conjuncts(where.this) if where is not None else [], ctes)

        projections = tree.expressions
        translate: Callable[[exp.Expression], exp.Expression] = lambda e: self.expr(e, scope)  # noqa: E731
        if tree.args.get("group") is not None or any(self._aggregates(p) for p in projections) or tree.args.get("having"):
            node, translate = self._aggregate(tree, node, scope, ctes)
        node, windowed = self._windows(node, projections, translate)
        projected = [windowed(p.unalias()) for p in projections]
        outputs = [(p.alias_or_name.lower(), self.names.fresh(p.alias_or_name)) for p in projections]
        node = Project(columns=tuple(internal for _, internal in outputs), input=node, exprs=tuple(projected))
        if tree.args.get("distinct"):
            if tree.args["distinct"].args.get("on"):
                raise Unsupported("DISTINCT ON")
            node = Aggregate(columns=node.columns, input=node, keys=node.columns, aggs=())
        return Relation(node, outputs)

    # ---- FROM --------------------------------------------------------------------------------
    def from_(self, tree: exp.Select, ctes: dict[str, Relation]) -> tuple[Node, Scope]:
        scope: Scope = {}
        from_ = tree.args.get("from_")
        if from_ is None:
            raise Unsupported("SELECT without FROM")
        parts = [self._relation(from_.this, ctes, scope)]
        condition: list[exp.Expression] = []
        for join in tree.args.get("joins") or []:
            side, kind = join.side.upper(), join.kind.upper()
            if join.args.get("using"):
                raise Unsupported("JOIN ... USING")
            if kind in ("SEMI", "ANTI"):
                raise Unsupported(f"{kind} JOIN")
            right = self._relation(join.this, ctes, scope)
            on = conjuncts(join.args.get("on"))
            if not side and kind in ("", "INNER", "CROSS"):
                parts.append(right)
                condition.extend(on)
                continue
            left = self._inner(parts, condition, scope)
            parts, condition = [self._outer(left, right, side.lower(), on, scope)], []
        return self._inner(parts, condition, scope), scope

    def _inner(self, parts: list[Node], condition: list[exp.Expression], scope: Scope) -> Node:
        if len(parts) == 1:
            if not condition:
                return parts[0]
            return Filter(columns=parts[0].columns, input=parts[0], predicate=self.expr(conjoin(condition), scope))
        return Join(
            columns=tuple(c for part in parts for c in part.columns),
            parts=tuple(parts),
            condition=self.expr(conjoin(condition), scope) if condition else None,
        )

    def _outer(self, left: Node, right: Node, side: str, on: list[exp.Expression], scope: Scope) -> Node:
        if _has_subquery(conjoin(on)):
            raise Unsupported("subquery in an outer join's ON")
        left_columns, right_columns = set(left.columns), set(right.columns)
        pairs, residual, left_only, right_only = [], [], [], []
        for part in on:
            translated = self.expr(part, scope)
            used = columns_in(translated)
            if isinstance(translated, exp.EQ) and all(isinstance(s, exp.Column) for s in (translated.left, translated.right)):
                a, b = translated.left.name, translated.right.name
                if a in left_columns and b in right_columns:
                    pairs.append((a, b))
                    continue
                if b in left_columns and a in right_columns:
                    pairs.append((b, a))
                    continue
            if side == "left" and used and used <= right_columns:
                right_only.append(translated)  # filters the null-supplying side before matching
            elif side == "right" and used and used <= left_columns:
                left_only.append(translated)
            else:
                residual.append(translated)
        if not pairs:
            raise Unsupported(f"{side.upper()} OUTER JOIN without an equality between its two sides")
        if right_only:
            right = Filter(columns=right.columns, input=right, predicate=conjoin(right_only))
        if left_only:
            left = Filter(columns=left.columns, input=left, predicate=conjoin(left_only))
        return OuterJoin(
            columns=left.columns + right.columns, left=left, right=right, side=side,
            pairs=tuple(pairs), residual=conjoin(residual),
        )

    def _relation(self, item: exp.Expression, ctes, scope: Scope) -> Node:
        alias = item.alias_or_name.lower()
        if isinstance(item, exp.Table):
            name = item.name.lower()
            if item.args.get("db") or item.args.get("catalog"):
                raise Unsupported(f"qualified table name {item.sql('spark')}")
            if name in ctes:
                relation = ctes[name]
                outputs, node = relation.outputs, relation.node
            elif name in self.tables:
                real, info = self.tables[name]
                outputs = [(c.lower(), self.names.fresh(c)) for c in info.columns]
                node = Scan(
                    columns=tuple(internal for _, internal in outputs), table=real,
                    source_kind=info.kind, fields=info.columns,
                )
            else:
                raise Unsupported(f"unknown table {item.name}")  # qualify reports it first
        elif isinstance(item, exp.Subquery):
            relation = self.query(item.this, ctes)
            outputs, node = relation.outputs, relation.node
        else:
            raise Unsupported(f"{type(item).__name__} in FROM")
        if alias in scope:
            raise Unsupported(f"relation alias {alias} used twice")
        # a relation read twice (a CTE, a view) gets fresh names so its uses can be joined
        taken = {c for names in scope.values() for c in names.values()}
        if any(internal in taken for _, internal in outputs):
            fresh = [(name, self.names.fresh(name)) for name, _ in outputs]
            node = Project(
                columns=tuple(internal for _, internal in fresh), input=node,
                exprs=tuple(col(internal) for _, internal in outputs),
            )
            outputs = fresh
        scope[alias] = dict(outputs)
        return node

    # ---- WHERE and subqueries ----------------------------------------------------------------
    def where(self, node: Node, scope: Scope, parts: list[exp.Expression], ctes) -> Node:
        plain, special = [], []
        for part in parts:
            for factored in factor_disjunction(part):
                (special if _has_subquery(factored) else plain).append(factored)
        if plain:
            node = Filter(columns=node.columns, input=node, predicate=self.expr(conjoin(plain), scope))
        for part in special:
            node = self._subquery_condition(node, scope, part, ctes, lambda e: self.expr(e, scope))
        return node

    def _subquery_condition(self, node: Node, scope: Scope, part: exp.Expression, ctes, translate) -> Node:
        part = _unparen(part)
        negated = isinstance(part, exp.Not)
        inner = _unparen(part.this) if negated else part
        if isinstance(inner, exp.Exists):
            return self._exists(node, scope, inner.this, ctes, anti=negated)
        if isinstance(inner, exp.In) and inner.args.get("query") is not None:
            return self._in(node, scope, inner, ctes, negated, translate)
        return self._scalar_condition(node, scope, part, ctes, translate)

    def _correlation(self, select: exp.Select, outer: Scope):
        """Split a subquery's WHERE conjuncts into local ones and ones that reference `outer`."""
        own = _defined_aliases(select)
        where = select.args.get("where")
        local, correlated = [], []
        for part in conjuncts(where.this) if where is not None else []:
            refs = {c.table.lower() for c in part.find_all(exp.Column)}
            outer_refs = {r for r in refs if r not in own and r in outer}
            (correlated if outer_refs else local).append(part)
        return local, correlated

    def _inner_relation(self, select: exp.Select, local: list[exp.Expression], ctes) -> tuple[Node, Scope]:
        for arg in ("group", "having", "limit", "order", "qualify"):
            if select.args.get(arg):
                raise Unsupported(f"correlated subquery with {arg.upper()}")
        node, scope = self.from_(select, ctes)
        return self.where(node, scope, local, ctes), scope

    def _pairs(self, correlated: list[exp.Expression], outer: Scope, inner: Scope, left: Node, right: Node):
        """Correlation conjuncts as equality pairs (outer column, inner column) and a residual."""
        combined = {**outer, **inner}
        pairs, residual = [], []
        left_columns, right_columns = set(left.columns), set(right.columns)
        for part in correlated:
            translated = self.expr(part, combined)
            if isinstance(translated, exp.EQ) and all(isinstance(s, exp.Column) for s in (translated.left, translated.right)):
                a, b = translated.left.name, translated.right.name
                if a in left_columns and b in right_columns:
                    pairs.append((a, b))
                    continue
                if b in left_columns and a in right_columns:
                    pairs.append((b, a))
                    continue
            residual.append(translated)
        return pairs, residual

    def _exists(self, node: Node, scope: Scope, select: exp.Expression, ctes, anti: bool) -> Node:
        if not isinstance(select, exp.Select):
            raise Unsupported("EXISTS over a set operation")
        if self._aggregates_in(select):
            raise Unsupported("EXISTS over an aggregate")
        local, correlated = self._correlation(select, scope)
        inner, inner_scope = self._inner_relation(select, local, ctes)
        pairs, residual = self._pairs(correlated, scope, inner_scope, node, inner)
        if not pairs:
            raise Unsupported(f"{'NOT ' if anti else ''}EXISTS without an equality to the outer query")
        return SemiJoin(
            columns=node.columns, left=node, right=inner, anti=anti, pairs=tuple(pairs),
            residual=conjoin(residual),
        )

    def _in(self, node: Node, scope: Scope, condition: exp.In, ctes, negated: bool, translate) -> Node:
        subquery = _unparen(condition.args["query"])
        select = subquery.this if isinstance(subquery, exp.Subquery) else subquery
        node, value = self._as_column(node, translate(condition.this), "in_value")
        local, correlated = self._correlation(select, scope) if isinstance(select, exp.Select) else ([], [])
        if not correlated:
            relation = self.query(select, ctes)
            if len(relation.outputs) != 1:
                raise Unsupported("IN over a subquery returning several columns")
            return SemiJoin(
                columns=node.columns, left=node, right=relation.node, anti=negated, null_aware=negated,
                pairs=((value, relation.outputs[0][1]),),
            )
        if negated:
            raise Unsupported("correlated NOT IN")
        if len(select.expressions) != 1 or self._aggregates_in(select):
            raise Unsupported("correlated IN over an aggregate or several columns")
        inner, inner_scope = self._inner_relation(select, local, ctes)
        inner, selected = self._as_column(inner, self.expr(select.expressions[0].unalias(), inner_scope), "in_item")
        pairs, residual = self._pairs(correlated, scope, inner_scope, node, inner)
        return SemiJoin(
            columns=node.columns, left=node, right=inner, pairs=tuple([(value, selected)] + pairs),
            residual=conjoin(residual),
        )

    def _scalar_condition(self, node: Node, scope: Scope, part: exp.Expression, ctes, translate) -> Node:
        """A condition holding one scalar subquery: join the subquery's value (grouped by its
        correlation columns) to the rows it belongs to, then filter on the condition."""
        found = [sub for sub in part.walk() if isinstance(sub, (exp.Subquery, exp.Exists))
                 or (isinstance(sub, exp.In) and sub.args.get("query"))]
        subqueries = [sub for sub in found if isinstance(sub, exp.Subquery)]
        if len(found) != 1 or len(subqueries) != 1:
            raise Unsupported("a condition with several subqueries, or a subquery that is not a scalar value")
        select = subqueries[0].this
        if not isinstance(select, exp.Select) or len(select.expressions) != 1:
            raise Unsupported("scalar subquery that is not a single-column SELECT")
        for arg in ("group", "having", "limit", "distinct", "order"):
            if select.args.get(arg):
                raise Unsupported(f"scalar subquery with {arg.upper()}")
        calls = self._aggregates_in(select)
        if not calls:
            raise Unsupported("scalar subquery without an aggregate (it may return several rows)")
        local, correlated = self._correlation(select, scope)
        own = _defined_aliases(select)
        inner_keys, outer_keys = [], []
        for condition in correlated:
            condition = _unparen(condition)
            sides = (condition.left, condition.right) if isinstance(condition, exp.EQ) else ()
            inner_side = [s for s in sides if isinstance(s, exp.Column) and s.table.lower() in own]
            outer_side = [s for s in sides if isinstance(s, exp.Column) and s.table.lower() not in own]
            if len(inner_side) != 1 or len(outer_side) != 1:
                raise Unsupported("correlated scalar subquery with a condition other than column = outer column")
            inner_keys.append(inner_side[0])
            outer_keys.append(outer_side[0])
        if correlated:
            # a key without subquery rows joins nothing; that is right only where a NULL value
            # would have made the condition NULL: a comparison, through arithmetic, of NULL-on-empty
            # aggregates
            if any(not isinstance(c, NULL_ON_EMPTY) for c in calls):
                raise Unsupported("correlated scalar subquery with COUNT (its empty value is not NULL)")
            path = subqueries[0].parent
            while path is not None and path is not part and isinstance(path, NULL_PROPAGATING):
                path = path.parent
            if path is not part or not isinstance(_unparen(part), COMPARISONS):
                raise Unsupported("correlated scalar subquery outside a comparison")
        grouped = select.copy()
        grouped.set("expressions", [k.copy().as_(f"__key{i}") for i, k in enumerate(inner_keys)]
                    + [select.expressions[0].unalias().copy().as_("__scalar")])
        grouped.set("where", exp.Where(this=conjoin([p.copy() for p in local])) if local else None)
        grouped.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]) if inner_keys else None)
        relation = self.select(grouped, ctes)
        value = dict(relation.outputs)
        keys = [exp.EQ(this=translate(outer), expression=col(value[f"__key{i}"])) for i, outer in enumerate(outer_keys)]
        joined = Join(columns=node.columns + relation.node.columns, parts=(node, relation.node), condition=conjoin(keys))
        test = translate(_replace_top_down(
            part.copy(), lambda sub: col(value["__scalar"]) if isinstance(sub, exp.Subquery) else None
        ))
        filtered = Filter(columns=joined.columns, input=joined, predicate=test)
        return Project(columns=node.columns, input=filtered, exprs=tuple(col(c) for c in node.columns))

    def _as_column(self, node: Node, expression: exp.Expression, hint: str) -> tuple[Node, str]:
        if isinstance(expression, exp.Column) and expression.name in node.columns:
            return node, expression.name
        name = self.names.fresh(hint)
        return Project(
            columns=node.columns + (name,), input=node,
            exprs=tuple(col(c) for c in node.columns) + (expression,),
        ), name

    # ---- expressions -------------------------------------------------------------------------
    def expr(self, expression: exp.Expression, scope: Scope) -> exp.Expression:
        if _has_subquery(expression):
            raise Unsupported("subquery inside an expression")

        def replace(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and node.table:  # untabled columns are internal already
                return col(self._resolve(node, scope))
            return node

        return expression.copy().transform(replace, copy=False)

    def _resolve(self, column: exp.Column, scope: Scope) -> str:
        table, name = column.table.lower(), column.name.lower()
        if table in scope and name in scope[table]:
            return scope[table][name]
        raise Unsupported(f"column reference {column.sql('spark')}")

    def _aggregates(self, expression: exp.Expression) -> list[exp.AggFunc]:
        found = []

        def visit(node: exp.Expression) -> None:
            if isinstance(node, exp.AggFunc):
                found.append(node)
                return
            if isinstance(node, (exp.Subquery, exp.Window, exp.Exists)):
                return
            for child in node.iter_expressions():
                visit(child)

        visit(expression)
        return found

    def _aggregates_in(self, select: exp.Select) -> list[exp.AggFunc]:
        return [call for p in select.expressions for call in self._aggregates(p)]

    # ---- aggregation -------------------------------------------------------------------------
    def _aggregate(self, tree: exp.Select, node: Node, scope: Scope, ctes):
        """Pre-projection, Aggregate and HAVING; returns the node and the translation of
        post-aggregate expressions (aggregate calls and group keys become columns)."""
        group = tree.args.get("group")
        for arg in ("rollup", "cube", "grouping_sets"):
            if group is not None and group.args.get(arg):
                raise Unsupported(f"GROUP BY {arg.upper()}")
        key_exprs = list(group.expressions) if group is not None else []
        pre_names: dict[str, str] = {}
        pre_exprs: list[tuple[str, exp.Expression]] = []

        def pre(expression: exp.Expression, hint: str) -> str:
            translated = self.expr(expression, scope)
            text = translated.sql("spark")
            if text not in pre_names:
                pre_names[text] = self.names.fresh(expression.name if isinstance(expression, exp.Column) else hint)
                pre_exprs.append((pre_names[text], translated))
            return pre_names[text]

        key_by_text = {self.expr(key, scope).sql("spark"): pre(key, "key") for key in key_exprs}
        keys = tuple(dict.fromkeys(key_by_text.values()))
        having = tree.args.get("having")
        having_parts = conjuncts(having.this) if having is not None else []
        calls: dict[str, AggCall] = {}
        sources = [p.unalias() for p in tree.expressions] + having_parts
        for expression in sources:
            for call in self._aggregates(expression):
                if call.sql("spark") not in calls:
                    calls[call.sql("spark")] = self._agg_call(call, pre)

        pre_node = Project(columns=tuple(n for n, _ in pre_exprs), input=node, exprs=tuple(e for _, e in pre_exprs))
        aggregate: Node = Aggregate(
            columns=keys + tuple(call.name for call in calls.values()),
            input=pre_node, keys=keys, aggs=tuple(calls.values()),
        )

        def post(expression: exp.Expression) -> exp.Expression:
            if _has_subquery(expression):
                raise Unsupported("subquery inside an expression")

            def replace(sub: exp.Expression) -> exp.Expression | None:
                if isinstance(sub, exp.AggFunc):
                    return col(calls[sub.sql("spark")].name)
                if isinstance(sub, exp.Column) and not sub.table:
                    return sub  # internal already (a window function's column)
                if isinstance(sub, exp.Window) or not any(sub.find_all(exp.Column)):
                    return None
                if not any(sub.find_all(exp.AggFunc)):
                    text = self.expr(sub, scope).sql("spark")
                    if text in key_by_text:
                        return col(key_by_text[text])
                    if isinstance(sub, exp.Column):
                        raise Unsupported(f"column {sub.sql('spark')} neither grouped nor aggregated")
                return None

            return _replace_top_down(expression.copy(), replace)

        plain = [p for p in having_parts if not _has_subquery(p)]
        if plain:
            aggregate = Filter(columns=aggregate.columns, input=aggregate, predicate=post(conjoin(plain)))
        for part in having_parts:
            if _has_subquery(part):
                aggregate = self._subquery_condition(aggregate, scope, part, ctes, post)
        return aggregate, post

    def _agg_call(self, call: exp.AggFunc, pre) -> AggCall:
        name = self.names.fresh(type(call).__name__.lower())
        func = SIMPLE_AGGS.get(type(call))
        argument = call.this
        distinct = isinstance(argument, exp.Distinct)
        if distinct:
            if len(argument.expressions) != 1:
                raise Unsupported(f"{call.sql('spark')} with several DISTINCT arguments")
            argument = argument.expressions[0]
        extra = [a for k, a in call.args.items() if k not in ("this", "big_int") and a]
        if func == "count" and (argument is None or isinstance(argument, exp.Star)) and not distinct:
            return AggCall(name=name, func="count_star")
        if func is not None and argument is not None and not extra and not (distinct and func != "count"):
            return AggCall(name=name, func=func, arg=pre(argument, func + "_arg"), distinct=distinct)
        # anything else is recomputed for the groups a change touches
        root = call.copy()

        def replace(node: exp.Expression) -> exp.Expression | None:
            if node is root or isinstance(node, (exp.Literal, exp.Star, exp.Distinct)):
                return None
            if any(node.find_all(exp.Column)) and not any(node.find_all(exp.AggFunc)):
                return col(pre(node, "arg"))
            return None

        return AggCall(name=name, func="other", expression=_replace_top_down(root, replace))

    # ---- window functions --------------------------------------------------------------------
    def _windows(self, node: Node, projections, translate):
        """One Window node per window function (partitions recomputed where they change);
        returns the node and a translation that reads each window function's column."""
        windows: dict[str, str] = {}
        for projection in projections:
            for window in projection.find_all(exp.Window):
                text = window.sql("spark")
                if text in windows:
                    continue
                partition = window.args.get("partition_by") or []
                if not partition:
                    raise Unsupported("window function without PARTITION BY")
                keys = []
                for expression in partition:
                    node, key = self._as_column(node, translate(expression), "partition")
                    keys.append(key)
                function = _replace_top_down(window.copy(), lambda sub: translate(sub) if isinstance(
                    sub, (exp.Column, exp.AggFunc)) else None)
                name = self.names.fresh("window")
                node = Window(columns=node.columns + (name,), input=node, partition=tuple(keys), functions=(function,))
                windows[text] = name

        def windowed(expression: exp.Expression) -> exp.Expression:
            return translate(_replace_top_down(
                expression.copy(), lambda sub: col(windows[sub.sql("spark")]) if isinstance(sub, exp.Window) else None
            ))

        return node, windowed


def _stateful_below(node: Node) -> bool:
    """Whether the relation under projections and filters is an aggregate, whose state gives its
    contents as of any epoch cheaply."""
    while isinstance(node, (Project, Filter)):
        node = node.input
    return isinstance(node, Aggregate)


def _replace_top_down(expression: exp.Expression, replace) -> exp.Expression:
    """Replace the outermost subtrees for which `replace` returns a node; leave the rest."""
    new = replace(expression)
    if new is not None:
        return new
    for key, value in list(expression.args.items()):
        if isinstance(value, exp.Expression):
            expression.set(key, _replace_top_down(value, replace))
        elif isinstance(value, list):
            expression.set(
                key, [_replace_top_down(v, replace) if isinstance(v, exp.Expression) else v for v in value]
            )
    return expression
