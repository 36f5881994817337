"""The operator graph: a relational plan whose nodes each have a delta rule (see `rules/`).

Nodes are immutable; rewrites (see `planning/optimize/`) build new nodes. Every node names its output
columns with internal names that are unique within the plan, so expressions (sqlglot trees) refer
to columns by name alone and any two inputs can be joined without renaming.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Iterator

from sqlglot import exp

WEIGHT = "__w"


def col(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def sql(expression: exp.Expression) -> str:
    """Spark SQL text of an expression over internal column names."""
    return expression.sql(dialect="spark", identify=True)


def columns_in(expression: exp.Expression | None) -> set[str]:
    if expression is None:
        return set()
    return {column.name for column in expression.find_all(exp.Column)}


def conjuncts(expression: exp.Expression | None) -> list[exp.Expression]:
    if expression is None:
        return []
    if isinstance(expression, exp.And):
        return conjuncts(expression.left) + conjuncts(expression.right)
    if isinstance(expression, exp.Paren):
        return conjuncts(expression.this)
    return [expression]


def conjoin(parts: list[exp.Expression]) -> exp.Expression | None:
    return exp.and_(*parts, copy=False) if parts else None


@dataclass(frozen=True, eq=False)
class Node:
    columns: tuple[str, ...]

    @property
    def inputs(self) -> tuple["Node", ...]:
        return ()

    def with_inputs(self, inputs: tuple["Node", ...]) -> "Node":
        return self

    def replace(self, **changes) -> "Node":
        return dataclasses.replace(self, **changes)

    @property
    def kind(self) -> str:
        return type(self).__name__

    def describe(self) -> str:
        return ""


@dataclass(frozen=True, eq=False)
class Unary(Node):
    input: Node = field(default=None)  # type: ignore[assignment]

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        (child,) = inputs
        return self if child is self.input else dataclasses.replace(self, input=child)


@dataclass(frozen=True, eq=False)
class Scan(Node):
    """A Delta table read: a source, or another derived table. `fields` are the table's column
    names, in the order of `columns`; `predicate` (over internal names) is applied at the scan."""

    table: str = ""
    source_kind: str = "source"  # "source" | "derived"
    fields: tuple[str, ...] = ()
    predicate: exp.Expression | None = None

    def describe(self) -> str:
        text = f"{self.source_kind} {self.table} [{', '.join(self.fields)}]"
        return text + (f" where {sql(self.predicate)}" if self.predicate is not None else "")


@dataclass(frozen=True, eq=False)
class Filter(Unary):
    predicate: exp.Expression = None  # type: ignore[assignment]

    def describe(self) -> str:
        return sql(self.predicate)


@dataclass(frozen=True, eq=False)
class Project(Unary):
    """`exprs[i]` computes `columns[i]`; expressions must be deterministic."""

    exprs: tuple[exp.Expression, ...] = ()

    def describe(self) -> str:
        return ", ".join(
            name if isinstance(e, exp.Column) and e.name == name else f"{sql(e)} AS {name}"
            for name, e in zip(self.columns, self.exprs)
        )


@dataclass(frozen=True, eq=False)
class Join(Node):
    """Inner join of any number of inputs on a conjunctive condition. `restrict` (set by the
    restrict_cogenerators pass) lists (i, a, j, b): in the term that starts from input i's change
    batch, input j is read only where its column b takes a value of a in that batch."""

    parts: tuple[Node, ...] = ()
    condition: exp.Expression | None = None
    restrict: tuple[tuple[int, str, int, str], ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.parts

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        return self if inputs == self.parts else dataclasses.replace(self, parts=tuple(inputs))

    def describe(self) -> str:
        text = f"{len(self.parts)} inputs on {sql(self.condition) if self.condition is not None else 'true'}"
        if self.restrict:
            text += "; co-generators read for the change's keys: " + ", ".join(
                f"d{i + 1}.{a} -> {j + 1}.{b}" for i, a, j, b in self.restrict)
        return text


@dataclass(frozen=True)
class AggCall:
    """One aggregate: `func` over input column `arg` (None for COUNT(*))."""

    name: str
    func: str  # count_star | count | sum | avg | min | max | other
    arg: str | None = None
    distinct: bool = False
    expression: exp.Expression | None = None  # the call over `arg`, for `other`

    def describe(self) -> str:
        if self.func == "count_star":
            return f"count(*) AS {self.name}"
        if self.func == "other":
            return f"{sql(self.expression)} AS {self.name}"
        inner = ("DISTINCT " if self.distinct else "") + (self.arg or "")
        return f"{self.func}({inner}) AS {self.name}"


@dataclass(frozen=True, eq=False)
class Aggregate(Unary):
    """GROUP BY `keys` (input columns, passed through) with `aggs`. No keys: a global aggregate,
    which always has exactly one row. No aggs: DISTINCT over the keys."""

    keys: tuple[str, ...] = ()
    aggs: tuple[AggCall, ...] = ()

    def describe(self) -> str:
        keys = ", ".join(self.keys) if self.keys else "()"
        if not self.aggs:
            return f"distinct {keys}"
        return f"by {keys}: " + ", ".join(agg.describe() for agg in self.aggs)


@dataclass(frozen=True, eq=False)
class UnionAll(Node):
    parts: tuple[Node, ...] = ()

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.parts

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        return self if inputs == self.parts else dataclasses.replace(self, parts=tuple(inputs))


@dataclass(frozen=True, eq=False)
class Binary(Node):
    left: Node = field(default=None)  # type: ignore[assignment]
    right: Node = field(default=None)  # type: ignore[assignment]

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)

    def with_inputs(self, inputs: tuple[Node, ...]) -> Node:
        left, right = inputs
        if left is self.left and right is self.right:
            return self
        return dataclasses.replace(self, left=left, right=right)


def _pairs(pairs: tuple[tuple[str, str], ...]) -> str:
    return " AND ".join(f"{a} = {b}" for a, b in pairs)


@dataclass(frozen=True, eq=False)
class OuterJoin(Binary):
    """LEFT, RIGHT or FULL outer join on equalities `pairs` (left column, right column) and a
    `residual` condition; columns are the left's then the right's."""

    side: str = "left"  # left | right | full
    pairs: tuple[tuple[str, str], ...] = ()
    residual: exp.Expression | None = None

    def describe(self) -> str:
        on = _pairs(self.pairs) + (f" AND {sql(self.residual)}" if self.residual is not None else "")
        return f"{self.side} on {on or 'true'}"


@dataclass(frozen=True, eq=False)
class SemiJoin(Binary):
    """Rows of `left` with (anti: without) a row of `right` matching `pairs` and `residual`:
    EXISTS / IN, and NOT EXISTS / NOT IN. `null_aware` gives NOT IN its SQL meaning: no row
    passes when `right` holds a NULL, and every row passes when `right` is empty."""

    anti: bool = False
    null_aware: bool = False
    pairs: tuple[tuple[str, str], ...] = ()
    residual: exp.Expression | None = None

    def describe(self) -> str:
        kind = "not in" if self.null_aware else ("anti" if self.anti else "semi")
        on = " AND ".join(part for part in (_pairs(self.pairs), sql(self.residual) if self.residual is not None else "")
                          if part)
        return f"{kind} on {on or 'true'}"


@dataclass(frozen=True, eq=False)
class SetOperation(Binary):
    """INTERSECT or EXCEPT (by position; `all` keeps multiplicities)."""

    operation: str = "intersect"  # intersect | except
    all: bool = False

    def describe(self) -> str:
        return self.operation + (" all" if self.all else "")


@dataclass(frozen=True, eq=False)
class Window(Unary):
    """Window functions over partitions of the input: `functions[i]` (Spark SQL over input
    columns, with its OVER clause) computes `columns[len(input.columns) + i]`."""

    partition: tuple[str, ...] = ()
    functions: tuple[exp.Expression, ...] = ()

    def describe(self) -> str:
        names = self.columns[len(self.input.columns):]
        return f"partition by {', '.join(self.partition)}: " + ", ".join(
            f"{sql(f)} AS {n}" for f, n in zip(self.functions, names)
        )


@dataclass(frozen=True, eq=False)
class TopK(Unary):
    """ORDER BY ... LIMIT: the first `limit` rows by `order` ((column, descending, nulls
    first)), ties broken by every column ascending so the result is deterministic."""

    order: tuple[tuple[str, bool, bool], ...] = ()
    limit: int = 0

    def describe(self) -> str:
        keys = ", ".join(f"{c} {'desc' if d else 'asc'}{' nulls first' if n else ''}" for c, d, n in self.order)
        return f"limit {self.limit} by {keys}"


@dataclass(frozen=True, eq=False)
class Integrate(Unary):
    """Keeps its input as state (a use count per distinct row) so readers can see the input as of
    an epoch's start or end without recomputing it (DBSP's integral)."""


@dataclass(frozen=True, eq=False)
class Opaque(Node):
    """A part of the query with no delta rule: the table is maintained by rescans. `construct`
    names what it is, for the NOT_INCREMENTAL reason."""

    construct: str = ""

    def describe(self) -> str:
        return self.construct


def from_full_state(node: Node) -> bool:
    """Whether `node`'s rows, computed in full, are a stateful operator's full state (an
    aggregate's groups finalized, an integrated input's rows), seen through the projections,
    filters and top-k above it."""
    while isinstance(node, (Project, Filter, TopK)):
        node = node.input
    return isinstance(node, (Aggregate, Integrate))


def single_row(node: Node) -> bool:
    """Whether `node` has at most one row: a global aggregate (a scalar subquery's value), seen
    through the projections and filters above it (a filter may drop the row)."""
    while isinstance(node, (Project, Filter)):
        node = node.input
    return isinstance(node, Aggregate) and not node.keys


def walk(root: Node) -> Iterator[Node]:
    """Every node once, inputs before the nodes that read them."""
    seen: set[int] = set()

    def visit(node: Node) -> Iterator[Node]:
        if id(node) in seen:
            return
        seen.add(id(node))
        for child in node.inputs:
            yield from visit(child)
        yield node

    yield from visit(root)


def transform(root: Node, rewrite) -> Node:
    """Apply `rewrite(node)` bottom-up, rebuilding parents whose inputs changed; shared nodes stay
    shared."""
    done: dict[int, Node] = {}

    def visit(node: Node) -> Node:
        if id(node) in done:
            return done[id(node)]
        inputs = tuple(visit(child) for child in node.inputs)
        rebuilt = node.with_inputs(inputs) if any(a is not b for a, b in zip(inputs, node.inputs)) else node
        result = rewrite(rebuilt)
        done[id(node)] = result
        return result

    return visit(root)


def render(root: Node, indent: str = "  ") -> str:
    lines: list[str] = []
    numbering: dict[int, int] = {}

    def visit(node: Node, depth: int) -> None:
        if id(node) in numbering:
            lines.append(f"{indent * depth}(see #{numbering[id(node)]})")
            return
        numbering[id(node)] = len(numbering) + 1
        detail = node.describe()
        lines.append(f"{indent * depth}#{numbering[id(node)]} {node.kind}" + (f" {detail}" if detail else ""))
        for child in node.inputs:
            visit(child, depth + 1)

    visit(root, 0)
    return "\n".join(lines)


def _is_equality(part) -> bool:
    return isinstance(part, (exp.EQ, exp.NullSafeEQ))


_ORDERS: dict[int, tuple[Join, dict[int, list]]] = {}
_ORDERS_LOCK = threading.Lock()


def join_order(node: Join, start: int) -> list[tuple[int, list]]:
    """From input `start`, the order to join the other inputs in, each with the conjuncts that
    become applicable when it joins: worked out once per join (a plan lives as long as its table,
    and every step asks again, for every term). Not to be changed by the caller."""
    held = _ORDERS.get(id(node))
    if held is not None and held[0] is node and start in held[1]:
        return held[1][start]
    order = _join_order(node, start)
    with _ORDERS_LOCK:
        if len(_ORDERS) >= 4096:
            _ORDERS.clear()
        held = _ORDERS.get(id(node))
        if held is None or held[0] is not node:  # the node held keeps its id from being reused
            held = _ORDERS[id(node)] = (node, {})
        held[1][start] = order
    return order


def _join_order(node: Join, start: int) -> list[tuple[int, list]]:
    remaining = conjuncts(node.condition)
    have = set(node.parts[start].columns)
    left = [i for i in range(len(node.parts)) if i != start]
    order = []
    while left:
        def usable(i: int):
            cols = have | set(node.parts[i].columns)
            return [p for p in remaining if columns_in(p) <= cols and columns_in(p) & set(node.parts[i].columns)]

        connected = [i for i in left if any(_is_equality(p) for p in usable(i))]
        chosen = connected[0] if connected else left[0]
        applicable = [p for p in remaining if columns_in(p) <= have | set(node.parts[chosen].columns)]
        remaining = [p for p in remaining if p not in applicable]
        order.append((chosen, applicable))
        have |= set(node.parts[chosen].columns)
        left.remove(chosen)
    if remaining:  # conjuncts over no input's columns (constants) apply last
        order.append((-1, remaining))
    return order
