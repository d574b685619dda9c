"""The web UI kept open on a broker while the guard measures it (issue 27:
the UI's polling must not slow traffic beyond the spread).

Two ways, as `bench/guard.py --ui api|browser`:
- api: the requests RabbitMQ 3.10's UI sends every 5 s with the Overview
  and the Queues page open, sent from a thread of this process with guest's
  login: what the broker sees of a browser on an operator's desk. The paths
  are those the browser test recorded (tests/browser/data).
- browser: headless Chromium on this machine, the same two pages, logged
  in as guest. On a small machine the browser's own CPU (charts redrawn
  every 5 s) competes with the broker: that measures the machine, not
  the broker.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "browser" / "data" / "rabbitmq_3_10_ui.json"
PAGES = ("overview", "queues")
REFRESH_S = 5.0  # the UI's default refresh
STARTUP_TIMEOUT_S = 30.0

Watch = Callable[[int], contextlib.AbstractContextManager[None]]


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not listening(port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no management listener on {port}")
        time.sleep(0.1)


def page_requests() -> list[str]:
    """The API paths the two pages fetch on each refresh."""
    recorded = json.loads(RECORDED.read_text())
    return [path for page in PAGES for path in recorded[page]]


@contextlib.contextmanager
def watcher(mode: str) -> Iterator[Watch]:
    if mode == "api":
        yield _api_watch
        return
    from playwright.sync_api import sync_playwright

    from tests.browser import ui_driver

    with sync_playwright() as playwright:
        browser = ui_driver.launch(playwright)

        @contextlib.contextmanager
        def watching(port: int) -> Iterator[None]:
            wait_listening(port)
            sessions: list[Any] = []
            try:
                for route in ("#/", "#/queues"):
                    base = f"http://127.0.0.1:{port}/"
                    ui = ui_driver.UiSession(playwright, base, None, browser)
                    sessions.append(ui)
                    ui.login()
                    ui.visit(route, route)
                yield
            finally:
                for ui in sessions:
                    if ui.current.errors:
                        print(f"UI errors: {ui.current.errors}", flush=True)
                    ui.close()

        yield watching
        browser.close()


@contextlib.contextmanager
def _api_watch(port: int) -> Iterator[None]:
    wait_listening(port)
    stop = threading.Event()
    failures: list[str] = []
    auth = "Basic " + base64.b64encode(b"guest:guest").decode()
    paths = page_requests()

    def poll() -> None:
        while not stop.is_set():
            for path in paths:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}{path}", headers={"Authorization": auth}
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        response.read()
                except OSError as exc:
                    failures.append(f"{path}: {exc}")
            stop.wait(REFRESH_S)

    thread = threading.Thread(target=poll, name="ui-poll", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=15)
        if failures:
            print(f"UI requests failed: {failures[:3]}", flush=True)
