"""The cost model: whether an incremental step or a rescan is the cheaper way to apply an epoch,
estimated from the table's own ledger (the seconds of its past steps of each kind and the change
rows they processed) and the change rows this step read.

The decision is taken after the step has read its change batches (`Context.read_changes`, shared
by the epoch's steps and cheap for a small change): a change that consolidates away never asks,
and the change rows that reach the plan are known rather than guessed from commit metrics. Only a
change large enough for a rescan to win by far is decided before it is read ("Before reading",
below). A rescan chosen here has
the reason COST with both estimates. Strict tables never rescan for cost; `Engine(cost_model=False)`
turns the model off.

Estimates, each a median so that one step slowed by a busy machine does not decide:
- incremental: the last INCREMENTAL_SEEN incremental steps that computed a change (a step whose
  change consolidated away says nothing of the cost of one that does not), each scaled up by this
  change's rows relative to its own (never down: fixed costs dominate small changes). Only the
  phases that grow with the change rows are scaled (reading the change and computing it, `SCALED`);
  the rest of a past step (its start, the output's and the state's commits, its figures) is taken
  as measured, and only the steps of the most rows among them (at least half the largest's) are
  scaled, their compute being the least made of fixed costs: scaling a step of a few rows whole
  made a change of a hundred times the rows cost a hundred times its fixed costs (TPC-H Q6 at
  scale 1, a tenth of the orders changed: 26.8 s estimated for a step that reads 28,711 rows on
  the driver, bench/RESULTS.md).
- the path: a change batch the driver holds (at most `driver_rows` change-feed rows, twice its
  commits' logged rows, as keyed.shared_reads reads it) is computed on the driver by key; one it
  does not is Spark's, joined with every operator's whole state. Steps on the driver say nothing
  of the Spark path's cost (they grew linearly on the driver, and then, at the first step past
  it, up to 265 times for 10 times the rows: TPC-H at scale 10, 1% of the orders changed,
  bench/RESULTS.md). Each incremental step records the inputs whose batch was Spark's
  (`spark_changes`), and a step is estimated from past steps of its own path (`on_spark_path`);
  the path is told by the batches, not by the rows that reached the plan: at scale 1, a tenth of
  TPC-H's orders changed logs 450,000 rows of orders, Spark's to read, of which 92,546 change
  rows reached Q22's plan, well within `driver_rows` (estimated at 2.9 s from its steps on the
  driver, the step took 29.6 s against a 9.5 s recompute). Before a Spark-path step was
  measured (also before any incremental step: a tenth of TPC-H's orders changed at scale 1 right
  after the first run, run incrementally by every table, took the epoch four times its recompute,
  bench/RESULTS.md), one is expected to cost at least SPARK_PATH_UNMEASURED times a rescan for cost
  (measured: 0.8 to 13 times the recompute, 6 in the median), and the rescan that wins is not
  tried but run for cost (no state kept): the state such a step would have kept is what a
  Spark-path step reads in full, and rebuilding it when a small change comes is a rescan's cost
  once, where keeping it costs one in every large epoch.
- few rows: a step on the driver of fewer than FIXED_COST_ROWS change rows is scaled as if it had
  read that many. Below it a step's compute is its fixed costs whatever its rows (TPC-H at scale
  0.1, from 300 to 30,000 change rows, most tables' compute stayed within a few tenths of a
  second; at scale 1 the costliest per row, Q2, grew from 1.1 s at 400 rows to 3.4 s at 4,000,
  bench/RESULTS.md), and one step of 17 change rows scaled from a step of 1 estimated 7.2 s and
  tried a rescan keeping the state (Q14, twice its recompute). On Spark's path no floor holds.
- how far: a change on the driver of more than EXTRAPOLATE times the rows of every measured step
  gets no estimate, and runs incrementally (so it is measured). Scaled from a step of few rows,
  its fixed costs would be multiplied with the rows: TPC-H Q2 at scale 1, one step of a few dozen
  rows, was estimated at 28.2 s for 4,000 rows and tried a rescan keeping the state (7.9 s against
  a 3.2 s recompute, `python -m bench.cost_rescans 1`), where a step on the driver of 4,000 rows
  costs a fraction of a second. On the driver the measurement runs under a budget (below); on
  Spark's path, where steps grew far past linearly, the estimate stands. The rows of a step below
  FIXED_COST_ROWS count as FIXED_COST_ROWS here too.
  On the driver, steps grow far less than linearly with their rows: at scale 0.1, ten times the
  change rows (0.1% to 1% of orders) took TPC-H Q3 0.66 s to 0.84 s, Q5 0.56 s to 0.62 s, where
  the scaled estimates said 4.0 s and 8.0 s; at scale 1 Q2 took three times as long for ten times
  the rows. Twenty times was the bound while first runs overstated the rescan estimate enough to
  hide that; once a first run cost about its recompute (its output read from its state), four
  tables tried rescans at 1% and lost (bench/RESULTS.md, first runs from the state). Hence four.
- rescan: the last RESCAN_SEEN rescans for cost (they write the output only, epoch._weigh); before
  the first, the last rescans of any kind, first run included, without the seconds they spent
  building the state. A first run overstates a rescan for cost: it runs cold, beside every other
  table's first run, and writes the whole table. Its seconds are divided by FIRST_RUN_OVERSTATES,
  measured: a first run's output seconds against a later rescan's of the same table, one step at
  a time (`python -m bench.rescan_costs 1 --queries 22 3 5 6 7`) and in the scale-1 bench
  (bench/RESULTS.md, cost model). While no rescan for cost was measured,
  a rescan the estimates favour is only tried: it keeps the state, in case it loses, and so costs
  a state build besides. Its estimate therefore includes the state build (a try is taken only
  when it is expected to win in its own epoch), and the margin below holds for it too: with
  tries at half the first run's seconds, most lost in that bench; with the margin over the output
  alone, a table whose incremental step was as cheap as its first run's output (TPC-H Q11 at
  scale 1) was tried, and the try cost three times the step. A try insures against an estimate
  scaled up from smaller steps, whose fixed costs the scaling multiplies (the tries that lost
  above). An estimate measured at this change's size (`at_size`: at least FIXED_COST_ROWS rows,
  within MEASURED_NEAR times the rows of every step it rests on) needs no insurance, and the
  rescan it favours is run for cost, its state not kept: at a tenth of TPC-H's orders changed at
  scale 10, Q2's step of 40,000 rows took 23.3 s against a 3.4 s recompute, and the try after it,
  on the same change, took 7.0 s, 2.8 s of it the state build (`python -m bench.cost_rescans 10`).

Budget: a step on the driver of more than EXTRAPOLATE times FIXED_COST_ROWS change rows runs only
as long as giving it up is expected to cost (`budget`: BUDGET times a rescan's output seconds and
the state's rebuild, or MARGIN times the step's own estimate where that is more), and is then
given up for a rescan for cost. It is the rent-or-buy rule of the ski-rental problem (Karlin,
Manasse, Rudolph and Sleator, "Competitive snoopy caching"): an exploring step costs at most about
twice what giving it up costs, whatever the step would have cost. Being held on the driver does not
bound a step's cost: at a tenth of TPC-H's orders changed at scale 10, Q2's first step, of 40,000
rows, took five times its recompute (bench/RESULTS.md). Giving up costs more than the rescan that
follows: a rescan for cost keeps no state, so the table's way back to incremental steps is a
rebuild of it (`_rebuild_seconds`). With the rescan alone as the budget, a day at scale 10 gave up
TPC-H Q7 past 18.9 s, rescanned it in 32.7 s and rebuilt its state in 28.0 s the next epoch, where
its steps took 6.7 s in the median (bench/RESULTS.md). The seconds a step spends making local
copies (keyed.local_copies, `making_seconds`) do not count against it: they fill a cache for the
epochs after it, which a rescan would not make unneeded. In the same day, the first hourly epoch
made ten copies, and Q3, given up past 16.6 s, rescanned for three epochs where its steps took 2.7 s
in the median after. The step checks its budget as each node's change begins and ends
(`Context.budget`), so it overruns by at most one node's own work, and nothing is written by then.
Its rows and seconds (`gave_up`, in the rescan's detail) are a floor, scaled linearly with the
rows, for the estimates of the next GIVE_UP_HELD steps that compute anything (a day of hourly
epochs), until a step finishes on at least its rows, or on fewer at a lower cost a row; a change
of at least its rows rescans for cost. It explores as any rescans for cost do (after EXPLORE_AFTER in a row, within EARLY), each
try under its budget again: a step slowed once (a busy machine, its local copies evicted) must not
hold a table at rescans for a day of epochs whose steps would have cost a fraction of one (the
day at scale 10, Q5, bench/RESULTS.md).

A rescan is chosen when the incremental estimate exceeds the rescan's by MARGIN, so noise does not
make a table flap between techniques. After EXPLORE_AFTER rescans for cost in a row, one step runs
incrementally again, so the incremental estimate follows the table as it changes (a rescan for
cost keeps no state, so that step first rebuilds it, and the step after it is the one measured:
on the driver, under its budget, it runs incrementally whatever its change's rows, or the rebuild
was for nothing; at scale 10, TPC-H Q3's rebuild was thrown away by a next change larger than the
one given up, bench/RESULTS.md).
It explores only where incremental could win (`explores`): a change the driver holds is read and
its rows decide; past that, the estimate must be on a measured path and within EARLY of the
rescan's, else the step rescans for cost again and explores on a later, smaller change.

Before reading: a large change costs its step a read of the change batches (Spark's, past
`driver_rows`) that a rescan then does not use; at a tenth of TPC-H's orders changed, that read was
a third of each rescan for cost (`python -m bench.cost_rescans 1`). So the step first weighs the
rows its inputs' commits logged (their metrics: rows inserted, updated and deleted, `logged`),
times the share of logged rows that reached the plan in its recent steps that read their change
(`shares`, `expected_rows`: updates of columns a table does not read, and rows its filters drop, do
not), those that changed the same inputs where there are any (`changed_inputs`: in the benchmark's
sweep, an update of a line-item column no query reads, a share of 0 between changes of orders and
line items, kept every 10% change from being decided unread). A rescan is chosen then, unread, when
the incremental estimate exceeds the rescan's by MARGIN times the recent shares' spread
(`unread_margin`: the median share over the smallest), so that the decision after reading would
have been the same unless this change's share falls below every recent one. Fewer than two shares,
or one of 0, say nothing of the spread: the estimate must then exceed the rescan's by EARLY, far
past MARGIN; anything closer is weighed again once the change is read. The path is known before
reading, whatever the share (each input's logged rows against `driver_rows`): before a step of
it was measured, a change that is Spark's rescans unread past MARGIN alone. A step that read its
change and then rescanned for cost is a share too (its estimate holds the rows it read): without it, a table
whose large changes all rescan would keep the one share of its last small change, and read each
large one first. A table whose large changes stop reaching its plan (they update a column it does
not read, say) rescans for cost on its past share until EXPLORE_AFTER of them, then reads the
change once more (the exploring step), which measures the share anew.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ..reasons import COST, NOT_KEPT, STATE_MISSING

INCREMENTAL_SEEN = 5
SCALED = ("read changes", "compute")
SPARK_PATH_UNMEASURED = 2.0
FIXED_COST_ROWS = 1_000
EXTRAPOLATE = 4
RESCAN_SEEN = 3
MARGIN = 1.25
EARLY = 4.0
EXPLORE_AFTER = 4
FIRST_RUN_OVERSTATES = 1.4
MEASURED_NEAR = 2.0
REPLACE_SHARE = 0.25
REPLACE_ROWS = 100_000
DIFF_AGAIN_AFTER = 4
BUDGET = 1.0
GIVE_UP_HELD = 24


@dataclass(frozen=True)
class Estimate:
    """Seconds each technique is expected to take for this step, and how many past steps each
    estimate rests on."""

    incremental: float
    rescan: float
    incremental_seen: int
    rescan_seen: int
    rows: int
    rescan_measured: bool = True  # rests on rescans for cost; else on past rescans, state build included
    path_measured: bool = True  # False: past `driver_rows` with no step measured past it (SPARK_PATH_UNMEASURED)
    at_size: bool = False  # the incremental estimate was measured at this change's size, not scaled up to it
    given_up_rows: int = 0  # rests on a step given up at that many rows (`budget`), not on one that finished

    @property
    def past_given_up(self) -> bool:
        """A step of at least this change's rows was given up, past its budget: it rescans until it
        explores (`explores`)."""
        return 0 < self.given_up_rows <= self.rows

    @property
    def favours_rescan(self) -> bool:
        return self.incremental > MARGIN * self.rescan or self.past_given_up

    @property
    def tries_rescan(self) -> bool:
        """A rescan is favoured but none for cost was measured yet, and the incremental estimate
        rests on steps of its own path, scaled up to this change: it is tried, keeping the state."""
        return self.favours_rescan and not self.rescan_measured and self.path_measured and not self.at_size

    def as_dict(self) -> dict:
        return {name: round(value, 3) if isinstance(value, float) else value for name, value in asdict(self).items()}

    def describe(self, choice: str = "rescanning") -> str:
        if self.tries_rescan and choice == "rescanning":
            choice = "no rescan for cost was measured yet, so one is tried"
        basis = (f"from {self.incremental_seen} past step(s)"
                 + (f" and one of {self.given_up_rows} rows given up past its budget" if self.given_up_rows else "")
                 if self.path_measured else
                 f"at least {SPARK_PATH_UNMEASURED:g}x the rescan: a change batch past driver_rows is Spark's to "
                 "compute, and no step of the table was measured there yet")
        if self.at_size and not self.rescan_measured and choice == "rescanning":
            choice = "rescanning, the state not kept: the incremental estimate was measured at this change's size"
        if self.rescan_measured or not self.path_measured:
            rescan = "at"
        else:
            rescan = "with its state build at" if self.at_size else "keeping the state at"
        return (f"an incremental step of {self.rows} change rows is estimated at {self.incremental:.1f} s "
                f"({basis}), a rescan {rescan} {self.rescan:.1f} s (from {self.rescan_seen} past rescan(s)); {choice}")


def _computed(step) -> bool:
    return step.technique == "incremental" and step.rows_read > 0 and "compute" in (step.detail or {}).get("phases", {})


def _for_cost(step) -> bool:
    """A rescan for cost, or the rescan that rebuilt the state they did not keep."""
    return step.technique == "rescan" and step.reason.startswith(COST) or _rebuilt(step)


def estimate(history: list, rows: int, spark_path: bool | None = None, driver_rows: int = 0,
             read: bool = True) -> Estimate | None:
    """The estimate for a step reading `rows` change rows, from `history` (the table's committed
    steps, oldest first); None when the history holds no step of one of the kinds, when this step
    explores (`explores`), or when a change on the driver is more than EXTRAPOLATE times the rows
    of every step measured there. With `spark_path` (whether a change batch of the step is
    Spark's), it is estimated from the steps of its path (above; `driver_rows` tells the path of
    steps recorded without it). `read`: whether the step has read its change (else `rows` is
    expected, and the step weighs whether to read it)."""
    recent = _last(history, _working, EXPLORE_AFTER)
    if recent and _rebuilt(recent[-1]) and spark_path is False:
        return None
    found = _estimate(history, rows, spark_path, driver_rows)
    if len(recent) == EXPLORE_AFTER and all(_for_cost(s) for s in recent) and explores(found, spark_path, read):
        return None
    return found


def _rebuilt(step) -> bool:
    """Whether `step` rebuilt the state that rescans for cost did not keep: an exploring step's
    first half, whose second, the step after it, is the one measured."""
    return step.technique == "rescan" and step.reason.startswith(f"{STATE_MISSING}: {NOT_KEPT}")


def _working(step) -> bool:
    """Whether `step` tells what a step costs: an incremental step that computed a change, or a rescan."""
    return step.technique == "rescan" or _computed(step)


def _last(history: list, wanted, count: int) -> list:
    """The last `count` steps of `history` that are `wanted`, oldest first. Searched from the newest
    back, so that a long ledger's old records, which the model never weighs, are not parsed
    (ledger._JsonText): a year of hourly steps is 17,520 records."""
    found = []
    for step in reversed(history):
        if len(found) == count:
            break
        if wanted(step):
            found.append(step)
    return found[::-1]


def explores(found: Estimate | None, spark_path: bool | None, read: bool) -> bool:
    """Whether a step due to explore (the last EXPLORE_AFTER steps that computed anything were
    rescans for cost) does. Exploring costs a rebuild of the state the rescans did not keep, and
    a step whose change is Spark's costs a read of it first; it is worth that when incremental
    could win: on a measured path, with the estimate within EARLY of the rescan's. So a change
    on the driver is read (its rows then decide), and a step whose change is Spark's explores only
    within EARLY: at a tenth of TPC-H's orders changed at scale 10, every table explored in one
    epoch, and the epoch took twice its recompute (bench/RESULTS.md)."""
    if found is None:
        return True
    if not read and spark_path is False:
        return True
    return found.path_measured and found.incremental <= EARLY * found.rescan


def _estimate(history: list, rows: int, spark_path: bool | None, driver_rows: int) -> Estimate | None:
    computed = _last(history, _computed, INCREMENTAL_SEEN)
    on_path = computed if spark_path is None else \
        _last(history, lambda s: _computed(s) and on_spark_path(s, driver_rows) == spark_path, INCREMENTAL_SEEN)
    incremental = on_path or computed
    for_cost, rescans = _rescans(history)
    if spark_path and not computed and rescans:  # no incremental step measured on any path
        output = _rescan_output_seconds(rescans)
        return Estimate(SPARK_PATH_UNMEASURED * output, output, 0, len(rescans), rows, bool(for_cost),
                        path_measured=False)
    if not rescans:
        return None
    given_up = _given_up(history) if spark_path is False else None
    floor = given_up["seconds"] * rows / max(1, given_up["rows"]) if given_up else 0.0
    given_up_rows = given_up["rows"] if given_up else 0
    output = _rescan_output_seconds(rescans)
    rescan = output if for_cost else statistics.median(_rescan_seconds(s, keeps_state=True) for s in rescans)
    largest = max((s.rows_read for s in incremental), default=0)
    if not incremental or (spark_path is False and on_path and rows > EXTRAPOLATE * max(largest, FIXED_COST_ROWS)):
        if given_up is None:
            return None
        return Estimate(floor, rescan, 0, len(rescans), rows, bool(for_cost), given_up_rows=given_up_rows)
    incremental = [s for s in incremental if 2 * s.rows_read >= largest]
    scaled = max(floor, statistics.median(_scaled(s, rows, on_spark_path(s, driver_rows)) for s in incremental))
    if spark_path and not on_path:
        return Estimate(max(scaled, SPARK_PATH_UNMEASURED * output), output, len(incremental), len(rescans), rows,
                        bool(for_cost), path_measured=False)
    return Estimate(scaled, rescan, len(incremental), len(rescans), rows, bool(for_cost),
                    at_size=_at_size(incremental, rows), given_up_rows=given_up_rows)


def _rescans(history: list) -> tuple[list, list]:
    """The last RESCAN_SEEN rescans for cost, and the rescans an estimate rests on: those, or before
    the first of them the last rescans of any kind."""
    for_cost = _last(history, lambda s: s.technique == "rescan" and s.reason.startswith(COST), RESCAN_SEEN)
    return for_cost, for_cost or _last(history, lambda s: s.technique == "rescan", RESCAN_SEEN)


def budget(history: list, rows: int, found: Estimate | None, spark_path: bool) -> float | None:
    """The seconds an incremental step of `rows` change rows on the driver may run, not counting
    the local copies it makes, before it gives up for a rescan for cost (the module's docstring,
    "Budget"): BUDGET times what giving up costs (a rescan's estimate, and the state's rebuild on the
    way back, `_rebuild_seconds`), or MARGIN times the step's own estimate where that is more; None
    on Spark's path, for a change of at most EXTRAPOLATE times FIXED_COST_ROWS, or before any rescan."""
    if spark_path or rows <= EXTRAPOLATE * FIXED_COST_ROWS:
        return None
    _, rescans = _rescans(history)
    if not rescans:
        return None
    given_up = _rescan_output_seconds(rescans) + _rebuild_seconds(history)
    return max(BUDGET * given_up, MARGIN * found.incremental if found is not None else 0.0)


