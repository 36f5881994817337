"""Screenshots of the Dagster UI with headless Chromium (Debian's chromium) over the DevTools
protocol, dismissing Dagster's community dialog first (its Skip button), which a plain
`chromium --screenshot` cannot do.

The README's pictures, after `make demo`: start the UI over the demo's warehouse in its own
process group, take docs/lineage.png (returns_by_nation with the tables it reads),
docs/partitions.png (its Partitions tab) and docs/columns.png (tpch_q10's Overview: its columns
and where they come from), stop the UI (`--columns-only`: the last one only):

    .venv/bin/python docs/screenshot.py --warehouse warehouse

One page of a UI that is already running (`PORT=3111 make ui`):

    .venv/bin/python docs/screenshot.py \\
        "http://127.0.0.1:3111/assets/returns_by_nation?view=lineage&lineageScope=upstream&lineageDepth=2" \\
        docs/lineage.png
"""

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets

REPOSITORY = Path(__file__).resolve().parent.parent
DOCS = REPOSITORY / "docs"
TABLE = "returns_by_nation"
PAGES = {  # picture -> page of the UI, relative to its address
    "lineage.png": f"/assets/{TABLE}?view=lineage&lineageScope=upstream&lineageDepth=2",
    "partitions.png": f"/assets/{TABLE}?view=partitions",
}
# an asset's Overview, tall enough to show its Columns (dagster/column_schema and column_lineage)
COLUMNS_TABLE = "tpch_q10"
COLUMNS = ("columns.png", f"/assets/{COLUMNS_TABLE}")
HEIGHTS = {"columns.png": 2600}
SKIP = """(() => { const b = [...document.querySelectorAll('button')].find(x => x.textContent.trim() === 'Skip');
  if (b) { b.click(); return true } return false })()"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def capture(page: str, shots: list[tuple[str, str]]) -> None:
    """Navigate the page to each url in turn and write its screenshot to the paired file (1800
    pixels wide, HEIGHTS[file name] or 1100 high)."""
    async with websockets.connect(page, max_size=50_000_000) as ws:
        ids = iter(range(1, 1_000_000))

        async def call(method, **params):
            n = next(ids)
            await ws.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                message = json.loads(await ws.recv())
                if message.get("id") == n:
                    return message.get("result")

        for url, out in shots:
            height = HEIGHTS.get(os.path.basename(out), 1100)
            await call("Emulation.setDeviceMetricsOverride", width=1800, height=height, deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            await asyncio.sleep(12)  # the UI loads the asset graph
            clicked = await call("Runtime.evaluate", expression=SKIP, returnByValue=True)
            print(f"{out}: dismissed dialog: {clicked['result']['value']}")
            await asyncio.sleep(4)
            shot = await call("Page.captureScreenshot", format="png")
            with open(out, "wb") as file:
                file.write(base64.b64decode(shot["data"]))


def screenshots(shots: list[tuple[str, str]]) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="epochal-chromium-") as profile:
        chrome = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--hide-scrollbars", "--window-size=1800,1100", f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            targets = []
            for _ in range(100):
                try:
                    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
                    break
                except OSError:
                    time.sleep(0.2)
            page = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
            asyncio.run(capture(page, shots))
        finally:
            chrome.terminate()
            chrome.wait(timeout=30)


def serve_ui(warehouse: str, home: str):
    """`dagster dev` over `warehouse` (as `make ui` starts it) in its own process group; returns the
    process and the UI's address once it serves the assets."""
    port = free_port()
    environment = {**os.environ, "DAGSTER_HOME": home, "EPOCHAL_WAREHOUSE": warehouse, "PYTHONPATH": str(REPOSITORY)}
    log = open(os.path.join(tempfile.gettempdir(), f"epochal-screenshot-dagster-{port}.log"), "w")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "dagster_workspace.yaml", "-h", "127.0.0.1",
         "-p", str(port)], cwd=REPOSITORY, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ui = f"http://127.0.0.1:{port}"
    query = json.dumps({"query": "{ assetNodes { id } }"}).encode()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dagster dev exited; see {log.name}")
        try:
            request = urllib.request.Request(f"{ui}/graphql", data=query, headers={"Content-Type": "application/json"})
            if json.load(urllib.request.urlopen(request, timeout=10)).get("data", {}).get("assetNodes"):
                return process, ui
        except (OSError, ValueError):
            pass
        time.sleep(2)
    stop(process)
    raise RuntimeError(f"dagster dev did not serve the assets within 300 s; see {log.name}")


def stop(process: subprocess.Popen) -> None:
    """Stop `dagster dev` and everything it started (its process group)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", help="one page of a running UI")
    parser.add_argument("out", nargs="?", help="where its screenshot goes")
    parser.add_argument("--warehouse", help="start the UI over this warehouse and take the README's pictures")
    parser.add_argument("--columns-only", action="store_true",
                        help=f"with --warehouse: only docs/{COLUMNS[0]} ({COLUMNS_TABLE}'s Overview with its columns)")
    args = parser.parse_args(argv)
    if args.warehouse:
        warehouse = os.path.abspath(args.warehouse)
        process, ui = serve_ui(warehouse, os.environ.get("DAGSTER_HOME") or os.path.join(warehouse, ".dagster"))
        pages = {} if args.columns_only else dict(PAGES)
        pages[COLUMNS[0]] = COLUMNS[1]
        try:
            screenshots([(ui + page, str(DOCS / name)) for name, page in pages.items()])
        finally:
            stop(process)
    elif args.url and args.out:
        screenshots([(args.url, args.out)])
    else:
        parser.error("give a url and an output file, or --warehouse")


if __name__ == "__main__":
    main()
