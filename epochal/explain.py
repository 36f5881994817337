"""`Engine.explain`: how a table is maintained, in plain text.

The naive graph and the optimized one (with the passes that changed it), each operator's delta
rule and state, the output key the MERGE uses, what is decided at run time, the rescan triggers
per input, and the invalidation sets (docs/architecture.md, section 4) of the table's sources, computed when the
definitions loaded.
"""

from __future__ import annotations

from .graph import Aggregate, Join, render, walk
from .planning.optimize.restrict_cogenerators import keyed_partners
from .protocol.rescan import read_columns, stateful_nodes
from .rules import rule_for


def _operators(plan) -> list[str]:
    lines = []
    for number, node in enumerate(_numbered(plan), start=1):
        rule, state = rule_for(node).explain(node)
        if isinstance(node, Join) and node.restrict:
            rule += "; co-generators read only for the change batch's key ranges (Delta skips other files)"
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


def _triggers(engine, table) -> list[str]:
    compiled = table.compiled
    out = ["rescan triggers:",
           "  FIRST_RUN before the first epoch; QUERY_CHANGED when the fingerprint changes; "
           "REQUESTED on a full refresh",
           "  SETTINGS_CHANGED when a session setting that changes results (time zone, ANSI mode, decimal "
           "precision loss, default collation, ...; epochal/settings.py) differs from the table's last step"]
    if compiled.plan is None:
        out.append(f"  NOT_INCREMENTAL: {compiled.blocker} (every epoch with input changes rescans)")
    reads = read_columns(table)
    for name in compiled.inputs:
        kind = "source" if name in engine.sources else "derived"
        columns = reads.get(name)
        shown = "all columns" if columns is None else (", ".join(sorted(columns)) or "no column (row counts)")
        out.append(f"  {kind} {name} (reads {shown}):")
        out.append("    CDF_UNAVAILABLE if, for an epoch's versions, its change data feed was off, its log expired, "
                   "its change or data files were vacuumed, or a column it does not read changed type, was renamed "
                   "or dropped (Delta reads no change data across that)")
        out.append("    SOURCE_REWRITTEN if it was overwritten, replaced, truncated, restored or recreated, or a column "
                   "it reads changed type (a new column is no reason)")
    if compiled.plan is not None:
        states = sorted(stateful_nodes(compiled.plan))
        if states:
            out.append(f"  STATE_MISSING if a state table ({', '.join(states)}, and their use-count tables) is missing, "
                       "lacks the version or files the ledger recorded, or was built for another plan of this query")
        else:
            out.append("  STATE_MISSING: no state (every operator reads its inputs by time travel)")
        sums = [f"{agg.name} ({agg.func}({agg.arg}))" for node in walk(compiled.plan) if isinstance(node, Aggregate)
                for agg in node.aggs if agg.func in ("sum", "avg") and not agg.distinct]
        if sums:
            out.append(f"  NOT_EXACT if the running sum of {', '.join(sums)} goes past its type (Spark's SUM "
                       "gives NULL there) or, in floating point, holds NaN or an infinity (which no later change "
                       "can take back out): refused before anything is written, never approximated")
    fraction = getattr(getattr(engine, "triggers", None), "rescan_fraction", None)
    if fraction is None:
        out.append("  COST: off (Engine(rescan_fraction=...) rescans when an epoch changes more than that share "
                   "of the input rows)")
    else:
        out.append(f"  COST when an epoch changes more than {fraction:.0%} of the input rows")
    if getattr(engine, "cost_model", False) and not table.strict:
        out.append("  COST when, once an epoch's change batches are read, the table's past steps estimate a rescan "
                   "cheaper than the incremental step (Engine(cost_model=False) turns this off)")
    if table.strict:
        out.append("  strict: the table fails with the reason instead of rescanning (except on its first run)")
    return out


def _invalidation(engine, table) -> list[str]:
    sets = getattr(engine, "invalidation", None)
    if sets is None:
        return []
    names = list(dict.fromkeys(engine.leaf_sources(table.name) + [
        n for n in table.compiled.inputs if n not in engine.sources]))
    lines = sets.describe_table(table.name, names)
    if not lines:
        return []
    return ["invalidation sets (computed when the definitions loaded; rescanning is per table, and a "
            "rescanned table writes its difference as an ordinary change, so its readers stay incremental):"] + [
        "  " + line for line in lines]


def _arrangements(engine, table) -> list[str]:
    arrangements = getattr(engine, "arrangements", None)
    if arrangements is None:
        return ["arrangements: off (Engine(arrange_rows=None))"]
    out = [f"arrangements (inputs of at least {arrangements.min_rows:,} rows read by an integer or date key "
           "are kept sorted by it after the refresh that read them, or that computed this table in full; "
           "epochal/arrangements.py):"]
    if table.compiled.plan is not None:
        read = sorted(f"{name}.{field}" for name, field in keyed_partners(table.compiled.plan))
        out.append("  read by key in incremental steps: " + (", ".join(read) if read else "none"))
    for name in table.compiled.inputs:
        held = arrangements.of(engine.path_of(name))
        if held is None:
            out.append(f"  {name}: not listed (the warehouse folder cannot be listed from here)")
        elif not held:
            out.append(f"  {name}: none (scanned for a change's keys)")
        for a in held or ():
            state = "unusable until built again" if a["to"] is None else \
                f"as of version {a['to']}, {a['appends']} append(s) since its build"
            out.append(f"  {name} by {a['key']}: {state}; {a['rows']:,} rows, {a['files']} file(s), "
                       f"{a['bytes'] / 1e6:.1f} MB; columns {', '.join(a['columns'])}")
    return out


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
        out.append("at run time:")
        out.append("  no input has a new version: noop, recorded without a Spark job")
        out.append("  an input's change batch consolidates to nothing (only columns not read changed): its join "
                   "terms and the operators above it are skipped")
    out.append("")
    out.extend(_arrangements(engine, table))
    out.append("")
    out.extend(_triggers(engine, table))
    invalidation = _invalidation(engine, table)
    if invalidation:
        out.append("")
        out.extend(invalidation)
    return "\n".join(out)
