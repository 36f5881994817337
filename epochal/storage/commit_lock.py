"""One writer at a time per local Delta table, across processes: every write the engine makes to a
table on a local path (no scheme, or file:) holds the table's commit lock for its duration.

Why (docs/architecture.md, section 3, "Two processes refreshing the same tables"): Delta-Spark
commits to a local path through HDFSLogStore, whose "write version N unless it exists" is
Hadoop's check of the destination followed by a rename that replaces it on the local file system;
its `synchronized` covers only a RawLocalFileSystem, not the checksummed one file: paths get. Two
writers of one version, in two processes (or two threads), can then both succeed: the second
replaces the first's commit, which is lost, and the .crc renamed after it can be the other's (a
ChecksumException on the next read). delta-rs renames without replacing, but a Spark writer's
check-then-rename still replaces a delta-rs commit landing in between. Dagster starts a process
per run, so two overlapping runs over a local warehouse meet there (tests/test_commit_race.py).
Remote paths take no lock: their log stores make commits atomic (S3: conditional writes).

The lock is `fcntl.flock` on `_delta_log/.epochal-commit.lock` in the table's folder (made, with
the folder, where the table does not exist yet; Delta-Spark and delta-rs list only commit,
checkpoint and checksum files of the log, and VACUUM leaves the log's folder alone), released by
the kernel when its holder dies, and a lock per path within the process, for flock excludes open
file descriptions, not the threads of one process. Reentrant within a thread. A write holds one
table's lock at a time, never two, so tables never wait on each other.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from contextlib import contextmanager

from .warehouse import is_local, local_path

log = logging.getLogger(__name__)

LOCK_FILE = ".epochal-commit.lock"


def local_folder(path: str) -> str | None:
    """The folder of a table on a local path (no scheme, `file:/...` or `file:///...`), absolute
    and normalized; None for any other scheme."""
    path = str(path)
    return os.path.normpath(os.path.abspath(local_path(path))) if is_local(path) else None


class _TableLock:
    """The lock of one table within this process: its thread lock, and the descriptor holding
    the flock while some thread holds it (depth: that thread's nested holds)."""

    def __init__(self) -> None:
        self.thread_lock = threading.RLock()
        self.depth = 0
        self.fd: int | None = None


_locks: dict[str, _TableLock] = {}
_guard = threading.Lock()


def _lock_of(folder: str) -> _TableLock:
    with _guard:
        return _locks.setdefault(folder, _TableLock())


def _forget_after_fork() -> None:
    """In a forked child: the parent's holds are not the child's (its copies of the descriptors
    are closed; the parent's flocks stay with the parent)."""
    global _guard
    for held in _locks.values():
        if held.fd is not None:
            try:
                os.close(held.fd)
            except OSError:
                pass
    _locks.clear()
    _guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _flock(folder: str) -> int:
    """An open descriptor of the table's lock file, flocked exclusively (waiting for the holder)."""
    name = os.path.join(folder, "_delta_log", LOCK_FILE)
    while True:
        os.makedirs(os.path.dirname(name), exist_ok=True)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the folder was deleted meanwhile
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another writer of %s to finish its commit", folder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            held, there = os.fstat(fd), os.stat(name)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                return fd
        except FileNotFoundError:  # deleted while we waited: lock the file at the path now
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file at the path is another (deleted and made again): lock that one


def _unflock(fd: int) -> None:
    os.close(fd)  # releases the flock


@contextmanager
def commit_lock(path: str):
    """Hold the commit lock of the Delta table at `path` (a no-op for a remote path)."""
    folder = local_folder(path)
    if folder is None:
        yield
        return
    lock = _lock_of(folder)
    with lock.thread_lock:
        if lock.depth == 0:
            lock.fd = _flock(folder)
        lock.depth += 1
        try:
            yield
        finally:
            lock.depth -= 1
            if lock.depth == 0:
                fd, lock.fd = lock.fd, None
                _unflock(fd)
