"""Python's switch interval while an epoch's steps run in parallel (epochal/switching.py)."""

from __future__ import annotations

import sys
import threading

import pytest

from epochal.switching import switch_interval


def test_lowered_within_and_restored_after_the_last_of_overlapping_refreshes():
    before = sys.getswitchinterval()
    inner_entered, outer_may_leave = threading.Event(), threading.Event()
    seen = []

    def other_refresh():
        with switch_interval(0.0002):
            seen.append(sys.getswitchinterval())
            inner_entered.set()
            outer_may_leave.wait(10)
        seen.append(sys.getswitchinterval())

    with switch_interval(0.0001):
        assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.02)
        thread = threading.Thread(target=other_refresh)
        thread.start()
        assert inner_entered.wait(10)
    assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.02), "still lowered while the other refresh runs"
    outer_may_leave.set()
    thread.join(10)
    assert seen == [pytest.approx(0.0001, rel=0.02), before]
    assert sys.getswitchinterval() == before


def test_never_raised_and_none_leaves_it():
    before = sys.getswitchinterval()
    with switch_interval(1.0):
        assert sys.getswitchinterval() == before
    with switch_interval(None):
        assert sys.getswitchinterval() == before
    assert sys.getswitchinterval() == before
