"""TPC-H queries as derived tables, maintained over hourly change batches at scale 0.01:
after every epoch each table equals the full recompute of its SQL, and every epoch after the first
is incremental (a noop where no input changed). The terminal summary shows, per query, the
technique of each epoch and the mean seconds of its incremental epochs.

`make test` maintains eight queries (1, 3, 5, 6, 10, 12, 13, 14) over 3 batches; `make test-tpch`
maintains all 22 over the full 10 (EPOCHAL_TPCH_QUERIES=all, EPOCHAL_TPCH_BATCHES=10), which takes
most of an hour on two cores: each query's epoch is a dozen or more Spark jobs and Delta commits.
EPOCHAL_TPCH_QUERIES="11 15 22" maintains the queries named."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from statistics import mean

import pytest

from epochal import Engine
from ops.changes import ChangeGenerator
from tests.conftest import TPCH_LOADED_AT
from tests.support import SUMMARIES, assert_matches_recompute

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
ALL_QUERIES = tuple(range(1, 23))
SHORT_QUERIES = (1, 3, 5, 6, 10, 12, 13, 14)  # filters, joins of up to six inputs, aggregates, CASE, NOT LIKE
_CHOSEN = os.environ.get("EPOCHAL_TPCH_QUERIES", "")  # "all", or numbers: "11 15 22"
QUERIES = tuple(f"tpch_q{n:02d}" for n in (
    ALL_QUERIES if _CHOSEN == "all" else tuple(int(n) for n in _CHOSEN.split()) or SHORT_QUERIES))
BATCHES = int(os.environ.get("EPOCHAL_TPCH_BATCHES", "3"))
LETTER = {"rescan": "R", "incremental": "I", "noop": "."}


def tpch_engine(spark, root: str, queries) -> Engine:
    engine = Engine(spark, root, cost_model=False)
    for source in SOURCES:
        engine.source(source, clock="logical")
    engine.define_all({name: (SQL / f"{name}.sql").read_text() for name in queries})
    return engine


def summary(epochs) -> str:
    lines = [f"TPC-H at scale 0.01 over {BATCHES} hourly batches (R rescan, I incremental, . noop)"]
    for name in QUERIES:
        reports = [r for reports in epochs for r in reports if r.table == name]
        seconds = [r.seconds for r in reports if r.technique == "incremental"]
        lines.append(
            f"  {name}  {''.join(LETTER[r.technique] for r in reports)}  "
            f"incremental {sum(r.technique == 'incremental' for r in reports)}/{len(reports) - 1}, "
            f"mean {mean(seconds):.2f}s" if seconds else f"  {name}  {''.join(LETTER[r.technique] for r in reports)}"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def maintained(spark, warehouse, copy_tpch):
    """The queries maintained over BATCHES hourly batches: (engine, reports per epoch, problems)."""
    root = copy_tpch(warehouse)
    engine = tpch_engine(spark, root, QUERIES)
    generator = ChangeGenerator(spark, root, seed=11, fraction=0.01)
    epochs = [engine.refresh(until=TPCH_LOADED_AT + timedelta(minutes=15))]
    problems = []
    for index in range(1, BATCHES + 1):
        generator.apply_batch(index, TPCH_LOADED_AT + timedelta(hours=index - 1, minutes=30))
        epochs.append(engine.refresh(until=TPCH_LOADED_AT + timedelta(hours=index)))
        try:
            assert_matches_recompute(engine, context=f"after batch {index}")
        except AssertionError as mismatch:
            problems.append(str(mismatch))
    SUMMARIES.append(summary(epochs))
    return engine, epochs, problems


def test_every_epoch_matches_the_full_recompute(maintained):
    _, _, problems = maintained
    assert not problems, "\n".join(problems)


def test_first_epoch_rescans_and_every_later_epoch_is_incremental(maintained):
    _, epochs, _ = maintained
    assert {(r.technique, r.reason) for r in epochs[0]} == {("rescan", "FIRST_RUN")}
    later = [(r.table, r.epoch, r.technique, r.reason) for reports in epochs[1:] for r in reports]
    assert len(later) == BATCHES * len(QUERIES)
    assert all(technique in ("incremental", "noop") for _, _, technique, _ in later), [
        entry for entry in later if entry[2] not in ("incremental", "noop")
    ]


def test_each_epoch_reads_its_sources_up_to_the_remap_frontier(maintained):
    engine, epochs, _ = maintained
    for reports in epochs:
        epoch = engine.remap.get(reports[0].epoch)
        for report in reports:
            assert report.frontier == {s: epoch.frontiers[s] - 1 for s in engine.table(report.table).compiled.inputs}
