"""Table identity: a source deleted and created again at the same path is a new Delta table (a new
`metaData.id`, its versions counting from 0 again). The remap starts its frontier again, every table
reading it rescans with SOURCE_REWRITTEN naming the new id, its arrangements are dropped before
anything is read, and each table equals its recompute then and after later epochs. Before, the
refresh after the replacement reported success and answered from the old table."""

from __future__ import annotations

import shutil
import uuid

import pytest
from deltalake import DeltaTable

from epochal import Engine
from tests.support import SyntheticSource, assert_matches_recompute

JOINED = "SELECT a.k, a.v, b.name FROM a JOIN b ON a.k = b.k"
BY_NAME = "SELECT name, count(*) AS n, sum(v) AS s FROM joined GROUP BY name"


def _replaced(spark, path: str, rows: list[tuple], commits: int) -> tuple[SyntheticSource, str, str]:
    """The source at `path` deleted and created again with `rows`, then `commits` more commits."""
    old_id = DeltaTable(path).metadata().id
    shutil.rmtree(path)
    source = SyntheticSource(spark, path, "k int, v int", rows)
    for i in range(commits):
        source.insert([(200 + i, i)])
    new_id = DeltaTable(path).metadata().id
    assert new_id != old_id
    return source, old_id, new_id


@pytest.mark.long  # a dozen refreshes with arrangements: make test-long
def test_a_source_created_again_at_its_path_rescans_its_readers(spark, warehouse):
    """Created again twice: first with fewer versions than the old table had (its frontier would
    stand still: a noop), then with more (its range would read as an ordinary change)."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a_path = f"{root}/sources/a"
    a = SyntheticSource(spark, a_path, "k int, v int", [(i, i) for i in range(40)])
    SyntheticSource(spark, f"{root}/sources/b", "k int, name string", [(i, f"n{i % 5}") for i in range(0, 40, 2)])
    engine = Engine(spark, root, cost_model=False, arrange_rows=0)
    engine.source("a")
    engine.source("b")
    engine.define_all({"joined": JOINED, "by_name": BY_NAME})
    engine.refresh()
    a.insert([(40, 40), (2, 7)])
    a.delete("k = 4")
    assert {r.table: r.technique for r in engine.refresh()} == {"joined": "incremental", "by_name": "incremental"}
    assert engine.arrangements.of(a_path), "the join's reads of a were arranged"

    for rows, commits in (([(i, 100 + i) for i in range(0, 20, 2)], 0), ([(i, 50 - i) for i in range(30)], 6)):
        a, old_id, new_id = _replaced(spark, a_path, rows, commits)
        reports = {r.table: r for r in engine.refresh()}
        joined = reports["joined"]
        assert (joined.technique, joined.reason.split(":")[0]) == ("rescan", "SOURCE_REWRITTEN"), joined.reason
        assert new_id in joined.reason and old_id in joined.reason, joined.reason
        assert reports["by_name"].technique == "incremental", reports["by_name"].reason  # joined kept its identity
        assert_matches_recompute(engine)

    a.insert([(2, 1), (300, 3)])
    a.delete("k = 6")
    reports = {r.table: r for r in engine.refresh()}
    assert {t: r.technique for t, r in reports.items()} == {"joined": "incremental", "by_name": "incremental"}, \
        {t: r.reason for t, r in reports.items()}
    assert_matches_recompute(engine)
