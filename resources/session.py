"""The one place a Spark session with Delta Lake is built.

The engine (`epochal`) never builds sessions: it is handed one. Dagster resources, tests, the
benchmark and the demo all come through `delta_spark_session`, so every process gets the same
Delta settings, and static settings (`spark.jars.packages`, driver memory) are fixed before the
JVM starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
    """How to reach Spark. `master` is `local[*]` or a `spark://host:port` standalone master (the
    environment variable EPOCHAL_SPARK_MASTER overrides the default); `remote` is a Spark Connect
    server's `sc://host:port` URL (default: $SPARK_REMOTE, as PySpark reads it), which wins over
    `master` (an `sc://` master means the same). Through Connect the server has its own settings:
    of the ones below only the session's (shuffle partitions, time zone) apply."""

    master: str = field(default_factory=lambda: os.environ.get("EPOCHAL_SPARK_MASTER", "local[*]"))
    remote: str | None = field(default_factory=lambda: os.environ.get("SPARK_REMOTE") or None)
    app_name: str = "epochal"
    driver_memory: str = field(default_factory=lambda: os.environ.get("EPOCHAL_DRIVER_MEMORY", "6g"))
    shuffle_partitions: int = 8
    ui: bool = False
    # further Spark confs; EPOCHAL_SPARK_CONF ("key=value;key=value") adds to them (settings here win)
    extra_conf: dict[str, str] = field(default_factory=dict)
    # Where the JVM's own output goes (Ivy's resolution report, Spark and Hadoop warnings): None
    # keeps it on this process's stdout and stderr.
    log_file: str | None = None
    # an s3a:// warehouse: hadoop-aws on the classpath and fs.s3a.* from the environment
    s3: bool = field(default_factory=lambda: is_s3(os.environ.get("EPOCHAL_WAREHOUSE", "")))


# The AWS SDK version that hadoop-aws of each Hadoop release is built with (hadoop-project's
# aws-java-sdk-v2.version). Only its s3 and s3-transfer-manager modules are resolved, not the
# 600 MB `bundle` hadoop-aws declares: S3A needs nothing else from it.
AWS_SDK_FOR_HADOOP = {"3.4.2": "2.29.52"}
S3_SCHEMES = ("s3a://", "s3://")


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEMES)


def hadoop_version() -> str:
    """The Hadoop version inside the installed pyspark (its hadoop-client-api JAR)."""
    import glob

    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    if not jars:
        raise SparkStartError("the installed pyspark has no hadoop-client-api JAR: cannot choose hadoop-aws")
    return os.path.basename(jars[0])[len("hadoop-client-api-"):-len(".jar")]


def s3_packages() -> list[str]:
    """hadoop-aws matching pyspark's Hadoop (S3A must be the same release) and its AWS SDK modules."""
    hadoop = hadoop_version()
    if hadoop not in AWS_SDK_FOR_HADOOP:
        raise SparkStartError(
            f"no known AWS SDK version for hadoop-aws {hadoop}: add it to AWS_SDK_FOR_HADOOP in "
            "resources/session.py (hadoop-project's aws-java-sdk-v2.version)")
    sdk = AWS_SDK_FOR_HADOOP[hadoop]
    return [f"org.apache.hadoop:hadoop-aws:{hadoop}", f"software.amazon.awssdk:s3:{sdk}",
            f"software.amazon.awssdk:s3-transfer-manager:{sdk}"]


@dataclass(frozen=True)
class ObjectStore:
    """An S3 or S3-compatible store as the environment names it, the same variables for Spark
    (S3A) and delta-rs: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (read by both from the
    environment), AWS_ENDPOINT_URL for a store other than AWS (MinIO, Ceph...; http:// allowed),
    AWS_REGION (default us-east-1)."""

    endpoint: str | None = field(default_factory=lambda: os.environ.get("AWS_ENDPOINT_URL") or None)
    region: str = field(default_factory=lambda: os.environ.get("AWS_REGION") or "us-east-1")

    def spark_conf(self) -> dict[str, str]:
        conf = {
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            # S3ConditionalLogStore commits through S3A's conditional create (If-None-Match: *)
            "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
            # fail within seconds when the store is unreachable, not after minutes of retries
            "spark.hadoop.fs.s3a.connection.establish.timeout": "15s",  # S3A's minimum
            "spark.hadoop.fs.s3a.attempts.maximum": "3",
            "spark.hadoop.fs.s3a.retry.limit": "3",
        }
        if self.endpoint:
            conf.update({
                "spark.hadoop.fs.s3a.endpoint": self.endpoint,
                "spark.hadoop.fs.s3a.path.style.access": "true",
                "spark.hadoop.fs.s3a.connection.ssl.enabled": str(self.endpoint.startswith("https://")).lower(),
            })
        return conf

    def storage_options(self) -> dict[str, str]:
        """delta-rs's options: conditional put (If-None-Match) makes its commits safe with many
        writers, as S3A's conditional create does Spark's."""
        options = {"AWS_REGION": self.region, "AWS_CONDITIONAL_PUT": "etag"}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(self.endpoint.startswith("http://")).lower()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            if os.environ.get(name):
                options[name] = os.environ[name]
        return options


