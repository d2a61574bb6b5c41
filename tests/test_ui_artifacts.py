"""The cost artifact of a pooled flow run, as the Prefect UI shows it, in headless Chromium.

A real server with its UI (``prefect server start``), one run of the example text
pipeline against it (embedded pool, which posts the run's artifacts when it ends),
then the flow run's page (Artifacts tab) and the cost table's own page opened in
Debian's Chromium, driven over the DevTools protocol (``websockets`` ships with
Prefect): the test waits until the rendered text shows the artifact, saves a
screenshot and the rendered HTML of each page, and prints their paths.

Chromium: ``scripts/install_chromium.sh`` (Debian's package); the session fixture
runs it when ``chromium`` is missing and skips, saying why, only if that fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.prefect_server import ROOT, PrefectServer, prefect_server, spawn, stop, tail

pytestmark = [pytest.mark.service, pytest.mark.slow]

INSTALL_SCRIPT = ROOT / "scripts" / "install_chromium.sh"

# Flags as the machine notes give them: without the background-networking ones, Chromium keeps
# trying to reach Google's hosts, which a closed network refuses.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1920,1100",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)

# One run of the text pipeline on the embedded pool; the pool is closed before exit, which waits for
# its run listeners (cost store, artifacts). Prints the flow run id.
RUN_ONE = """
from esg_prefect import ESGTaskRunner
from esg_prefect.examples.pipelines import text_flow
from esg_prefect.integration.runner import close_shared_pools

state = text_flow.with_options(task_runner=ESGTaskRunner(backend="inline"))(request_seed=5, return_state=True)
close_shared_pools()
assert state.is_completed(), state
print(state.state_details.flow_run_id)
"""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of Debian's Chromium, installed with scripts/install_chromium.sh if missing."""
    found = shutil.which("chromium")
    if found:
        return found
    try:
        done = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"Chromium is not installed and {INSTALL_SCRIPT.name} could not run: {exc}")
    found = shutil.which("chromium")
    if done.returncode != 0 or not found:
        pytest.skip(
            f"Chromium is not installed and {INSTALL_SCRIPT.name} failed (exit {done.returncode}); "
            f"install Debian's chromium package to run this test:\n{(done.stdout + done.stderr)[-1500:]}"
        )
    return found


class Page:
    """One browser tab, driven over the Chrome DevTools Protocol."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command and return its result (events arriving meanwhile are dropped)."""
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=60))
            if msg.get("id") == self._next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def click_tab(self, label: str, timeout_s: float = 30.0) -> None:
        """Click the page's tab labelled ``label`` once it is there."""
        script = (
            "(() => { const t = [...document.querySelectorAll('[role=tab], .p-tab, button, a')]"
            f".find(e => e.textContent.trim() === {json.dumps(label)});"
            " if (t) { t.click(); return true; } return false; })()"
        )
        give_up = time.monotonic() + timeout_s
        while not self.evaluate(script):
            assert time.monotonic() < give_up, f"no tab {label!r} on the page"
            time.sleep(0.5)

    def wait_for_text(self, needles: Sequence[str], timeout_s: float = 60.0) -> str:
        """The page's rendered text once it contains every needle; fails with the text seen last."""
        give_up = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < give_up:
            with contextlib.suppress(RuntimeError):  # e.g. "context destroyed" while the page navigates
                text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            if all(n in text for n in needles):
                return str(text)
            time.sleep(0.5)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"the page never showed {missing}; it showed:\n{text[:3000]}")

    def save(self, png: Path) -> None:
        """A screenshot of the whole page, and its rendered HTML beside it."""
        width, height = self.evaluate(
            "[document.documentElement.scrollWidth, Math.max(document.documentElement.scrollHeight, 1100)]"
        )
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": width, "height": min(height, 6000), "scale": 1},
        )
        png.write_bytes(base64.b64decode(shot["data"]))
        png.with_suffix(".html").write_text(self.evaluate("document.documentElement.outerHTML") or "")


@contextlib.contextmanager
def headless_chromium(binary: str, workdir: Path) -> Iterator[Page]:
    """Start headless Chromium with a fresh profile; yields its first tab."""
    from websockets.sync.client import connect

    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True)
    log = workdir / "chromium.log"
    proc = spawn([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"], dict(os.environ), log)
    try:
        port_file = profile / "DevToolsActivePort"
        give_up = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError(f"Chromium did not open its DevTools port:\n{tail(log)}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        tab = next(t for t in targets if t.get("type") == "page")
        with connect(tab["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            page = Page(ws)
            page.call("Page.enable")
            yield page
    finally:
        stop(proc, timeout_s=10, sig=signal.SIGTERM)


def run_text_pipeline(server: PrefectServer, workdir: Path) -> str:
    """One pooled run of the text pipeline against ``server``, in a process of its own; its flow run id."""
    env = server.env | {"ESG_PREFECT_STORE_URL": f"sqlite:///{workdir}/costs.db"}
    done = subprocess.run(
        [sys.executable, "-c", RUN_ONE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"the pipeline run failed:\n{(done.stdout + done.stderr)[-3000:]}"
    return done.stdout.strip().splitlines()[-1]


def test_cost_artifact_is_visible_on_the_flow_run_page(tmp_path: Path, chromium: str) -> None:
    with prefect_server(tmp_path / "home", ui=True) as server:
        run_id = run_text_pipeline(server, tmp_path)
        with server.api() as api:
            arts = api.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
        table = next(a for a in arts if a["type"] == "table")
        key = f"esg-cost-{run_id[:8]}"
        assert table["key"] == key

        with headless_chromium(chromium, tmp_path) as page:
            page.open(f"{server.url}/runs/flow-run/{run_id}")
            page.wait_for_text(["text-pipeline", "Artifacts"])
            page.click_tab("Artifacts")
            text = page.wait_for_text([key, f"esg-summary-{run_id[:8]}", "stage calls of flow run"])
            flow_run_png = tmp_path / "flow-run-artifacts.png"
            page.save(flow_run_png)

            page.open(f"{server.url}/artifacts/artifact/{table['id']}")
            table_text = page.wait_for_text([key, "queue_wait_ms", "encode", "summarize", "total"])
            artifact_png = tmp_path / "cost-artifact.png"
            page.save(artifact_png)
    assert "Artifacts" in text
    for column in ("stage", "batch_size", "runs_in_batch", "actual_ms", "cost"):
        assert column in table_text
    for png in (flow_run_png, artifact_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    print(f"flow run page screenshot: {flow_run_png}\ncost artifact screenshot: {artifact_png}")
