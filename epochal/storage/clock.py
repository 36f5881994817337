"""Source clocks: how a source commit's time (FromTime) is read.

A commit's time is its Delta commit timestamp, or a logical time the writer put in the commit's
`userMetadata` as JSON under LOGICAL_TIME_KEY. The logical clock lets a generator produce a day of
hourly batches in seconds while epochs still follow the batches' own hours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

LOGICAL_TIME_KEY = "epochal.logical_time"


def utc(ts: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted."""
    return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


def logical_time_metadata(ts: datetime, **extra: object) -> str:
    """The `userMetadata` string a writer attaches to a commit to stamp it with a logical time."""
    return json.dumps({LOGICAL_TIME_KEY: utc(ts).isoformat(), **extra}, sort_keys=True)


def parse_logical_time(user_metadata: str | None) -> datetime | None:
    if not user_metadata:
        return None
    try:
        value = json.loads(user_metadata).get(LOGICAL_TIME_KEY)
    except (ValueError, AttributeError):
        return None
    return utc(datetime.fromisoformat(value)) if value else None


@dataclass(frozen=True)
class CommitClock:
    """Source time is the Delta commit timestamp."""

    name: str = "commit"

    def time_of(self, commit: dict) -> datetime:
        return datetime.fromtimestamp(commit["timestamp"] / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class LogicalClock:
    """Source time is the logical time in the commit's userMetadata; a commit without one (for
    example the table's creation by a tool that does not stamp) falls back to its commit time."""

    name: str = "logical"

    def time_of(self, commit: dict) -> datetime:
        logical = parse_logical_time(commit.get("userMetadata"))
        if logical is not None:
            return logical
        return datetime.fromtimestamp(commit["timestamp"] / 1000, tz=timezone.utc)


def clock_named(name: str) -> CommitClock | LogicalClock:
    if name == "commit":
        return CommitClock()
    if name == "logical":
        return LogicalClock()
    raise ValueError(f"unknown source clock {name!r}: use 'commit' or 'logical'")
