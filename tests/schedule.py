"""How `make test` hands test files to its xdist workers: the longest first, each to the first
worker that waits for work.

`--dist loadfile` keeps a file on one worker (its module fixtures, a TPC-H copy or a demo run, are
built once), so the suite's wall time is its busiest worker's files. xdist orders files by their
number of tests and hands a worker its next file while two of its tests are still pending; a
file of few, slow tests could then start last on a busy worker while the other one idles. Here
the files go in order of their seconds in file_seconds.json (longest first, files not in it before
all: a new file may be slow), and a worker gets its next file only once it waits on its last
test (an xdist worker holds its last test until it knows the one after it). That is the longest-
processing-time rule: with exact seconds, two workers end within 7/6 of the best split's time.

`make test ARGS=--record-file-seconds` writes the run's seconds per file there (RECORD).
"""

from __future__ import annotations

import json
from pathlib import Path

RECORD = Path(__file__).with_name("file_seconds.json")


def recorded() -> dict[str, float]:
    """Each test file's seconds (setup, call and teardown of its tests) in the recorded run."""
    try:
        return {str(k): float(v) for k, v in json.loads(RECORD.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def record(seconds: dict[str, float]) -> None:
    """Keep `seconds` per test file for later runs' order (files that did not run keep theirs)."""
    merged = {**recorded(), **seconds}
    RECORD.write_text(json.dumps({k: round(v, 1) for k, v in sorted(merged.items())}, indent=1) + "\n")


def longest_first(items: list) -> None:
    """Reorder collected `items` in place: whole files, longest recorded first (unknown first of
    all), tests within a file in their own order."""
    seconds = recorded()
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def rank(item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return -seconds.get(path, float("inf")), first_seen[path]

    items.sort(key=rank)  # stable: a file's tests keep their order


def scheduler(config, log):
    """xdist's loadfile scheduling, in collection order (`longest_first`), a file handed out
    only when a worker has nothing else to run."""
    from xdist.scheduler import LoadFileScheduling

    class WhenIdle(LoadFileScheduling):
        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep longest_first's order
    return WhenIdle(config, log)
