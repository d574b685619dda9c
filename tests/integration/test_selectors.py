"""JMS message selectors (`x-filter-jms-selector` in basic.consume): a
consumer receives exactly the messages its selector accepts and leaves the
others for other consumers; a bad selector fails the consume with 406 and
says where. pika over real sockets, consumers on both IO workers."""

from __future__ import annotations

import collections
from typing import Any

import pika
import pytest

from tests.broker_process import Broker
from tests.clients import connect, pump, worker_of

REGIONS = ["north", "south", "east", "west", "centre", "nowhere"]
# Five disjoint selectors, each over headers and standard properties; a
# message whose region is 'nowhere' matches none of them.
SELECTORS = {
    "north": "region = 'north' AND size BETWEEN 0 AND 1000",
    "south": "region IN ('south') AND NOT (size > 1000)",
    "east": "region LIKE 'e_s%' AND size * 2 >= 0",
    "west": "region = 'west' AND (JMSPriority >= 0 OR size IS NULL)",
    "centre": "region <> 'north' AND region LIKE 'c%' AND size IS NOT NULL",
}


def test_five_selectors_get_exactly_their_subsets_of_10k_messages(broker: Broker) -> None:
    conns = [connect(broker) for _ in SELECTORS]
    assert len({worker_of(c) for c in conns}) == 2, "consumers should span both workers"
    got: dict[str, list[int]] = {name: [] for name in SELECTORS}
    pub = connect(broker)
    pch = pub.channel()
    pch.queue_declare("sel")
    for conn, (name, selector) in zip(conns, SELECTORS.items(), strict=True):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)

        def on_message(c: Any, m: Any, p: Any, body: bytes, name: str = name) -> None:
            got[name].append(int(body))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume("sel", on_message, arguments={"x-filter-jms-selector": selector})
    expected: dict[str, list[int]] = collections.defaultdict(list)
    n = 10_000
    for i in range(n):
        region = REGIONS[(i * 7) % len(REGIONS)]
        size = (i * 37) % 1000
        expected[region].append(i)
        pch.basic_publish(
            "",
            "sel",
            str(i).encode(),
            pika.BasicProperties(headers={"region": region, "size": size}, priority=i % 10),
        )
        if i % 500 == 0:
            for c in conns:
                c.process_data_events(time_limit=0)
    wanted = sum(len(expected[name]) for name in SELECTORS)
    pump(conns, lambda: sum(map(len, got.values())) >= wanted, 60, "every matching message")
    for c in conns:
        c.process_data_events(time_limit=0.2)
    for name in SELECTORS:
        assert got[name] == expected[name], f"selector {name!r} got the wrong messages"
    # What no selector wanted is still in the queue, for anybody else.
    left = pch.queue_declare("sel", passive=True).method.message_count
    assert left == len(expected["nowhere"])
    rest: list[int] = []
    pch.basic_consume("sel", lambda c, m, p, b: rest.append(int(b)), auto_ack=True)
    pump([pub], lambda: len(rest) >= left, 20, "the unmatched messages")
    assert rest == expected["nowhere"]
    assert broker.status()["processes"] and all(
        p.get("lost_wakeups_rescued", 0) == 0 for p in broker.status()["processes"]
    )
    for c in (*conns, pub):
        c.close()


def test_a_selector_consumer_is_woken_by_the_first_match_after_a_backlog(broker: Broker) -> None:
    sub, pub = connect(broker), connect(broker)
    pch = pub.channel()
    pch.queue_declare("sel2")
    for i in range(200):
        pch.basic_publish("", "sel2", b"no", pika.BasicProperties(headers={"k": i}))
    got: list[bytes] = []
    sub.channel().basic_consume(
        "sel2",
        lambda c, m, p, b: got.append(b),
        auto_ack=True,
        arguments={"x-filter-jms-selector": "k > 1000"},
    )
    sub.process_data_events(time_limit=0.2)
    assert got == []
    for k in (5, 2000, 7, 3000):
        pch.basic_publish("", "sel2", b"%d" % k, pika.BasicProperties(headers={"k": k}))
    pump([sub], lambda: len(got) >= 2, 10, "the two matching messages")
    assert got == [b"2000", b"3000"]
    assert pch.queue_declare("sel2", passive=True).method.message_count == 202
    sub.close()
    pub.close()


