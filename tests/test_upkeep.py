"""Periodic rewrites of kept state, under test: state tables compacted and arrangements built again
(keyed/upkeep.py), their thresholds lowered through the Engine so both happen within a few
epochs, and every table compared with its full recompute after every epoch (run_epochs). At the
defaults they would first run after 8 and 64 epochs, which no other test reaches. `driver_rows=4`:
a version of more rows is not read whole on the driver but by key, through the arrangements,
which every such read then advances (a small version held whole needs no arrangement)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochal import Upkeep
from tests.support import upkeep_done
from tests.test_differential import DEFINITIONS, EPOCH, SLOW, run_epochs
from tests.test_differential_sql import AGGREGATES_AND_SETS, JOINS_AND_SUBQUERIES

pytestmark = pytest.mark.long  # six epochs of fourteen tables: the long tier (make test-long, run by CI)

EAGER = Upkeep(compact_after=2, compact_fraction=0.0, rebuild_appends=3, rebuild_fraction=0.5, rebuild_rows=0)  # appended chains read, then rebuilt
KEPT = {
    **{name: DEFINITIONS[name] for name in ("by_group", "totals", "joined", "joined_agg", "pairs",
                                            "left_path", "right_path", "diamond")},
    **{name: JOINS_AND_SUBQUERIES[name] for name in ("left_outer", "without_partner", "left_counts")},
    **{name: AGGREGATES_AND_SETS[name] for name in ("group_sizes", "top_groups", "shared_all")},
}


def with_a_change_to_both(epoch, key: int):
    """The drawn epoch with a row inserted into each source that joins (key 0..4): every epoch
    appends to the state and to the arrangements, so the lowered thresholds are reached."""
    a_ops, b_ops = epoch
    return ([*a_ops, ("insert", [(key, "x", key, Decimal("1.25"))])],
            [*b_ops, ("insert", [(key, "one", 0.5)])])


@SLOW
@given(epochs=st.lists(EPOCH, min_size=6, max_size=6), keys=st.lists(st.integers(0, 4), min_size=6, max_size=6))
def test_compactions_and_rebuilds_leave_every_table_equal_to_its_recompute(spark, warehouse, epochs, keys):
    root = f"{warehouse}/{uuid.uuid4().hex[:8]}"
    run_epochs(spark, warehouse, KEPT, [with_a_change_to_both(e, k) for e, k in zip(epochs, keys)], root=root,
               arrange_rows=0, driver_rows=4, upkeep=EAGER)
    compactions, rebuilds = upkeep_done(root)
    assert compactions > 0, "no state table was compacted"
    assert rebuilds > 0, "no arrangement was built again"
