"""Session-wide Spark settings that an operation needs for its duration only."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def session_confs(spark, confs: dict[str, str]):
    """Set session confs for the duration of a block, then restore what was there. They are
    session-wide: every write in the block, from any thread, sees them."""
    previous = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