LOGSTORE_CLASS = "io.epochal.storage.S3ConditionalLogStore"
LOGSTORE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "java", "S3ConditionalLogStore.java")
LOGSTORE_JAR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".tools",
                            "epochal-s3-logstore.jar")


def s3_logstore_jar() -> str:
    """The JAR of resources/java/S3ConditionalLogStore.java, compiled on first use (javac, against
    Delta's delta-storage JAR as Spark resolved it and pyspark's Hadoop) and rebuilt when the
    source is newer."""
    import glob
    import importlib.metadata
    import subprocess
    import tempfile
    import zipfile

    import pyspark

    if os.path.exists(LOGSTORE_JAR) and os.path.getmtime(LOGSTORE_JAR) >= os.path.getmtime(LOGSTORE_SOURCE):
        return LOGSTORE_JAR
    version = importlib.metadata.version("delta-spark")
    ivy = os.path.expanduser("~/.ivy2.5.2")
    storage = (glob.glob(f"{ivy}/cache/io.delta/delta-storage/jars/delta-storage-{version}.jar")
               + glob.glob(f"{ivy}/jars/io.delta_delta-storage-{version}.jar"))
    if not storage:
        raise SparkStartError(f"delta-storage {version} is not in {ivy}: run `make setup` (python -m "
                              "resources.session) once so that Spark resolves Delta's JARs")
    classpath = os.pathsep.join([storage[0], os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")])
    with tempfile.TemporaryDirectory(prefix="epochal-logstore-") as classes:
        try:
            subprocess.run(["javac", "-nowarn", "-d", classes, "-cp", classpath, LOGSTORE_SOURCE],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SparkStartError(f"could not compile {LOGSTORE_SOURCE} (needs javac from a Java 17 JDK): "
                                  f"{getattr(error, 'stderr', '') or error}") from error
        os.makedirs(os.path.dirname(LOGSTORE_JAR), exist_ok=True)
        partial = LOGSTORE_JAR + f".{os.getpid()}.tmp"
        with zipfile.ZipFile(partial, "w") as jar:
            for folder, _, files in os.walk(classes):
                for name in files:
                    jar.write(os.path.join(folder, name), os.path.relpath(os.path.join(folder, name), classes))
        os.replace(partial, LOGSTORE_JAR)  # two first uses at once: each writes its own, one wins
    return LOGSTORE_JAR


JAVA_OPTIONS = "spark.driver.extraJavaOptions"
QUIET_JVM = "-Dlog4j2.level=WARN"
# G1 hands heap back to the system only where more than MaxHeapFreeRatio of it is free after a
# concurrent cycle (70% by default), so a driver keeps for its life the heap its largest job grew
# (a first epoch's builds, a recompute): a day of epochs in one process held its JVM at that peak
# through every hourly epoch. At 30% (and growing to leave 10% free) the heap follows what the
# work holds, and a concurrent cycle after 15 s without a collection returns an idle driver's
# (bench/RESULTS.md, a day at scale 10 in one process). Options given later (EPOCHAL_SPARK_CONF,
# SparkSettings.extra_conf) come after these on the JVM's command line, and the last one wins.
HEAP_RETURNED = "-XX:MaxHeapFreeRatio=30 -XX:MinHeapFreeRatio=10 -XX:G1PeriodicGCInterval=15000"


def confs_from_environment() -> dict[str, str]:
    """EPOCHAL_SPARK_CONF's Spark confs: `key=value` pairs separated by semicolons (a value may hold
    spaces and '=', as spark.driver.extraJavaOptions does; that one, given twice, adds up)."""
    confs = {}
    for pair in os.environ.get("EPOCHAL_SPARK_CONF", "").split(";"):
        if not pair.strip():
            continue
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise SparkStartError(f"EPOCHAL_SPARK_CONF: {pair.strip()!r} is not key=value (pairs are separated by ';')")
        key, value = key.strip(), value.strip()
        confs[key] = f"{confs[key]} {value}" if key == JAVA_OPTIONS and key in confs else value
    return confs


def storage_options_for(root: str) -> dict[str, str] | None:
    """The delta-rs storage options for a warehouse root: None for a local folder."""
    return ObjectStore().storage_options() if is_s3(root) else None


def delta_artifact() -> str:
    """The Maven coordinate of the Delta JAR matching the installed pyspark and delta-spark."""
    import importlib.metadata

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


def _resolution_record(packages: str, confs: dict[str, str]) -> str:
    """Where the JARs Ivy resolved for `packages` under `confs` (the session's `spark.jars.*`
    settings, which steer the resolution) are recorded."""
    import pyspark

    key = json.dumps([packages, pyspark.__version__, sorted(confs.items())])
    folder = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(folder, "epochal", f"jars-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json")


def resolved_jars(packages: str, confs: dict[str, str]) -> list[str] | None:
    """The JARs an earlier session on this machine resolved for `packages`, when each file is
    still there: a session then starts with them (`spark.jars`) instead of Ivy resolving the
    packages again, which reads every dependency's descriptor at each start (about a second)."""
    try:
        with open(_resolution_record(packages, confs)) as handle:
            jars = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(jars, list) or not jars or not all(isinstance(j, str) and os.path.isfile(j) for j in jars):
        return None
    return jars


def record_resolution(spark, packages: str, confs: dict[str, str], given: list[str]) -> None:
    """Record the JARs the session's Ivy resolution put on `spark.jars` (besides the `given`
    ones), for `resolved_jars`. A record that cannot be written is no error: the next session
    resolves again."""
    jars = [j.removeprefix("file:") for j in spark.sparkContext.getConf().get("spark.jars", "").split(",") if j]
    jars = [j for j in jars if j not in given and os.path.isfile(j)]
    if not jars:
        return
    path = _resolution_record(packages, confs)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w") as handle:
            json.dump(jars, handle)
        os.replace(temporary, path)
    except OSError:
        pass


def delta_spark_session(settings: SparkSettings | None = None):
    """Return the process's Spark session, built with Delta Lake configured.

    With a local or standalone master the Delta JARs are resolved by Spark's own package
    mechanism (Ivy) from Maven Central on first use and cached under ~/.ivy2.5.2 (Maven's
    ~/.m2/repository is consulted first). The JARs a resolution gave are recorded under
    ~/.cache/epochal, and later sessions start with them while they are all there
    (`resolved_jars`). With Spark Connect, Delta must be configured on the server; the client
    only connects.
    """
    from pyspark.sql import SparkSession

    settings = settings or SparkSettings()
    remote = connect_url(settings)
    if remote is not None:
        return connect_session(remote, settings)

    active = SparkSession.getActiveSession()
    if active is not None:
        return active

    packages = ",".join([delta_artifact(), *(s3_packages() if settings.s3 else [])])
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
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
        # steps refreshed at once run each in its own pool (epochal.metrics.scheduler_pool) and
        # share the cores, rather than queue behind each other's tasks in submission order
        .config("spark.scheduler.mode", "FAIR")
        # Every epoch runs the same plan shapes again; Spark compiles generated code once per
        # distinct source and keeps 100 (the default), far fewer than a pipeline's steps produce, so
        # it would recompile most of them every epoch (thousands of compilations over a few epochs
        # of the differential test's tables, a handful with this cache; bench/RESULTS.md).
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        # an incremental plan can be large; never build multi-megabyte plan strings for the UI
        .config("spark.sql.maxPlanStringLength", "100000")
    )
    environment = confs_from_environment()
    extra_conf = {**environment, **settings.extra_conf}
    # JVM options add to the quiet log level and the heap's return (and the environment's to the
    # caller's), not replace them
    extra_conf[JAVA_OPTIONS] = " ".join(filter(None, [
        QUIET_JVM, HEAP_RETURNED, environment.get(JAVA_OPTIONS), settings.extra_conf.get(JAVA_OPTIONS)]))
    if settings.s3:
        builder = builder.config("spark.jars.excludes", "software.amazon.awssdk:bundle")
        for key, value in ObjectStore().spark_conf().items():
            builder = builder.config(key, value)
        # Delta's default S3 LogStore is safe for one driver only; ours commits with conditional writes
        extra_conf["spark.jars"] = ",".join(filter(None, [extra_conf.get("spark.jars"), s3_logstore_jar()]))
        for scheme in ("s3a", "s3"):
            builder = builder.config(f"spark.delta.logStore.{scheme}.impl", LOGSTORE_CLASS)
    steering = {key: value for key, value in extra_conf.items() if key.startswith("spark.jars.")}
    if settings.s3:
        steering["spark.jars.excludes"] = "software.amazon.awssdk:bundle"
    given = [jar for jar in extra_conf.get("spark.jars", "").split(",") if jar]
    resolved = resolved_jars(packages, steering)
    if resolved is None:
        builder = builder.config("spark.jars.packages", packages)
    else:
        extra_conf["spark.jars"] = ",".join(given + resolved)
    for key, value in extra_conf.items():
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
    if resolved is None:
        record_resolution(spark, packages, steering, given)
    spark.sparkContext.setLogLevel("WARN")
    return spark


CONNECT_TIMEOUT = 20.0  # seconds to reach a Connect server before saying it is unreachable
# The settings a session of the engine runs with that a Connect client can set on the server's
# session (runtime confs); static ones (JARs, extensions, memory, codegen cache) are the server's.
CONNECT_SESSION_CONFS = ("spark.sql.session.timeZone", "spark.sql.shuffle.partitions",
                         "spark.databricks.delta.snapshotPartitions", "spark.sql.adaptive.enabled",
                         "spark.sql.maxPlanStringLength")


def connect_url(settings: SparkSettings) -> str | None:
    """The Spark Connect URL the settings name, if any."""
    if settings.remote:
        return settings.remote
    return settings.master if settings.master.startswith("sc://") else None


def connect_session(url: str, settings: SparkSettings):
    """A Spark Connect session to `url`, with the engine's runtime settings set on the server's
    session. A server that cannot be reached fails within CONNECT_TIMEOUT seconds with an error
    naming the URL (PySpark's own client retries for minutes)."""
    import socket
    import time
    from urllib.parse import urlparse

    from pyspark.sql import SparkSession

    if not url.startswith("sc://"):
        raise SparkStartError(f"{url!r} is not a Spark Connect URL (sc://host:port)")
    parsed = urlparse("http://" + url[len("sc://"):].split(";", 1)[0])
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic())):
                break
        except OSError as error:
            if time.monotonic() >= deadline:
                raise SparkStartError(
                    f"no Spark Connect server answers at {url} ({host}:{port}: {error}) within "
                    f"{CONNECT_TIMEOUT:.0f}s: start one (README, Spark Connect) or correct the URL "
                    "(SPARK_REMOTE, or the Spark resource's spark_remote)") from None
            time.sleep(0.5)
    spark = SparkSession.builder.remote(url).getOrCreate()
    wanted = {"spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
              "spark.databricks.delta.snapshotPartitions": "2", "spark.sql.adaptive.enabled": "true",
              "spark.sql.maxPlanStringLength": "100000"}
    wanted.update({k: v for k, v in {**confs_from_environment(), **settings.extra_conf}.items()
                   if k in CONNECT_SESSION_CONFS})
    try:
        for key, value in wanted.items():
            spark.conf.set(key, value)
    except Exception as error:
        raise SparkStartError(f"the Spark Connect server at {url} did not take the session's settings: {error}") from error
    return spark


def connect_server_command(port: int, host: str = "127.0.0.1", master: str = "local[*]",
                           driver_memory: str = "4g", extra_conf: dict[str, str] | None = None) -> list[str]:
    """The command that runs a Spark Connect server in the foreground from the installed pyspark,
    with Delta Lake (its JAR resolved like a local session's, its SQL extension and catalog) and
    the static settings a local session of the engine has. `sbin/start-connect-server.sh` takes the
    same options and runs it as a daemon instead."""
    import pyspark

    spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    confs = {
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        "spark.databricks.delta.snapshotPartitions": "2",
        **(extra_conf or {}),
    }
    command = [os.path.join(spark_home, "bin", "spark-submit"),
               "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", master, "--driver-memory", driver_memory, "--packages", delta_artifact()]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    return command + ["spark-internal"]


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
