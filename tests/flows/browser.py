"""A page opened in real headless Chromium over the DevTools protocol (127.0.0.1 only): what it logged,
what it fetched, a JSON answer from the rendered DOM, and a screenshot."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_TIMEOUT_S = 60


def _port(profile: Path, proc: subprocess.Popen) -> int:
    """The DevTools port Chromium chose (``--remote-debugging-port=0`` writes it to the profile)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    marker = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with status {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError(f"chromium wrote no DevTools port within {START_TIMEOUT_S} s")


async def _session(ws_url: str, page_url: str, expression: str, screenshot: Path) -> dict:
    import websockets

    async with websockets.connect(ws_url, max_size=64 << 20) as ws:
        ids, errors, requests, loaded = iter(range(1, 10**6)), [], [], asyncio.Event()
        pending: dict[int, asyncio.Future] = {}

        async def reader():
            async for raw in ws:
                message = json.loads(raw)
                if "id" in message and message["id"] in pending:
                    pending.pop(message["id"]).set_result(message)
                method, params = message.get("method"), message.get("params", {})
                if method == "Runtime.exceptionThrown":
                    errors.append(params["exceptionDetails"].get("text", "exception"))
                elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                    errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    errors.append(params["entry"]["text"])
                elif method == "Network.requestWillBeSent":
                    requests.append(params["request"]["url"])
                elif method == "Page.loadEventFired":
                    loaded.set()

        async def call(method: str, **params) -> dict:
            i = next(ids)
            pending[i] = asyncio.get_running_loop().create_future()
            await ws.send(json.dumps({"id": i, "method": method, "params": params}))
            reply = await asyncio.wait_for(pending[i], 30)
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]

        task = asyncio.create_task(reader())
        for domain in ("Runtime", "Log", "Network", "Page"):
            await call(f"{domain}.enable")
        await call("Page.navigate", url=page_url)
        await asyncio.wait_for(loaded.wait(), 30)
        answer = await call("Runtime.evaluate", expression=expression, returnByValue=True)
        metrics = await call("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        await call("Emulation.setDeviceMetricsOverride", width=int(size["width"]), height=int(size["height"]),
                   deviceScaleFactor=1, mobile=False)
        shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        task.cancel()
        return {"value": answer["result"].get("value"), "errors": errors, "requests": requests}


def open_page(path: Path, expression: str, screenshot: Path) -> dict:
    """Open ``path`` in headless Chromium and evaluate ``expression`` (a JSON-able value) once it loaded:
    ``{"value", "errors" (console errors, exceptions), "requests" (every URL the page asked for)}``."""
    # (ignore_cleanup_errors: a Chromium helper process may still be writing into the profile as it is removed)
    with tempfile.TemporaryDirectory(prefix="smelt-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                                 f"--user-data-dir={profile}", "--window-size=1200,900", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port = _port(Path(profile), proc)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                target = next(t for t in json.load(r) if t["type"] == "page")
            return asyncio.run(_session(target["webSocketDebuggerUrl"], path.resolve().as_uri(), expression,
                                        screenshot))
        finally:  # the whole tree (renderer, GPU and crash helpers too) before the profile goes
            helpers = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
            proc.terminate()
            for helper in helpers:
                try:
                    helper.terminate()
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(helpers, timeout=10)
            for helper in alive:
                helper.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
