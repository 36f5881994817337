"""Session-wide Spark settings that a write needs for its duration only."""

from __future__ import annotations

from epochal.sessions import session_confs

# Delta copies this conf into the userMetadata of every commit made while it is set; unlike the
# writer option of the same name, it also reaches MERGE and DataFrameWriterV2's create().
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

__all__ = ["USER_METADATA_CONF", "session_confs"]
