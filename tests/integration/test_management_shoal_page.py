"""Shoal's own page in the management UI (issue 27, item 3): GET
/api/shoal (broker/management/shoal_page.py) over real sockets, with what
pika does to the broker showing up in it: connections per IO worker, a
stream's offsets and its consumer's lag, a queue paged to disk; and the
extension's script and template (broker/management/extension/), which the
UI loads without a login.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, pump, worker_of
from tests.integration.test_management import (  # noqa: F401  (managed: a fixture)
    http,
    managed,
    start_managed,
)

EXTENSION = Path(__file__).resolve().parents[2] / "broker" / "management" / "extension"
WINDOW = 16  # --queue-capacity of the paging test's broker: the smallest log


def shoal(broker: Broker, user: str = "guest", password: str = "guest") -> dict[str, Any]:
    status, body = http(broker, "GET", "/shoal", user=user, password=password)
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def get(broker: Broker, path: str) -> tuple[int, bytes]:
    """A GET without credentials, as the page loads its scripts."""
    port = broker.management_port  # type: ignore[attr-defined]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def worker_row(broker: Broker, index: int) -> dict[str, Any]:
    return next(w for w in shoal(broker)["io_workers"] if w["index"] == index)


def stream_row(broker: Broker, name: str) -> dict[str, Any] | None:
    return next((s for s in shoal(broker)["streams"] if s["name"] == name), None)


def test_io_workers_one_row_each_with_their_connections(managed: Broker) -> None:  # noqa: F811
    page = shoal(managed)
    assert page["node"] == f"shoal@{socket.gethostname()}"
    assert page["cluster"]["mode"] == "standalone"
    assert [n["role"] for n in page["cluster"]["nodes"]] == ["standalone"]
    workers = page["io_workers"]
    pids = managed.pids("io-worker")
    assert {w["index"]: w["pid"] for w in workers} == pids and len(pids) == managed.workers == 2
    for w in workers:
        assert w["ready"] and not w["retiring"] and w["alarms"] == []
        assert 0 <= w["arena_used_bytes"] <= w["arena_bytes"] > 0
        assert w["rss_bytes"] > 0 and w["cpu_seconds"] >= 0
    assert page["arena"]["total_bytes"] == sum(w["arena_bytes"] for w in workers)
    assert {p["role"] for p in page["processes"]} >= {"supervisor", "acceptor", "scheduler"}

    before = {w["index"]: w for w in workers}
    conn = connect(managed)
    try:
        index = worker_of(conn)
        # The acceptor counts the connection as it hands it over; the
        # channel is counted by the worker's statistics, flushed every 0.25 s.
        conn.channel()
        wait_for(
            lambda: worker_row(managed, index)["connections"] == before[index]["connections"] + 1,
            10,
            "the connection counted on its worker",
        )
        wait_for(
            lambda: worker_row(managed, index)["channels"] == before[index]["channels"] + 1,
            10,
            "the channel counted on its worker",
        )
        # A second request has a previous one to measure CPU use against.
        assert worker_row(managed, index)["cpu_percent"] is not None
    finally:
        conn.close()
    wait_for(
        lambda: worker_row(managed, index)["connections"] == before[index]["connections"],
        10,
        "the closed connection uncounted",
    )


def test_a_stream_shows_its_offsets_and_its_consumers_lag(managed: Broker) -> None:  # noqa: F811
    assert shoal(managed)["streams"] == []
    conn = connect(managed)
    try:
        ch = conn.channel()
        ch.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
        ch.confirm_delivery()
        for i in range(15):
            ch.basic_publish("", "events", f"m{i}".encode())
        # Confirmed means durable in the stream: offsets 0..14.
        row = wait_for(
            lambda: (s := stream_row(managed, "events")) and s["last_offset"] == 14 and s,
            10,
            "the stream's last offset",
        )
        assert (row["vhost"], row["first_offset"], row["messages"]) == ("/", 0, 15)
        assert row["segments"] >= 1 and row["bytes"] > 0
        assert row["writer"] in (0, 1) and row["consumers"] == []
        assert not [q for q in shoal(managed)["paging"]["queues"] if q["name"] == "events"]

        consumer = conn.channel()
        consumer.basic_qos(prefetch_count=10)
        delivered: list[int] = []

        def on_message(channel: Any, method: Any, _props: Any, _body: bytes) -> None:
            delivered.append(method.delivery_tag)

        consumer.basic_consume(
            "events", on_message, arguments={"x-stream-offset": "first"}, consumer_tag="reader"
        )
        pump([conn], lambda: len(delivered) == 10, 10, "the prefetch's 10 deliveries")

        def consumer_at(offset: int, lag: int) -> Callable[[], bool]:
            def seen() -> bool:
                conn.process_data_events(time_limit=0)
                stream = stream_row(managed, "events")
                consumers = stream["consumers"] if stream else []
                return [(c["tag"], c["offset"], c["lag"]) for c in consumers] == [
                    ("reader", offset, lag)
                ]

            return seen

        # Ten sent of fifteen, none acknowledged: the next offset is 10,
        # five behind the stream's end.
        wait_for(consumer_at(10, 5), 10, "the consumer at offset 10, lag 5")
        (c,) = stream_row(managed, "events")["consumers"]  # type: ignore[index]
        assert c["unacked"] == 10 and c["worker"] == worker_of(conn)
        consumer.basic_ack(delivered[-1], multiple=True)
        pump([conn], lambda: len(delivered) == 15, 10, "the last 5 deliveries")
        wait_for(consumer_at(15, 0), 10, "the consumer caught up")
    finally:
        conn.close()
    wait_for(
        lambda: stream_row(managed, "events")["consumers"] == [],  # type: ignore[index]
        10,
        "the consumer gone with its connection",
    )


@pytest.fixture
def small_window(broker_factory: Callable[..., Broker]) -> Broker:
    """A broker whose queue logs hold WINDOW messages: more page to disk."""
    return start_managed(broker_factory, "--queue-capacity", str(WINDOW))


def test_paging_shows_the_queue_past_its_window(small_window: Broker) -> None:
    page = shoal(small_window)
    assert page["paging"]["queue_window"] == WINDOW
    assert page["paging"]["queues"] == [] and page["paging"]["messages_paged_out"] == 0
    count = 5 * WINDOW
    conn = connect(small_window)
    try:
        ch = conn.channel()
        ch.queue_declare("deep")
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", "deep", b"x" * 100 + i.to_bytes(4, "big"))

        def paged() -> dict[str, Any] | None:
            rows = shoal(small_window)["paging"]["queues"]
            return next((q for q in rows if q["name"] == "deep"), None)

        # Every publish was confirmed: each message is in the log or paged out.
        row = wait_for(paged, 10, "the queue in the paging table")
        assert row["vhost"] == "/"
        assert row["messages_paged_out"] > 0
        assert row["messages_paged_out"] + row["messages_in_memory"] == count
        assert row["messages_in_memory"] <= WINDOW
        totals = shoal(small_window)["paging"]
        assert totals["messages_paged_out"] == row["messages_paged_out"]

        # Drained, the queue leaves the table and its paging files go.
        for _ in range(count):
            method, _props, _body = ch.basic_get("deep", auto_ack=True)
            assert method is not None
        wait_for(lambda: paged() is None, 10, "the drained queue out of the paging table")
        assert shoal(small_window)["paging"]["paging_file_bytes"] == 0
    finally:
        conn.close()


def test_only_monitoring_and_administrator_users_see_it(managed: Broker) -> None:  # noqa: F811
    for user, tags in (("mgr", "management"), ("pm", "policymaker"), ("mon", "monitoring")):
        status, body = http(managed, "PUT", f"/users/{user}", {"password": "pw", "tags": tags})
        assert status == 201, body
    for user in ("mgr", "pm"):
        assert http(managed, "GET", "/shoal", user=user, password="pw") == (
            401,
            {"error": "not_authorized", "reason": "Not monitor user"},
        )
    assert len(shoal(managed, "mon", "pw")["io_workers"]) == 2
    assert http(managed, "GET", "/shoal", password="wrong")[0] == 401


def test_the_extension_is_listed_and_its_files_served_without_login(
    managed: Broker,  # noqa: F811
) -> None:
    port = managed.management_port  # type: ignore[attr-defined]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/extensions",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert {"javascript": "shoal.js"} in json.loads(response.read())
    for path, local in (("/js/shoal.js", "shoal.js"), ("/js/tmpl/shoal.ejs", "shoal.ejs")):
        status, body = get(managed, path)
        assert (status, body) == (200, (EXTENSION / local).read_bytes()), path
    script = (EXTENSION / "shoal.js").read_text()
    assert "dispatcher_add(" in script and "NAVIGATION['Shoal']" in script
    # render() needs a template that starts with its <h1> (the page's title).
    assert (EXTENSION / "shoal.ejs").read_text().startswith("<h1>")
    assert get(managed, "/api/shoal")[0] == 401  # the data needs a login


@pytest.mark.browser  # its own CI step (--browser), as tests/browser
@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no Chromium to render the page in",
)
def test_the_page_renders_in_a_browser_empty_and_full(managed: Broker) -> None:  # noqa: F811
    """The UI itself logs in, follows the Shoal tab and renders the
    template, with nothing to list and then with a stream and a consumer:
    no template error (the UI writes those into #debug) and no page error."""
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    port = managed.management_port  # type: ignore[attr-defined]
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "console",
                lambda msg: errors.append(msg.text) if "Uncaught" in msg.text else None,
            )
            page.goto(f"http://127.0.0.1:{port}/", timeout=20_000)
            page.fill("input[name=username]", "guest")
            page.fill("input[name=password]", "guest")
            page.click("input[type=submit]")
            page.wait_for_selector("#tabs a[href='#/shoal']", timeout=20_000)

            def show_shoal(expect: str) -> str:
                """Shoal's page once its text has `expect` (or the UI
                reported a template error): the UI refreshes it every 5 s."""
                page.goto(f"http://127.0.0.1:{port}/#/shoal", timeout=20_000)
                page.wait_for_function(
                    "expect => (document.querySelector('#main') || {innerText: ''})"
                    ".innerText.includes(expect)"
                    " || (document.querySelector('#debug') || {}).innerText",
                    arg=expect,
                    timeout=20_000,
                )
                assert page.inner_text("#debug").strip() == "", page.inner_text("#debug")
                text: str = page.inner_text("#main")
                assert text.startswith("Shoal on node"), text
                return text

            text = show_shoal("... no streams ...")
            for heading in ("IO workers", "Streams", "Paging to disk", "Cluster"):
                assert heading in text
            assert "standalone" in text

            conn = connect(managed)
            try:
                ch = conn.channel()
                ch.queue_declare("shown", durable=True, arguments={"x-queue-type": "stream"})
                ch.confirm_delivery()
                ch.basic_publish("", "shown", b"hello")
                ch.basic_qos(prefetch_count=10)
                ch.basic_consume(
                    "shown",
                    lambda *_: None,
                    arguments={"x-stream-offset": "first"},
                    consumer_tag="shown-reader",
                )

                def consuming() -> bool:
                    conn.process_data_events(time_limit=0)
                    stream = stream_row(managed, "shown")
                    return bool(stream and stream["consumers"])

                wait_for(consuming, 10, "the stream's consumer in /api/shoal")
                page.goto(f"http://127.0.0.1:{port}/#/queues", timeout=20_000)
                text = show_shoal("shown-reader")
                assert "Stream consumers" in text
            finally:
                conn.close()
            assert errors == []
        finally:
            browser.close()
