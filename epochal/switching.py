"""How often Python hands its interpreter lock from thread to thread while an epoch's steps run
side by side.

A thread that lets go of the lock for a short call (an Arrow compute function, a system call,
a call into the JVM) must take it back afterwards, and beside a thread running Python it waits
until that thread lets go: at the latest after the switch interval (`sys.getswitchinterval`,
5 ms by default). A step's keyed read from local copies makes many such calls, so beside
another step's Python its reads took ten times as long as alone (`python -m bench.copy_reads
--beside --switch-interval`; figures in bench/RESULTS.md). While the steps run in parallel the
interval is STEP_SWITCH_INTERVAL, and Python's own once the last of them is done.
"""

from __future__ import annotations

import contextlib
import sys
import threading

STEP_SWITCH_INTERVAL = 0.0001  # seconds

_guard = threading.Lock()
_entered = 0
_saved = 0.0


@contextlib.contextmanager
def switch_interval(seconds: float | None):
    """Python's switch interval at most `seconds` within (None: left as it is). Refreshes that
    overlap keep the lowest they asked for until the last of them ends, then the interval found
    before the first is restored."""
    global _entered, _saved
    if seconds is None:
        yield
        return
    with _guard:
        if not _entered:
            _saved = sys.getswitchinterval()
        _entered += 1
        if seconds < sys.getswitchinterval():
            sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        with _guard:
            _entered -= 1
            if not _entered:
                sys.setswitchinterval(_saved)
