"""Rescan triggers (docs/architecture.md, section 6): whether an epoch step can use its inputs' change batches
and its state, decided before anything is written.

`_decide` in epoch.py settles FIRST_RUN, QUERY_CHANGED, REQUESTED and NOT_INCREMENTAL; `detect`
adds, for a step that would otherwise be incremental:

- CDF_UNAVAILABLE: for some version in an input's range the change data feed was off, its log
  entry is gone (log retention), or files the change feed or the epoch-start snapshot need were
  removed (VACUUM); or the range crosses a schema change Delta will not read change data across
  (a type change, rename or drop of a column the query does not read).
- SOURCE_REWRITTEN: an input was overwritten or replaced, truncated, restored, recreated, or a
  column the query reads changed type. (A table deleted and created again at the same path, a new
  Delta table id, is found before this, by epoch.input_ranges.) A new column, or any change to a column the query does not
  read, is not a reason (the change batches select the columns read).
- STATE_MISSING: a state table the plan needs is gone, lacks the version the ledger recorded, lost
  data files, or was built for another plan of the same query.
- COST: the inputs' changed rows exceed `rescan_fraction` of their rows, so a recompute reads less;
  or, once the change batches are read, the cost model (cost.py) expects a rescan to be cheaper
  (raised as `Costly` by the step).

Everything is read from the Delta logs through delta-rs (no Spark job): the log entries of the
range's commits (operation, metrics, schema and property changes, file lists) and the existence of
the files they name. Delta itself has the last word where the step reads: the few error conditions
that mean "this range cannot be read" (CDF_ERRORS, by condition code) raise `Unreadable` there,
before anything is written, and the step is rescanned with CDF_UNAVAILABLE (or SOURCE_REWRITTEN).
Any other error propagates. (Asking Delta up front instead, by planning every table's change-feed
reads, cost an eighth of an incremental epoch for a check the log already makes.)
"""

from __future__ import annotations

import hashlib
import json
from functools import partial

from deltalake.exceptions import DeltaError

from ..errors import EpochError
from ..graph import Scan, walk
from ..reasons import CDF_UNAVAILABLE, COST, SOURCE_REWRITTEN, STATE_MISSING, STATE_NOT_KEPT, Trigger
from ..rules import rule_for
from ..storage.deltalog import DeltaLog, TableFiles, changed_rows, table_at
from .context import state_names
from .environment import Environment, Triggers

SCHEMA_OPERATIONS = ("ADD COLUMNS", "CHANGE COLUMN", "CHANGE COLUMNS", "RENAME COLUMN", "DROP COLUMNS",
                     "REPLACE COLUMNS")
REPLACING = ("CREATE OR REPLACE TABLE AS SELECT", "REPLACE TABLE AS SELECT", "CREATE OR REPLACE TABLE",
             "REPLACE TABLE")


# ---- what a table reads --------------------------------------------------------------------------
def read_columns(table) -> dict[str, set[str]]:
    """Per input, the column names (lower case) the table's plan reads; an input read only by a
    plan without delta rules counts as read in full (None)."""
    plan = table.compiled.plan or table.compiled.naive
    reads: dict[str, set[str] | None] = {name: set() for name in table.compiled.inputs}
    if plan is None:
        return {name: None for name in table.compiled.inputs}
    for node in walk(plan):
        if isinstance(node, Scan) and reads.get(node.table) is not None:
            reads[node.table] |= {f.lower() for f in node.fields}
    return reads


# ---- detection -----------------------------------------------------------------------------------
def detect(env: Environment, table, last, inputs) -> Trigger | None:
    """The first reason this step cannot be incremental, or None. Raises EpochError when no rescan
    can help (the query reads a column its input no longer has)."""
    triggers = env.triggers
    reads = read_columns(table)
    for name, rng in inputs.items():
        if not rng.changed or rng.before < 0:
            continue
        found = _input_trigger(env, triggers, table, rng, reads.get(name))
        if found is not None:
            return found
    found = state_trigger(env, table, last)
    if found is not None:
        return found
    if triggers.rescan_fraction is not None:
        return cost_trigger(env, triggers.rescan_fraction, inputs)
    return None


def _describe(rng) -> str:
    return f"{rng.kind} {rng.name!r}"


def _input_trigger(env: Environment, triggers: Triggers, table, rng, reads: set[str] | None) -> Trigger | None:
    log = DeltaLog.open(rng.path, env.storage_options)
    if log is None:
        return Trigger(SOURCE_REWRITTEN, f"{_describe(rng)} no longer exists at {rng.path} (deleted or moved)")
    key = (rng.path, rng.before, rng.after, log.version, frozenset(reads) if reads is not None else None)

    found = triggers.remembered(key, lambda: _log_trigger(env, table, rng, log, reads))
    if found is not None and found.code == "STALE":
        raise EpochError(found.detail)
    return found


