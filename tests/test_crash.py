"""Crash matrix (docs/architecture.md, section 3): for every kill point of the epoch protocol, a refresh runs in
a child process (its own Spark session and JVM) that SIGKILLs itself at that step; the test kills
what is left of the child (its JVM), writes more source commits, re-runs the refresh of the same
epoch in its own process and asserts that the tables, and the state the next epoch will read,
equal an uninterrupted run's (which equals the full recompute), that no source commit was skipped
or read twice (the ledger's steps cover each input back to back), and that no step wrote twice.

The pipeline (tests/reliability.py) is a join + aggregate + DISTINCT chain over two small sources
with NULL keys and duplicate rows; the crashed epoch is a time window closed after a change batch.
The matrix runs three times: the epoch incremental with arrangements off; incremental with
arrangements forced, the kill points inside an arrangement's build and a local copy added, after
which the next epoch must equal the recompute too; and every change rescanned, the crashed step a
rescan that replaces a table's contents rather than diffing them. The children all
start at once (a JVM start is the expensive part) and each crashes in its own copy of one
prepared warehouse.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
from contextlib import contextmanager

import pytest

from epochal import Upkeep
from epochal.faults import POINTS
from epochal.protocol import cost
from tests.reliability import (
    GROUPS,
    PIPELINE,
    append,
    build_engine,
    closed_window,
    contents,
    create_sources,
    exactly_once_problems,
    random_batch,
    state_contents,
    update,
)
from tests.support import SUMMARIES, assert_matches_recompute
from tests.worker import Child, parent_jars

pytestmark = pytest.mark.long  # make test-long (CI runs it after make test)

# (kill point, table it fires for): each table in turn, each point once. `agg` is the first table
# to run (join + aggregate), `j` a multiset join, `dist` the DISTINCT that reads `j`.
MATRIX = (
    ("after_remap", None),
    ("after_started", "dist"),
    ("after_read_changes", "agg"),
    ("after_output_merge", "j"),
    ("after_state_merge", "agg"),
    ("before_commit", "dist"),
)
# The same with arrangements forced (every version of more than 4 rows read by key through them),
# and the points of the kept state's upkeep: the warehouse has had an incremental epoch (an
# arrangement append and a state append behind it) and the crashed epoch's lowered thresholds
# compact the state and build the arrangements again, copies included, or, for the append point,
# append to them. The compaction point fires inside a step, as the state merge's does; the
# arrangement points once the epoch's steps have committed: the re-run has nothing to do, and the
# epoch after it reads what they left half done.
ARRANGED_MATRIX = MATRIX + (
    ("after_arrangement_build", None),
    ("in_local_copy", None),
    ("after_state_compaction", None),
    ("after_arrangement_append", None),
)
assert {point for point, _ in ARRANGED_MATRIX} == set(POINTS)
# The kept state's thresholds lowered: every state table compacted after one append, and every
# arrangement built again after one (EAGER); or never built again (APPENDING), for the append point.
EAGER = {"compact_after": 1, "compact_fraction": 0.0, "rebuild_appends": 1, "rebuild_fraction": 0.0, "rebuild_rows": 0}
APPENDING = {"compact_after": 1, "compact_fraction": 0.0, "rebuild_appends": 64, "rebuild_fraction": 1e9, "rebuild_rows": 10 ** 9}
# Prepared in place rather than copied: an arrangement is named after its input's path, so in a
# copied warehouse the crashed epoch finds none and builds them (a moved warehouse rebuilds its
# arrangements, a cache), never reaching the append.
IN_PLACE = {"after_arrangement_append"}
# And a rescan that replaces `agg` (no table reads it) rather than diffing it: every change
# rescans (a tiny rescan_fraction), and the epoch before the crashed one changed every group's
# sum, so its diff changed a large share of the table (cost.replaces); the crash hits the replace.
REPLACING_MATRIX = (
    ("after_started", "agg"),
    ("after_output_merge", "agg"),
    ("before_commit", "agg"),
)
FAMILIES = {"": MATRIX, "arranged": ARRANGED_MATRIX, "replacing": REPLACING_MATRIX}
# The cost model's constants per family, set in the children and here alike: agg holds a few rows,
# and a diff of fewer than REPLACE_ROWS rows is never replaced.
COST = {"replacing": {"REPLACE_ROWS": 0}}


@contextmanager
def cost_constants(family: str):
    saved = {name: getattr(cost, name) for name in COST.get(family, {})}
    for name, value in COST.get(family, {}).items():
        setattr(cost, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cost, name, value)
CASES = [(point, table, family) for family, matrix in FAMILIES.items() for point, table in matrix]
IDS = [(f"{point}@{table}" if table else point) + (f"+{family}" if family else "") for point, table, family in CASES]
OUTCOMES: dict[str, str] = {}
DEFINITIONS = {name: PIPELINE[name] for name in ("agg", "j", "dist")}


def engine_options(point: str, family: str) -> dict:
    """The Engine's options for a case (as the child takes them: JSON)."""
    if family == "replacing":
        return {"rescan_fraction": 1e-9}
    if family != "arranged":
        return {}
    return {"arrange_rows": 0, "driver_rows": 4, "upkeep": APPENDING if point == "after_arrangement_append" else EAGER}


