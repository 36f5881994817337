"""Rescan triggers, each produced for real on small Delta tables (docs/architecture.md, section 6): the table
that reads the source rescans with the expected reason, its result equals the full recompute, and
the table reading it stays incremental (the rescan wrote its difference as an ordinary change).

Two tables per test: `t` aggregates source `a` (so it has state), `d` filters `t`.
"""

from __future__ import annotations

import shutil
import uuid

import pytest
from delta.tables import DeltaTable

from epochal import Engine, reasons
from epochal import engine as engine_module
from epochal.changes import InputRange
from epochal.errors import EpochError, StrictModeError
from epochal.keyed.state import StateStore
from epochal.protocol import cost, rescan
from epochal.protocol.context import Context
from tests.support import SyntheticSource, assert_matches_recompute

SCHEMA = "k int, g string, v int, w string"
ROWS = [(i, "xyz"[i % 3], i, f"w{i}") for i in range(10)]
T = "SELECT g, count(*) AS n, sum(v) AS s FROM a GROUP BY g"
D = "SELECT g, s FROM t WHERE n > 1"


def build(spark, root: str, **options) -> Engine:
    engine = Engine(spark, root, parallelism=1, **{"cost_model": False, **options})
    engine.source("a")
    engine.define_all({"t": T, "d": D})
    return engine


@pytest.fixture
def setup(spark, warehouse):
    """(engine, source a, root) after a first epoch."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    source = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, ROWS)
    engine = build(spark, root)
    assert {(r.table, r.reason) for r in engine.refresh()} == {("t", "FIRST_RUN"), ("d", "FIRST_RUN")}
    return engine, source, root


def weighed(spark, warehouse: str, **options) -> tuple[Engine, SyntheticSource]:
    """An engine with the cost model on, after its first run, and its source `a`; `d` is strict:
    its steps are as quick as its first run, and the model might try a rescan of it."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, ROWS)
    engine = build(spark, root, cost_model=True, **options)
    engine.define("d", D, strict=True)
    engine.refresh()
    return engine, a


def sql(spark, statement: str, path: str) -> None:
    spark.sql(statement.format(table=f"delta.`{path}`"))


def refreshed(engine, **options) -> dict:
    reports = {r.table: r for r in engine.refresh(**options)}
    assert_matches_recompute(engine)
    return reports


def assert_rescan(reports, code: str, *words: str) -> None:
    t, d = reports["t"], reports["d"]
    assert (t.technique, t.reason.split(":")[0]) == ("rescan", code), (t.technique, t.reason)
    for word in words:
        assert word in t.reason, t.reason
    assert d.technique == "incremental", (d.technique, d.reason)


@pytest.mark.long  # a source fault, as the fault matrix's (make test-faults): make test-long, keeping make test within 10 minutes
def test_cdf_unavailable_after_vacuum_and_while_the_feed_was_off(spark, setup):
    engine, a, _ = setup
    a.delete("k = 1")
    a.update("k = 2", {"v": "v + 5"})
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        sql(spark, "VACUUM {table} RETAIN 0 HOURS", a.path)  # the change files of the epoch are gone
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert_rescan(refreshed(engine), "CDF_UNAVAILABLE", "VACUUM", "source 'a'")

    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)", a.path)
    a.insert([(20, "x", 7, "w")])
    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)", a.path)
    a.insert([(21, "y", 8, "w")])
    assert_rescan(refreshed(engine), "CDF_UNAVAILABLE", "was off")

    a.insert([(22, "z", 9, "w")])  # and back to incremental
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}


