"""The remap groups its records into epochs once per version of its table: what it answers must
still be every epoch as its records say, after records written by this remap, by another
process's, a source added to an existing epoch, and a compaction (delta-rs only)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from epochal.storage.clock import CommitClock
from epochal.storage.reclock import Remap, ReclockError, Source

START = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _source(tmp_path, name: str, commits: int) -> Source:
    path = str(tmp_path / name)
    for n in range(commits):
        write_deltalake(path, pa.table({"id": [n]}), mode="append")
    return Source(name, path, CommitClock())


def _commit(source: Source) -> None:
    write_deltalake(source.path, pa.table({"id": [0]}), mode="append")


def _as_values(remap: Remap) -> list[tuple]:
    return [(e.key, e.end, e.kind, dict(e.frontiers), dict(e.notes), dict(e.table_ids)) for e in remap.epochs()]


def test_epochs_are_grouped_once_and_still_as_the_records_say(tmp_path):
    uri = str(tmp_path / "remap")
    orders, lines = _source(tmp_path, "orders", 2), _source(tmp_path, "lines", 3)
    remap, elsewhere = Remap(uri), Remap(uri)

    first = remap.on_demand([orders], now=START)
    assert dict(first.frontiers) == {"orders": 2}
    _commit(orders)
    second = elsewhere.on_demand([orders], now=START + timedelta(hours=1))  # another process's records
    assert dict(second.frontiers) == {"orders": 3}
    assert remap.get(second.key) == second and remap.latest() == second
    assert [e.key for e in remap.epochs()] == [first.key, second.key]

    widened = remap.window(first.end, [orders, lines], now=START + timedelta(hours=2))  # a source added to it
    assert dict(widened.frontiers) == {"orders": 2, "lines": 3}
    assert dict(first.frontiers) == {"orders": 2}  # an epoch handed out earlier keeps its own
    assert elsewhere.get(first.key) == widened
    assert remap.latest() == second

    _commit(lines)
    third = remap.on_demand([orders, lines], now=START + timedelta(hours=3))
    assert dict(third.frontiers) == {"orders": 3, "lines": 4}
    grouped = _as_values(remap)
    assert _as_values(Remap(uri)) == grouped  # a remap that groups every record afresh agrees

    DeltaTable(uri).optimize.compact()  # every record in new files: grouped again from all
    assert _as_values(remap) == grouped and _as_values(elsewhere) == grouped
    assert remap.window(first.end, [orders, lines], now=START + timedelta(hours=4)) == widened


def test_a_source_that_moved_is_refused_with_both_paths(tmp_path):
    uri = str(tmp_path / "remap")
    orders = _source(tmp_path, "orders", 1)
    remap = Remap(uri)
    first = remap.on_demand([orders], now=START)
    moved = Source("orders", str(tmp_path / "elsewhere"), CommitClock())
    lines = _source(tmp_path, "lines", 1)
    with pytest.raises(ReclockError, match="recorded in the remap at .*orders but is declared at .*elsewhere"):
        remap.window(first.end, [moved, lines], now=START + timedelta(hours=1))
