"""Drives the management web UI in headless Chromium (Debian's, through
Playwright's `executable_path`) and records what it saw: every /api/
answer the page got, page errors, template errors (the UI catches those
and logs "Uncaught error: ..." to the console and the #debug box), and a
screenshot per page. Shared by the browser test (tests/browser) and by
capture_rabbitmq.py, which records the same visits against RabbitMQ 3.10.8
for the field-by-field comparison."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
PAGE_TIMEOUT_MS = 20_000
# A page is done when its template rendered, or when rendering failed (the
# UI then writes the error into #debug).
RENDERED = (
    "document.querySelector('#main h1, #main h2') !== null"
    " || (document.querySelector('#debug') || {}).innerText"
)


def chromium_path() -> str | None:
    configured = os.environ.get("SHOAL_CHROMIUM")
    if configured:
        return configured
    for candidate in CHROMIUM_PATHS:
        if shutil.which(candidate):
            return candidate
    return None


@dataclass
class Visit:
    """What one page load showed: the API answers (path -> status, body)."""

    route: str
    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    text: str = ""  # the page's visible text, once rendered
    logo: str | None = None  # the header logo's image


def launch(playwright: Any) -> Any:
    """Debian's Chromium, headless, through Playwright."""
    executable = chromium_path()
    if executable is None:
        raise RuntimeError("no chromium: apt-get install -y chromium")
    return playwright.chromium.launch(
        executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
    )


def q(name: str) -> str:
    """A name as the UI puts it into a route or an API path."""
    return urllib.parse.quote(name, safe="")


class UiSession:
    """One logged-in browser page on the UI at `base` (http://host:port/)."""

    def __init__(self, playwright: Any, base: str, shots: Path | None, browser: Any = None) -> None:
        """A page in `browser`, or in a Chromium of its own (closed with it)."""
        self.base = base.rstrip("/") + "/"
        self.shots = shots
        self.own_browser = browser is None
        if browser is None:
            browser = launch(playwright)
        self.browser = browser
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.current = Visit("login")
        self.page.on("pageerror", lambda exc: self.current.errors.append(f"pageerror: {exc}"))
        self.page.on("console", self._console)
        self.page.on("response", self._response)
        self.page.on("dialog", lambda dialog: dialog.accept())  # "Are you sure?" confirms

    def _console(self, message: Any) -> None:
        text = message.text
        if message.type == "error" or text.startswith(("Uncaught error", "Stack:")):
            self.current.errors.append(f"console {message.type}: {text}")

    def _response(self, response: Any) -> None:
        path = response.url[len(self.base) - 1 :] if response.url.startswith(self.base) else ""
        if not path.startswith("/api/"):
            return
        try:
            body: Any = response.json() if response.status != 204 else None
        except Exception:
            body = None
        method = response.request.method
        key = path if method == "GET" else f"{method} {path}"
        self.current.answers[key] = (response.status, body)

    def login(self, user: str = "guest", password: str = "guest") -> Visit:
        self.current = Visit("login")
        self.page.goto(self.base)
        self.page.fill("input[name=username]", user)
        self.page.fill("input[name=password]", password)
        self.page.click("input[type=submit]")
        self.page.wait_for_selector("#main h1")
        return self.current

    def visit(self, route: str, name: str) -> Visit:
        """Open `route` (#/...), wait until its template rendered, return
        what the page fetched and any error it raised; screenshot `name`."""
        self.current = Visit(name)
        self.page.evaluate("document.querySelector('#main').innerHTML = ''")
        self.page.evaluate(
            "route => { if (location.hash === route) app.refresh(); else location.hash = route; }",
            route,
        )
        try:
            self.page.wait_for_function(RENDERED)
        except Exception as exc:
            self.current.errors.append(f"not rendered in {PAGE_TIMEOUT_MS} ms: {exc}")
        self.page.wait_for_load_state("networkidle")
        self._debug_box()
        self.current.text = self.page.inner_text("body")
        self.current.logo = self.page.get_attribute("#logo img", "src")
        self.screenshot(name)
        return self.current

    def screenshot(self, name: str) -> None:
        if self.shots is not None:
            self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def _debug_box(self) -> None:
        text = self.page.evaluate("(document.querySelector('#debug') || {}).innerText || ''")
        if text.strip():
            self.current.errors.append(f"#debug: {text.strip()[:500]}")

    def popup(self) -> str:
        """The text of a warning popup the UI shows, if any."""
        popups = self.page.locator(".form-popup-warn")
        return popups.first.inner_text() if popups.count() else ""

    def close(self) -> None:
        if self.own_browser:
            self.browser.close()
        else:
            self.page.close()


