"""The cost model's estimates (epochal/cost.py) over ledger histories. The model is a pure
function of the table's committed steps; its use by a real engine is in test_rescan.py."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal import reasons
from epochal.protocol import cost
from epochal.storage.ledger import COMMITTED, Step

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


def step(technique: str, seconds: float, rows: int = 0, reason: str = "", computed: bool = True) -> Step:
    phases = {"read changes": 0.1, **({"compute": seconds} if computed else {})}
    return Step(seq=0, status=COMMITTED, epoch="e", epoch_end=AT, technique=technique, reason=reason,
                rows_read=rows, seconds=seconds, detail={"phases": phases})


def test_no_estimate_without_a_step_of_each_kind():
    assert cost.estimate([], 10) is None
    assert cost.estimate([step("rescan", 3.0, reason="FIRST_RUN")], 10) is None
    assert cost.estimate([step("incremental", 1.0, 10)], 10) is None


def test_estimates_are_medians_and_scale_up_with_the_change_only():
    history = [step("rescan", 14.0, reason="FIRST_RUN"), step("rescan", 3.0, reason="REQUESTED"),
               step("rescan", 4.0, reason="REQUESTED"),
               step("incremental", 1.0, 100), step("incremental", 50.0, 100), step("incremental", 2.0, 100)]
    small = cost.estimate(history, 10)
    # the first run's 14 s count as 14 / FIRST_RUN_OVERSTATES = 10 s: the median rescan is 4 s
    assert (small.incremental, small.rescan, small.incremental_seen, small.rescan_seen) == (2.0, 4.0, 3, 3)
    assert not small.favours_rescan and not small.tries_rescan
    assert cost.estimate(history, 300).tries_rescan  # 6 s against 4 s, and no rescan for cost measured yet
    assert "one is tried" in cost.estimate(history, 300).describe()
    history.append(step("rescan", 4.0, reason="COST: estimated"))
    small = cost.estimate(history, 10)
    assert (small.rescan, small.rescan_seen, small.rescan_measured) == (4.0, 1, True)
    assert not small.favours_rescan
    large = cost.estimate(history, 400)  # 4x the rows of each past step
    assert large.incremental == pytest.approx(8.0) and large.favours_rescan and not large.tries_rescan


def test_a_first_run_counts_for_less_than_a_rescan_and_a_rescan_is_tried_only_past_the_margin():
    history = [step("rescan", 14.0, reason="FIRST_RUN"), step("incremental", 4.0, 100)]
    estimate = cost.estimate(history, 100)
    assert estimate.rescan == pytest.approx(14.0 / cost.FIRST_RUN_OVERSTATES)
    assert not estimate.favours_rescan  # 4 s against 10 s
    assert not cost.estimate(history, 300).favours_rescan  # 12 s: within the margin of 10 s
    assert cost.estimate(history, 350).tries_rescan  # 14 s
    history.append(step("rescan", 12.0, reason="COST: estimated"))  # measured: no more tries
    assert not cost.estimate(history, 350).favours_rescan


def test_steps_whose_change_consolidated_away_are_not_observations():
    history = [step("rescan", 2.0, reason="FIRST_RUN"), step("incremental", 8.0, 100),
               step("incremental", 0.1, 100, computed=False), step("incremental", 0.1, 100, computed=False)]
    assert cost.estimate(history, 100).incremental == 8.0


def test_margin_keeps_close_estimates_incremental():
    history = [step("rescan", 2.0, reason="COST: estimated"), step("incremental", 2.4, 100)]
    assert not cost.estimate(history, 100).favours_rescan
    assert cost.estimate(history, 110).favours_rescan


def test_explores_after_rescans_for_cost_in_a_row():
    costly = [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER)]
    history = [step("rescan", 2.0, reason="FIRST_RUN"), step("incremental", 8.0, 100)]
    assert cost.estimate(history + costly[:-1], 100).favours_rescan
    assert cost.estimate(history + costly, 100) is None
    assert cost.estimate(history + costly + [step("incremental", 8.0, 100)], 100).favours_rescan


def test_the_rebuild_after_rescans_for_cost_counts_as_one_and_the_next_step_explores():
    """Rescans for cost keep no state: the step that explores rebuilds it (a rescan whose reason
    says the state was not kept), and the step after that runs incrementally to be measured."""
    costly = [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER - 1)]
    rebuilt = step("rescan", 6.0, reason=f"STATE_MISSING: {reasons.NOT_KEPT}, which is to run incrementally")
    history = [step("rescan", 2.0, reason="FIRST_RUN"), step("incremental", 8.0, 100)]
    assert cost.estimate(history + costly + [rebuilt], 100) is None
    assert cost.estimate(history + costly + [rebuilt, step("incremental", 8.0, 100)], 100).favours_rescan


def test_the_step_after_a_rebuild_runs_incrementally_on_the_driver_whatever_its_rows():
    """Else the rebuild was for nothing: a change far past the give-up's floor still runs (under
    its budget); one that is Spark's, which no budget bounds, is weighed as any other."""
    history = [step("rescan", 7.0, reason="FIRST_RUN"), given_up(40_000, 6.0)]
    history += [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER - 2)]
    history.append(step("rescan", 6.0, reason=f"STATE_MISSING: {reasons.NOT_KEPT}, which is to run incrementally"))
    far = int(40_000 * (cost.EARLY + 1) * 2.0 / 6.0)
    assert cost.estimate(history, far, spark_path=False) is None
    assert cost.estimate(history, far, spark_path=False, read=False) is None
    assert cost.budget(history, far, None, spark_path=False) == pytest.approx(2.0)
    assert cost.estimate(history, far, spark_path=True).favours_rescan
    assert cost.estimate(history + [step("rescan", 2.0, reason="COST: estimated")], far, spark_path=False).favours_rescan


