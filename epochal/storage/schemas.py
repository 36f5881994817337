"""Result schemas Spark analysed for the driver's computations, remembered on this machine's disk.

A rule that computes a change on the driver still types it as Spark would: it asks Spark once for
the schema its operation gives over rows of its input's schema (an empty relation analysed, see
rules.base.analysed_schema). A process remembers the answer, but every Dagster run is a new
process, and its first epoch would ask again for every operator of every table: the analyses
cost more than the epoch's own work. So the answers are also kept in files, one per question,
under the warehouse's local folder.

A question is everything the answer depends on: the operation and its input schema, the typing
settings, Spark's version, and a fingerprint of the engine's own code (the functions that build
the operation). A change to any of them asks Spark again; nothing is ever answered from another
engine's or another Spark's analysis.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from pyspark.sql.types import StructType

log = logging.getLogger("epochal")

_FINGERPRINT: str | None = None
_FINGERPRINT_LOCK = threading.Lock()


def engine_fingerprint() -> str:
    """A digest of the source of every module of the engine (read once per process)."""
    global _FINGERPRINT
    with _FINGERPRINT_LOCK:
        if _FINGERPRINT is None:
            root = Path(__file__).resolve().parent.parent
            digest = hashlib.sha256()
            for path in sorted(root.rglob("*.py")):
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
            _FINGERPRINT = digest.hexdigest()
        return _FINGERPRINT


class AnalysedSchemas:
    """Schemas by question, in `folder` (created when first written)."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, question: tuple) -> str:
        name = hashlib.sha256(repr((question, engine_fingerprint())).encode()).hexdigest()
        return os.path.join(self.folder, name[:2], name + ".json")

    def get(self, question: tuple) -> StructType | None:
        """The schema remembered for `question`, or None (never asked, or unreadable)."""
        try:
            with open(self._path(question), encoding="utf-8") as file:
                return StructType.fromJson(json.load(file))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, question: tuple, schema: StructType) -> None:
        """Remember `schema` (written whole, then renamed into place: a reader sees all or none)."""
        path = self._path(question)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), suffix=".tmp", delete=False,
                                             encoding="utf-8") as file:
                file.write(schema.json())
            os.replace(file.name, path)
        except OSError as error:  # a cache: the next process asks Spark again
            log.debug("could not remember an analysed schema in %s: %s", path, error)
