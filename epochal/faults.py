"""Named points in the epoch protocol where a test can stop the process, to prove that a crash at
any step followed by a rerun loses and doubles nothing.

Set EPOCHAL_KILL_AT to a point's name (optionally `name@table`) and the process kills itself with
SIGKILL on reaching it: no cleanup, no finally blocks, as when a machine dies. Points:

    after_remap          the epoch's frontiers are recorded in the remap
    after_started        the step is recorded as started in the ledger
    after_read_changes   the change batches are read
    after_output_merge   the derived table is written
    after_state_merge    a state table is written (each one)
    after_state_compaction  a state table's compacted contents replace it (each one)
    before_commit        everything is written; the ledger's committed record is not
    after_arrangement_build   an arrangement is written, its local copies not yet made
    after_arrangement_append  an input's change feed is appended to its arrangement
    in_local_copy        a local copy's key bounds are in place, its rows are not

The last three fire after the refresh's steps committed, where its inputs are arranged: the
refresh they kill has answered, and what they leave half done is read by the next one.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "EPOCHAL_KILL_AT"
POINTS = ("after_remap", "after_started", "after_read_changes", "after_output_merge",
          "after_state_merge", "after_state_compaction", "before_commit",
          "after_arrangement_build", "after_arrangement_append", "in_local_copy")


def point(name: str, table: str | None = None) -> None:
    wanted = os.environ.get(KILL_AT)
    if not wanted:
        return
    target, _, only = wanted.partition("@")
    if target == name and (not only or only == table):
        os.kill(os.getpid(), signal.SIGKILL)
