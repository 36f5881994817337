"""Which local copies to read without asking for their pages first.

A read of a copy asks the kernel for the pages holding its rows that the page cache lacks
(`local_copies.MappedCopy.prefetch`): a mincore(2) over each buffer's span and the arithmetic of
the rows' byte ranges. Where the copies fit in memory (TPC-H scale 1 here) every page is found
held, and those checks were about a tenth of the incremental epoch's driver time, spent to ask
for nothing (docs/performance.md, local copies). So a copy whose last `warm_reads` checked reads
found every page held skips the check for its next `skipped_reads` reads, then checks again; a
read that finds pages absent starts its count over. The advice never changes what is read: a
skipped check costs at most a read's page faults, taken one at a time."""

from __future__ import annotations

import collections
import threading

WARM_READS = 4  # checked reads in a row that found every page held
SKIPPED_READS = 16  # reads that then skip the check, before one checks again
KEPT = 4_096  # copies whose count is kept (the least recently read forgotten first)


class PageResidency:
    """Per copy (its path), how many checked reads in a row found every page held, and how many
    reads are still to skip their check. Shared by the threads of a refresh."""

    def __init__(self, warm_reads: int = WARM_READS, skipped_reads: int = SKIPPED_READS, kept: int = KEPT):
        self.warm_reads = warm_reads
        self.skipped_reads = skipped_reads
        self.kept = kept
        self._counts: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # copy -> [warm, to skip]
        self._guard = threading.Lock()

    def checks(self, copy: str) -> bool:
        """Whether this read of `copy` is to ask for the pages it lacks (and count what it found)."""
        with self._guard:
            counts = self._counts.get(copy)
            if counts is None or counts[1] == 0:
                return True
            counts[1] -= 1
            return False

    def found(self, copy: str, absent: bool) -> None:
        """A checked read of `copy` found pages `absent` from the page cache, or none."""
        with self._guard:
            counts = self._counts.setdefault(copy, [0, 0])
            self._counts.move_to_end(copy)
            if absent:
                counts[0] = counts[1] = 0
            else:
                counts[0] += 1
                if counts[0] >= self.warm_reads:
                    counts[1] = self.skipped_reads
            while len(self._counts) > self.kept:
                self._counts.popitem(last=False)
