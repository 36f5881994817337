"""Concurrent runs (docs/architecture.md, sections 2 and 3): two processes refreshing the same tables for the
same epoch apply it exactly once; two processes refreshing different tables at once share the
remap without conflict; a refresh racing a source writer reads one consistent frontier; and the
insert-if-absent record tables (remap, ledgers) admit exactly one writer per key. The two races
run with arrangements off and forced (both processes then build and append to the same
arrangements).

The second process is a child (tests/worker.py) with its own Spark session; both processes start
a refresh at the same wall-clock instant. Epochs are time windows (`until`), so both processes
name the same epoch.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter
from datetime import datetime

import pyarrow as pa
import pytest

from epochal.errors import EpochalError
from epochal.storage.metastore import RecordTable
from epochal.storage.reclock import Remap
from tests.reliability import (
    PIPELINE,
    SOURCES,
    append,
    build_engine,
    closed_window,
    create_sources,
    exactly_once_problems,
    random_batch,
    source_version,
)
from tests.support import assert_matches_recompute
from tests.worker import Child, parent_jars

pytestmark = pytest.mark.long  # make test-long (CI runs it after make test)

DEFINITIONS = {name: PIPELINE[name] for name in ("agg", "j", "dist")}
# arrangements forced: both processes build and append to the same arrangements (every version of
# more than 4 rows is read by key through them), and the epochs after read what they left
ARRANGED = {"arrange_rows": 0, "driver_rows": 4}


@pytest.fixture(scope="module", params=[{}, ARRANGED], ids=["unarranged", "arranged"])
def options(request) -> dict:
    return request.param


@pytest.fixture(scope="module")
def child(spark, tmp_path_factory):
    worker = Child.start(parent_jars(spark), tmp_path_factory.mktemp("concurrency-logs") / "child.log")
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def shared(warehouse, options) -> str:
    """One warehouse the two racing tests use in turn (sources a and b), per set of options."""
    root = f"{warehouse}/shared-{'arranged' if options else 'unarranged'}"
    create_sources(root)
    return root


def race(spark, child: Child, root: str, mine: list[str] | None, theirs: list[str] | None, until: datetime,
         options: dict):
    """Refresh `mine` here and `theirs` in the child (None: all tables), both for the epoch ending
    `until`, starting at the same instant. Returns (engine, my outcome, the child's answer): an
    outcome is a list of reports or the error raised."""
    engine = build_engine(spark, root, DEFINITIONS, **options)
    child.ready()
    at = time.time() + 1.0
    child.send({"root": root, "sources": list(SOURCES), "definitions": DEFINITIONS, "tables": theirs,
                "until": until.isoformat(), "at": at, "options": options})
    time.sleep(max(0.0, at - time.time()))
    try:
        mine_outcome = engine.refresh(mine, until=until)
    except EpochalError as error:
        mine_outcome = error
    answer = child.answer()
    assert answer is not None, f"the child died:\n{child.tail()}"
    return engine, mine_outcome, answer


def _outcome_ok(outcome, what: str) -> None:
    """A refresh that lost a race either returns reports or fails with a clear message."""
    if isinstance(outcome, Exception):
        message = str(outcome)
        assert "table '" in message and ("another run" in message or "concurrent" in message), (what, message)
    elif isinstance(outcome, dict) and "error" in outcome:
        message = outcome["message"]
        assert outcome["error"] in ("EpochError", "EpochalError") and "table '" in message, (what, outcome)


def test_two_processes_refreshing_the_same_tables_for_the_same_epoch_apply_it_once(spark, shared, child, options):
    """Both processes refresh every table for the same window, twice: the first epoch (tables
    created and rescanned) and an incremental one. Each table commits each epoch once, writes it
    once, and equals its recompute."""
    for number, batch in enumerate((None, 7), start=1):
        if batch is not None:
            random_batch(shared, random.Random(batch), commits=4)
        until = closed_window()
        engine, mine, theirs = race(spark, child, shared, None, None, until, options)
        _outcome_ok(mine, f"epoch {number} here")
        _outcome_ok(theirs, f"epoch {number} in the child")
        assert not isinstance(mine, Exception) or "reports" in theirs, "both runs failed"
        engine = build_engine(spark, shared, DEFINITIONS, **options)
        for name in engine.tables():
            committed = [s for s in engine.table(name).ledger.committed() if s.epoch_end == until]
            assert len(committed) == 1, f"{name}: epoch {number} committed {len(committed)} times"
        problems = exactly_once_problems(engine)
        assert not problems, "\n".join(problems)
        assert_matches_recompute(engine, context=f"after raced epoch {number}")


def test_two_processes_refreshing_different_tables_share_the_remap(spark, shared, child, options):
    """`agg` (reads a and b) here, `dist` (reads `j`, which reads a and b) in the child, one
    window, one instant: one remap record per source, and every table reads the sources up to it."""
    random_batch(shared, random.Random(3), commits=3)
    append(shared, "a", [(5, "x", 2)])
    until = closed_window()
    engine, mine, theirs = race(spark, child, shared, ["agg"], ["dist"], until, options)
    assert not isinstance(mine, Exception), mine
    assert "reports" in theirs, theirs
    assert {r["table"] for r in theirs["reports"]} == {"j", "dist"}
    rows = [r for r in engine.remap.table.read() if r["end_time"] == until]
    assert Counter(r["source"] for r in rows) == {"a": 1, "b": 1}, rows
    frontier = {r["source"]: r["frontier"] for r in rows}
    assert frontier == {name: source_version(shared, name) + 1 for name in SOURCES}
    engine = build_engine(spark, shared, DEFINITIONS, **options)
    for name in ("agg", "j"):
        step = engine.table(name).ledger.last_committed()
        assert step.epoch_end == until and step.inputs["a"]["to"] == frontier["a"] - 1, (name, step)
    assert_matches_recompute(engine, context="after two tables at once")
    assert not exactly_once_problems(engine)


def test_a_refresh_racing_a_source_writer_reads_one_consistent_frontier(spark, warehouse):
    """A writer appends duplicate rows to `a` (a commit every 50 ms) while an on-demand
    epoch runs: every table reads `a` up to the epoch's frontier and equals its recompute there;
    once the writer stops, `cnt` counts every row it wrote exactly once."""
    root = f"{warehouse}/writer"
    create_sources(root)
    engine = build_engine(spark, root, {"cnt": PIPELINE["cnt"], "agg": PIPELINE["agg"]})
    engine.refresh()
    written = Counter()
    stop = threading.Event()
    remap = Remap(engine.warehouse.engine_path("remap"))
    known = len(remap.epochs())

    def writer() -> None:
        """A commit every 50 ms until ten commits after the epoch's frontiers are recorded (every
        commit is read by a later epoch: keep them few)."""
        key = after = 0
        while not stop.is_set() and after < 10:
            append(root, "a", [(key % 6, "w", 1), (key % 6, "w", 1)])
            written["rows"] += 2
            key += 1
            after += len(remap.epochs()) > known
            time.sleep(0.05)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        reports = engine.refresh()
        assert_matches_recompute(engine, context="while the writer commits")
    finally:
        stop.set()
        thread.join()
    frontiers = {r.table: r.frontier.get("a") for r in reports}
    epoch = engine.remap.get(reports[0].epoch)
    assert set(frontiers.values()) == {epoch.frontiers["a"] - 1}, (frontiers, epoch)
    assert epoch.frontiers["a"] - 1 < source_version(root, "a"), "the writer committed nothing during the epoch"
    engine.refresh()
    assert_matches_recompute(engine, context="after the writer stopped")
    [row] = engine.read("cnt").collect()
    assert (row["n"], row["s"]) == (7 + written["rows"], 21 + written["rows"]), (row, written)
    assert engine.ledger("cnt")[-1].inputs["a"]["to"] == source_version(root, "a")
    problems = exactly_once_problems(engine)
    assert not problems, "\n".join(problems)


# ---- the record tables' insert-if-absent, many processes at once (delta-rs only, no Spark) --------
RECORDS = pa.schema([("epoch", pa.string()), ("source", pa.string()), ("frontier", pa.int64())])


def _insert_many(uri: str, writer: int, at: float) -> list[bool]:
    table = RecordTable(uri, RECORDS, ("epoch", "source"))
    time.sleep(max(0.0, at - time.time()))
    return [table.insert_if_absent([{"epoch": f"e{n}", "source": "a", "frontier": writer}])[0][0]
            for n in range(20)]


def test_record_tables_admit_one_writer_per_key(tmp_path):
    uri = str(tmp_path / "records")
    at = time.time() + 3
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_insert_many, [(uri, writer, at) for writer in range(4)])
    stored = RecordTable(uri, RECORDS, ("epoch", "source")).read()
    assert Counter(r["epoch"] for r in stored) == {f"e{n}": 1 for n in range(20)}
    assert [sum(column) for column in zip(*results)] == [1] * 20  # exactly one writer won each key


def test_record_reads_follow_new_versions_from_what_they_cached(tmp_path):
    """A RecordTable reads only the files a version added to the one it cached; after a compaction
    (files removed) it reads everything. Its records equal a fresh reader's at every version,
    also when other writers added versions in between."""
    from deltalake import DeltaTable

    uri = str(tmp_path / "records")
    reader, other = RecordTable(uri, RECORDS, ("epoch", "source")), RecordTable(uri, RECORDS, ("epoch", "source"))

    def key(rows):
        return sorted((r["epoch"], r["source"], r["frontier"]) for r in rows)

    for n in range(6):
        writer = reader if n % 2 else other
        writer.insert_if_absent([{"epoch": f"e{n}", "source": s, "frontier": n} for s in "ab"])
        if n == 3:
            DeltaTable(uri).optimize.compact()
        fresh = RecordTable(uri, RECORDS, ("epoch", "source")).read()
        assert key(reader.read()) == key(fresh) and len(fresh) == 2 * (n + 1)
    assert reader.insert_if_absent([{"epoch": "e1", "source": "a", "frontier": 99}]) == [
        (False, {"epoch": "e1", "source": "a", "frontier": 1})]
