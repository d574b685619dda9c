"""Browsers (Qpid's non-acquiring consumers): basic.consume with
`x-filter-no-consume: true` sees every available message in queue order and
takes none; with `x-filter-auto-close: true` it is cancelled (a server-sent
basic.cancel) once it reaches the end of the queue. pika over real sockets,
with connections on both IO workers."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from tests.broker_process import Broker
from tests.clients import connect, connections_on_both_workers, pump

BROWSE = {"x-filter-no-consume": True}
SNAPSHOT = {"x-filter-no-consume": True, "x-filter-auto-close": True}


def fill(ch: Any, queue: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        ch.basic_publish("", queue, str(i).encode())


def ready(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_browser_sees_every_message_in_order_and_leaves_them(broker: Broker) -> None:
    pub, browser_conn = connections_on_both_workers(broker)
    ch = pub.channel()
    ch.queue_declare("b1")
    fill(ch, "b1", 1000)
    bch = browser_conn.channel()
    seen: list[tuple[bytes, bool]] = []
    bch.basic_consume(
        "b1",
        lambda c, m, p, body: seen.append((body, m.redelivered)),
        auto_ack=True,
        arguments=BROWSE,
    )
    pump([browser_conn], lambda: len(seen) >= 1000, 20, "1000 browsed messages")
    assert [int(body) for body, _ in seen] == list(range(1000))
    assert not any(redelivered for _, redelivered in seen)
    assert ready(ch, "b1") == 1000
    # Still there for an acquiring consumer, all of them.
    got = []
    ch.basic_consume("b1", lambda c, m, p, body: got.append(body), auto_ack=True)
    pump([pub], lambda: len(got) >= 1000, 20, "1000 consumed messages")
    assert [int(b) for b in got] == list(range(1000))
    browser_conn.process_data_events(time_limit=0.3)
    assert len(seen) == 1000  # the browser was not handed anything twice
    pub.close()
    browser_conn.close()


def test_browser_is_notified_of_new_messages(broker: Broker) -> None:
    pub, browser_conn = connections_on_both_workers(broker)
    ch = pub.channel()
    ch.queue_declare("b2")
    fill(ch, "b2", 3)
    seen: list[int] = []
    browser_conn.channel().basic_consume(
        "b2", lambda c, m, p, body: seen.append(int(body)), auto_ack=True, arguments=BROWSE
    )
    pump([browser_conn], lambda: len(seen) >= 3, 10, "the backlog")
    for round_ in range(5):  # each publish after it ran dry wakes it again
        fill(ch, "b2", 1, start=3 + round_)
        pump([browser_conn], lambda n=4 + round_: len(seen) >= n, 10, "a new message")
    assert seen == list(range(8))
    assert ready(ch, "b2") == 8
    pub.close()
    browser_conn.close()


def test_auto_close_browser_gets_a_snapshot_then_a_cancel(broker: Broker) -> None:
    pub, browser_conn = connections_on_both_workers(broker)
    ch = pub.channel()
    ch.confirm_delivery()  # all 1000 are in the queue before the snapshot starts
    ch.queue_declare("b3")
    fill(ch, "b3", 1000)
    bch = browser_conn.channel()
    seen: list[int] = []
    cancelled: list[str] = []
    bch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = bch.basic_consume(
        "b3", lambda c, m, p, body: seen.append(int(body)), auto_ack=True, arguments=SNAPSHOT
    )
    pump([browser_conn], lambda: bool(cancelled), 20, "the server-sent basic.cancel")
    assert cancelled == [tag]
    assert seen == list(range(1000))
    # Cancelled: later messages are not browsed, and the queue kept everything.
    fill(ch, "b3", 10, start=1000)
    assert ready(ch, "b3") == 1010
    browser_conn.process_data_events(time_limit=0.3)
    assert len(seen) == 1000
    assert ready(bch, "b3") == 1010  # the channel is still open and usable
    pub.close()
    browser_conn.close()


def test_auto_close_browser_on_an_empty_queue_is_cancelled_at_once(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("b4")
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume("b4", lambda *a: None, arguments=SNAPSHOT)
    pump([conn], lambda: bool(cancelled), 10, "basic.cancel")
    assert cancelled == [tag]
    conn.close()


def test_browsers_and_two_acquirers_together(broker: Broker) -> None:
    """Two acquiring consumers on different workers and two browsers, while a
    publisher sends: every message goes to exactly one acquirer, none is lost,
    and each browser sees what it sees in queue order, never twice."""
    a1, a2 = connections_on_both_workers(broker)
    b1, b2 = connections_on_both_workers(broker)
    pub = connect(broker)
    pch = pub.channel()
    pch.queue_declare("b5")
    n = 5000
    acquired: list[list[int]] = [[], []]
    browsed: list[list[int]] = [[], []]
    for i, conn in enumerate((a1, a2)):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=20)

        def on_acquired(c: Any, m: Any, p: Any, body: bytes, i: int = i) -> None:
            acquired[i].append(int(body))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume("b5", on_acquired)
    for i, conn in enumerate((b1, b2)):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)

        def on_browsed(c: Any, m: Any, p: Any, body: bytes, i: int = i) -> None:
            browsed[i].append(int(body))
            c.basic_ack(m.delivery_tag)  # acking a browsed copy settles nothing

        ch.basic_consume("b5", on_browsed, arguments=BROWSE)
    conns = [a1, a2, b1, b2]
    for start in range(0, n, 500):
        fill(pch, "b5", 500, start=start)
        for c in conns:
            c.process_data_events(time_limit=0)
    pump(conns, lambda: len(acquired[0]) + len(acquired[1]) >= n, 30, "every message acquired")
    for c in conns:
        c.process_data_events(time_limit=0.2)
    everything = sorted(acquired[0] + acquired[1])
    assert everything == list(range(n)), "a message was lost or delivered to both acquirers"
    assert acquired[0] and acquired[1]
    for seen in browsed:
        assert seen, "a browser saw nothing: the test did not exercise browsing"
        assert seen == sorted(set(seen)), "a browser saw messages out of order or twice"
    assert ready(pch, "b5") == 0
    for c in (*conns, pub):
        c.close()


def test_browser_nack_and_recover_leave_the_queue_alone(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("b6")
    fill(ch, "b6", 3)
    tags: list[int] = []
    ch.basic_consume("b6", lambda c, m, p, body: tags.append(m.delivery_tag), arguments=BROWSE)
    pump([conn], lambda: len(tags) >= 3, 10, "three browsed messages")
    ch.basic_nack(tags[0], requeue=True)
    ch.basic_reject(tags[1], requeue=False)
    ch.basic_recover(requeue=True)
    assert ready(ch, "b6") == 3
    conn.process_data_events(time_limit=0.2)
    assert len(tags) == 3  # nothing came back: nothing had been taken
    conn.close()


@pytest.mark.parametrize("name", ["x-filter-no-consume", "x-filter-auto-close"])
def test_a_browse_flag_that_is_not_a_boolean_is_refused(broker: Broker, name: str) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("b7")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("b7", lambda *a: None, arguments={name: "yes"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == f"PRECONDITION_FAILED - invalid arg '{name}' for consumer: 'yes'"
    conn.close()
