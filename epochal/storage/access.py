"""A warehouse on an object store is checked once, before anything is read or written: an
unreachable endpoint, refused credentials or a missing bucket would otherwise surface minutes later
(both Spark's S3A and delta-rs retry with backoff), deep inside an epoch and after some writes.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import urlparse

import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler

from ..errors import EpochalError
from .warehouse import is_local

# a list request with one retry and short timeouts answers within seconds either way
PROBE_OPTIONS = {"connect_timeout": "5s", "timeout": "10s", "max_retries": "1", "retry_timeout": "10s"}
PROBE_SECONDS = 25.0


class StorageUnreachable(EpochalError):
    """The warehouse's object store cannot be used; the message says what to check."""


def check_warehouse(root: str, storage_options: dict[str, str] | None) -> None:
    """Raise StorageUnreachable unless the warehouse root can be listed with these options."""
    if is_local(root):
        return
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            store = pafs.PyFileSystem(DeltaStorageHandler(root, {**(storage_options or {}), **PROBE_OPTIONS}))
            store.get_file_info(pafs.FileSelector("", allow_not_found=True))
            outcome.append(None)
        except Exception as error:  # noqa: BLE001 - classified below
            outcome.append(error)

    thread = threading.Thread(target=probe, name="epochal-storage-probe", daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS)
    endpoint = (storage_options or {}).get("AWS_ENDPOINT_URL") or (storage_options or {}).get("aws_endpoint_url")
    where = endpoint or "the store's default endpoint"
    if not outcome:
        raise StorageUnreachable(
            f"warehouse {root}: no answer from {where} within {PROBE_SECONDS:.0f} s. Check the endpoint "
            "(AWS_ENDPOINT_URL) and that the server is running and reachable; nothing was written")
    if outcome[0] is not None:
        raise StorageUnreachable(_explain(root, where, str(outcome[0]))) from outcome[0]


# a connection that never reached the store: whatever else the message holds (a port such as
# :40443 in the request's URL once read as a 404)
_NOT_CONNECTED = ("Connection refused", "tcp connect error", "dns error", "Name or service not known",
                  "No route to host", "timed out")
_STATUS = re.compile(r"(?<![\w:/.%-])(40[34])(?![\w.])")  # an HTTP status, not digits of a port or a path


def _explain(root: str, where: str, error: str) -> str:
    bucket = urlparse(root).netloc
    detail = " ".join(re.sub(r"\x1b\[[0-9;]*m|↳", " ", error).split())[:400]  # no terminal colours
    answered = not any(marker in error for marker in _NOT_CONNECTED)
    statuses = set(_STATUS.findall(error)) if answered else set()
    if "403" in statuses or "Forbidden" in error or "InvalidAccessKeyId" in error or "SignatureDoesNotMatch" in error:
        what = (f"{where} refused the credentials (403). Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                f"(or the storage options) and that they may list and write bucket {bucket!r}")
    elif "404" in statuses or "NoSuchBucket" in error:
        what = (f"bucket {bucket!r} does not exist at {where} (404). Create it, or correct the bucket in "
                "the warehouse URI")
    else:
        what = (f"cannot reach {where}. Check the endpoint (AWS_ENDPOINT_URL, with http:// for a store "
                "without TLS) and that the server is running and reachable")
    return f"warehouse {root}: {what}; nothing was written. ({detail})"
