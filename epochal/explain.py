"""`Engine.explain`: how a table is maintained, in plain text.

The naive graph and the optimized one (with the passes that changed it), each operator's delta
rule and state, the output key the MERGE uses, and when the table falls back to a rescan.
"""

from __future__ import annotations

from .graph import render, walk
from .rules import rule_for


def _operators(plan) -> list[str]:
    lines = []
    for number, node in enumerate(_numbered(plan), start=1):
        rule, state = rule_for(node).explain(node)
        lines.append(f"  #{number} {node.kind}: {rule}")
        lines.append(f"      state: {state}")
    return lines


def _numbered(plan):
    """Nodes in the order `render` numbers them (pre-order, each once)."""
    seen, order = set(), []

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        order.append(node)
        for child in node.inputs:
            visit(child)

    visit(plan)
    return order


def explain(engine, table) -> str:
    compiled = table.compiled
    out = [f"table {table.name}", f"  fingerprint {compiled.fingerprint}"]
    out.append("  inputs: " + ", ".join(
        f"{name} ({'source' if name in engine.sources else 'derived'})" for name in compiled.inputs
    ))
    out.append("  output: " + ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in table.schema.fields))
    if table.key is None:
        out.append("  merge: rows matched whole (the result may hold duplicate rows)")
    else:
        key = [table.schema.fields[i].name for i in table.key]
        out.append("  merge: on key (" + (", ".join(key) or "single row") + ")")
    if compiled.plan is None:
        out.append(f"  maintenance: rescan every epoch with input changes (NOT_INCREMENTAL: {compiled.blocker})")
    else:
        out.append("  maintenance: incremental")
        out.append("")
        out.append("graph as written:")
        out.append(render(compiled.naive, "  "))
        out.append("")
        out.append("graph after rewriting (" + (", ".join(compiled.passes) or "no pass changed it") + "):")
        out.append(render(compiled.plan, "  "))
        out.append("")
        out.append("delta rules and state:")
        out.extend(_operators(compiled.plan))
    out.append("")
    out.append("rescan triggers:")
    out.append("  FIRST_RUN before the first epoch; QUERY_CHANGED when the fingerprint changes; "
               "REQUESTED on a full refresh")
    if compiled.plan is None:
        out.append(f"  NOT_INCREMENTAL: {compiled.blocker}")
    for source in engine.leaf_sources(table.name):
        out.append(f"  source {source}: its change feed unusable -> this table rescans")
    return "\n".join(out)
