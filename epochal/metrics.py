"""What a step cost besides seconds: Spark jobs, bytes they scanned, Delta commits, input reads.

Every Spark and Delta operation has a fixed cost whatever its data (a trivial job's scheduling,
a time-travel read's snapshot rebuilt from the log, a Spark MERGE's dozen jobs; bench/RESULTS.md
has the figures), so counting them per step is how the next bottleneck is found: the step's
report carries the counts (`detail["cost"]`), the Dagster metadata and `make bench` show them.

Spark jobs are counted through a job group set on the step's thread (PySpark pins a JVM thread to
each Python thread, and the steps of one refresh run on their own threads); bytes are the input
bytes of those jobs' stages (data files and Delta log files read), from Spark's status store.
Through Spark Connect neither is available and both stay None.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from contextlib import contextmanager

JOB_GROUP = "spark.jobGroup.id"
SCHEDULER_POOL = "spark.scheduler.pool"


class Meter:
    """Counts for one step; `commits` and `reads` are noted by the code that does them."""

    def __init__(self) -> None:
        self.group = f"epochal-{uuid.uuid4().hex[:12]}"
        self.commits = 0
        self.driver_commits = 0
        # (kind, input, version(s)) -> times read; kind "changes" or "version" through Spark,
        # "shared changes", "shared version" or "restricted version" (the rows of some keys)
        # through shared_reads.py
        self.reads: Counter = Counter()
        self.jobs: int | None = None
        self.bytes_scanned: int | None = None
        # seconds from each job's submission to its end, summed; and its tasks' run time: a step
        # whose seconds are far above these waits outside Spark's jobs (planning, Python, commits)
        self.job_seconds: float | None = None
        self.task_seconds: float | None = None
        # the part of the tasks' run time spent on a core, and in the JVM's collector: a shared
        # machine's load lengthens run time (tasks waiting for a core or the disk), where CPU
        # time moves with the work alone
        self.task_cpu_seconds: float | None = None
        self.task_gc_seconds: float | None = None
        self.job_names: list[str] = []  # in the report's detail with EPOCHAL_JOB_NAMES=1 (diagnosis)

    def note_read(self, kind: str, name: str, versions) -> None:
        self.reads[(kind, name, versions)] += 1

    def count_jobs(self, spark) -> None:
        """Count the jobs run in the group so far, and their input bytes."""
        context = _context(spark)
        if context is not None:
            (self.jobs, self.bytes_scanned, self.job_names, self.job_seconds, self.task_seconds,
             self.task_cpu_seconds, self.task_gc_seconds) = _jobs_and_bytes(context, self.group)

    def as_dict(self) -> dict:
        names = {"spark_job_names": self.job_names} if os.environ.get("EPOCHAL_JOB_NAMES") else {}
        versions = [key for key in self.reads if key[0] in ("version", "shared version", "restricted version")]
        return {
            "spark_jobs": self.jobs,
            "bytes_scanned": self.bytes_scanned,
            "spark_job_seconds": self.job_seconds,
            "task_seconds": self.task_seconds,
            "task_cpu_seconds": self.task_cpu_seconds,
            "task_gc_seconds": self.task_gc_seconds,
            "delta_commits": self.commits,
            "driver_commits": self.driver_commits,
            "change_reads": sum(n for key, n in self.reads.items() if key[0] == "changes"),
            "shared_change_reads": sum(n for key, n in self.reads.items() if key[0] == "shared changes"),
            "input_versions_read": len(versions),
            **names,
            "time_travel_reads": sum(n for key, n in self.reads.items() if key[0] == "version"),
            "shared_version_reads": sum(n for key, n in self.reads.items() if key[0] == "shared version"),
            "restricted_version_reads": sum(n for key, n in self.reads.items() if key[0] == "restricted version"),
        }


def _context(spark):
    try:
        return spark.sparkContext  # classic Spark; Spark Connect raises
    except Exception:  # noqa: BLE001 - PySparkNotImplementedError or an attribute error, by version
        return None


@contextmanager
def _thread_property(spark, key: str, value: str):
    """Set a Spark local property of this thread (what its jobs carry) for the block, then
    restore it; nothing on Spark Connect, whose server owns its threads."""
    context = _context(spark)
    if context is None:
        yield
        return
    previous = context.getLocalProperty(key)
    context.setLocalProperty(key, value)
    try:
        yield
    finally:
        context.setLocalProperty(key, previous)


@contextmanager
def metered(spark, meter: Meter):
    """Run the block's Spark jobs in the meter's job group, then restore the thread's group."""
    with _thread_property(spark, JOB_GROUP, meter.group):
        yield meter


def scheduler_pool(spark, pool: str):
    """Run the block's Spark jobs in the scheduler pool `pool`, then restore the thread's pool.
    Under `spark.scheduler.mode=FAIR` (resources/session.py sets it) steps running at once, each
    in its own pool, share the cores; under Spark's default FIFO a step's jobs wait behind every
    task of the jobs submitted before them, so a small step beside a large one took several times
    its own tasks' seconds (TPC-H Q15 at scale 10, a tenth of the orders changed: 30.8 s of wall
    for 11.4 s of tasks, bench/RESULTS.md), and the cost model learnt its partner's cost as its
    own. Harmless under FIFO."""
    return _thread_property(spark, SCHEDULER_POOL, pool)


def _jobs_and_bytes(context, group: str) -> tuple[int, int | None, list[str], float | None, float | None,
                                                 float | None, float | None]:
    ids = context.statusTracker().getJobIdsForGroup(group)
    try:
        store = context._jsc.sc().statusStore()
        total, names, job_ms, task_ms, cpu_ns, gc_ms = 0, [], 0, 0, 0, 0
        for job in sorted(ids):
            data = store.job(job)
            ms = 0
            if data.submissionTime().isDefined() and data.completionTime().isDefined():
                ms = data.completionTime().get().getTime() - data.submissionTime().get().getTime()
            job_ms += ms
            stages, ran, job_task_ms = data.stageIds().iterator(), 0, 0
            while stages.hasNext():
                try:
                    stage = store.lastStageAttempt(stages.next())
                except Exception:  # noqa: BLE001 - a stage that never ran (skipped) has no attempt
                    continue
                ran += 1
                total += stage.inputBytes()
                job_task_ms += stage.executorRunTime()
                cpu_ns += stage.executorCpuTime()
                gc_ms += stage.jvmGcTime()
            task_ms += job_task_ms
            names.append(f"{data.name()} [{ms} ms, {ran} stages, {job_task_ms} ms in tasks]")
        return (len(ids), total, names, round(job_ms / 1000, 3), round(task_ms / 1000, 3), round(cpu_ns / 1e9, 3),
                round(gc_ms / 1000, 3))
    except Exception:  # noqa: BLE001 - the status store is Spark's internal API: count jobs without it
        return len(ids), None, [], None, None, None, None
