"""A warehouse on an S3-compatible object store: a real MinIO server (built from its Go module by
`make minio`) on 127.0.0.1, a bucket, and the warehouse at s3a://bucket/...: Spark through
hadoop-aws (S3A), delta-rs (remap, ledgers, log reads) through storage options, both configured
from the same AWS_* environment variables (resources.session.ObjectStore). Part of
`make test-deploy`.

- TPC-H at scale 0.01, three derived tables, a first epoch and two hourly change batches: every
  epoch equals the full recompute, and the engine's bookkeeping is on the store.
- delta-rs's commits (the remap and ledgers) use S3 conditional writes (If-None-Match), so
  processes racing for one record key admit exactly one, as on a local disk.
- An unreachable endpoint, refused credentials and a missing bucket each fail within 30 s with an
  error naming the URI and what to check, and write nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from tests.deploy import LOOPBACK, REPO, assert_loopback_only, free_port, loopback_env, run_driver, server

pytestmark = pytest.mark.deploy

ACCESS_KEY, SECRET_KEY, BUCKET = "epochal", "epochal-secret-key", "bucket"


def minio_binary() -> str:
    """MinIO as `make minio` installs it (.tools/minio), or $EPOCHAL_MINIO, or one on PATH."""
    for candidate in (os.environ.get("EPOCHAL_MINIO"), str(REPO / ".tools" / "minio"), shutil.which("minio")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("no MinIO server: `make minio` builds it into .tools/minio (needs Go)")


class Store:
    def __init__(self, endpoint: str, data: Path, process):
        self.endpoint, self.data, self.process = endpoint, data, process

    def env(self, **extra: str) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": "us-east-1", **extra}

    def storage_options(self, **changed: str) -> dict[str, str]:
        return {**self.env(), "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag", **changed}

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, scheme="http", region="us-east-1",
                                 endpoint_override=self.endpoint[len("http://"):], allow_bucket_creation=True)

    def keys(self, prefix: str) -> list[str]:
        """Every object under bucket/prefix."""
        found = self.filesystem().get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True,
                                                                  allow_not_found=True))
        return [info.path for info in found if info.type == pafs.FileType.File]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A MinIO server on 127.0.0.1 with one bucket, stopped by its process group at the end."""
    folder = tmp_path_factory.mktemp("minio")
    port, console = free_port(), free_port()
    env = loopback_env(MINIO_ROOT_USER=ACCESS_KEY, MINIO_ROOT_PASSWORD=SECRET_KEY, MINIO_BROWSER="off")
    command = [minio_binary(), "server", "--quiet", "--address", f"{LOOPBACK}:{port}",
               "--console-address", f"{LOOPBACK}:{console}", str(folder / "data")]
    with server(command, folder / "minio.log", port, env=env) as process:
        created = Store(f"http://{LOOPBACK}:{port}", folder, process)
        created.filesystem().create_dir(BUCKET)
        yield created


def test_the_store_listens_on_loopback_only(store):
    assert_loopback_only(store.process.pid)


ROOT = f"s3a://{BUCKET}/warehouse"


@pytest.fixture(scope="module")
def maintained(store, tmp_path_factory):
    """The driver's answer after TPC-H, a first epoch and batches 1 and 2 at ROOT, each epoch
    compared with the recompute; batch 3 is applied too, for the race below."""
    logs = tmp_path_factory.mktemp("s3-driver")
    return run_driver(["--master", "local[2]", "--warehouse", ROOT, "--steps", "load,first,batch:1,batch:2,apply:3,side"],
                      logs / "driver.log", env=loopback_env(**store.env()))


def test_a_warehouse_on_s3_is_maintained_exactly(store, maintained):
    from epochal.storage.ledger import Ledger

    assert "error" not in maintained, maintained
    assert maintained["mismatches"] == [], maintained
    for name, techniques in maintained["techniques"].items():
        assert techniques[0] == "rescan" and "incremental" in techniques[1:], (name, techniques)
    # the bookkeeping is on the store, readable by delta-rs with the same options
    ledger = Ledger(f"{ROOT}/_epochal/tables/tpch_q01/ledger", store.storage_options())
    assert len(ledger.committed()) == 3
    assert any(key.endswith(".parquet") for key in store.keys("warehouse/tables/tpch_q01"))