def _log_trigger(env: Environment, table, rng, log: DeltaLog, reads: set[str] | None) -> Trigger | None:
    what = _describe(rng)
    if rng.after > log.version:
        return Trigger(SOURCE_REWRITTEN, f"{what} has no version {rng.after} (latest {log.version}): it was recreated")
    files = TableFiles(rng.path, env.storage_options)
    start = files.commit(rng.before)
    try:
        at_start = table_at(rng.path, rng.before, env.storage_options)
    except DeltaError:  # delta-rs: the log no longer reaches back to that version
        at_start = None
    if start is None or at_start is None:
        return Trigger(CDF_UNAVAILABLE, f"the log of {what} no longer holds version {rng.before}, where this "
                                        "epoch starts (expired under delta.logRetentionDuration)")
    feed_on = _feed_on(dict(at_start.metadata().configuration))
    schema = json.loads(at_start.schema().to_json())["fields"]
    needed: list[str] = []
    unreadable: str | None = None
    for version in range(rng.before + 1, rng.after + 1):
        commit = files.commit(version)
        if commit is None:
            return Trigger(CDF_UNAVAILABLE, f"the log entry of {what} version {version} is gone "
                                            "(expired under delta.logRetentionDuration)")
        rewrite = _rewrite(commit)
        if rewrite is not None:
            return Trigger(SOURCE_REWRITTEN, f"{what} was {rewrite} at version {version}")
        if commit.metadata is not None:
            new_schema = json.loads(commit.metadata.get("schemaString") or '{"fields": []}')["fields"]
            seen, unseen = _schema_change(schema, new_schema, reads)
            if seen:
                return _seen_change(env, table, rng, log, reads, f"{seen} at version {version}")
            if unseen and unreadable is None:
                unreadable = f"{unseen} at version {version}"
            schema = new_schema
            feed_on = _feed_on(commit.metadata.get("configuration") or {})
        if not feed_on:
            return Trigger(CDF_UNAVAILABLE, f"the change data feed of {what} was off at version {version} "
                                            "(delta.enableChangeDataFeed), so its changes were not recorded")
        needed.extend(commit.cdc or commit.added)
        needed.extend(commit.removed)
    if unreadable is not None:
        return Trigger(CDF_UNAVAILABLE, f"Delta cannot read the change data of {what} across a schema change "
                                        f"of columns this table does not read ({unreadable})")
    missing = files.missing(needed)
    if missing:
        return Trigger(CDF_UNAVAILABLE, f"{len(missing)} data or change files of {what} versions "
                                        f"{rng.before + 1}..{rng.after} were removed (VACUUM), e.g. {missing[0]}")
    return None