def test_a_rescan_for_cost_is_estimated_without_building_its_state_and_a_try_with_it():
    """A rescan for cost writes the output only; a try keeps the state, so it is expected to cost
    the whole of a past rescan and is taken only when that wins by the margin."""
    first = step("rescan", 9.0, reason="FIRST_RUN")
    first.detail["phases"]["write state"] = 6.0
    tried = cost.estimate([first, step("incremental", 9.0, 100)], 100)
    assert tried.rescan == pytest.approx(9.0 / cost.FIRST_RUN_OVERSTATES) and tried.tries_rescan
    assert "keeping the state" in tried.describe()
    assert not cost.estimate([first, step("incremental", 7.0, 100)], 100).favours_rescan  # 7 s against 6.4 s
    measured = step("rescan", 9.0, reason="COST: estimated")
    measured.detail["phases"]["write state"] = 6.0
    estimate = cost.estimate([first, step("incremental", 4.0, 100), measured], 100)
    assert estimate.rescan == pytest.approx(3.0) and estimate.favours_rescan


def test_a_rescan_favoured_by_a_step_measured_at_the_change_size_is_run_for_cost_not_tried():
    """A try insures against an estimate scaled up from smaller steps; one measured at this
    change's size (TPC-H Q2 at scale 10, a tenth of the orders changed: 23.3 s for 40,000 rows,
    the try after it 7.0 s against a 3.4 s recompute) rescans for cost, its state not kept."""
    history = [step("rescan", 14.0, reason="FIRST_RUN"), step("incremental", 23.3, 40_000)]
    measured = cost.estimate(history, 40_000)
    assert measured.favours_rescan and measured.at_size and not measured.tries_rescan
    assert "the state not kept" in measured.describe() and "one is tried" not in measured.describe()
    assert cost.estimate(history, 2 * 40_000).at_size
    scaled = cost.estimate(history, 3 * 40_000)  # scaled up from the step: tried
    assert scaled.favours_rescan and not scaled.at_size and scaled.tries_rescan
    few = [step("rescan", 1.4, reason="FIRST_RUN"), step("incremental", 5.0, 100)]
    assert cost.estimate(few, 100).tries_rescan  # below FIXED_COST_ROWS a slow step may be noise: tried
    two = history + [step("incremental", 20.0, 25_000)]  # each step it rests on must be near the change
    assert cost.estimate(two, 50_000).at_size and cost.estimate(two, 60_000).tries_rescan