def routes(names: dict[str, str]) -> list[tuple[str, str]]:
    """(screenshot name, route) for every page an operator uses; `names`
    gives the live connection, channel and node names."""
    return [
        ("overview", "#/"),
        ("node", f"#/nodes/{q(names['node'])}"),
        ("connections", "#/connections"),
        ("connection", f"#/connections/{q(names['connection'])}"),
        ("channels", "#/channels"),
        ("channel", f"#/channels/{q(names['channel'])}"),
        ("exchanges", "#/exchanges"),
        ("exchange-direct", "#/exchanges/%2F/amq.direct"),
        ("exchange-ui", "#/exchanges/%2F/ui.x"),
        ("queues", "#/queues"),
        ("queue", "#/queues/%2F/ui.q"),
        ("users", "#/users"),
        ("user", "#/users/guest"),
        ("vhosts", "#/vhosts"),
        ("vhost", "#/vhosts/%2F"),
        ("feature-flags", "#/feature-flags"),
        ("policies", "#/policies"),
        ("policy", "#/policies/%2F/ui-policy"),
        ("limits", "#/limits"),
        ("cluster-name", "#/cluster-name"),
    ]


def shape(value: Any, roles: dict[str, str] | None = None) -> Any:
    """The structure of an API answer: dicts by keys (a live name as a key,
    such as the node's in cluster_state, by its role), lists by their first
    element, leaves by JSON type; what the templates can read."""
    roles = roles or {}
    if isinstance(value, dict):
        return {roles.get(k, k): shape(v, roles) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0], roles)] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "string"


def missing(reference: Any, ours: Any, where: str = "") -> list[str]:
    """Paths present in RabbitMQ's answer and absent from ours."""
    gaps: list[str] = []
    if isinstance(reference, dict):
        if not isinstance(ours, dict):
            return [f"{where or '.'}: object expected"]
        for key, value in reference.items():
            if key not in ours:
                gaps.append(f"{where}.{key}")
            else:
                gaps += missing(value, ours[key], f"{where}.{key}")
    elif isinstance(reference, list) and reference and isinstance(ours, list) and ours:
        gaps += missing(reference[0], ours[0], f"{where}[]")
    return gaps


def normalised(visits: list[Visit], names: dict[str, str]) -> dict[str, Any]:
    """{page: {api path: {status, shape}}} with live names (connection,
    channel, node) replaced by their role, so two brokers compare."""

    def generic(path: str) -> str:
        for role, name in names.items():
            path = path.replace(q(name), "{" + role + "}")
        return path

    roles = {name: "{" + role + "}" for role, name in names.items()}
    return {
        v.route: {
            generic(k): {"status": s, "shape": shape(b, roles)} for k, (s, b) in v.answers.items()
        }
        for v in visits
    }


def api(port: int, method: str, path: str, body: Any = None) -> Any:
    """One management API call as guest (the scenario's set-up)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


class Scenario:
    """What the pages show, the same on both brokers: an exchange `ui.x`,
    a queue `ui.q` with 3 messages bound to it and to amq.direct, a policy,
    a vhost limit, and a connection `ui-consumer` holding a consumer."""

    def __init__(self, amqp_port: int, management_port: int) -> None:
        import pika

        self.management_port = management_port
        params = pika.ConnectionParameters(
            "127.0.0.1",
            amqp_port,
            heartbeat=0,
            client_properties={"connection_name": "ui-consumer"},
        )
        self.connection = pika.BlockingConnection(params)
        ch = self.connection.channel()
        ch.exchange_declare("ui.x", "topic", durable=True)
        ch.queue_declare("ui.q", durable=True)
        ch.queue_bind("ui.q", "amq.direct", "ui.k")
        ch.queue_bind("ui.q", "ui.x", "ui.#")
        for i in range(3):
            ch.basic_publish("amq.direct", "ui.k", f"message {i}".encode())
        ch.queue_declare("ui.consumed", durable=False, auto_delete=True)
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume("ui.consumed", lambda *_: None)
        api(
            management_port,
            "PUT",
            "/api/policies/%2F/ui-policy",
            {"pattern": "^ui\\.p", "definition": {"max-length": 1000}, "apply-to": "queues"},
        )
        api(management_port, "PUT", "/api/vhost-limits/%2F/max-queues", {"value": 500})

    def names(self, deadline_s: float = 20) -> dict[str, str]:
        """The live names the routes need, once the API lists them."""
        end = time.monotonic() + deadline_s
        while True:
            connections = [
                c
                for c in api(self.management_port, "GET", "/api/connections")
                if c.get("client_properties", {}).get("connection_name") == "ui-consumer"
            ]
            channels = [
                c
                for c in api(self.management_port, "GET", "/api/channels")
                if connections and c["connection_details"]["name"] == connections[0]["name"]
            ]
            if connections and channels:
                node = api(self.management_port, "GET", "/api/nodes")[0]["name"]
                return {
                    "connection": connections[0]["name"],
                    "channel": channels[0]["name"],
                    "node": node,
                }
            if time.monotonic() > end:
                raise TimeoutError("the API lists no ui-consumer connection and channel")
            time.sleep(0.2)

    def close(self) -> None:
        self.connection.close()