def _feed_on(configuration: dict) -> bool:
    return str(configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"


def _rewrite(commit) -> str | None:
    """What a commit did to the whole table, if it replaced its contents rather than changing rows."""
    operation, parameters = commit.operation.upper(), commit.parameters
    mode = str(parameters.get("mode", "")).lower()
    if operation in REPLACING:
        return "replaced (" + operation + ")"
    if mode in ("overwrite", "complete") and operation in ("WRITE", "STREAMING UPDATE", "CREATE TABLE AS SELECT"):
        return "overwritten"
    if operation == "TRUNCATE":
        return "truncated"
    if operation == "DELETE" and str(parameters.get("predicate", "")).strip() in ("", "[]", '["true"]', "true"):
        return "truncated (DELETE without a condition)"
    if operation == "RESTORE":
        target = parameters.get("version")
        return f"restored to version {target}" if target is not None else f"restored to {parameters.get('timestamp')}"
    return None


def _mapping_id(field: dict):
    return (field.get("metadata") or {}).get("delta.columnMapping.id")


def _type(field: dict) -> str:
    kind = field["type"]
    return kind if isinstance(kind, str) else json.dumps(kind, sort_keys=True)


def _schema_change(old: list[dict], new: list[dict], reads: set[str] | None) -> tuple[str | None, str | None]:
    """(a change of columns the query reads, a change Delta cannot read change data across) between
    two schemas, each described or None. New columns are neither."""
    by_id = {_mapping_id(f): f for f in new if _mapping_id(f) is not None}
    by_name = {f["name"].lower(): f for f in new}
    seen, unseen = [], []
    for field in old:
        name = field["name"]
        read = reads is None or name.lower() in reads
        # with column mapping a column keeps its id across renames; before it, only its name
        match = by_id.get(_mapping_id(field)) if _mapping_id(field) is not None else by_name.get(name.lower())
        if match is None:
            change = f"column {name} dropped"
        elif match["name"].lower() != name.lower():
            change = f"column {name} renamed to {match['name']}"
        elif _type(match) != _type(field):
            change = f"column {name} changed type {_type(field)} -> {_type(match)}"
        else:
            continue
        (seen if read else unseen).append(change)
    return ("; ".join(seen) or None), ("; ".join(unseen) or None)


def _seen_change(env: Environment, table, rng, log: DeltaLog, reads, change: str) -> Trigger:
    """A schema change the query sees: a rescan, provided the definition was loaded against the
    schema the input has now (otherwise the query, or the table's schema, is stale)."""
    current = {f.name.lower(): f.dataType.simpleString() for f in log.spark_schema().fields}
    gone = sorted(c for c in (reads or ()) if c not in current)
    if gone:
        return Trigger("STALE", (
            f"table {table.name!r} reads column(s) {', '.join(gone)} of {_describe(rng)}, which it no longer "
            f"has ({change}); update the table's SQL and define it again"))
    invalidation = env.invalidation
    loaded = invalidation.read_types(table.name, rng.name) if invalidation is not None else {}
    stale = sorted(c for c in (reads or ()) if c in loaded and loaded[c] != current.get(c))
    if stale:
        return Trigger("STALE", (
            f"table {table.name!r} was defined when {_describe(rng)} had column(s) "
            + ", ".join(f"{c} {loaded[c]}" for c in stale) + f", now {', '.join(current[c] for c in stale)} "
            f"({change}); define the table again (reload the definitions) so its schema follows"))
    return Trigger(SOURCE_REWRITTEN, f"{_describe(rng)}: {change}, a column this table reads")


# ---- state ---------------------------------------------------------------------------------------
def stateful_nodes(plan) -> dict[str, object]:
    """State name -> node, for every node whose rule keeps state."""
    names = state_names(plan, lambda node: rule_for(node).stateful(node))
    return {names[id(node)]: node for node in walk(plan) if id(node) in names}


def plan_signature(plan) -> str:
    """A hash of what the state layout depends on (each stateful node's name, kind, columns and
    description), recorded with every step, so state built by another plan of the same query (an
    optimizer setting or an engine upgrade) is rebuilt, not misread."""
    if plan is None:
        return ""
    parts = [(name, node.kind, node.columns, node.describe()) for name, node in sorted(stateful_nodes(plan).items())]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def state_trigger(env: Environment, table, last) -> Trigger | None:
    plan = table.compiled.plan
    if plan is None or last is None:
        return None
    recorded = dict(last.state_versions)
    expected = stateful_nodes(plan)
    previous = (last.detail or {}).get("plan")
    if previous and previous != plan_signature(plan):
        return Trigger(STATE_MISSING, "the state tables were built for another plan of this query "
                                      "(the optimizer or engine changed); rebuilding them")
    if (last.detail or {}).get("state") == STATE_NOT_KEPT:  # the step's cost model decides (epoch._weigh)
        return None
    absent = sorted(name for name in expected if name not in recorded)
    if absent:
        return Trigger(STATE_MISSING, f"no state version recorded for {', '.join(absent)}")
    for name, version in sorted(recorded.items()):
        path = f"{table.state_root}/{name}"
        log = DeltaLog.open(path, env.storage_options)
        if log is None:
            return Trigger(STATE_MISSING, f"state table {name} is missing ({path})")
        if log.version < version:
            return Trigger(STATE_MISSING, f"state table {name} has no version {version} (latest {log.version}): "
                                          "it was recreated")
        try:
            uris = table_at(path, version, env.storage_options).file_uris()
        except DeltaError as error:
            return Trigger(STATE_MISSING, f"state table {name} cannot be read at version {version} ({error})")
        root = path.rstrip("/") + "/"
        relative = [u[len(root):] if u.startswith(root) else u.rsplit("/", 1)[-1] for u in uris]
        missing = TableFiles(path, env.storage_options).missing(relative)
        if missing:
            return Trigger(STATE_MISSING, f"state table {name} lost {len(missing)} data files of version {version}")
    return None


def logged_rows_by_input(env: Environment, inputs) -> dict[str, int] | None:
    """Per changed input, the rows the commits of its range inserted, updated or deleted, by
    their metrics (remembered for the refresh: several tables read one range); None when a
    commit has none to tell."""
    logged = {}
    for name, rng in inputs.items():
        if rng.changed and rng.before >= 0:
            rows = env.triggers.remembered(("logged rows", rng.path, rng.before, rng.after),
                                           partial(changed_rows, rng.path, rng.before, rng.after, env.storage_options))
            if rows is None:
                return None
            logged[name] = rows
    return logged


def logged_rows(env: Environment, inputs) -> int | None:
    """The rows the commits of the inputs' changed ranges logged (`logged_rows_by_input`), in all."""
    by_input = logged_rows_by_input(env, inputs)
    return None if by_input is None else sum(by_input.values())


def cost_trigger(env: Environment, fraction: float, inputs) -> Trigger | None:
    """COST when the rows the epoch changed across the inputs exceed `fraction` of the rows the
    inputs hold at its end: the incremental terms read at least the changes (and their partners),
    a recompute reads every input once."""
    changed = logged_rows(env, inputs)
    if changed is None:
        return None  # cannot tell: stay incremental
    rows = sum(table_at(rng.path, rng.after, env.storage_options).count() for rng in inputs.values() if rng.after >= 0)
    if changed and changed > fraction * rows:
        share = f"{changed / rows:.0%}" if rows else "all"
        return Trigger(COST, f"{changed} of the inputs' {rows} rows changed ({share}), more than "
                             f"rescan_fraction={fraction:g}: a recompute reads less")
    return None
