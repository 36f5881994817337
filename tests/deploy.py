"""Servers for the deployment tests (tests/test_deploy_*.py): each started on 127.0.0.1 in its own
process group and stopped by that group's id in a `finally`, so a failing test leaves nothing
running; and the driver those tests run (tests/deploy_driver.py) as a child process, since one
Python process holds one Spark session and the tests' own session is `local[*]`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "@@deploy "
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# set by PySpark in its own process once a Spark Connect session is made; a classic session
# (here or in a child process that inherits them) then fails with CONNECT_URL_NOT_SET
CONNECT_ENVIRONMENT = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def loopback_env(**extra: str) -> dict[str, str]:
    """The environment of every Spark process here: SPARK_LOCAL_IP makes the RPC endpoints, block
    managers and web UIs bind 127.0.0.1 (their default is every interface)."""
    env = {name: value for name, value in os.environ.items() if name not in CONNECT_ENVIRONMENT}
    env.update({"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": LOOPBACK,
                "SPARK_LOCAL_HOSTNAME": "localhost", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening on {port}:\n{tail(log)}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listened on {LOOPBACK}:{port} within {timeout:.0f}s:\n{tail(log)}")


def tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_group(process: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM the process's group (the server and anything it started), SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@contextmanager
def server(command: list[str], log: Path, port: int, env: dict[str, str] | None = None, timeout: float = 120):
    """Run `command` in its own process group until the block ends (also when it raises)."""
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env or loopback_env(),
                                   cwd=str(REPO), start_new_session=True)
    try:
        wait_for_port(port, process, log, timeout)
        yield process
    finally:
        stop_group(process)


def listening_addresses(pgid: int) -> set[str]:
    """The local addresses on which the processes of group `pgid` listen (TCP, from /proc)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                address, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    found.add(_address(address.split(":")[0], width))
    return found


def assert_loopback_only(pgid: int) -> None:
    """Every listening socket of the group is on a loopback address (127.0.0.0/8 or ::1)."""
    import ipaddress

    addresses = listening_addresses(pgid)
    assert addresses, f"process group {pgid} listens nowhere"
    beyond = sorted(a for a in addresses if not ipaddress.ip_address(a).is_loopback)
    assert not beyond, f"process group {pgid} listens beyond loopback: {beyond}"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _address(hexed: str, width: int) -> str:
    raw = bytes.fromhex(hexed)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    text = socket.inet_ntop(socket.AF_INET6, words)
    return text[7:] if text.startswith("::ffff:") else text


def run_driver(args: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """Run tests/deploy_driver.py with `args` in its own process group; its JSON answer. The group
    is killed when the driver ends, fails or overruns `timeout`."""
    with open(log, "ab") as err:
        process = subprocess.Popen([sys.executable, "-m", "tests.deploy_driver", *args], stdout=subprocess.PIPE,
                                   stderr=err, env=env or loopback_env(), cwd=str(REPO), start_new_session=True,
                                   text=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the driver ran longer than {timeout:.0f}s:\n{tail(log)}") from None
    finally:
        stop_group(process, grace=5)
    answers = [json.loads(line[len(MARK):]) for line in output.splitlines() if line.startswith(MARK)]
    assert answers, f"the driver exited with {process.returncode} without an answer:\n{tail(log)}"
    return answers[-1]