def test_delta_refusing_a_range_where_the_step_reads_abandons_it_and_rescans(spark, setup, monkeypatch):
    """Delta has the last word: were the log check to miss an unreadable range, Delta's refusal
    where the step reads (before any write) abandons the step and rescans it, or fails a strict
    table with nothing written."""
    engine, a, root = setup
    monkeypatch.setattr(rescan, "_log_trigger", lambda *arguments: None)
    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES (delta.enableChangeDataFeed = false)", a.path)
    a.insert([(23, "x", 7, "w")])
    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)", a.path)
    a.insert([(24, "y", 8, "w")])
    output = engine.table("t").path
    version = DeltaTable.forPath(spark, output).history(1).first()["version"]

    strict = build(spark, root, strict=True)
    with pytest.raises(StrictModeError, match=r"table 't' is strict and would need a rescan \(CDF_UNAVAILABLE: "
                                              r"Delta cannot read the change data of source 'a'.*nothing was written"):
        strict.refresh()
    assert DeltaTable.forPath(spark, output).history(1).first()["version"] == version

    assert_rescan(refreshed(engine), "CDF_UNAVAILABLE", "Delta cannot read the change data of source 'a'",
                  "DELTA_MISSING_CHANGE_DATA")
    abandoned = [s.detail.get("why", "") for s in engine.table("t").ledger.steps() if s.status == "abandoned"]
    assert any("DELTA_MISSING_CHANGE_DATA" in why for why in abandoned), abandoned


@pytest.mark.long  # a source fault, as the fault matrix's (make test-faults): make test-long, keeping make test within 10 minutes
def test_source_rewritten_by_overwrite_truncate_and_restore(spark, setup):
    engine, a, _ = setup
    spark.createDataFrame([(1, "x", 100, "o"), (2, "q", 5, "o")], SCHEMA).write.format("delta") \
        .mode("overwrite").save(a.path)
    assert_rescan(refreshed(engine), "SOURCE_REWRITTEN", "overwritten")

    before_truncate = DeltaTable.forPath(spark, a.path).history(1).first()["version"]
    sql(spark, "TRUNCATE TABLE {table}", a.path)
    assert_rescan(refreshed(engine), "SOURCE_REWRITTEN", "truncated")

    sql(spark, f"RESTORE TABLE {{table}} TO VERSION AS OF {before_truncate}", a.path)
    assert_rescan(refreshed(engine), "SOURCE_REWRITTEN", f"restored to version {before_truncate}")


def test_schema_changes_only_rescan_when_the_query_sees_them(spark, setup):
    engine, a, root = setup
    # a new column the query does not read: incremental, also after reloading the definitions
    sql(spark, "ALTER TABLE {table} ADD COLUMNS (extra string)", a.path)
    spark.createDataFrame([(30, "x", 3, "w", "e")], SCHEMA + ", extra string").write.format("delta") \
        .mode("append").save(a.path)
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}
    engine = build(spark, root)
    a.schema = SCHEMA + ", extra string"
    a.insert([(31, "y", 4, "w", "f")])
    assert {(r.technique, r.reason) for r in refreshed(engine).values()} == {("incremental", "")}

    # a wider type of a column the query reads: SOURCE_REWRITTEN once the definitions are reloaded
    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')", a.path)
    sql(spark, "ALTER TABLE {table} ALTER COLUMN v TYPE BIGINT", a.path)
    a.schema = "k int, g string, v bigint, w string, extra string"
    a.insert([(32, "z", 10**11, "w", "g")])
    with pytest.raises(EpochError, match=r"table 't' was defined when source 'a' had column\(s\) v int.*define the table again"):
        engine.refresh()
    engine = build(spark, root)
    assert_rescan(refreshed(engine), "SOURCE_REWRITTEN", "column v changed type integer -> long")


def test_rename_and_drop_need_column_mapping_and_rescan_or_fail_by_what_is_read(spark, setup):
    engine, a, _ = setup
    sql(spark, "ALTER TABLE {table} SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
               "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')", a.path)
    sql(spark, "ALTER TABLE {table} RENAME COLUMN w TO label", a.path)  # not read by t
    a.schema = "k int, g string, v int, label string"
    a.insert([(40, "x", 1, "l")])
    assert_rescan(refreshed(engine), "CDF_UNAVAILABLE", "column w renamed to label")

    sql(spark, "ALTER TABLE {table} DROP COLUMN v", a.path)  # read by t: no rescan can answer
    a.schema = "k int, g string, label string"
    a.insert([(41, "x", "l")])
    with pytest.raises(EpochError, match=r"table 't' reads column\(s\) v of source 'a'.*update the table's SQL"):
        engine.refresh()


