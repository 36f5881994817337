"""Build the naive operator graph from a qualified SQL tree (Pulley/Tremor: naive first, rewrite
after). Every construct without a delta rule raises `Unsupported` naming it; the caller then keeps
the table on rescans (NOT_INCREMENTAL) instead of answering wrongly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from .errors import Unsupported
from .graph import (
    Aggregate,
    AggCall,
    Filter,
    Join,
    Node,
    Project,
    Scan,
    UnionAll,
    col,
    conjoin,
    conjuncts,
)


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


class Planner:
    def __init__(self, tables: dict[str, TableInfo]):
        self.tables = {name.lower(): (name, info) for name, info in tables.items()}
        self.names = Names()

    # ---- queries -------------------------------------------------------------------------
    def query(self, tree: exp.Expression, ctes: dict[str, Relation] | None = None) -> Relation:
        ctes = dict(ctes or {})
        with_ = tree.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise Unsupported("WITH RECURSIVE")
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = self.query(cte.this, ctes)
        if isinstance(tree, exp.Subquery):
            return self.query(tree.this, ctes)
        if isinstance(tree, exp.Union):
            return self.union(tree, ctes)
        if isinstance(tree, (exp.Intersect, exp.Except)):
            raise Unsupported(type(tree).__name__.upper())
        if isinstance(tree, exp.Select):
            return self.select(tree, ctes)
        raise Unsupported(f"query of type {type(tree).__name__}")

    def union(self, tree: exp.Union, ctes: dict[str, Relation]) -> Relation:
        parts = [self.query(tree.left, ctes), self.query(tree.right, ctes)]
        if len(parts[0].outputs) != len(parts[1].outputs):
            raise Unsupported("UNION of inputs with different numbers of columns")
        self._check_order_limit(tree)
        outputs = [(name, self.names.fresh(name)) for name, _ in parts[0].outputs]
        inputs = tuple(self._project_to(part, [internal for _, internal in outputs]) for part in parts)
        node: Node = UnionAll(columns=tuple(internal for _, internal in outputs), parts=inputs)
        if tree.args.get("distinct"):
            node = Aggregate(columns=node.columns, input=node, keys=node.columns, aggs=())
        return Relation(node, outputs)

    def _project_to(self, relation: Relation, names: list[str]) -> Node:
        exprs = tuple(col(internal) for _, internal in relation.outputs)
        return Project(columns=tuple(names), input=relation.node, exprs=exprs)

    def _check_order_limit(self, tree: exp.Expression) -> None:
        if tree.args.get("limit") is not None or tree.args.get("offset") is not None:
            raise Unsupported("LIMIT/OFFSET (top-k)")

    def select(self, tree: exp.Select, ctes: dict[str, Relation]) -> Relation:
        self._check_order_limit(tree)
        for arg in ("qualify", "laterals", "pivots", "connect", "match", "prewhere"):
            if tree.args.get(arg):
                raise Unsupported(arg.upper())
        if any(tree.find_all(exp.Window)):
            raise Unsupported("window function")
        for clause in ("expressions", "where", "having", "group"):
            value = tree.args.get(clause)
            for part in value if isinstance(value, list) else [value]:
                if part is not None and any(
                    isinstance(sub, (exp.Subquery, exp.Exists)) or (isinstance(sub, exp.In) and sub.args.get("query"))
                    for sub in part.find_all(exp.Subquery, exp.Exists, exp.In)
                ):
                    raise Unsupported(f"subquery in {clause.upper()}")

        scope: dict[str, dict[str, str]] = {}
        relations: list[Node] = []
        condition: list[exp.Expression] = []
        from_ = tree.args.get("from_")
        if from_ is None:
            raise Unsupported("SELECT without FROM")
        self._add_relation(from_.this, ctes, scope, relations)
        for join in tree.args.get("joins") or []:
            side, kind = join.side.upper(), join.kind.upper()
            if side or kind not in ("", "INNER", "CROSS"):
                raise Unsupported(f"{' '.join(part for part in (side, kind) if part)} JOIN")
            if join.args.get("using"):
                raise Unsupported("JOIN ... USING")
            self._add_relation(join.this, ctes, scope, relations)
            if join.args.get("on") is not None:
                condition.extend(conjuncts(join.args["on"]))
        where = tree.args.get("where")
        condition.extend(conjuncts(where.this if where is not None else None))

        columns = tuple(c for node in relations for c in node.columns)
        if len(relations) == 1:
            node = relations[0]
            if condition:
                node = Filter(columns=columns, input=node, predicate=self.expr(conjoin(condition), scope))
        else:
            predicate = self.expr(conjoin(condition), scope) if condition else None
            node = Join(columns=columns, parts=tuple(relations), condition=predicate)

        projections = tree.expressions
        if tree.args.get("group") is not None or any(self._aggregates(p) for p in projections) or tree.args.get("having"):
            node, projected = self._aggregate(tree, node, scope)
        else:
            projected = [self.expr(p.unalias(), scope) for p in projections]
        outputs = [(p.alias_or_name.lower(), self.names.fresh(p.alias_or_name)) for p in projections]
        node = Project(columns=tuple(internal for _, internal in outputs), input=node, exprs=tuple(projected))
        if tree.args.get("distinct"):
            if tree.args["distinct"].args.get("on"):
                raise Unsupported("DISTINCT ON")
            node = Aggregate(columns=node.columns, input=node, keys=node.columns, aggs=())
        return Relation(node, outputs)

    def _add_relation(self, item: exp.Expression, ctes, scope, relations: list[Node]) -> None:
        alias = item.alias_or_name.lower()
        if isinstance(item, exp.Table):
            name = item.name.lower()
            if item.args.get("db") or item.args.get("catalog"):
                raise Unsupported(f"qualified table name {item.sql('spark')}")
            if name in ctes and not item.args.get("db"):
                relation = ctes[name]
                outputs = relation.outputs
                node = relation.node
            elif name in self.tables:
                real, info = self.tables[name]
                outputs = [(c.lower(), self.names.fresh(c)) for c in info.columns]
                node = Scan(
                    columns=tuple(internal for _, internal in outputs),
                    table=real,
                    source_kind=info.kind,
                    fields=info.columns,
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
        # a CTE or view read twice gets fresh names so its two uses can be joined
        if any(internal in {c for other in relations for c in other.columns} for _, internal in outputs):
            fresh = [(name, self.names.fresh(name)) for name, _ in outputs]
            node = Project(
                columns=tuple(internal for _, internal in fresh),
                input=node,
                exprs=tuple(col(internal) for _, internal in outputs),
            )
            outputs = fresh
        scope[alias] = dict(outputs)
        relations.append(node)

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, expression: exp.Expression, scope: dict[str, dict[str, str]]) -> exp.Expression:
        def replace(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column):
                return col(self._resolve(node, scope))
            return node

        return expression.copy().transform(replace, copy=False)

    def _resolve(self, column: exp.Column, scope: dict[str, dict[str, str]]) -> str:
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
            if isinstance(node, (exp.Subquery, exp.Window)):
                return
            for child in node.iter_expressions():
                visit(child)

        visit(expression)
        return found

    def _aggregate(self, tree: exp.Select, node: Node, scope) -> tuple[Node, list[exp.Expression]]:
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
        calls: dict[str, AggCall] = {}
        for expression in [p.unalias() for p in tree.expressions] + ([having.this] if having is not None else []):
            for call in self._aggregates(expression):
                if call.sql("spark") not in calls:
                    calls[call.sql("spark")] = self._agg_call(call, pre)

        pre_node = Project(columns=tuple(n for n, _ in pre_exprs), input=node, exprs=tuple(e for _, e in pre_exprs))
        aggregate = Aggregate(
            columns=keys + tuple(call.name for call in calls.values()),
            input=pre_node,
            keys=keys,
            aggs=tuple(calls.values()),
        )

        def post(expression: exp.Expression) -> exp.Expression:
            def replace(sub: exp.Expression) -> exp.Expression | None:
                if isinstance(sub, exp.AggFunc):
                    return col(calls[sub.sql("spark")].name)
                if not any(sub.find_all(exp.Column)):
                    return None
                if not any(sub.find_all(exp.AggFunc)):
                    text = self.expr(sub, scope).sql("spark")
                    if text in key_by_text:
                        return col(key_by_text[text])
                    if isinstance(sub, exp.Column):
                        raise Unsupported(f"column {sub.sql('spark')} neither grouped nor aggregated")
                return None

            return _replace_top_down(expression.copy(), replace)

        projected = [post(p.unalias()) for p in tree.expressions]
        result: Node = aggregate
        if having is not None:
            result = Filter(columns=aggregate.columns, input=aggregate, predicate=post(having.this))
        return result, projected

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
