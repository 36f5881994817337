"""Crash matrix (docs/architecture.md, section 3): for every kill point of the epoch protocol, a refresh runs in
a child process (its own Spark session and JVM) that SIGKILLs itself at that step; the test kills
what is left of the child (its JVM), writes more source commits, re-runs the refresh of the same
epoch in its own process and asserts that the tables, and the state the next epoch will read,
equal an uninterrupted run's (which equals the full recompute), that no source commit was skipped
or read twice (the ledger's steps cover each input back to back), and that no step wrote twice.

The pipeline (tests/reliability.py) is a join + aggregate + DISTINCT chain over two small sources
with NULL keys and duplicate rows; the crashed epoch is an incremental one (a time window closed
after a change batch). The children all start at once (a JVM start is the expensive part) and each
crashes in its own copy of one prepared warehouse.
"""

from __future__ import annotations

import random
import shutil
import signal

import pytest

from epochal.faults import POINTS
from tests.reliability import (
    PIPELINE,
    append,
    build_engine,
    closed_window,
    contents,
    create_sources,
    exactly_once_problems,
    random_batch,
    state_contents,
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
assert {point for point, _ in MATRIX} == set(POINTS)
IDS = [f"{point}@{table}" if table else point for point, table in MATRIX]
OUTCOMES: dict[str, str] = {}
DEFINITIONS = {name: PIPELINE[name] for name in ("agg", "j", "dist")}


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
                         "and the recompute)\n" + "\n".join(f"  {name:32} {OUTCOMES[name]}" for name in IDS if name in OUTCOMES))


@pytest.fixture(scope="module")
def prepared(spark, warehouse, children):
    """A warehouse after a first epoch plus a change batch (`base`), and the window `until` that
    closes after the batch; one copy per kill point, handed to its child to refresh that window
    with the kill point set; and an uninterrupted run's tables and state for the same window."""
    base = f"{warehouse}/base"
    create_sources(base)
    build_engine(spark, base, DEFINITIONS).refresh()
    random_batch(base, random.Random(1), commits=4)
    until = closed_window()
    for (point, table), name in zip(MATRIX, IDS):
        if name not in children:
            continue
        root = f"{warehouse}/{name.replace('@', '-')}"
        shutil.copytree(base, root)
        children[name].ready()
        children[name].send({"root": root, "sources": ["a", "b"], "definitions": DEFINITIONS,
                             "until": until.isoformat(), "kill_at": f"{point}@{table}" if table else point})

    reference = f"{warehouse}/reference"
    shutil.copytree(base, reference)
    engine = build_engine(spark, reference, DEFINITIONS)
    engine.refresh(until=until)
    assert_matches_recompute(engine, context="the uninterrupted run")
    assert not exactly_once_problems(engine)
    roots = {name: f"{warehouse}/{name.replace('@', '-')}" for name in IDS}
    return roots, until, contents(engine), state_contents(engine)


@pytest.mark.parametrize("name", IDS)
def test_crash_at_each_step_then_rerun_equals_an_uninterrupted_run(spark, children, prepared, name):
    """The re-run refreshes the same window; a source commit made after the crash (after the
    window closed) must not leak into the resumed step. Tables, and the state the next epoch will
    read, equal the uninterrupted run's; the ledger covers every source version once."""
    roots, until, tables, states = prepared
    child = children[name]
    answer = child.answer()
    assert answer is None, f"the child finished without reaching kill point {name}: {answer}"
    assert child.killed() == -signal.SIGKILL, f"the child did not die by SIGKILL at {name}:\n{child.tail()}"

    root = roots[name]
    append(root, "a", [(1, "late", 100), (None, "late", 1)])  # after the window: the next epoch's
    append(root, "b", [(1, "late")])
    engine = build_engine(spark, root, DEFINITIONS)
    engine.refresh(until=until)
    assert contents(engine) == tables, f"after the re-run of {name} the tables differ from an uninterrupted run"
    assert state_contents(engine) == states, f"after the re-run of {name} the state differs from an uninterrupted run"
    problems = exactly_once_problems(engine)
    assert not problems, "\n".join(problems)
    OUTCOMES[name] = "; ".join(f"{table} {_fate(engine, table)}" for table in engine.tables())


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