def test_state_missing_after_its_folder_is_deleted(spark, setup):
    engine, a, _ = setup
    state = engine.table("t").state_root
    shutil.rmtree(state)
    a.insert([(50, "x", 2, "w")])
    assert_rescan(refreshed(engine), "STATE_MISSING", "missing")
    a.insert([(51, "y", 2, "w")])  # state rebuilt: incremental again
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}


def test_strict_table_fails_with_the_reason_instead_of_rescanning(spark, setup):
    engine, a, root = setup
    shutil.rmtree(engine.table("t").state_root)
    a.insert([(60, "x", 2, "w")])
    strict = Engine(spark, root, strict=True, parallelism=1)
    strict.source("a")
    strict.define_all({"t": T, "d": D})
    with pytest.raises(StrictModeError, match=r"table 't' is strict and would need a rescan \(STATE_MISSING"):
        strict.refresh()
    assert_rescan(refreshed(engine), "STATE_MISSING")  # not strict: rescans


def test_query_changed_when_the_sql_is_edited_but_not_when_it_is_reformatted(spark, setup):
    engine, a, _ = setup
    engine.define("t", "select g,\n  COUNT(*) as n, SUM(v) as s -- same query\nfrom a group by g")
    a.insert([(70, "x", 1, "w")])
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}

    engine.define("t", "SELECT g, count(*) AS n, sum(v) AS s FROM a WHERE v > 2 GROUP BY g")
    reports = refreshed(engine)
    assert (reports["t"].technique, reports["t"].reason) == ("rescan", "QUERY_CHANGED")
    assert reports["d"].technique == "incremental"

    reports = refreshed(engine, full_refresh=True)
    assert (reports["t"].technique, reports["t"].reason) == ("rescan", "REQUESTED")


def test_cost_rescans_a_sixty_percent_change(spark, warehouse):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, ROWS)
    engine = build(spark, root, rescan_fraction=0.5)
    engine.refresh()
    a.insert([(100 + i, "new", i, "w") for i in range(15)])  # 15 of 25 rows: 60%, one new group of t
    assert_rescan(refreshed(engine), "COST", "15 of the inputs' 25 rows changed (60%)")
    a.update("k = 1", {"v": "v + 1"})  # 10%: incremental
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}