def test_a_table_whose_step_costs_its_first_run_output_is_not_tried():
    """TPC-H Q11 at scale 1: a first run of 1.93 s, 0.88 s of it the state build, then a step of
    0.94 s. Over its output alone (0.75 s) the step passed the margin, and the try took 3.3 s."""
    first = step("rescan", 1.933, reason="FIRST_RUN")
    first.detail["phases"]["write state"] = 0.88
    assert not cost.estimate([first, step("incremental", 0.943, 40)], 40).favours_rescan


def read(technique: str, seconds: float, logged: int, rows: int, unread: bool = False) -> Step:
    """A step that recorded its inputs' logged rows: incremental, having read `rows`, or a rescan
    whose estimate was made on `rows` (read first, or expected, `unread`)."""
    made = step(technique, seconds, rows if technique == "incremental" else 0,
                reason="" if technique == "incremental" else "COST: estimated")
    made.detail["logged_rows"] = logged
    if technique == "rescan":
        made.detail["estimate"] = {"rows": rows, **({"unread": True} if unread else {})}
    return made


def test_shares_count_steps_that_read_their_change_before_rescanning_and_not_those_unread():
    history = [step("rescan", 5.0, reason="FIRST_RUN"), read("incremental", 0.1, 100, 110),
               read("rescan", 4.0, 1000, 1200), read("rescan", 3.0, 1000, 1100, unread=True)]
    assert cost.shares(history) == [1.1, 1.2]
    assert cost.expected_rows(cost.shares(history), 2000) == 2300


def test_the_margin_before_reading_is_the_shares_spread_and_early_until_two_tell_it():
    one = [step("rescan", 5.0, reason="FIRST_RUN"), read("incremental", 0.1, 100, 100)]
    assert cost.unread_margin(cost.shares(one)) == cost.EARLY
    steady = one + [read("rescan", 4.0, 1000, 1000)]
    assert cost.unread_margin(cost.shares(steady)) == pytest.approx(cost.MARGIN)
    varied = one + [read("incremental", 0.1, 100, 300), read("incremental", 0.1, 100, 200)]
    assert cost.unread_margin(cost.shares(varied)) == pytest.approx(cost.MARGIN * 2.0)  # median 2 over the least, 1
    wild = one + [read("incremental", 0.1, 100, 1000), read("incremental", 0.1, 100, 900)]
    assert cost.unread_margin(cost.shares(wild)) == cost.EARLY  # 9x spread: capped
    consolidated = one + [read("incremental", 0.1, 100, 0)]
    assert cost.unread_margin(cost.shares(consolidated)) == cost.EARLY
    # 1,000 logged rows expected to bring 1,000: 1 s scaled by 10 against a first run's 5 s / 1.4
    estimate = cost.estimate(steady, cost.expected_rows(cost.shares(steady), 10_000))
    assert estimate.incremental > cost.MARGIN * estimate.rescan and estimate.incremental < cost.EARLY * estimate.rescan
    assert cost.favours_rescan_unread(estimate, cost.unread_margin(cost.shares(steady)))
    assert not cost.favours_rescan_unread(estimate, cost.unread_margin(cost.shares(one)))


def phased(seconds: float, rows: int, **phases: float) -> Step:
    return Step(seq=0, status=COMMITTED, epoch="e", epoch_end=AT, technique="incremental", reason="",
                rows_read=rows, seconds=seconds, detail={"phases": {k.replace("_", " "): v for k, v in phases.items()}})


def test_only_the_phases_that_grow_with_the_change_are_scaled():
    """A step of 1 s of which 0.3 s read and computed its 100 rows: ten times the rows add
    nine times those 0.3 s, not nine times its commits and start."""
    history = [step("rescan", 50.0, reason="FIRST_RUN"),
               phased(1.0, 100, start=0.2, read_changes=0.1, compute=0.2, write_output=0.2, write_state=0.3)]
    assert cost.estimate(history, 1000).incremental == pytest.approx(1.0 + 0.3 * 9)
    assert cost.estimate(history, 50).incremental == pytest.approx(1.0)  # never down


