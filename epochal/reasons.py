"""Why a step is not incremental: the reason codes a step records (docs/exactness.md lists them),
and the errors a step raises to be rescanned for one. The decisions are rescan.py's and the cost
model's; the errors are raised where a step finds out (a Delta read refused, a state check, the
cost of the change read)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.errors import AnalysisException, IllegalArgumentException, UnsupportedOperationException

from .errors import EpochError

CDF_UNAVAILABLE = "CDF_UNAVAILABLE"
SOURCE_REWRITTEN = "SOURCE_REWRITTEN"
STATE_MISSING = "STATE_MISSING"
COST = "COST"
NOT_EXACT = "NOT_EXACT"
# detail["state"] of a rescan for COST, which writes the output only, and of the steps after it
# until one rebuilds the state (epoch._weigh)
STATE_NOT_KEPT = "not kept"
NOT_KEPT = "the state was not kept by the rescans for COST before this step"  # the reason's detail when rebuilt

# Delta's error conditions that mean the change data of a range cannot be read.
CDF_ERRORS = {
    "DELTA_MISSING_CHANGE_DATA": CDF_UNAVAILABLE,
    "DELTA_UNSUPPORTED_TIME_TRAVEL_BEYOND_DELETED_FILE_RETENTION_DURATION": CDF_UNAVAILABLE,
    "DELTA_VERSION_NOT_FOUND": CDF_UNAVAILABLE,
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE": CDF_UNAVAILABLE,
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA": CDF_UNAVAILABLE,
    "DELTA_CDC_START_VERSION_AFTER_LATEST": SOURCE_REWRITTEN,  # the table has fewer versions now
}


@dataclass(frozen=True)
class Trigger:
    code: str
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.detail}"


class Unreadable(EpochError):
    """Delta refused to read an input range (one of CDF_ERRORS) while a step computed its change:
    the step is rescanned for `trigger`, or refused when the table is strict."""

    def __init__(self, trigger: Trigger):
        super().__init__(trigger.reason)
        self.trigger = trigger


class Costly(EpochError):
    """The cost model expects a rescan to be cheaper than the incremental step it was asked
    about (found once the step read its change batches): the step is rescanned for `trigger`."""

    def __init__(self, trigger: Trigger, detail: dict | None = None, keep_state: bool = False):
        super().__init__(trigger.reason)
        self.trigger = trigger
        self.detail = detail or {}  # for the rescan step's record: the estimates
        self.keep_state = keep_state  # a rescan tried to be measured keeps it: it may well lose


@contextmanager
def refusals(what: str):
    """Turn Delta's "this range cannot be read" errors (CDF_ERRORS, by condition code) raised in the
    block into `Unreadable`, naming `what` was read; any other error propagates as it is."""
    try:
        yield
    except (AnalysisException, IllegalArgumentException, UnsupportedOperationException) as error:
        condition = error.getCondition() if hasattr(error, "getCondition") else None
        if condition not in CDF_ERRORS:
            raise
        raise Unreadable(Trigger(CDF_ERRORS[condition], f"Delta cannot read {what} ({condition})")) from error


class NotExact(EpochError):
    """A step's arithmetic would not give what the recompute gives (a running sum that overflowed
    its type, so the state no longer holds the sum): refused before anything is written, and the
    step is rescanned for `trigger` (or refused, when the table is strict)."""

    def __init__(self, trigger: Trigger):
        super().__init__(trigger.reason)
        self.trigger = trigger
