"""The conformance suite (tests/conformance.py): a drawn column type, every shape of SQL it
admits, a random change stream, a path (driver or Spark, arrangements forced or none) and session
settings (ANSI, decimal precision loss, a time zone change), each table compared with Spark's full
computation of its SQL after every epoch. `make test` draws EPOCHAL_CONFORMANCE_EXAMPLES runs (1)
anew every time (hypothesis prints the seed of a failure); `make conformance` draws many in
EPOCHAL_CONFORMANCE_SHARDS test items (one per worker) and, with EPOCHAL_CONFORMANCE_KEEP_GOING,
records every mismatch for the matrix instead of stopping at the first."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.conformance import column_named, expected_rescans, record, run_case, runs

EXAMPLES = int(os.environ.get("EPOCHAL_CONFORMANCE_EXAMPLES", "1"))
# make test's slice: a few of the type's shapes, two epochs; make conformance: every shape, up to three
SLICE = {} if os.environ.get("EPOCHAL_CONFORMANCE_EXAMPLES") else {"epochs": (2, 2), "most_shapes": 8}
if os.environ.get("EPOCHAL_CONFORMANCE_TYPE"):  # one type only, as Spark spells it: decimal(38,10), map<string,int>
    SLICE["column"] = column_named(os.environ["EPOCHAL_CONFORMANCE_TYPE"])
SHARDS = int(os.environ.get("EPOCHAL_CONFORMANCE_SHARDS", "1"))
KEEP_GOING = bool(os.environ.get("EPOCHAL_CONFORMANCE_KEEP_GOING"))
ALLOWED = {"NOT_INCREMENTAL"}  # recomputed with a stated reason: exact, and shown in the matrix


def problems(run, outcome) -> list[str]:
    found = [f"tables refused at definition: {outcome.errors}"] if outcome.errors else []
    found += outcome.mismatches
    for name, steps in outcome.cases.items():
        for number, (technique, reason) in enumerate(steps[1:], start=1):
            if technique == "rescan" and reason.split(":")[0] not in ALLOWED | expected_rescans(run, number):
                found.append(f"{name} rescanned at epoch {number + 1}: {reason}")
    return found


@pytest.mark.parametrize("shard", range(SHARDS))
@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],  # a run does not shrink well
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(run=runs(**SLICE))
def test_every_case_equals_its_recompute_after_every_epoch(spark, warehouse, shard, run):
    print(run.describe())
    outcome, by_table = run_case(spark, warehouse, run)
    record(outcome, by_table)
    found = problems(run, outcome)
    if KEEP_GOING:
        for problem in found:
            print(f"MISMATCH {run.describe()}: {problem}")
        return
    assert not found, f"{run.describe()}:\n" + "\n".join(found)