def test_selector_and_plain_consumer_share_a_queue(broker: Broker) -> None:
    a, b = connect(broker), connect(broker)
    pch = a.channel()
    pch.queue_declare("sel3")
    picky: list[int] = []
    plain: list[int] = []
    bch = b.channel()
    bch.basic_qos(prefetch_count=10)
    bch.basic_consume(
        "sel3",
        lambda c, m, p, body: (picky.append(int(body)), c.basic_ack(m.delivery_tag)),
        arguments={"x-filter-jms-selector": "colour = 'red'"},
    )
    ach = a.channel()
    ach.basic_qos(prefetch_count=10)
    ach.basic_consume(
        "sel3", lambda c, m, p, body: (plain.append(int(body)), c.basic_ack(m.delivery_tag))
    )
    for i in range(1000):
        colour = "red" if i % 3 == 0 else "blue"
        pch.basic_publish("", "sel3", b"%d" % i, pika.BasicProperties(headers={"colour": colour}))
    pump([a, b], lambda: len(picky) + len(plain) >= 1000, 30, "all 1000 messages")
    assert set(picky) | set(plain) == set(range(1000))
    assert not set(picky) & set(plain)
    assert all(i % 3 == 0 for i in picky)
    assert picky == sorted(picky) and plain == sorted(plain)
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("selector", "where"),
    [
        ("colour = = 'red'", "unexpected '=' at position 9"),
        ("colour = 'red", "at position 9"),
        ("colour IN (1, 2)", "at position 11"),
    ],
)
def test_an_invalid_selector_fails_the_consume_with_its_position(
    broker: Broker, selector: str, where: str
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("sel4")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("sel4", lambda *a: None, arguments={"x-filter-jms-selector": selector})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.startswith("PRECONDITION_FAILED - invalid selector")
    assert where in exc.value.reply_text
    conn.close()


def test_a_browser_with_a_selector_sees_only_what_it_selects(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("sel5")
    for i in range(20):
        ch.basic_publish("", "sel5", b"%d" % i, pika.BasicProperties(headers={"n": i}))
    seen: list[int] = []
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    ch.basic_consume(
        "sel5",
        lambda c, m, p, b: seen.append(int(b)),
        auto_ack=True,
        arguments={
            "x-filter-no-consume": True,
            "x-filter-auto-close": True,
            "x-filter-jms-selector": "n >= 15 OR n = 3",
        },
    )
    pump([conn], lambda: bool(cancelled), 10, "the end of the browse")
    assert seen == [3, 15, 16, 17, 18, 19]
    assert ch.queue_declare("sel5", passive=True).method.message_count == 20
    conn.close()


@pytest.mark.parametrize("consumers", [1, 2])
def test_a_long_run_of_unwanted_messages_is_read_in_slices(broker: Broker, consumers: int) -> None:
    """More unwanted entries than one slice (1024) in front of the wanted
    ones: the selector consumer yields between slices and still gets them,
    whether it is the queue's only consumer or one of two."""
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("sel6")
    for _ in range(3000):
        ch.basic_publish("", "sel6", b"no", pika.BasicProperties(headers={"k": "no"}))
    for i in range(3):
        ch.basic_publish("", "sel6", b"%d" % i, pika.BasicProperties(headers={"k": "yes"}))
    got: list[bytes] = []
    for _ in range(consumers):
        ch.basic_consume(
            "sel6",
            lambda c, m, p, b: got.append(b),
            auto_ack=True,
            arguments={"x-filter-jms-selector": "k = 'yes'"},
        )
    pump([conn], lambda: len(got) >= 3, 10, "the wanted messages behind the unwanted ones")
    assert sorted(got) == [b"0", b"1", b"2"]
    assert ch.queue_declare("sel6", passive=True).method.message_count == 3000
    conn.close()
