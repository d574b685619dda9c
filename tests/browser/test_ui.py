"""The management web UI in a real browser (issue 27): headless Chromium
(Debian's), driven by Playwright, logs in as guest, opens every page an
operator uses, does what an operator does there, and the broker's state is
checked over AMQP afterwards. A page error, a template error or an /api/
answer of 4xx/5xx fails the test; so does a field RabbitMQ 3.10.8's answer
has on that page and Shoal's lacks, unless it is one named below with why.

Screenshots of every page go to the test's output directory
(tmp_path/screens, or $SHOAL_UI_SCREENSHOTS). CI runs these in their own
step (`--browser`): they need chromium and playwright."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.browser import ui_driver
from tests.integration.test_management import start_managed

pytestmark = pytest.mark.browser
REFERENCE = Path(__file__).parent / "data" / "rabbitmq_3_10_ui.json"

# Fields RabbitMQ's answers have that Shoal's leave out, and why (the last
# name of the field; "_details" goes with its counter).
NOT_SERVED = {
    # Erlang's VM: Shoal's processes are OS processes running Python.
    "garbage_collection": "an Erlang process's heap settings",
    "reductions": "Erlang's scheduler work units",
    "gc_num": "Erlang's garbage collections",
    "gc_bytes_reclaimed": "Erlang's garbage collections",
    "metrics_gc_queue_length": "the Erlang stats database's queues",
    "mnesia_disk_tx_count": "Mnesia, RabbitMQ's schema database",
    "mnesia_ram_tx_count": "Mnesia, RabbitMQ's schema database",
    "ra_open_file_metrics": "Ra, RabbitMQ's Raft library",
    "cowboy_opts": "Cowboy, RabbitMQ's web server",
    "ssl_opts": "Cowboy, RabbitMQ's web server",
    "backlog": "Erlang's listen socket options",
    "exit_on_close": "Erlang's listen socket options",
    "linger": "Erlang's listen socket options",
    "nodelay": "Erlang's listen socket options",
    "io_read_avg_time": "Erlang's file handle cache",
    "io_write_avg_time": "Erlang's file handle cache",
    "io_seek_avg_time": "Erlang's file handle cache",
    "io_seek_count": "Erlang's file handle cache",
    "io_sync_avg_time": "Erlang's file handle cache",
    "io_sync_count": "Erlang's file handle cache",
    "io_reopen_count": "Erlang's file handle cache",
    # RabbitMQ's own storage: Shoal's store is another design.
    "backing_queue_status": "a classic queue's internal queues (q1..q4, delta)",
    "msg_store_read_count": "RabbitMQ's message store",
    "msg_store_write_count": "RabbitMQ's message store",
    "queue_index_read_count": "RabbitMQ's queue index",
    "queue_index_write_count": "RabbitMQ's queue index",
    "disk_reads": "RabbitMQ's queue index reads",
    "disk_writes": "RabbitMQ's queue index writes",
    "release_series_support_status": "RabbitMQ's release series",
    # Not tracked: the UI then shows the object's state (running), not "idle".
    "idle_since": "when a queue or channel last did something",
}
# A channel's message_stats are counted (publish, confirm, unroutable,
# deliver/get, ack) and an exchange's (publish_in, publish_out); a
# connection's, RabbitMQ's sum of its channels', are not.
NOT_COUNTED_HERE = {
    "connection": {"message_stats"},
}
VHOST_NOT_COUNTED = {"confirm", "drop_unroutable", "return_unroutable"}


def allowed(page: str, path: str, field: str) -> bool:
    name = field.rsplit(".", 1)[-1].removesuffix("_details")
    if name in NOT_SERVED:
        return True
    if "/api/vhosts" in path and name in VHOST_NOT_COUNTED:
        return True
    top = field.lstrip(".").removeprefix("items").removeprefix("[].")
    return top in NOT_COUNTED_HERE.get(page, set())


@pytest.fixture
def ui_broker(broker_factory: Callable[..., Broker]) -> Broker:
    # Rates sampled every 0.5 s, so that charts have samples within the test;
    # shovels on, so the shovel pages and "Move messages" are there.
    return start_managed(broker_factory, "--collect-statistics-interval", "500", "--shovels")


@pytest.fixture
def screens(tmp_path: Path) -> Path:
    where = Path(os.environ.get("SHOAL_UI_SCREENSHOTS") or tmp_path / "screens")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def session(ui_broker: Broker, screens: Path) -> Iterator[ui_driver.UiSession]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        port = ui_broker.management_port  # type: ignore[attr-defined]
        ui = ui_driver.UiSession(playwright, f"http://127.0.0.1:{port}/", screens)
        try:
            yield ui
        finally:
            ui.close()


def failures(visit: ui_driver.Visit) -> list[str]:
    bad = [f"{visit.route}: {e}" for e in visit.errors]
    bad += [
        f"{visit.route}: {status} from {path}"
        for path, (status, _body) in visit.answers.items()
        if status >= 400
    ]
    return bad


def test_every_page_renders_with_the_fields_rabbitmq_gives(
    ui_broker: Broker, session: ui_driver.UiSession
) -> None:
    scenario = ui_driver.Scenario(ui_broker.port, ui_broker.management_port)  # type: ignore[attr-defined]
    try:
        names = scenario.names()

        def sampled() -> bool:
            path = "/api/queues/%2F/ui.q?lengths_age=60"
            queue = ui_driver.api(scenario.management_port, "GET", path)
            return bool(queue["messages_details"]["samples"])

        wait_for(sampled, 20, "a sample of ui.q's length")
        visits = [session.login()]
        visits += [session.visit(route, name) for name, route in ui_driver.routes(names)]
        page = session.page  # (reads the page only: no request in between)
        brand = {
            "title": page.title(),
            "logo": page.locator("#logo img").get_attribute("src"),
            "logo drawn": page.evaluate("document.querySelector('#logo img').naturalWidth > 0"),
            "versions": page.locator("#versions").inner_text(),
        }
        shoal = session.visit("#/shoal", "shoal")
        consumed = api_from_page(session, "/api/queues/%2F/ui.consumed")
    finally:
        scenario.close()
    problems = [p for v in [*visits, shoal] for p in failures(v)]
    assert not problems, "\n".join(problems)
    # Shoal's own name and mark in the header (www/SHOAL.md), and the
    # runtime it runs on.
    assert brand["title"] == "Shoal Management"
    assert brand["logo"] == "img/shoal-logo.svg" and brand["logo drawn"], brand
    assert "Python 3." in brand["versions"] and "Erlang" not in brand["versions"], brand
    for visit in [*visits[1:], shoal]:  # every page but the login form
        assert visit.logo == "img/shoal-logo.svg", (visit.route, visit.logo)
        assert "Erlang" not in visit.text, f"an Erlang label on {visit.route}"

    # The same API calls as against RabbitMQ, and every field its answers
    # have, but those named above.
    reference = json.loads(REFERENCE.read_text())
    ours = ui_driver.normalised(visits, names)
    gaps = []
    for page, answers in reference.items():
        assert set(ours[page]) == set(answers), page
        for path, answer in answers.items():
            missing = ui_driver.missing(answer["shape"], ours[page][path]["shape"])
            gaps += [f"{page} {path} {f}" for f in missing if not allowed(page, path, f)]
    assert not gaps, "\n".join(gaps)

    # Live data on the pages.
    by_page = {v.route: v for v in visits}
    queues = by_page["queues"].answers
    (_status, listing), *_ = [a for p, a in queues.items() if p.startswith("/api/queues?")]
    row = next(q for q in listing["items"] if q["name"] == "ui.q")
    assert (row["messages_ready"], row["consumers"]) == (3, 0)
    assert row["message_bytes"] == len(b"message 0") * 3
    _status, queue = next(a for p, a in by_page["queue"].answers.items() if "ui.q?" in p)
    assert [s["sample"] for s in queue["messages_details"]["samples"]][:1] == [3]
    assert [c["channel_details"]["name"] for c in consumed["consumer_details"]] == [
        names["channel"]
    ]
    _status, connection = next(
        a for p, a in by_page["connection"].answers.items() if "/channels" not in p
    )
    assert connection["client_properties"]["connection_name"] == "ui-consumer"
    assert connection["recv_oct"] > 0 and connection["send_oct"] > 0
    _status, overview = next(
        a for p, a in by_page["overview"].answers.items() if p.startswith("/api/overview")
    )
    assert overview["object_totals"]["consumers"] >= 1
    assert overview["churn_rates"]["connection_created"] >= 1
    assert [p.split("?")[0] for p in shoal.answers] == ["/api/shoal"]


def api_from_page(session: ui_driver.UiSession, path: str) -> Any:
    """One API answer fetched by the page itself (with its login)."""
    return session.page.evaluate("path => JSON.parse(sync_get(path))", path.removeprefix("/api"))


def amqp(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def depth(broker: Broker, queue: str) -> int | None:
    """Messages ready in `queue`, or None if it does not exist."""
    connection = amqp(broker)
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker:
        return None
    finally:
        if connection.is_open:
            connection.close()


def open_section(session: ui_driver.UiSession, heading: str) -> None:
    """Unfold a folded section (the page remembers which are open)."""
    folded = session.page.locator(
        "#main div:is(.section-hidden:not(.section-visible), .section-invisible) > h2",
        has_text=heading,
    )
    if folded.count():
        folded.first.click()


def test_operator_actions_change_the_broker(
    ui_broker: Broker, session: ui_driver.UiSession
) -> None:
    page = session.page
    session.login()
    session.visit("#/queues", "actions-queues")

    # Add a queue.
    open_section(session, "Add a new queue")
    add = page.locator("form[action='#/queues'][method=put]")
    add.locator("input[name=name]").fill("ui.added")
    add.locator("input[type=submit]").click()
    wait_for(lambda: depth(ui_broker, "ui.added") == 0, 20, "the queue added in the UI")

    # Publish two messages to it from its page, then get one back.
    session.visit("#/queues/%2F/ui.added", "actions-queue")
    for body in ("hello from the UI", "second"):
        open_section(session, "Publish message")
        publish = page.locator("form[action='#/exchanges/publish']")
        publish.locator("textarea[name=payload]").fill(body)
        publish.locator("input[type=submit]").click()
        page.wait_for_selector(".form-popup-info")  # "Message published."
        page.locator(".form-popup-info span").first.click()
        page.wait_for_function("document.querySelectorAll('.form-popup-info').length === 0")
    wait_for(lambda: depth(ui_broker, "ui.added") == 2, 20, "two messages published")
    open_section(session, "Get messages")
    get = page.locator("form[action='#/queues/get']")
    get.locator("select[name=ackmode]").select_option("ack_requeue_false")
    get.locator("input[type=submit]").click()
    page.wait_for_selector("#msg-wrapper pre")
    assert "hello from the UI" in page.locator("#msg-wrapper").inner_text()
    session.screenshot("actions-got-message")
    wait_for(lambda: depth(ui_broker, "ui.added") == 1, 20, "the got message acked")

    # Purge, then delete (each asks "Are you sure?": the session accepts).
    open_section(session, "Purge")
    page.locator("form.confirm-purge-queue input[type=submit]").click()
    page.wait_for_selector(".form-popup-info")
    wait_for(lambda: depth(ui_broker, "ui.added") == 0, 20, "the queue purged")
    open_section(session, "Delete")
    page.locator("form.confirm-queue input[type=submit]").click()
    wait_for(lambda: depth(ui_broker, "ui.added") is None, 20, "the queue deleted")
    page.wait_for_function("location.hash === '#/queues'")

    # Add a user, give it permissions on /, and log in as it over AMQP.
    session.visit("#/users", "actions-users")
    open_section(session, "Add a user")
    form = page.locator("form[action='#/users-add']")
    form.locator("input[name=username]").fill("ui-user")
    form.locator("input[name=password]").fill("ui-secret")
    form.locator("input[name=password_confirm]").fill("ui-secret")
    form.locator("input[name=tags]").fill("management")
    form.locator("input[type=submit]").click()
    page.wait_for_selector("#main a:has-text('ui-user')")
    session.visit("#/users/ui-user", "actions-user")
    open_section(session, "Permissions")
    perms = page.locator("form[action='#/permissions'][method=put]")
    perms.locator("select[name=vhost]").select_option("/")
    perms.locator("input[name=configure]").fill("^ui-user\\.")
    perms.locator("input[type=submit]").click()
    port = ui_broker.management_port  # type: ignore[attr-defined]

    def permitted() -> bool:
        try:
            return bool(ui_driver.api(port, "GET", "/api/permissions/%2F/ui-user"))
        except urllib.error.HTTPError:
            return False

    wait_for(permitted, 20, "the permissions set in the UI")
    page.wait_for_selector("#main table.list td:has-text('ui-user')")
    session.screenshot("actions-user-permissions")
    problems = failures(session.current)
    assert not problems, "\n".join(problems)

    params = pika.URLParameters(f"amqp://ui-user:ui-secret@127.0.0.1:{ui_broker.port}/")
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.queue_declare("ui-user.own", auto_delete=True)  # configure allows it
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().queue_declare("not-theirs")
        assert refused.value.reply_code == 403
    finally:
        connection.close()


def test_exchange_and_channel_rates_show_under_load(
    ui_broker: Broker, session: ui_driver.UiSession
) -> None:
    """A publisher at work: the exchange's page and the channels' list show
    a publish rate above zero (the page's own API answers, as it drew them)."""
    stop = threading.Event()

    def publish() -> None:
        connection = amqp(ui_broker)
        channel = connection.channel()
        channel.queue_declare("ui.load")
        channel.queue_bind("ui.load", "amq.direct", "load")
        while not stop.is_set():
            for _ in range(100):
                channel.basic_publish("amq.direct", "load", b"under load")
            channel.queue_purge("ui.load")  # a round trip: the publishes are in
        connection.close()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        session.login()

        def rate(route: str, name: str, path: str, pick: Callable[[Any], float]) -> float:
            visit = session.visit(route, name)
            assert not failures(visit), failures(visit)
            _status, answer = next(a for p, a in visit.answers.items() if p.startswith(path))
            return pick(answer)

        def exchange_rate() -> bool:
            return (
                rate(
                    "#/exchanges/%2F/amq.direct",
                    "load-exchange",
                    "/api/exchanges/%2F/amq.direct?",
                    lambda x: x["message_stats"]["publish_in_details"]["rate"],
                )
                > 0
            )

        def channel_rate() -> bool:
            return (
                rate(
                    "#/channels",
                    "load-channels",
                    "/api/channels?",
                    lambda page: max(
                        c.get("message_stats", {}).get("publish_details", {}).get("rate", 0)
                        for c in page["items"]
                    ),
                )
                > 0
            )

        wait_for(exchange_rate, 30, "a publish rate on the exchange's page", interval=1)
        wait_for(channel_rate, 30, "a publish rate on the channels' page", interval=1)
    finally:
        stop.set()
        publisher.join(10)


def test_move_messages_and_the_shovel_pages(
    ui_broker: Broker, session: ui_driver.UiSession
) -> None:
    """The shovel management plugin's pages (www/js/shovel.js, vendored):
    "Move messages" on a queue's page moves what the queue holds and the
    shovel removes itself; a shovel added under Admin runs, shows as running
    on the status page, moves what is published, and is deleted from its page."""
    page = session.page
    port = ui_broker.management_port  # type: ignore[attr-defined]
    connection = amqp(ui_broker)
    channel = connection.channel()
    channel.queue_declare("ui.move.from", durable=True)
    for i in range(30):
        channel.basic_publish("", "ui.move.from", f"m{i}".encode())
    session.login()
    visits = [session.visit("#/queues/%2F/ui.move.from", "shovel-queue")]
    open_section(session, "Move messages")
    move = page.locator("form[action='#/shovel-parameters-move-messages']")
    move.locator("input[name=dest-queue]").fill("ui.move.to")
    move.locator("input[type=submit]").click()
    wait_for(lambda: depth(ui_broker, "ui.move.to") == 30, 30, "the 30 messages moved")
    assert depth(ui_broker, "ui.move.from") == 0
    wait_for(
        lambda: ui_driver.api(port, "GET", "/api/parameters/shovel") == [],
        30,
        "the move's shovel to remove itself",
    )

    visits.append(session.visit("#/dynamic-shovels", "shovel-management"))
    open_section(session, "Add a new shovel")
    add = page.locator("form[action='#/shovel-parameters'][method=put]")
    add.locator("input[name=name]").fill("ui-shovel")
    add.locator("input[name=amqp091-src-queue]").fill("ui.shovel.from")
    add.locator("input[name=amqp091-dest-queue]").fill("ui.shovel.to")
    add.locator("input[type=submit]").click()
    wait_for(
        lambda: [r["state"] for r in ui_driver.api(port, "GET", "/api/shovels")] == ["running"],
        30,
        "the shovel added in the UI to run",
    )
    visits.append(session.visit("#/shovels", "shovel-status"))
    status_text = page.locator("#main").inner_text()
    assert "ui-shovel" in status_text and "running" in status_text
    channel.basic_publish("", "ui.shovel.from", b"through the UI's shovel")
    wait_for(lambda: depth(ui_broker, "ui.shovel.to") == 1, 30, "the message shovelled")
    connection.close()

    visits.append(session.visit("#/dynamic-shovels/%2F/ui-shovel", "shovel-page"))
    assert "ui.shovel.from" in page.locator("#main").inner_text()
    open_section(session, "Delete this shovel")
    page.locator("form[action='#/shovel-parameters'][method=delete] input[type=submit]").click()
    wait_for(
        lambda: ui_driver.api(port, "GET", "/api/parameters/shovel") == [],
        30,
        "the shovel deleted in the UI",
    )
    problems = [p for visit in visits for p in failures(visit)]
    assert not problems, "\n".join(problems)
