"""Giving the driver's freed memory back to the system once a refresh is done.

A refresh's change batches, keyed reads and driver-side operators allocate through Arrow's pool
(mimalloc in pyarrow's wheels) and the C library's malloc (numpy, Python's objects); both keep
the pages they freed for reuse. A process that lives on after the refresh (a Dagster code
server, a notebook, the benchmark's recomputes) would hold its largest epoch's memory through
whatever it does next, beside a JVM that needs its own share of the same machine. Giving it back
costs a collection of Python's cycles and a walk of both allocators' free pages, so it is done
only after a refresh that grew the process by GROWTH: a small epoch reuses the pages the last
one freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys

import pyarrow as pa

GROWTH = 256 << 20


def give_back_freed_memory() -> None:
    """Collect cycles that hold Arrow buffers, then have Arrow's pool and glibc's malloc return
    the pages they keep unused (malloc_trim; other C libraries keep theirs)."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class FreedMemory:
    """When to give freed memory back: after a refresh that grew the process by GROWTH since the
    last time it was given back (always, where the resident memory cannot be read)."""

    def __init__(self) -> None:
        self.held = resident_bytes()

    def after_refresh(self) -> bool:
        now = resident_bytes()
        if now is not None and self.held is not None and now - self.held < GROWTH:
            return False
        give_back_freed_memory()
        self.held = resident_bytes()
        return True


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