@pytest.mark.long  # many measured epochs; make test-long
def test_cost_model_rescans_a_change_its_history_says_is_cheaper_to_recompute(spark, warehouse, monkeypatch):
    """The model's history: the first run (a rescan) and one incremental step of one updated row
    (two change rows read: its old and new values). 400 inserted rows, as the commit's metrics log
    them, are then expected to bring 800 change rows (that step's share), estimated at 800x its
    seconds, far above the rescan even before they are read: the step rescans for COST unread,
    with both estimates, stays exact, and the table reading it stays incremental. The same change
    under a strict table, or with the model off, stays incremental. (The estimate scales a step
    of 2 rows 400 times: below cost.FIXED_COST_ROWS, from which the model otherwise scales a step
    on the driver, and past cost.EXTRAPOLATE, as the last engine here shows; both lifted so that
    a test table's small steps make the history.)"""
    monkeypatch.setattr(cost, "EXTRAPOLATE", 1e9)
    monkeypatch.setattr(cost, "FIXED_COST_ROWS", 1)
    engine, a = weighed(spark, warehouse)
    a.update("k = 1", {"v": "v + 1"})
    first = refreshed(engine)
    assert first["t"].technique == "incremental", first["t"].reason
    a.insert([(1000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
    assert first["t"].rows_read == 2 and engine.table("t").ledger.last_committed().detail["logged_rows"] == 1
    reports = refreshed(engine)
    assert_rescan(reports, "COST", "not read", "logged 400 changed rows", "800 change rows", "one is tried")
    estimate = reports["t"].detail["estimate"]
    assert (estimate["rows"], estimate["logged_rows"], estimate["unread"]) == (800, 400, True), estimate
    assert estimate["incremental"] > cost.EARLY * estimate["rescan"], estimate
    steps = engine.table("t").ledger.steps()
    assert [s.status for s in steps if s.epoch == steps[-1].epoch] == ["started", "abandoned", "started", "committed"]
    # the first rescan for COST rests on the first run only: it is tried, and keeps the state
    assert "state" not in steps[-1].detail and steps[-1].state_versions, steps[-1].detail
    a.insert([(2000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
    again = refreshed(engine)
    assert_rescan(again, "COST", "logged 400 changed rows", "rescanning")
    # measured now: a rescan for COST writes the output only, the state is not kept ...
    last = engine.table("t").ledger.last_committed()
    assert (last.detail["state"], last.state_versions) == (reasons.STATE_NOT_KEPT, {})
    a.insert([(3000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
    assert_rescan(refreshed(engine), "COST", "logged 400 changed rows")  # ... and the next large change is weighed without it
    # ... until a step is to run incrementally (here: the model is off), which rebuilds the state first
    engine.cost_model = False
    a.update("k = 2", {"v": "v + 1"})
    assert_rescan(refreshed(engine), "STATE_MISSING", reasons.NOT_KEPT)
    last = engine.table("t").ledger.last_committed()
    assert "state" not in last.detail and last.state_versions
    a.update("k = 3", {"v": "v + 1"})
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}

    for options in ({"cost_model": False}, {"cost_model": True, "strict": True}):
        other = f"{warehouse}/{uuid.uuid4().hex[:8]}"
        b = SyntheticSource(spark, f"{other}/sources/a", SCHEMA, ROWS)
        engine = build(spark, other, **options)
        engine.refresh()
        b.update("k = 1", {"v": "v + 1"})
        refreshed(engine)
        b.insert([(1000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
        assert {r.technique for r in refreshed(engine).values()} == {"incremental"}, options

    monkeypatch.undo()  # the default: 400 rows on the driver, below FIXED_COST_ROWS, cost what the step of 2 cost
    other = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    c = SyntheticSource(spark, f"{other}/sources/a", SCHEMA, ROWS)
    engine = build(spark, other, cost_model=True)
    engine.refresh()
    c.update("k = 1", {"v": "v + 1"})
    refreshed(engine)
    c.insert([(1000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
    measured = refreshed(engine)["t"]
    assert (measured.technique, measured.rows_read) == ("incremental", 400), measured
    history = engine.table("t").ledger.committed()
    estimate = history[-1].detail["estimate"]
    assert (estimate["rows"], estimate["incremental"]) == (400, pytest.approx(history[-2].seconds, abs=1e-3)), estimate


@pytest.mark.long  # measured epochs, as the test above
def test_a_change_past_driver_rows_before_a_step_was_measured_there_rescans_unread_without_the_state(spark, warehouse):
    """With `driver_rows` at 10, two one-row updates (two change rows each, on the driver) tell a
    share of 2; 400 inserted rows (expected to bring 800) make a change batch past `driver_rows`,
    Spark's to compute, where no step of the table was measured: the step is expected at twice
    the rescan's output, rescans for COST unread and keeps no state (no try). The next small
    change rebuilds the state (STATE_MISSING), and the one after it is incremental; all stay exact."""
    engine, a = weighed(spark, warehouse, driver_rows=10)
    for key in (1, 2):
        a.update(f"k = {key}", {"v": "v + 1"})
        assert refreshed(engine)["t"].technique == "incremental"
    a.insert([(1000 + i, "xyz"[i % 3], i, "w") for i in range(400)])
    reports = refreshed(engine)
    assert_rescan(reports, "COST", "not read", "logged 400 changed rows", "800 change rows",
                  "no step of the table was measured there yet")
    assert "tried" not in reports["t"].reason and "keeping the state" not in reports["t"].reason
    last = engine.table("t").ledger.last_committed()
    assert (last.detail["state"], last.state_versions) == (reasons.STATE_NOT_KEPT, {})
    assert last.detail["estimate"]["path_measured"] is False, last.detail
    a.update("k = 3", {"v": "v + 1"})
    assert_rescan(refreshed(engine), "STATE_MISSING", reasons.NOT_KEPT)
    a.update("k = 4", {"v": "v + 1"})
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}


@pytest.mark.long  # measured epochs, as the test above
def test_a_large_change_its_steps_found_consolidating_away_is_read_not_rescanned_unread(spark, warehouse, monkeypatch):
    """Updates of a column the table does not read (w) consolidate away: a step that read one
    records a share of 0 of its logged rows. After two of them and one update of v (share 2), an
    update of every row's w (400 rows logged) is expected to bring none, where at v's share it
    would be estimated far above a rescan: the step reads it (no rescan unread) and, it
    consolidating away, stays incremental. Scaling a step of 2 rows to 800 needs
    cost.FIXED_COST_ROWS and cost.EXTRAPOLATE lifted, as in the cost-model test above."""
    monkeypatch.setattr(cost, "EXTRAPOLATE", 1e9)
    monkeypatch.setattr(cost, "FIXED_COST_ROWS", 1)
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, [(i, "xyz"[i % 3], i, f"w{i}") for i in range(400)])
    engine = build(spark, root, cost_model=True)
    engine.refresh()
    a.update("k = 1", {"v": "v + 1"})
    refreshed(engine)
    for key in (2, 3):
        a.update(f"k = {key}", {"w": "'changed'"})
        unread = refreshed(engine)["t"]
        assert (unread.technique, unread.rows_read) == ("incremental", 0), unread
    history = engine.table("t").ledger.committed()
    assert [s.detail.get("logged_rows") for s in history[1:]] == [1, 1, 1]
    assert cost.expected_rows(cost.shares(history), 400) == 0
    assert cost.favours_rescan_unread(cost.estimate(history, 800))  # had the share been v's
    a.update("true", {"w": "concat(w, '!')"})
    reports = refreshed(engine)
    assert (reports["t"].technique, reports["t"].rows_read) == ("incremental", 0), reports["t"]


@pytest.mark.long  # measured epochs, as the tests above
def test_a_step_past_its_budget_is_given_up_for_a_rescan_and_its_size_explored_again(spark, warehouse,
                                                                                     monkeypatch):
    """An incremental step with no estimate (nothing measured near its rows) runs under a budget
    (cost.budget; here 0, and cost.FIXED_COST_ROWS lifted so that 40 rows are past the budget's
    floor): past it, the step is abandoned before it writes anything and the epoch is a rescan for
    COST that keeps no state, exact, with what was given up recorded; `d`, strict, stays
    incremental. Changes of as many rows then rescan for COST on that record until EXPLORE_AFTER
    in a row; with the budget back at its default, the next explores: it rebuilds the state, and
    the one after is incremental and ends the record."""
    default = cost.BUDGET
    monkeypatch.setattr(cost, "FIXED_COST_ROWS", 1)
    monkeypatch.setattr(cost, "BUDGET", 0.0)
    engine, a = weighed(spark, warehouse)
    a.insert([(1000 + i, "xyz"[i % 3], i, "w") for i in range(40)])
    assert_rescan(refreshed(engine), "COST", "given up after", "past its budget of 0.0 s")
    steps = engine.table("t").ledger.steps()
    assert [s.status for s in steps if s.epoch == steps[-1].epoch] == ["started", "abandoned", "started", "committed"]
    last = engine.table("t").ledger.last_committed()
    assert last.detail["gave_up"]["rows"] == 40 and last.detail["gave_up"]["budget"] == 0.0, last.detail
    assert last.detail["gave_up"]["copying"] >= 0.0
    assert (last.detail["state"], last.state_versions) == (reasons.STATE_NOT_KEPT, {})
    for batch in range(2, cost.EXPLORE_AFTER + 1):
        a.insert([(1000 * batch + i, "xyz"[i % 3], i, "w") for i in range(40)])
        assert_rescan(refreshed(engine), "COST", "one of 40 rows given up past its budget")
    monkeypatch.setattr(cost, "BUDGET", default)
    a.insert([(8000 + i, "xyz"[i % 3], i, "w") for i in range(40)])
    assert_rescan(refreshed(engine), "STATE_MISSING", reasons.NOT_KEPT)
    a.insert([(9000 + i, "xyz"[i % 3], i, "w") for i in range(40)])
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}
    a.insert([(10_000 + i, "xyz"[i % 3], i, "w") for i in range(40)])
    reports = refreshed(engine)
    assert {r.technique for r in reports.values()} == {"incremental"}, {n: r.reason for n, r in reports.items()}
    history = engine.table("t").ledger.committed()
    assert cost.estimate(history, 40, spark_path=False).given_up_rows == 0


@pytest.mark.parametrize("at_size", [False, True], ids=["scaled", "at_size"])
def test_the_first_rescan_for_cost_is_tried_keeping_the_state_unless_measured_at_the_change_size(
        spark, warehouse, monkeypatch, at_size):
    """With no rescan for cost measured yet, the model favours one when the first run, discounted,
    estimates it cheaper (here: always). Scaled up from smaller steps (cost.FIXED_COST_ROWS here),
    the estimate may be wrong, so the rescan is tried: it builds the state as well, and when it
    loses (here: the margin is then out of reach) the next step is incremental without a
    rebuild. Measured at the change's size (cost.Estimate.at_size; FIXED_COST_ROWS lifted), it
    needs no try: the rescan runs for COST and keeps no state."""
    monkeypatch.setattr(cost, "FIRST_RUN_OVERSTATES", 1e9)
    if at_size:
        monkeypatch.setattr(cost, "FIXED_COST_ROWS", 1)
    engine, a = weighed(spark, warehouse)
    a.update("k = 1", {"v": "v + 1"})
    assert refreshed(engine)["t"].technique == "incremental"  # no incremental step seen yet
    a.update("k = 2", {"v": "v + 1"})
    reports = refreshed(engine)
    last = engine.table("t").ledger.last_committed()
    assert reports["t"].detail["estimate"]["at_size"] is at_size
    if at_size:
        assert_rescan(reports, "COST", "the state not kept")
        assert "one is tried" not in reports["t"].reason
        assert (last.detail["state"], last.state_versions) == (reasons.STATE_NOT_KEPT, {})
        return
    assert_rescan(reports, "COST", "one is tried")
    assert "state" not in last.detail and last.state_versions, last.detail
    monkeypatch.setattr(cost, "MARGIN", 1e9)
    a.update("k = 3", {"v": "v + 1"})
    assert refreshed(engine)["t"].technique == "incremental"  # measured now, and within the margin


def test_a_rescan_builds_an_aggregate_over_an_aggregate_from_the_lower_state(spark, warehouse, monkeypatch):
    """A rescan keeping the state (here a first run, then a full refresh) writes every aggregate's
    full state, lowest first. The upper aggregate's is planned over the lower one's as the lower
    write computes it (Context.full_state persists it once asked for twice), not over the source
    again; a table whose rows are its top aggregate's groups, through a top-k too, or a top-k of
    its integrated input, writes its output from that state, its SQL not run (change._from_state).
    The states and outputs so built keep the epochs after each rescan equal to the recompute."""
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, ROWS)
    engine = Engine(spark, root, parallelism=1, cost_model=False)
    engine.source("a")
    groups = "SELECT g, count(*) AS n, sum(v) AS s FROM a GROUP BY g"
    engine.define_all({"u": f"SELECT n, count(*) AS groups, sum(s) AS s FROM ({groups}) GROUP BY n",
                       "top": f"SELECT g, s FROM ({groups}) ORDER BY s DESC LIMIT 2",
                       "largest": "SELECT k, v FROM a WHERE v > 2 ORDER BY v DESC LIMIT 3"})

    def sql_not_run(*arguments):
        raise AssertionError("a rescan of a table read from its state ran its SQL")

    with monkeypatch.context() as patched:
        patched.setattr(engine_module, "output_frame", sql_not_run)
        assert {r.reason for r in engine.refresh()} == {"FIRST_RUN"}
        assert_matches_recompute(engine)
        a.insert([(10 + i, "w", i, "w") for i in range(4)])
        a.update("k = 1", {"g": "'w'"})
        assert {r.technique for r in refreshed(engine).values()} == {"incremental"}
        assert {r.technique for r in refreshed(engine, full_refresh=True).values()} == {"rescan"}
    a.delete("g = 'x'")
    assert {r.technique for r in refreshed(engine).values()} == {"incremental"}

    table = engine.table("u")
    inputs = {n: InputRange(n, engine.path_of(n), "source", v["from"], v["to"], engine.schema_of(n))
              for n, v in table.ledger.last_committed().inputs.items()}
    ctx = Context(spark, table.compiled.plan, inputs, StateStore(spark, f"{root}/unused", {}), rescan=True)
    ctx.build_states()
    try:
        lower, upper = ctx.state.writes
        leaves = upper.frame._jdf.queryExecution().optimizedPlan().collectLeaves()
        assert {leaves.apply(i).nodeName() for i in range(leaves.size())} == {"InMemoryRelation"}, \
            upper.frame._jdf.queryExecution().optimizedPlan().toString()
    finally:
        ctx.unpersist()


@pytest.mark.parametrize("path", ["driver", pytest.param("spark", marks=pytest.mark.long)])  # the Spark twin: make test-long
def test_a_rescan_replaces_a_table_no_other_reads_once_its_diffs_change_a_large_share(spark, warehouse, path,
                                                                                      monkeypatch):
    """With rescan_fraction at 0.5, every epoch that adds 1 to each of a's values rescans `p` (a
    projection of a no table reads) and `t` (read by `d`). Each diff changes every row (a share of
    1): from the next rescan on, `p` writes its result as the table's contents (cost.replaces),
    recording the commit's rows, until DIFF_AGAIN_AFTER replaces, when it diffs once more; `t`
    keeps diffing, so `d` reads an ordinary change. Every epoch equals the recompute, and the
    replace's change data feed, every old row deleted and every new one inserted, consolidates to
    the difference of the two versions, as a reader of the table's changes sees it. Diffs and
    replaces on the driver, or by Spark (`driver_rows` 0). (cost.REPLACE_ROWS lifted: the test's
    tables are a few rows.)"""
    monkeypatch.setattr(cost, "REPLACE_ROWS", 0)
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    a = SyntheticSource(spark, f"{root}/sources/a", SCHEMA, ROWS)
    engine = build(spark, root, rescan_fraction=0.5, **({"driver_rows": 0} if path == "spark" else {}))
    engine.define("p", "SELECT k, v FROM a WHERE v > 0")
    engine.refresh()
    seen = []
    for _ in range(cost.DIFF_AGAIN_AFTER + 2):
        a.update("true", {"v": "v + 1"})
        reports = refreshed(engine)
        assert (reports["p"].technique, reports["t"].technique) == ("rescan", "rescan"), reports
        p, t = (engine.table(name).ledger.last_committed() for name in ("p", "t"))
        assert "replaced" not in t.detail and t.detail["changed_share"] == 1.0, t.detail
        seen.append("replaced" if "replaced" in p.detail else p.detail["changed_share"])
        if "replaced" in p.detail:
            counts = [spark.read.format("delta").option("versionAsOf", v).load(engine.table("p").path).count()
                      for v in (p.output_version, p.output_version - 1)]
            assert [p.rows_inserted, p.rows_deleted] == counts == [10, 10], p
            _assert_feed_is_the_difference(spark, engine.table("p").path, p.output_version)
    assert seen == [1.0] + ["replaced"] * cost.DIFF_AGAIN_AFTER + [1.0], seen


def _assert_feed_is_the_difference(spark, path: str, version: int) -> None:
    from collections import Counter

    def rows(at: int) -> Counter:
        return Counter(tuple(r) for r in spark.read.format("delta").option("versionAsOf", at).load(path).collect())

    feed = Counter()
    for row in spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version) \
            .option("endingVersion", version).load(path).collect():
        weight = {"insert": 1, "delete": -1}[row["_change_type"]]
        feed[(row["k"], row["v"])] += weight
    difference = Counter(rows(version))
    difference.subtract(rows(version - 1))
    assert +feed == +difference and -feed == -difference, (feed, difference)
