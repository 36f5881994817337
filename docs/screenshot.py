"""Screenshot a page of the Dagster UI (`make ui`) with headless Chromium (Debian's chromium) over the
DevTools protocol, dismissing Dagster's community dialog first (its Skip button), which a plain
`chromium --screenshot` cannot do. How docs/lineage.png was taken, after `make demo`:

    PORT=3111 make ui &
    .venv/bin/python docs/screenshot.py \
        "http://127.0.0.1:3111/assets/returns_by_nation?view=lineage&lineageScope=upstream&lineageDepth=2" \
        docs/lineage.png
"""

import asyncio
import base64
import json
import subprocess
import sys
import time
import urllib.request

import websockets

PORT = 9333
SKIP = """(() => { const b = [...document.querySelectorAll('button')].find(x => x.textContent.trim() === 'Skip');
  if (b) { b.click(); return true } return false })()"""


async def capture(page: str, url: str, out: str) -> None:
    async with websockets.connect(page, max_size=50_000_000) as ws:
        ids = iter(range(1, 1_000_000))

        async def call(method, **params):
            n = next(ids)
            await ws.send(json.dumps({"id": n, "method": method, "params": params}))
            while True:
                message = json.loads(await ws.recv())
                if message.get("id") == n:
                    return message.get("result")

        await call("Emulation.setDeviceMetricsOverride", width=1800, height=1100, deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(12)  # the UI loads the asset graph
        clicked = await call("Runtime.evaluate", expression=SKIP, returnByValue=True)
        print("dismissed dialog:", clicked["result"]["value"])
        await asyncio.sleep(4)
        shot = await call("Page.captureScreenshot", format="png")
        with open(out, "wb") as file:
            file.write(base64.b64decode(shot["data"]))


def main(url: str, out: str) -> None:
    chrome = subprocess.Popen(["chromium", "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                               "--window-size=1800,1100", f"--remote-debugging-port={PORT}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        targets = []
        for _ in range(50):
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json"))
                break
            except OSError:
                time.sleep(0.2)
        page = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        asyncio.run(capture(page, url, out))
    finally:
        chrome.terminate()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