def _rebuild_seconds(history: list) -> float:
    """What rebuilding the state costs a table that comes back from rescans for cost (which keep
    none): the median of its last RESCAN_SEEN rescans that wrote the state, their whole seconds (a
    first run's divided by FIRST_RUN_OVERSTATES); 0 for a table without state."""
    wrote = _last(history, lambda s: s.technique == "rescan" and bool(s.state_versions), RESCAN_SEEN)
    return statistics.median(_rescan_seconds(s, keeps_state=True) for s in wrote) if wrote else 0.0


def _given_up(history: list) -> dict | None:
    """The newest step given up past its budget (its `gave_up`: rows and seconds) among the last
    GIVE_UP_HELD steps that computed anything, unless a step that finished after it refutes it:
    one on at least its rows, or one cheaper a row than it (steps grow less than linearly with
    their rows, so a smaller step cheaper a row says the step given up was slowed, not large)."""
    finished = []
    for step in reversed(_last(history, _working, GIVE_UP_HELD)):
        gave_up = (step.detail or {}).get("gave_up")
        if gave_up and not any(rows >= gave_up["rows"] or seconds * gave_up["rows"] < gave_up["seconds"] * rows
                               for rows, seconds in finished):
            return gave_up
        if _computed(step):
            finished.append((step.rows_read, step.seconds))
    return None