def spark(made: Step, *inputs: str) -> Step:
    """`made`, recorded with the inputs whose change batch was Spark's (none: on the driver)."""
    made.detail["spark_changes"] = list(inputs)
    return made


def test_a_spark_path_step_is_estimated_from_steps_of_its_path_and_before_one_from_the_rescan():
    """Steps on the driver say nothing of Spark's path: before a step whose change batch was
    Spark's was measured, one is expected at SPARK_PATH_UNMEASURED times the rescan's output, and
    the rescan that wins is run for cost (no try, no state kept)."""
    first = step("rescan", 14.0, reason="FIRST_RUN")
    first.detail["phases"]["write state"] = 7.0  # the output: 7 s / 1.4 = 5 s
    history = [first, spark(phased(0.5, 100, compute=0.5))]
    assert not cost.estimate(history, 4000, spark_path=False).favours_rescan  # on the driver: 2 s
    spark_path = cost.estimate(history, 400, spark_path=True)
    assert (spark_path.incremental, spark_path.rescan) == (pytest.approx(cost.SPARK_PATH_UNMEASURED * 5.0),
                                                           pytest.approx(5.0))
    assert spark_path.favours_rescan and not spark_path.tries_rescan and not spark_path.path_measured
    assert "no step of the table was measured there yet" in spark_path.describe()
    assert "keeping the state" not in spark_path.describe()
    large = spark(phased(400.0, 2000, compute=400.0), "orders")  # the first Spark-path step: 0.2 s a row
    assert cost.estimate(history + [large], 4000, spark_path=True).incremental == pytest.approx(800.0)
    assert cost.estimate(history + [large], 4000, spark_path=False).incremental == pytest.approx(2.0)
    history.append(spark(phased(3.0, 800, compute=3.0), "orders"))
    measured = cost.estimate(history, 1000, spark_path=True)
    assert (measured.incremental, measured.incremental_seen, measured.path_measured) == (pytest.approx(3.75), 1, True)
    assert not measured.favours_rescan  # against a try at the first run's 10 s


def test_the_path_is_the_change_batches_not_the_rows_that_reached_the_plan():
    """A step of few rows whose batch was Spark's (most of a large change filtered out) is on
    Spark's path; a step recorded without `spark_changes` (an older ledger) by its rows against
    `driver_rows`."""
    assert cost.on_spark_path(spark(phased(1.0, 10), "orders"), driver_rows=500)
    assert not cost.on_spark_path(spark(phased(1.0, 10_000)), driver_rows=500)
    assert cost.on_spark_path(phased(1.0, 501), driver_rows=500)
    assert not cost.on_spark_path(phased(1.0, 500), driver_rows=500)


def test_shares_are_those_of_steps_that_changed_the_same_inputs_where_there_are_any():
    """An update of a line-item column the table does not read (share 0) says nothing of a change
    of orders and line items: with it among the shares the margin before reading would be EARLY."""
    def changing(made: Step, *names: str) -> Step:
        made.inputs = {n: {"from": 1, "to": 2 if n in names else 1} for n in ("orders", "lineitem")}
        return made

    history = [step("rescan", 5.0, reason="FIRST_RUN"),
               changing(read("incremental", 0.1, 100, 200), "orders", "lineitem"),
               changing(read("incremental", 0.1, 100, 0), "lineitem"),
               changing(read("incremental", 0.1, 100, 220), "orders", "lineitem")]
    both = frozenset({"orders", "lineitem"})
    assert cost.shares(history, both) == [2.0, 2.2]
    assert cost.unread_margin(cost.shares(history, both)) == pytest.approx(cost.MARGIN * 2.1 / 2.0)
    assert cost.unread_margin(cost.shares(history)) == cost.EARLY
    assert cost.shares(history, frozenset({"lineitem"})) == [0.0]
    assert cost.shares(history, frozenset({"orders"})) == [2.0, 0.0, 2.2]  # none alike: every step's


