"""The Spark session as a Dagster resource.

A thin wrapper: `resources.session.delta_spark_session` stays the one place a session is built, so
jobs, tests and the demo share its Delta settings. With `spark_remote` (or $SPARK_REMOTE) the session is a Spark Connect client
of that server: no JVM in the run's process. The session is per process and is not stopped
when a run ends: Dagster runs each run in its own process, and an in-process run (the demo, tests)
keeps using the caller's session.
"""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from resources.session import SparkSettings, delta_spark_session


class SparkResource(ConfigurableResource):
    master: str | None = Field(
        default=None,
        description="local[*] or spark://host:port; unset: $EPOCHAL_SPARK_MASTER, else local[*]",
    )
    spark_remote: str | None = Field(
        default=None,
        description="a Spark Connect server, sc://host:port (with Delta's SQL extension; README), used instead of "
        "master; unset: $SPARK_REMOTE, as PySpark reads it, else none",
    )
    driver_memory: str | None = Field(
        default=None, description="unset: $EPOCHAL_DRIVER_MEMORY, else the session default (6g)"
    )
    shuffle_partitions: int = Field(default=8, description="spark.sql.shuffle.partitions")
    ui: bool = Field(default=False, description="serve the Spark UI (port 4040)")
    log_file: str | None = Field(
        default=None, description="file for the JVM's own output (Ivy's resolution report, Spark and "
        "Hadoop warnings); unset: this process's stdout and stderr",
    )

    def settings(self) -> SparkSettings:
        chosen = {"shuffle_partitions": self.shuffle_partitions, "ui": self.ui, "log_file": self.log_file}
        if self.master:
            chosen["master"] = self.master
        if self.spark_remote:
            chosen["remote"] = self.spark_remote
        if self.driver_memory:
            chosen["driver_memory"] = self.driver_memory
        return SparkSettings(**chosen)

    def session(self):
        """The process's Spark session with Delta (an already running one is reused as is)."""
        return delta_spark_session(self.settings())