def _at_size(incremental: list, rows: int) -> bool:
    """Whether a change of `rows` is measured by the `incremental` steps its estimate rests on,
    not scaled up from them (the module's docstring, on tries)."""
    return rows >= FIXED_COST_ROWS and rows <= MEASURED_NEAR * min(s.rows_read for s in incremental)


def on_spark_path(step, driver_rows: int) -> bool:
    """Whether a change batch of `step` was Spark's (its `spark_changes`); for a step recorded
    without them, whether it read more than `driver_rows` rows."""
    detail = step.detail or {}
    return bool(detail["spark_changes"]) if "spark_changes" in detail else step.rows_read > driver_rows


def _scaled(step, rows: int, spark_path: bool) -> float:
    """A past incremental step's seconds for a change of `rows` rows: its SCALED phases scaled by
    the rows relative to its own (at least FIXED_COST_ROWS on the driver), never down."""
    phases = (step.detail or {}).get("phases") or {}
    grows = min(step.seconds, sum(phases.get(name, 0.0) for name in SCALED))
    measured = step.rows_read if spark_path else max(step.rows_read, FIXED_COST_ROWS)
    return step.seconds + grows * (max(1.0, rows / measured) - 1.0)


def changed_inputs(step) -> frozenset[str]:
    """The inputs whose versions moved in `step` (its ledger record of their ranges)."""
    return frozenset(name for name, versions in (step.inputs or {}).items() if versions.get("from") != versions.get("to"))


