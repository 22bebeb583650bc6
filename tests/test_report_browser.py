"""The report in a real browser: headless Chromium (Debian's `chromium`) opens it from disk, with no
console errors, no network request, every figure decoded, the main sections present, nothing wider
than the window at 1280 px and at phone width; screenshots land in tests/artifacts/.

The browser is driven over the DevTools protocol (``--remote-debugging-port`` on the loopback
interface, ``websockets``' synchronous client)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from draftfit.report import SECTIONS, write_report
from draftfit.results import load

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "reports" / "example" / "results.json"
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0"]
WIDTHS = {"desktop": (1280, 900, False), "phone": (390, 844, True)}

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")


class DevTools:
    """A minimal DevTools-protocol client over one page session."""

    def __init__(self, url: str):
        from websockets.sync.client import connect

        self.ws = connect(url, max_size=None, open_timeout=30)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, *, timeout: float = 60) -> dict:
        ident = next(self.ids)
        message = {"id": ident, "method": method, "params": params or {}}
        if self.session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if "method" in event:
                self.events.append(event)
                if event["method"] == method:
                    return event

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()


@pytest.fixture(scope="module", params=["example", "measured-hostile"])
def report_file(request, tmp_path_factory) -> Path:
    """The committed example's report, and the same with synthetic `verify` measurements and
    markup/special tokens wherever prompt, dataset or model text reaches the page."""
    results = load(EXAMPLE)
    if request.param == "measured-hostile":
        from test_report import hostile, with_measured

        results = hostile(with_measured(results))
    path = write_report(results, tmp_path_factory.mktemp("report"))
    return path.rename(path.with_name(f"report-{request.param}.html"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    scratch = tmp_path_factory.mktemp("chromium-tmp")  # chromium's own temporary files stay in pytest's tmp
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(scratch)})
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not port_file.is_file() or len(port_file.read_text().splitlines()) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"chromium did not start (exit code {proc.poll()})")
        time.sleep(0.1)
    port, path = port_file.read_text().splitlines()[:2]
    client = DevTools(f"ws://127.0.0.1:{port}{path}")
    try:
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def page(browser, report_file):
    """The report loaded in a fresh tab, with the events seen while loading it."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})
    browser.session = browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.send(f"{domain}.enable")
    browser.events.clear()
    browser.send("Page.navigate", {"url": report_file.as_uri()})
    browser.wait_for("Page.loadEventFired")
    browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    return browser


def test_no_console_errors_and_no_network(page, report_file):
    errors = []
    for event in page.events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
            errors.append(params)
        elif method == "Runtime.exceptionThrown":
            errors.append(params)
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            errors.append(params["entry"])
    assert errors == []
    requests = [e["params"]["request"]["url"] for e in page.events if e["method"] == "Network.requestWillBeSent"]
    assert requests and all(url == report_file.as_uri() or url.startswith("data:") for url in requests), requests
    assert not [e for e in page.events if e["method"] == "Page.javascriptDialogOpening"]


def test_main_sections_and_figures_are_there(page):
    found = page.evaluate("""Array.from(document.querySelectorAll('main > section')).map(s => [s.id,
        s.querySelector('h2').innerText.trim(), s.getBoundingClientRect().height])""")
    assert [f[0] for f in found] == [sid for sid, _ in SECTIONS]
    assert all(f[2] > 40 for f in found)
    assert page.evaluate("document.querySelectorAll('script').length") == 0
    images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt])")
    assert len(images) >= 6
    assert all(done and width > 100 and alt for done, width, alt in images), images


OVERLAPS = """(() => {
  const out = [];
  for (const grid of document.querySelectorAll('.figs')) {
    const kids = Array.from(grid.children).map(k => k.getBoundingClientRect());
    for (let i = 0; i < kids.length; i++) for (let j = i + 1; j < kids.length; j++) {
      const a = kids[i], b = kids[j];
      if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) out.push([i, j]);
    }
  }
  return out;
})()"""


@pytest.mark.parametrize("name", list(WIDTHS))
def test_layout_fits_the_window_and_screenshot(page, report_file, name):
    width, height, mobile = WIDTHS[name]
    page.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert page.evaluate("window.innerWidth") == width
    # nothing wider than the window: wide tables scroll inside their own box
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    too_wide = page.evaluate(f"""Array.from(document.querySelectorAll('main *')).filter(e => !(e.parentElement && e.parentElement.closest('.scroll')) &&
        e.getBoundingClientRect().right > {width} + 1).map(e => e.tagName + '.' + e.className)""")
    assert too_wide == []
    assert page.evaluate(OVERLAPS) == []
    # command options are never broken inside (`-` / `-speculative-config`)
    flags = page.evaluate("Array.from(document.querySelectorAll('pre .flag')).map(e => [e.textContent, e.getClientRects().length])")
    assert flags and all(lines == 1 for _, lines in flags), flags
    figure_width = page.evaluate("document.querySelector('figure img').getBoundingClientRect().width")
    assert 300 <= figure_width <= 720
    # legends and ticks stay legible: no figure is drawn at less than 0.9 of its natural size
    scales = page.evaluate("Array.from(document.querySelectorAll('figure img')).map(e => e.getBoundingClientRect().width / e.naturalWidth)")
    assert scales and min(scales) >= 0.9, scales
    if name == "desktop":  # the tables comparing prediction and measurement fit the window, not cut at its edge
        cut = page.evaluate("Array.from(document.querySelectorAll('#measured .scroll')).filter(e => e.scrollWidth > e.clientWidth + 1).length")
        assert cut == 0
    shot = page.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                "clip": {"x": 0, "y": 0, "width": width, "height": min(6000, page.evaluate("document.documentElement.scrollHeight")), "scale": 1}})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    data = base64.b64decode(shot["data"])
    (ARTIFACTS / f"{report_file.stem}-{name}.png").write_bytes(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    if name == "desktop":  # the top of the page, as the README shows it (reports/example/screenshot.png)
        top = page.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": width, "height": 1480, "scale": 1}})
        (ARTIFACTS / f"{report_file.stem}-top.png").write_bytes(base64.b64decode(top["data"]))