def as_engine_options(options: dict) -> dict:
    return {**options, "upkeep": Upkeep(**options["upkeep"])} if "upkeep" in options else options


@pytest.fixture(scope="module")
def children(spark, tmp_path_factory, request):
    """One child per selected kill point, started before anything else so their JVMs start
    meanwhile."""
    logs = tmp_path_factory.mktemp("crash-logs")
    jars = parent_jars(spark)
    selected = {item.callspec.params["name"] for item in request.session.items
                if getattr(item, "callspec", None) and item.module.__name__ == __name__}
    started = {name: Child.start(jars, logs / f"{name}.log") for name in IDS if name in selected}
    yield started
    for child in started.values():
        child.close()
    if OUTCOMES:
        SUMMARIES.append("Crash matrix (kill point@table -> what the re-run did; all equal the uninterrupted run "
                         "and the recompute)\n" + "\n".join(f"  {name:44} {OUTCOMES[name]}" for name in IDS if name in OUTCOMES))


def _base(spark, root: str, family: str):
    """A warehouse after a first epoch (arranged: and an incremental one; replacing: and a rescan
    that changed every group of agg) plus a change batch, and the window that closes after the
    batch."""
    create_sources(root)
    engine = build_engine(spark, root, DEFINITIONS, **as_engine_options(engine_options("", family)))
    engine.refresh()
    if family == "replacing":
        for group in GROUPS:
            update(root, "a", "g", group, {"v": "t.v + 1"})
        engine.refresh()
        assert engine.table("agg").ledger.last_committed().detail["changed_share"] >= cost.REPLACE_SHARE
    if family == "arranged":  # an incremental epoch that surely appends to agg's state and to both arrangements
        random_batch(root, random.Random(2), commits=3)
        append(root, "a", [(1, "base", 3)])
        append(root, "b", [(1, "base")])
        engine.refresh()
    random_batch(root, random.Random(1), commits=4)
    return closed_window()


