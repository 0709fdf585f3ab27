"""Fixtures for the console's browser tests: per module, one ``strom console`` process against the
module's broker, one chromium; per test, a fresh page at a laptop's 1366x768."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from brokerproc import HOST, STROM, free_port

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "console"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1366, "height": 768}
START_TIMEOUT = 30.0


class ConsoleProcess:
    """``strom console`` in a child process; ``url`` is its base URL (no trailing slash)."""

    def __init__(self, bootstrap: str, log: Path, *extra: str) -> None:
        port = free_port()
        self.url = f"http://{HOST}:{port}"
        self._log = log.open("wb")
        self._proc = subprocess.Popen(
            [
                str(STROM),
                "console",
                "--bootstrap-server",
                bootstrap,
                "--host",
                HOST,
                "--port",
                str(port),
                *extra,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._log_path = log

    def wait_ready(self) -> None:
        # Poll until the console answers: uvicorn is up and the lifespan made the admin client.
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/static/console.css", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"strom console did not start: {self._log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def start_console(bootstrap: str, workdir: Path, *extra: str) -> ConsoleProcess:
    proc = ConsoleProcess(bootstrap, workdir / "console.log", *extra)
    proc.wait_ready()
    return proc


@pytest.fixture(scope="module")
def console(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a console serving the module's broker."""
    proc = start_console(bootstrap, tmp_path_factory.mktemp("console"))
    try:
        yield proc.url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport=VIEWPORT)
    opened = context.new_page()
    # Generous: the machine is shared, and a page may wait on the cluster.
    opened.set_default_timeout(20_000)
    try:
        yield opened
    finally:
        context.close()


def save_screenshot(page: Page, name: str) -> Path:
    """Save what the page shows as artifacts/console/<name>.png (the whole page, not just the viewport)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture()
def screenshot() -> Callable[[Page, str], Path]:
    """``screenshot(page, name)``: a fixture, since test modules cannot import a conftest by name."""
    return save_screenshot