def shares(history: list, changed: frozenset[str] | None = None) -> list[float]:
    """The share of its inputs' logged rows that reached the plan (rows read over rows logged) in
    each of the last INCREMENTAL_SEEN steps that read their change and recorded both: incremental
    steps (a change that consolidated away counts, at a share of 0) and steps that read it before
    a rescan (their estimate's rows). With `changed` (the inputs this step's commits changed), the
    steps that changed the same inputs, where there are any: a table filters each input's rows
    differently, so a change of the line items alone (an update of a column no table reads, at a
    share of 0) says little of one of the orders and their line items."""
    found, alike = [], []  # newest first, searched back until INCREMENTAL_SEEN alike (`_last`)
    for s in reversed(history):
        if len(alike) == INCREMENTAL_SEEN or (changed is None and len(found) == INCREMENTAL_SEEN):
            break
        if s.technique not in ("incremental", "rescan"):
            continue
        detail = s.detail or {}
        logged, estimate = detail.get("logged_rows"), detail.get("estimate") or {}
        if not logged or "phases" not in detail:
            continue
        if s.technique == "incremental":
            share = s.rows_read / logged
        elif "rows" in estimate and not estimate.get("unread"):
            share = estimate["rows"] / logged
        else:
            continue
        found.append(share)
        if changed is not None and changed_inputs(s) == changed:
            alike.append(share)
    return (alike or found)[:INCREMENTAL_SEEN][::-1]


