"""Where things live: one root (a local folder or any Hadoop-compatible URI).

    <root>/sources/<name>      source Delta tables (written by users or the TPC-H loader)
    <root>/tables/<name>       derived Delta tables (written only by the engine)
    <root>/_epochal/           engine state: remap, per-table ledgers and state tables
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from ..errors import EpochalError

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class InvalidName(EpochalError, ValueError):
    """A table name that is not a plain identifier (it would be a path or SQL otherwise)."""


def check_name(name: str, what: str = "table") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidName(
            f"{what} name {name!r} is not allowed: names are letters, digits and underscores, "
            "starting with a letter or underscore (at most 128), because they become folder names "
            "and SQL identifiers. Rename the table (or its SQL file)."
        )
    return name


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    """The file-system path of a local URI: a plain path as it is, `file:/p` and `file:///p`
    (percent-decoded, as Hadoop writes them) as `/p`."""
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def within(path: str, root: str | None) -> str:
    """`path` relative to `root` where it lies under it, else `path`: what the engine's caches are
    named by, so that a warehouse copied or moved elsewhere keeps them."""
    path = path.rstrip("/")
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return path


@dataclass(frozen=True)
class Warehouse:
    root: str

    def __post_init__(self) -> None:
        root = self.root.rstrip("/") or "/"
        if is_local(root):
            root = os.path.abspath(local_path(root))
        object.__setattr__(self, "root", root)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def source_path(self, name: str) -> str:
        return self.join("sources", check_name(name, "source"))

    def table_path(self, name: str) -> str:
        return self.join("tables", check_name(name))

    def engine_path(self, *parts: str) -> str:
        return self.join("_epochal", *parts)

    def local_folder(self, *parts: str) -> str:
        """A folder on this machine's disk for caches derived from the warehouse: under
        <root>/_epochal for a local warehouse, else under ~/.cache/epochal, named by the root."""
        if is_local(self.root):
            return os.path.join(self.root, "_epochal", *parts)
        digest = hashlib.sha1(self.root.encode()).hexdigest()[:16]
        return os.path.join(os.path.expanduser("~"), ".cache", "epochal", digest, *parts)