def test_a_larger_change_is_scaled_from_the_steps_of_the_most_rows():
    """A step of 10 rows is mostly fixed costs: scaled to 10,000 rows it says 1,000 s, where the
    step of 1,000 rows says 20 s."""
    history = [step("rescan", 50.0, reason="FIRST_RUN"), phased(1.0, 10, compute=1.0),
               phased(2.0, 1000, compute=2.0), phased(1.5, 600, compute=1.5)]
    found = cost.estimate(history, 10_000)
    assert (found.incremental, found.incremental_seen) == (pytest.approx((20.0 + 25.0) / 2), 2)


def test_a_change_on_the_driver_far_past_every_measured_step_is_measured_not_scaled():
    """One step of 4,000 rows scaled to 200,000 multiplies its fixed costs fiftyfold: past
    EXTRAPOLATE times the rows there is no estimate, so the step runs and is measured. A step of
    fewer than FIXED_COST_ROWS counts as that many here too. On Spark's path the estimate stands."""
    history = [step("rescan", 5.0, reason="FIRST_RUN"), spark(phased(0.6, 4000, compute=0.5))]
    assert cost.estimate(history, 4000 * cost.EXTRAPOLATE, spark_path=False).incremental == \
        pytest.approx(0.6 + 0.5 * (cost.EXTRAPOLATE - 1))
    assert cost.estimate(history, 4000 * cost.EXTRAPOLATE + 1, spark_path=False) is None
    few = [step("rescan", 5.0, reason="FIRST_RUN"), spark(phased(0.4, 40, compute=0.3))]
    assert cost.estimate(few, cost.FIXED_COST_ROWS * cost.EXTRAPOLATE, spark_path=False) is not None
    assert cost.estimate(few, cost.FIXED_COST_ROWS * cost.EXTRAPOLATE + 1, spark_path=False) is None
    on_spark = [step("rescan", 5.0, reason="FIRST_RUN"), spark(phased(0.4, 40, compute=0.3), "orders")]
    assert cost.estimate(on_spark, 4000, spark_path=True).favours_rescan


def test_a_step_of_few_rows_on_the_driver_is_scaled_from_fixed_cost_rows():
    """Below FIXED_COST_ROWS a step on the driver is its fixed costs: TPC-H Q14 at scale 0.1, a
    step of 1 change row (0.69 s, 0.38 s computing) scaled to 17 rows said 7.2 s and tried a
    rescan keeping the state at twice its recompute. Scaled from FIXED_COST_ROWS, 17 rows cost
    what the step cost, and EXTRAPOLATE times FIXED_COST_ROWS that many times its compute; on
    Spark's path the step's own rows."""
    history = [step("rescan", 7.0, reason="FIRST_RUN"), spark(phased(0.69, 1, start=0.31, compute=0.38))]
    assert cost.estimate(history, 17, spark_path=False).incremental == pytest.approx(0.69)
    assert not cost.estimate(history, 17, spark_path=False).favours_rescan
    assert cost.estimate(history, cost.EXTRAPOLATE * cost.FIXED_COST_ROWS, spark_path=False).incremental == \
        pytest.approx(0.69 + 0.38 * (cost.EXTRAPOLATE - 1))
    on_spark = [step("rescan", 7.0, reason="FIRST_RUN"), spark(phased(0.69, 1, start=0.31, compute=0.38), "orders")]
    assert cost.estimate(on_spark, 17, spark_path=True).incremental == pytest.approx(0.69 + 0.38 * 16)


def test_a_change_far_past_the_rescan_does_not_explore():
    """Exploring rebuilds the state the rescans for cost did not keep; on a change whose estimate
    is more than EARLY times the rescan's, incremental cannot win and the step rescans again."""
    costly = [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER)]
    history = [step("rescan", 2.0, reason="FIRST_RUN"), step("incremental", 8.0, 100)] + costly
    assert cost.estimate(history, 100) is None
    far = cost.estimate(history, 1_000)
    assert far is not None and far.favours_rescan and far.incremental > cost.EARLY * far.rescan


