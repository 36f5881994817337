"""Screenshot a page of the Dagster UI (`make ui`) with headless Chromium (Debian's chromium) over the
DevTools protocol, dismissing Dagster's community dialog first (its Skip button), which a plain
`chromium --screenshot` cannot do. How docs/lineage.png was taken, after `make demo`:

    PORT=3111 make ui &
    .venv/bin/python docs/screenshot.py \
        "http://127.0.0.1:3111/assets/returns_by_nation?view=lineage&lineageScope=upstream&lineageDepth=2" \
        docs/lineage.png
"""
import asyncio, base64, json, subprocess, sys, time, urllib.request
import websockets
url, out = sys.argv[1], sys.argv[2]
chrome = subprocess.Popen(["chromium", "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           "--window-size=1800,1100", "--remote-debugging-port=9333", "about:blank"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(50):
        try:
            targets = json.load(urllib.request.urlopen("http://127.0.0.1:9333/json")); break
        except Exception:
            time.sleep(0.2)
    ws_url = [t for t in targets if t["type"] == "page"][0]["webSocketDebuggerUrl"]
    async def main():
        async with websockets.connect(ws_url, max_size=50_000_000) as ws:
            n = 0
            async def call(method, **params):
                nonlocal n; n += 1
                await ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while True:
                    msg = json.loads(await ws.recv())
                    if msg.get("id") == n:
                        return msg.get("result")
            await call("Emulation.setDeviceMetricsOverride", width=1800, height=1100, deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            await asyncio.sleep(12)
            clicked = await call("Runtime.evaluate", expression="""(() => { const b = [...document.querySelectorAll('button')].find(x => x.textContent.trim() === 'Skip'); if (b) { b.click(); return true } return false })()""", returnByValue=True)
            print("dismissed dialog:", clicked["result"]["value"])
            await asyncio.sleep(4)
            shot = await call("Page.captureScreenshot", format="png")
            open(out, "wb").write(base64.b64decode(shot["data"]))
    asyncio.run(main())
finally:
    chrome.terminate()
