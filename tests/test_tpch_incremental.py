"""TPC-H queries as derived tables, maintained over hourly change batches at scale 0.01: after
every epoch each table equals the full recompute of its SQL, and every epoch after the first is
incremental."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from epochal import Engine
from ops.changes import ChangeGenerator
from tests.conftest import TPCH_LOADED_AT
from tests.support import assert_matches_recompute

SQL = Path(__file__).resolve().parent.parent / "assets" / "sql"
SOURCES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
QUERIES = ("tpch_q01", "tpch_q03", "tpch_q05", "tpch_q06", "tpch_q10", "tpch_q12", "tpch_q14")
BATCHES = 10


def tpch_engine(spark, root: str, queries) -> Engine:
    engine = Engine(spark, root)
    for source in SOURCES:
        engine.source(source, clock="logical")
    engine.define_all({name: (SQL / f"{name}.sql").read_text() for name in queries})
    return engine


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
    return engine, epochs, problems


def test_every_epoch_matches_the_full_recompute(maintained):
    _, _, problems = maintained
    assert not problems, "\n".join(problems)


def test_first_epoch_rescans_and_every_later_epoch_is_incremental(maintained):
    _, epochs, _ = maintained
    assert {(r.technique, r.reason) for r in epochs[0]} == {("rescan", "FIRST_RUN")}
    later = [(r.table, r.epoch, r.technique, r.reason) for reports in epochs[1:] for r in reports]
    assert len(later) == BATCHES * len(QUERIES)
    assert all(technique == "incremental" for _, _, technique, _ in later), later


def test_each_epoch_reads_its_sources_up_to_the_remap_frontier(maintained):
    engine, epochs, _ = maintained
    for reports in epochs:
        epoch = engine.remap.get(reports[0].epoch)
        for report in reports:
            assert report.frontier == {s: epoch.frontiers[s] - 1 for s in engine.table(report.table).compiled.inputs}
