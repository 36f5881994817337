"""When the engine gives the driver's freed memory back (epochal/memory.py): after a refresh that
grew the process by GROWTH, not after every one."""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest

from epochal import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm (Linux)")


def test_gives_back_only_after_the_process_grew():
    freed = memory.FreedMemory()
    assert not freed.after_refresh()  # nothing grew since it started
    grown = pa.allocate_buffer(memory.GROWTH + (64 << 20))
    memoryview(grown).cast("B")[:: 4096] = b"\x01" * len(range(0, grown.size, 4096))  # touch every page
    assert freed.after_refresh()
    assert not freed.after_refresh()  # held since: no growth
    del grown
    assert not freed.after_refresh()