def expected_rows(recent: list[float], logged: int) -> int | None:
    """The change rows a step whose inputs' commits logged `logged` rows is expected to read:
    `logged` times the median of the `recent` shares (`shares`); None before any."""
    return round(logged * statistics.median(recent)) if recent else None


def unread_margin(recent: list[float]) -> float:
    """How far an estimate made before reading must exceed the rescan's for the step to rescan
    unread: MARGIN times the median of the `recent` shares (`shares`) over the smallest, at most
    EARLY; EARLY when fewer than two shares, or one of 0, tell the spread."""
    if len(recent) < 2 or min(recent) <= 0:
        return EARLY
    return min(EARLY, MARGIN * statistics.median(recent) / min(recent))


def favours_rescan_unread(estimate: Estimate | None, margin: float = EARLY) -> bool:
    """Whether `estimate`, made on the expected rows before the change is read, exceeds the
    rescan's by `margin` (`unread_margin`), enough to rescan without reading the change."""
    return estimate is not None and estimate.incremental > margin * estimate.rescan


def _rescan_output_seconds(rescans: list) -> float:
    """What a rescan for cost is expected to take: the median of the `rescans`' output seconds."""
    return statistics.median(_rescan_seconds(s, keeps_state=False) for s in rescans)


def _rescan_seconds(step, keeps_state: bool) -> float:
    """What a rescan is expected to take, judged by a past rescan: its output seconds for a
    rescan for cost, its whole seconds for a try (which keeps the state); a first run's divided
    by FIRST_RUN_OVERSTATES."""
    seconds = step.seconds if keeps_state else _output_seconds(step)
    return seconds / FIRST_RUN_OVERSTATES if step.reason == "FIRST_RUN" else seconds