def test_two_drivers_racing_on_s3_lose_and_double_nothing(store, maintained, tmp_path):
    """Two Spark drivers at the same instant: five appends each to one Delta table (every commit
    must survive: a lost one is what a non-atomic commit on S3 does), then a refresh of the same
    tables for the same epoch (batch 3). Each table commits the epoch once and equals its
    recompute; a driver that lost the race either reports or fails saying so."""
    assert "error" not in maintained, maintained
    env = loopback_env(**store.env())
    racer = ["--master", "local[1]", "--warehouse", ROOT, "--steps", "appends:5,race:3",
             "--barrier", str(tmp_path / "barrier")]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda n: run_driver(racer, tmp_path / f"racer{n}.log", env=env), (1, 2)))
    for answer in answers:
        assert "error" not in answer, answer
        for problem in answer.get("refresh_errors", []):
            assert "table '" in problem and ("another run" in problem or "concurrent" in problem), problem
    assert any(not answer.get("refresh_errors") for answer in answers), answers
    checked = run_driver(["--master", "local[1]", "--warehouse", ROOT, "--steps", "check,conditional"],
                         tmp_path / "check.log", env=env)
    assert "error" not in checked, checked
    # the mechanism, deterministically: two creates of one file open at once both land when plain
    # (the second silently replaces the first), the second is refused when conditional, and the
    # LogStore reports a refused commit as Delta expects
    conditional = checked["conditional"]
    assert conditional["plain"].startswith("both closed"), conditional
    assert conditional["conditional"].startswith("second refused"), conditional
    assert conditional["logstore"] == "second commit refused: java.nio.file.FileAlreadyExistsException", conditional
    assert checked["appends"] == 10, checked
    assert checked["mismatches"] == [] and checked["exactly_once_problems"] == [], checked
    for name, epochs in checked["committed_epochs"].items():
        assert len(epochs) == len(set(epochs)) == 4, (name, epochs)


RECORDS = pa.schema([("epoch", pa.string()), ("source", pa.string()), ("frontier", pa.int64())])


def _insert_many(uri: str, options: dict[str, str], writer: int, at: float) -> list[bool]:
    from epochal.storage.metastore import RecordTable

    table = RecordTable(uri, RECORDS, ("epoch", "source"), options)
    time.sleep(max(0.0, at - time.time()))
    return [table.insert_if_absent([{"epoch": f"e{n}", "source": "a", "frontier": writer}])[0][0]
            for n in range(10)]


def test_record_tables_on_s3_admit_one_writer_per_key(store):
    """Four processes insert the same ten keys at once through S3 conditional writes: each key
    is stored once, and exactly one writer was told it won it."""
    from epochal.storage.metastore import RecordTable

    uri, options = f"s3a://{BUCKET}/records", store.storage_options()
    at = time.time() + 3
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_insert_many, [(uri, options, writer, at) for writer in range(4)])
    stored = RecordTable(uri, RECORDS, ("epoch", "source"), options).read()
    assert Counter(r["epoch"] for r in stored) == {f"e{n}": 1 for n in range(10)}
    assert [sum(column) for column in zip(*results)] == [1] * 10


@pytest.mark.parametrize("case", ["unreachable endpoint", "wrong credentials", "missing bucket"])
def test_a_store_that_cannot_be_used_fails_fast_and_writes_nothing(store, case):
    from epochal import Engine
    from epochal.storage.access import StorageUnreachable

    bucket, options = BUCKET, store.storage_options()
    if case == "unreachable endpoint":
        options = store.storage_options(AWS_ENDPOINT_URL=f"http://{LOOPBACK}:{free_port()}")
        expected = "AWS_ENDPOINT_URL"
    elif case == "wrong credentials":
        options = store.storage_options(AWS_SECRET_ACCESS_KEY="not-the-secret")
        expected = "AWS_SECRET_ACCESS_KEY"
    else:
        bucket, expected = "no-such-bucket", "does not exist"
    root = f"s3a://{bucket}/bad-{case.replace(' ', '-')}"
    started = time.monotonic()
    with pytest.raises(StorageUnreachable) as refused:
        Engine(object(), root, storage_options=options)  # refused before Spark is used
    assert time.monotonic() - started < 30
    message = str(refused.value)
    assert root in message and expected in message and "nothing was written" in message, message
    assert store.keys(f"bad-{case.replace(' ', '-')}") == []
