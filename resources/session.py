"""The one place a Spark session with Delta Lake is built.

The engine (`epochal`) never builds sessions: it is handed one. Dagster resources, tests, the
benchmark and the demo all come through `delta_spark_session`, so every process gets the same
Delta settings, and static settings (`spark.jars.packages`, driver memory) are fixed before the
JVM starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
CODEGEN_CACHE_ENTRIES = 4096


class SparkStartError(RuntimeError):
    """Spark with Delta could not be started; the message says what to check."""


@dataclass(frozen=True)
class SparkSettings:
    """How to reach Spark. `master` is `local[*]`, a `spark://host:port` standalone master or a
    Spark Connect `sc://host:port` URL; the environment variable EPOCHAL_SPARK_MASTER overrides
    the default."""

    master: str = field(default_factory=lambda: os.environ.get("EPOCHAL_SPARK_MASTER", "local[*]"))
    app_name: str = "epochal"
    driver_memory: str = field(default_factory=lambda: os.environ.get("EPOCHAL_DRIVER_MEMORY", "6g"))
    shuffle_partitions: int = 8
    ui: bool = False
    extra_conf: dict[str, str] = field(default_factory=dict)
    # Where the JVM's own output goes (Ivy's resolution report, Spark and Hadoop warnings): None
    # keeps it on this process's stdout and stderr.
    log_file: str | None = None


def delta_artifact() -> str:
    """The Maven coordinate of the Delta JAR matching the installed pyspark and delta-spark."""
    import importlib.metadata

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


def delta_spark_session(settings: SparkSettings | None = None):
    """Return the process's Spark session, built with Delta Lake configured.

    With a local or standalone master the Delta JARs are resolved by Spark's own package
    mechanism (Ivy) from Maven Central on first use and cached under ~/.ivy2.5.2 (Maven's
    ~/.m2/repository is consulted first). With Spark Connect, Delta must be configured on the
    server; the client only connects.
    """
    from pyspark.sql import SparkSession

    settings = settings or SparkSettings()
    if settings.master.startswith("sc://"):
        return SparkSession.builder.remote(settings.master).getOrCreate()

    active = SparkSession.getActiveSession()
    if active is not None:
        return active

    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.jars.packages", delta_artifact())
        .config("spark.sql.extensions", DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.default.parallelism", str(settings.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "true" if settings.ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Delta replays its log with this many tasks; the default (50) is sized for clusters.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.adaptive.enabled", "true")
        # Every epoch runs the same plan shapes again; Spark compiles generated code once per
        # distinct source and keeps 100 (the default), far fewer than a pipeline's steps produce, so
        # it would recompile most of them every epoch (6,255 compilations, ~10 ms each, for 4 epochs
        # of the differential test's tables; 5 with this cache).
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        # an incremental plan can be large; never build multi-megabyte plan strings for the UI
        .config("spark.sql.maxPlanStringLength", "100000")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
    )
    for key, value in settings.extra_conf.items():
        builder = builder.config(key, value)
    try:
        with jvm_output_to(settings.log_file):
            spark = builder.getOrCreate()
    except Exception as error:  # the JVM exits before Python sees why; Ivy printed the reason
        if "JAVA_GATEWAY_EXITED" not in str(error) and "Java gateway" not in str(error):
            raise
        report = "printed above"
        if settings.log_file:
            report = f"below, from {settings.log_file}"
            print(_tail(settings.log_file), file=sys.stderr)
        raise SparkStartError(
            f"Spark could not start with Delta Lake ({delta_artifact()}). Most often the JAR could "
            f"not be resolved from Maven Central: read the Ivy 'UNRESOLVED DEPENDENCIES' report "
            f"{report}, check that https://repo1.maven.org/maven2 is reachable (proxy "
            "settings), or fill ~/.m2/repository with `mvn dependency:get -Dartifact="
            f"{delta_artifact()}`. Also check that Java 17 is on PATH (`java -version`)."
        ) from error
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextlib.contextmanager
def jvm_output_to(log_file: str | None):
    """Point this process's stdout and stderr (file descriptors 1 and 2) at `log_file` while the
    JVM is launched: the JVM inherits them, so its output goes to the file for its whole life,
    while Python's own output is restored when the block ends."""
    if not log_file:
        yield
        return
    os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log_file, "a") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def _tail(path: str, lines: int = 200) -> str:
    try:
        with open(path, errors="replace") as file:
            return "".join(file.readlines()[-lines:])
    except OSError as error:
        return f"(could not read {path}: {error})"


if __name__ == "__main__":  # `python -m resources.session [LOG]`: resolve the JARs once
    import tempfile

    # With LOG, Ivy's report goes there and is printed only when Spark cannot start.
    session = delta_spark_session(SparkSettings(log_file=sys.argv[1] if len(sys.argv) > 1 else None))
    with tempfile.TemporaryDirectory(prefix="epochal-delta-check-") as folder:  # own folder: setups may run at once
        session.range(1).write.format("delta").save(os.path.join(folder, "check"))
    print(f"Spark {session.version} with {delta_artifact()}: ok")