def test_an_unmeasured_spark_path_does_not_explore_and_a_driver_change_is_read_first():
    """A change that is Spark's, on a path no step measured, would cost SPARK_PATH_UNMEASURED
    times the rescan: no exploring there. A change the driver holds is read before deciding."""
    costly = [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER)]
    on_driver = step("incremental", 3.0, 100)
    on_driver.detail["spark_changes"] = []
    history = [step("rescan", 2.0, reason="FIRST_RUN"), on_driver] + costly
    spark = cost.estimate(history, 100, spark_path=True, read=False)
    assert spark is not None and not spark.path_measured and cost.favours_rescan_unread(spark, cost.MARGIN)
    assert cost.estimate(history, 4_000, spark_path=False, read=False) is None
    read = cost.estimate(history, 4_000, spark_path=False, read=True)  # 12 s against 2 s
    assert read is not None and read.incremental > cost.EARLY * read.rescan


def test_a_change_past_the_driver_right_after_the_first_run_rescans():
    """With no incremental step measured on any path, a change that is Spark's is expected to cost
    SPARK_PATH_UNMEASURED times the rescan; on the driver there is still no estimate (it is run,
    and measured)."""
    first = [step("rescan", 7.0, reason="FIRST_RUN")]
    on_spark = cost.estimate(first, 100_000, spark_path=True, read=False)
    assert on_spark is not None and not on_spark.path_measured and on_spark.favours_rescan
    assert on_spark.incremental == pytest.approx(cost.SPARK_PATH_UNMEASURED * on_spark.rescan)
    assert cost.estimate(first, 100_000, spark_path=False) is None
    assert cost.estimate(first, 100_000) is None


def _rescan(share: float | None = None, replaced: bool = False, reason: str = "COST: estimated",
            rows: int = cost.REPLACE_ROWS) -> Step:
    rescan = step("rescan", 2.0, reason=reason)
    rescan.rows_inserted, rescan.rows_deleted = rows // 2, rows - rows // 2
    if share is not None:
        rescan.detail["changed_share"] = share
    if replaced:
        rescan.detail["replaced"] = "the table's last rescans changed a large share of its rows"
    return rescan


def test_a_rescan_replaces_after_a_diff_of_a_large_share_and_diffs_again_to_follow_the_share():
    first = [step("rescan", 3.0, reason="FIRST_RUN"), step("incremental", 1.0, 10)]
    assert not cost.replaces([step("rescan", 3.0, reason="FIRST_RUN")])  # a first run says nothing of a diff
    assert cost.replaces(first + [_rescan(cost.REPLACE_SHARE)])
    assert not cost.replaces(first + [_rescan(cost.REPLACE_SHARE / 2)])
    assert not cost.replaces(first + [_rescan(1.0, rows=cost.REPLACE_ROWS - 1)])  # a small table: diffs cost little
    replaced = [_rescan(replaced=True) for _ in range(cost.DIFF_AGAIN_AFTER)]
    assert cost.replaces(first + [_rescan(0.4)] + replaced[:-1])
    assert not cost.replaces(first + [_rescan(0.4)] + replaced)  # the next diffs, and measures the share anew
    assert not cost.replaces(first + [_rescan(0.4)] + replaced + [_rescan(0.1)])


def test_an_incremental_step_since_the_large_diff_ends_the_replaces():
    history = [step("rescan", 3.0, reason="FIRST_RUN"), _rescan(0.9), step("incremental", 1.0, 10)]
    assert not cost.replaces(history)
    # a step whose change consolidated away computed nothing, and does not end them
    assert cost.replaces(history[:-1] + [step("incremental", 0.2, 0, computed=False)])


def _unreadable(made: Step) -> Step:
    """`made` as a ledger record whose JSON columns would fail to parse: a step the model must
    not look into."""
    record = made.to_record()
    record.update(inputs="{unreadable", state_versions="{unreadable", detail="{unreadable")
    return Step.from_record(record)


