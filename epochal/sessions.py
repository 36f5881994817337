"""Session-wide Spark settings: the ones an operation needs for its duration only, and the ones
the engine's own steps depend on for their speed, whatever session the caller hands it."""

from __future__ import annotations

import logging
from contextlib import contextmanager

log = logging.getLogger("epochal")

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
SCHEDULER_MODE = "spark.scheduler.mode"
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
CODEGEN_CACHE = "spark.sql.codegen.cache.maxEntries"
# Spark's and Delta's defaults, sized for clusters and large tables: a step over a change batch of
# a few thousand rows then runs 200 shuffle tasks per exchange and replays each Delta log with 50
# tasks, which on a small machine costs more than the step's own work (a first epoch of the TPC-H
# tables at a small scale took many times longer on a plain session than with these).
SPARK_DEFAULTS = {SHUFFLE_PARTITIONS: "200", SNAPSHOT_PARTITIONS: "50"}
CODEGEN_CACHE_WANTED = 1000
_warned: set[str] = set()


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


def engine_confs(spark) -> dict[str, str]:
    """The settings the engine's steps run with (in the caller's session or child sessions): Spark's
    defaults that the caller left as they are replaced by values sized to the cores, a setting the
    caller chose kept as it is. Warns once
    about static settings that cannot be changed on a running session."""
    try:
        cores = max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - Spark Connect: the server's settings are its own
        return {}
    wanted = {SHUFFLE_PARTITIONS: str(max(2, 2 * cores)), SNAPSHOT_PARTITIONS: str(max(1, min(50, cores)))}
    chosen = {key: spark.conf.get(key, SPARK_DEFAULTS[key]) for key in wanted}
    confs = {key: wanted[key] if value == SPARK_DEFAULTS[key] else value for key, value in chosen.items()}
    entries = int(spark.conf.get(CODEGEN_CACHE, "100"))
    if entries < CODEGEN_CACHE_WANTED and CODEGEN_CACHE not in _warned:
        _warned.add(CODEGEN_CACHE)
        log.warning("%s is %d: Spark recompiles the generated code of most plans every epoch (an epoch runs more "
                    "distinct plans than that). It is a static setting: set it to 4096 when building the session "
                    "(SparkSession.builder.config(%r, '4096'))", CODEGEN_CACHE, entries, CODEGEN_CACHE)
    return confs


def warn_if_fifo(spark) -> None:
    """Warn once when steps are to run at once on a session whose scheduler is FIFO (a static
    setting): they queue behind each other's tasks rather than share the cores."""
    try:
        mode = spark.sparkContext.getConf().get(SCHEDULER_MODE, "FIFO")
    except Exception:  # noqa: BLE001 - Spark Connect: the server schedules
        return
    if mode.upper() == "FIFO" and SCHEDULER_MODE not in _warned:
        _warned.add(SCHEDULER_MODE)
        log.warning("spark.scheduler.mode is FIFO: steps refreshed at once (Engine(parallelism>1)) queue behind each "
                    "other's tasks, a small step waiting for a large one's. It is a static setting: build the session "
                    "with SparkSession.builder.config(%r, 'FAIR')", SCHEDULER_MODE)