@pytest.fixture(scope="module")
def prepared(spark, warehouse, children):
    """Per case, a copy of its base warehouse, handed to its child to refresh the window with the
    kill point set; and per set of engine options an uninterrupted run's tables and state for the
    same window."""
    until = {}
    for family in FAMILIES:
        with cost_constants(family):
            until[family] = _base(spark, f"{warehouse}/base-{family or 'plain'}", family)
    untils = {}
    for (point, table, family), name in zip(CASES, IDS):
        if name not in children:
            continue
        root = f"{warehouse}/{name.replace('@', '-').replace('+', '-')}"
        if point in IN_PLACE:
            with cost_constants(family):
                untils[name] = _base(spark, root, family)
        else:
            shutil.copytree(f"{warehouse}/base-{family or 'plain'}", root)
            untils[name] = until[family]
        children[name].ready()
        children[name].send({"root": root, "sources": ["a", "b"], "definitions": DEFINITIONS,
                             "until": untils[name].isoformat(), "options": engine_options(point, family), "cost": COST.get(family, {}),
                             "kill_at": f"{point}@{table}" if table else point})

    references = {}
    for point, _, family in CASES:
        options = engine_options(point, family)
        key = json.dumps(options, sort_keys=True)
        if key in references:
            continue
        reference = f"{warehouse}/reference-{len(references)}"
        shutil.copytree(f"{warehouse}/base-{family or 'plain'}", reference)
        engine = build_engine(spark, reference, DEFINITIONS, **as_engine_options(options))
        with cost_constants(family):
            engine.refresh(until=until[family])
        if family == "replacing":  # the crashed epoch's agg step is a replace
            assert "replaced" in engine.table("agg").ledger.last_committed().detail
        assert_matches_recompute(engine, context="the uninterrupted run")
        assert not exactly_once_problems(engine)
        references[key] = (contents(engine), state_contents(engine))
    roots = {name: f"{warehouse}/{name.replace('@', '-').replace('+', '-')}" for name in IDS}
    return roots, untils, references


@pytest.mark.parametrize("name", IDS)
def test_crash_at_each_step_then_rerun_equals_an_uninterrupted_run(spark, children, prepared, name):
    """The re-run refreshes the same window; a source commit made after the crash (after the
    window closed) must not leak into the resumed step. Tables, and the state the next epoch will
    read, equal the uninterrupted run's; the ledger covers every source version once. The epoch
    after it (the late commits) equals the recompute too: it reads what the crash left behind."""
    roots, untils, references = prepared
    point, _, family = CASES[IDS.index(name)]
    options = engine_options(point, family)
    tables, states = references[json.dumps(options, sort_keys=True)]
    child = children[name]
    answer = child.answer()
    assert answer is None, f"the child finished without reaching kill point {name}: {answer}"
    assert child.killed() == -signal.SIGKILL, f"the child did not die by SIGKILL at {name}:\n{child.tail()}"

    root = roots[name]
    append(root, "a", [(1, "late", 100), (None, "late", 1)])  # after the window: the next epoch's
    append(root, "b", [(1, "late")])
    engine = build_engine(spark, root, DEFINITIONS, **as_engine_options(options))
    with cost_constants(family):
        engine.refresh(until=untils[name])
    assert contents(engine) == tables, f"after the re-run of {name} the tables differ from an uninterrupted run"
    assert state_contents(engine) == states, f"after the re-run of {name} the state differs from an uninterrupted run"
    problems = exactly_once_problems(engine)
    assert not problems, "\n".join(problems)
    OUTCOMES[name] = "; ".join(f"{table} {_fate(engine, table)}" for table in engine.tables())
    with cost_constants(family):
        engine.refresh()
    assert_matches_recompute(engine, context=f"the epoch after the re-run of {name}")
    assert not exactly_once_problems(engine)


def _fate(engine, table: str) -> str:
    """What became of the crashed epoch for one table: committed by the child before it died,
    resumed (started by the child, finished by the re-run), or run by the re-run from scratch."""
    steps = engine.table(table).ledger.steps()
    started = {s.seq: s.run_id for s in steps if s.status == "started"}
    fates = []
    for step in steps:
        if step.status != "committed" or step.seq == 1:
            continue
        if step.run_id != engine.run_id:
            fates.append("committed before the kill")
        elif started.get(step.seq, step.run_id) != engine.run_id:
            fates.append(f"resumed ({step.technique})")
        else:
            fates.append(f"run by the re-run ({step.technique})")
    return ", ".join(fates) or "nothing to do"