def test_a_long_ledger_is_weighed_from_its_newest_steps_without_parsing_the_rest():
    """A table refreshed hourly holds 17,520 records after a year; the model weighs its last few
    steps, so the older records' JSON is never parsed (ledger._JsonText)."""
    both = frozenset({"orders", "lineitem"})
    recent = [read("rescan", 4.0, 1000, 1100) for _ in range(cost.RESCAN_SEEN)]
    recent += [read("incremental", 0.5, 100, 110 + n) for n in range(cost.INCREMENTAL_SEEN)]
    for made in recent:
        made.inputs = {name: {"from": 1, "to": 2} for name in both}
    old = [_unreadable(read("incremental", 9.0, 100, 500)) for _ in range(2_000)]
    assert cost.estimate(old + recent, 120) == cost.estimate(recent, 120)
    assert cost.shares(old + recent, both) == cost.shares(recent, both)
    assert cost.replaces(old + recent) == cost.replaces(recent) is False
    with pytest.raises(ValueError):
        old[0].detail  # noqa: B018 (what the model did not do)


def _reference_shares(history: list, changed: frozenset[str] | None = None) -> list[float]:
    """`cost.shares` as its docstring defines it, over every step."""
    found = []
    for s in history:
        logged, estimate = s.detail.get("logged_rows"), s.detail.get("estimate") or {}
        if not logged or "phases" not in s.detail:
            continue
        if s.technique == "incremental":
            found.append((cost.changed_inputs(s), s.rows_read / logged))
        elif s.technique == "rescan" and "rows" in estimate and not estimate.get("unread"):
            found.append((cost.changed_inputs(s), estimate["rows"] / logged))
    alike = [share for inputs, share in found if inputs == changed]
    return (alike or [share for _, share in found])[-cost.INCREMENTAL_SEEN:]


_SOURCES = ("orders", "lineitem", "part")


@st.composite
def _histories(draw) -> list[Step]:
    history = []
    for _ in range(draw(st.integers(0, 14))):
        technique = draw(st.sampled_from(["incremental", "rescan", "noop"]))
        made = read(technique if technique != "noop" else "incremental", 1.0, draw(st.integers(0, 50)),
                    draw(st.integers(0, 60)), unread=draw(st.booleans()))
        made.technique = technique
        changed = draw(st.sets(st.sampled_from(_SOURCES)))
        made.inputs = {name: {"from": 1, "to": 2 if name in changed else 1} for name in _SOURCES}
        history.append(made)
    return history


@given(history=_histories(), changed=st.none() | st.sets(st.sampled_from(_SOURCES)).map(frozenset))
@settings(max_examples=200, deadline=None)
def test_shares_searched_from_the_newest_step_back_are_those_over_every_step(history, changed):
    assert cost.shares(history, changed) == _reference_shares(history, changed)


def given_up(rows: int, seconds: float) -> Step:
    """The rescan for cost an incremental step past its budget gave up for (epoch._over_budget)."""
    made = step("rescan", 2.0, reason="COST: an incremental step ... was given up")
    made.detail.update({"estimate": {"rows": rows}, "gave_up": {"rows": rows, "seconds": seconds, "budget": 2.0}})
    return made


def test_a_step_on_the_driver_past_fixed_cost_rows_has_a_budget_of_a_rescan():
    """Ski rental: a step of a table without state runs as long as a rescan is expected to take
    (its output, a first run's discounted), or MARGIN times its own estimate where that is more; a
    small change, a change that is Spark's, and a table with no rescan yet have none."""
    first = [step("rescan", 7.0, reason="FIRST_RUN")]
    rows = cost.EXTRAPOLATE * cost.FIXED_COST_ROWS + 1
    assert cost.budget(first, rows, None, spark_path=False) == pytest.approx(cost.BUDGET * 7.0 / cost.FIRST_RUN_OVERSTATES)
    assert cost.budget(first, rows - 1, None, spark_path=False) is None
    assert cost.budget(first, rows, None, spark_path=True) is None
    assert cost.budget([], rows, None, spark_path=False) is None
    history = first + [step("rescan", 3.0, reason="COST: estimated"), step("incremental", 2.8, 3000)]
    found = cost.estimate(history, rows, spark_path=False)
    assert not found.favours_rescan
    assert cost.budget(history, rows, found, spark_path=False) == pytest.approx(cost.MARGIN * found.incremental)