def _output_seconds(step) -> float:
    """What a rescan for cost would take: a rescan's seconds without building the state (a rescan
    for cost writes the output only)."""
    return max(0.0, step.seconds - ((step.detail or {}).get("phases") or {}).get("write state", 0.0))


def replaces(history: list) -> bool:
    """Whether a rescan writes its full result as the table's contents (as a first run does)
    rather than diffing it against them: when the table's last steps are rescans, the last of them
    that diffed changed at least REPLACE_SHARE of the rows of the two versions it diffed (its
    `changed_share`: 1 when every row changed, as a replace writes them) and at least REPLACE_ROWS
    rows, and fewer than DIFF_AGAIN_AFTER replaced since it (then one diffs again, so the share
    follows the table). A diff of fewer rows costs a fraction of a second, and a table of a few
    rows (an aggregate's groups) changes most of them in every epoch: there is nothing to gain, and
    in the sweep where such tables began replacing, TPC-H Q6 (one row) took twice its recompute
    (bench/RESULTS.md, rescans that replace).

    A diff on the driver collects the result, reads the table and consolidates both, whatever the
    share; its commit then rewrites every file a change touches, which at such a share is every
    file. A replace skips all but the collect and writes each row once: TPC-H Q10 at scale 10,
    a tenth of the orders changed, diffed a third of its rows every epoch, slower than its
    recompute, and replacing cost what the recompute did (bench/RESULTS.md, rescans that replace).
    Only a table no derived table reads is replaced (epoch.py): a reader would rescan for
    SOURCE_REWRITTEN. An incremental step in between (the table's changes became small) ends the
    run: the next rescan diffs."""
    since = 0
    for step in (s for s in reversed(history) if _working(s)):
        detail = step.detail or {}
        if step.technique != "rescan":
            return False
        if detail.get("replaced"):
            since += 1
            if since >= DIFF_AGAIN_AFTER:
                return False
            continue
        share = detail.get("changed_share")
        return share is not None and share >= REPLACE_SHARE and step.rows_inserted + step.rows_deleted >= REPLACE_ROWS
    return False
