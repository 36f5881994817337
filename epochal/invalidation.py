"""Invalidation sets, computed once, when the definitions load, not per epoch ("Notes on
Invalidate and Rescan in Bud"; docs/architecture.md, section 4).

For every table that others read (each source, and each derived table with readers): if its change
feed became unusable (vacuumed, switched off, the table rewritten), which derived tables would have
to rescan, and which stay incremental because a table in between absorbs the change.

What absorbs: a rescan recomputes one derived table in full and writes the difference to it as an
ordinary change (one MERGE), so the tables that read it see a normal change batch and stay
incremental. Rescanning is per table: a stateful operator inside a plan (an aggregate, a use count)
does not absorb anything, because a rescan of its table rebuilds every state of that plan. So the
rescan set of an input is exactly the tables that read it directly (whether their plans are
incremental or not), and every table further down stays incremental, absorbed by the direct
readers it reads through, unless it has no delta rules and rescans on any input change anyway
(Bud's default set; listed apart).

Also recorded here when a table is defined: the columns it reads of each input, with their types
at that moment, so a later schema change can be told apart from a stale definition (rescan.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .protocol.rescan import read_columns


@dataclass(frozen=True)
class InputSets:
    """What happens when `name`'s change feed is unusable for an epoch."""

    name: str
    kind: str  # "source" | "derived"
    rescan: tuple[str, ...]  # read it directly: rescan (reason CDF_UNAVAILABLE / SOURCE_REWRITTEN)
    incremental: dict[str, tuple[str, ...]]  # downstream table -> the direct readers absorbing it
    always: tuple[str, ...]  # downstream tables without delta rules: rescan on any input change

    def describe(self) -> str:
        text = f"{self.kind} {self.name}: change feed unusable -> rescan: {', '.join(self.rescan) or 'none'}"
        if self.incremental:
            text += "; stays incremental: " + ", ".join(
                f"{table} (absorbed by {', '.join(by)})" for table, by in self.incremental.items())
        if self.always:
            text += "; rescans on any change anyway (NOT_INCREMENTAL): " + ", ".join(self.always)
        return text


@dataclass(frozen=True)
class Invalidation:
    inputs: dict[str, InputSets] = field(default_factory=dict)
    reads: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # table -> input -> column -> type

    def of(self, name: str) -> InputSets | None:
        return self.inputs.get(name)

    def read_types(self, table: str, input_name: str) -> dict[str, str]:
        return self.reads.get(table, {}).get(input_name, {})

    def describe_table(self, table: str, inputs: list[str]) -> list[str]:
        """The sets of the given inputs (a table's leaf sources and derived inputs), one line each."""
        return [self.inputs[name].describe() for name in inputs if name in self.inputs]

    def summary(self, table: str) -> str:
        """One line for a Dagster asset description: what makes this table rescan, and which
        tables' rescans it absorbs for its readers."""
        rescans_for = sorted(n for n, s in self.inputs.items() if table in s.rescan)
        absorbs = sorted({down for s in self.inputs.values() for down, by in s.incremental.items() if table in by})
        text = f"Rescans when the change feed of {', '.join(rescans_for) or 'no input'} is unusable"
        if absorbs:
            text += f"; its rescans keep {', '.join(absorbs)} incremental"
        return text + "."


def compute(engine, previous: Invalidation | None = None, defined: str | None = None) -> Invalidation:
    """The sets for the engine's current definitions. Read columns of tables other than `defined`
    are kept from `previous`: their types are those seen when each table was defined."""
    tables = {name: engine.table(name) for name in engine.tables()}
    readers: dict[str, list[str]] = {}
    for name, table in tables.items():
        for upstream in table.compiled.inputs:
            readers.setdefault(upstream, []).append(name)

    def incremental(name: str) -> bool:
        return tables[name].compiled.plan is not None

    sets = {}
    for name in sorted(readers):
        direct = sorted(readers[name])
        absorbed: dict[str, set[str]] = {}
        stack = [(reader, reader) for reader in direct]
        while stack:
            via, current = stack.pop()
            for down in readers.get(current, []):
                if down in direct:
                    continue
                if via not in absorbed.setdefault(down, set()):
                    absorbed[down].add(via)
                    stack.append((via, down))
        order = [n for n in engine.tables() if n in absorbed]
        sets[name] = InputSets(
            name=name,
            kind="source" if name in engine.sources else "derived",
            rescan=tuple(direct),
            incremental={n: tuple(sorted(absorbed[n])) for n in order if incremental(n)},
            always=tuple(n for n in order if not incremental(n)),
        )

    reads = {n: r for n, r in (previous.reads if previous else {}).items() if n in tables and n != defined}
    for name, table in tables.items():
        if name in reads:
            continue
        columns = read_columns(table)
        reads[name] = {}
        for upstream, wanted in columns.items():
            types = {f.name.lower(): f.dataType.simpleString() for f in engine.schema_of(upstream).fields}
            reads[name][upstream] = {c: t for c, t in types.items() if wanted is None or c in wanted}
    return Invalidation(inputs=sets, reads=reads)