def test_a_budget_counts_the_state_rebuild_that_giving_up_costs():
    """A rescan for cost keeps no state: the way back to incremental steps rebuilds it, so giving
    up costs that rebuild too (the median of the last rescans that wrote the state, a first run's
    discounted); a table without state has none to rebuild."""
    rows = cost.EXTRAPOLATE * cost.FIXED_COST_ROWS + 1
    first = step("rescan", 14.0, reason="FIRST_RUN")
    first.state_versions = {"join": 0}
    output = 14.0 / cost.FIRST_RUN_OVERSTATES
    assert cost.budget([first], rows, None, spark_path=False) == pytest.approx(cost.BUDGET * 2 * output)
    for_cost = step("rescan", 3.0, reason="COST: estimated")  # no state: not a rebuild
    rebuilt = step("rescan", 8.0, reason=f"STATE_MISSING: {reasons.NOT_KEPT}, which is to run incrementally")
    rebuilt.state_versions = {"join": 4}
    history = [first, for_cost, rebuilt]
    # the rescan: the one for cost (3 s); the rebuild: the median of 10 s and 8 s
    assert cost.budget(history, rows, None, spark_path=False) == pytest.approx(cost.BUDGET * (3.0 + 9.0))
    stateless = step("rescan", 14.0, reason="FIRST_RUN")
    assert cost.budget([stateless], rows, None, spark_path=False) == pytest.approx(cost.BUDGET * output)


def test_a_step_given_up_is_a_floor_and_a_change_of_its_rows_rescans_until_it_explores():
    """Given up at 40,000 rows after 6 s, a change of as many rows rescans for cost, and explores
    after EXPLORE_AFTER rescans where the floor is within EARLY of a rescan (its try under the
    budget again), not past it; a smaller one is estimated at the floor scaled down (and runs under
    its budget); a step that finished on at least its rows, or on fewer at a lower cost a row,
    ends it, as do GIVE_UP_HELD steps after it."""
    history = [step("rescan", 7.0, reason="FIRST_RUN"), given_up(40_000, 6.0)]
    same = cost.estimate(history, 40_000, spark_path=False)
    assert same.past_given_up and same.favours_rescan and same.incremental == pytest.approx(6.0)
    assert "one of 40000 rows given up past its budget" in same.describe()
    smaller = cost.estimate(history, 10_000, spark_path=False)
    assert smaller.incremental == pytest.approx(1.5) and not smaller.past_given_up and not smaller.favours_rescan
    history += [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.EXPLORE_AFTER)]
    assert cost.estimate(history, 40_000, spark_path=False) is None  # 6 s against 2 s: within EARLY
    assert cost.estimate(history, 10_000, spark_path=False) is None
    far = int(40_000 * (cost.EARLY + 1) * 2.0 / 6.0)
    assert cost.estimate(history, far, spark_path=False).favours_rescan  # the floor scaled past EARLY
    assert cost.estimate(history, 40_000, spark_path=True).given_up_rows == 0  # the give-up was on the driver
    measured = history + [phased(1.0, 40_000, compute=0.8)]
    assert cost.estimate(measured, 40_000, spark_path=False).given_up_rows == 0
    smaller_since = history + [phased(2.0, 10_000, compute=1.8)]  # dearer a row than the step given up
    assert cost.estimate(smaller_since, 40_000, spark_path=False).past_given_up
    cheaper_since = history + [phased(1.0, 10_000, compute=0.8)]  # the step given up was slowed
    assert cost.estimate(cheaper_since, 40_000, spark_path=False).given_up_rows == 0
    aged = history + [step("rescan", 2.0, reason="COST: estimated") for _ in range(cost.GIVE_UP_HELD)]
    assert cost.estimate(aged, 40_000, spark_path=False) is None
