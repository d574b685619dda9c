"""Message deduplication (x-message-deduplication, issue 26) as pika clients
see it: RabbitMQ's message-deduplication plugin's and LavinMQ's API, a
cache shared by both IO workers, exact, kept over restarts when on disk.

Every wait is bounded; the TTL test waits for the clock to pass a TTL of a
few milliseconds (what it tests), never for the broker.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from tests.broker_process import Broker
from tests.clients import connect, connections_on_both_workers, worker_of

DEDUP = {"x-message-deduplication": True}


def props(key: Any, **headers: Any) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-deduplication-header": key, **headers})


def depth(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def bodies(ch: Any, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _p, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def test_a_queue_takes_one_copy_of_each_key_and_confirms_every_publish(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dq", arguments=DEDUP)
    for key in ("a", "b", "a", "c", "b", "a"):
        ch.basic_publish("", "dq", key.encode(), props(key))  # acked: no NackError
    # A duplicate is accepted, not returned, even when mandatory.
    ch.basic_publish("", "dq", b"a-again", props("a"), mandatory=True)
    # A message with no header is not checked.
    ch.basic_publish("", "dq", b"plain")
    ch.basic_publish("", "dq", b"plain")
    assert bodies(ch, "dq") == [b"a", b"b", b"c", b"plain", b"plain"]
    # The key's type counts, as for the plugin: 5 and "5" differ.
    ch.basic_publish("", "dq", b"int", props(5))
    ch.basic_publish("", "dq", b"str", props("5"))
    ch.basic_publish("", "dq", b"int-again", props(5))
    assert bodies(ch, "dq") == [b"int", b"str"]
    conn.close()


def test_the_plugin_exchange_type_routes_as_fanout_once_per_key(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx", "x-message-deduplication", arguments={"x-cache-size": 100})
    for q in ("q1", "q2"):
        ch.queue_declare(q)
        ch.queue_bind(q, "dx", routing_key="ignored")
    for key in ("k1", "k2", "k1"):
        ch.basic_publish("dx", "any-key", key.encode(), props(key))
    assert bodies(ch, "q1") == [b"k1", b"k2"]
    assert bodies(ch, "q2") == [b"k1", b"k2"]
    # The duplicate of a mandatory publish is accepted: not returned.
    ch.basic_publish("dx", "", b"dup", props("k1"), mandatory=True)
    assert depth(ch, "q1") == 0
    conn.close()


def test_any_exchange_with_the_argument_deduplicates_and_keeps_its_routing(
    broker: Broker,
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("lx", "direct", arguments={**DEDUP, "x-cache-size": 10})
    ch.queue_declare("green")
    ch.queue_declare("red")
    ch.queue_bind("green", "lx", "green")
    ch.queue_bind("red", "lx", "red")
    ch.basic_publish("lx", "green", b"1", props("one"))
    ch.basic_publish("lx", "red", b"1-again", props("one"))  # seen at the exchange
    ch.basic_publish("lx", "red", b"2", props("two"))
    assert bodies(ch, "green") == [b"1"]
    assert bodies(ch, "red") == [b"2"]
    # Unroutable and mandatory, and not a duplicate: returned as ever.
    with pytest.raises(UnroutableError):
        ch.basic_publish("lx", "blue", b"3", props("three"), mandatory=True)
    conn.close()


@pytest.mark.parametrize(
    ("type_", "arguments", "text"),
    [
        (
            "x-message-deduplication",
            {},
            "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0",
        ),
        (
            "x-message-deduplication",
            {"x-cache-size": 0},
            "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0",
        ),
        (
            "fanout",
            {**DEDUP, "x-cache-ttl": -1},
            "Invalid argument, 'x-cache-ttl' must be an integer greater than 0",
        ),
        (
            "x-message-deduplication",
            {"x-cache-size": 5, "x-cache-persistence": "tape"},
            "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'",
        ),
    ],
)
def test_bad_arguments_are_refused_with_the_plugins_texts(
    broker: Broker, type_: str, arguments: dict[str, Any], text: str
) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare("bad", type_, arguments=arguments)
    assert info.value.reply_code == 406
    assert info.value.reply_text == f"PRECONDITION_FAILED - {text}"
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare("bad", type_, passive=True)  # nothing was made
    assert info.value.reply_code == 404
    conn.close()


def test_many_publishers_on_two_workers_enqueue_each_id_exactly_once(
    broker: Broker,
) -> None:
    """Six publishers, three per IO worker, send the same 400 ids in
    different orders at once: every id is in the queue once."""
    ids, per_worker = 400, 3
    first, other = connections_on_both_workers(broker)
    first.channel().queue_declare("race", arguments={**DEDUP, "x-cache-size": 1000})
    conns = [first, other]
    while (
        sum(worker_of(c) == worker_of(first) for c in conns) < per_worker
        or sum(worker_of(c) == worker_of(other) for c in conns) < per_worker
    ):
        c = connect(broker)
        mine = sum(worker_of(x) == worker_of(c) for x in conns)
        if mine < per_worker:
            conns.append(c)
        else:
            c.close()
        assert len(conns) <= 2 * per_worker
    start = threading.Barrier(len(conns))
    errors: list[BaseException] = []

    def publish(conn: pika.BlockingConnection, seed: int) -> None:
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            order = list(range(ids))
            order = order[seed * 67 % ids :] + order[: seed * 67 % ids]
            start.wait(30)
            for i in order:
                ch.basic_publish("", "race", b"%d" % i, props(f"id-{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(c, n)) for n, c in enumerate(conns)]
    # pika connections are not thread-safe: each thread uses its own only.
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    assert not errors, errors
    check = connect(broker).channel()
    got = sorted(int(b) for b in bodies(check, "race"))
    assert got == list(range(ids))
    for c in conns:
        c.close()


def test_the_cache_keeps_x_cache_size_keys_the_oldest_going_first(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("small", arguments={**DEDUP, "x-cache-size": 3})
    for key in ("a", "b", "c", "d"):  # "a" is the oldest: gone when "d" came
        ch.basic_publish("", "small", key.encode(), props(key))
    for key in ("b", "c", "d", "a"):  # b, c, d duplicates; "a" new (evicts b)
        ch.basic_publish("", "small", key.encode() + b"2", props(key))
    assert bodies(ch, "small") == [b"a", b"b", b"c", b"d", b"a2"]
    conn.close()


def test_a_key_expires_after_the_caches_ttl_or_the_messages(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("ttl", arguments={**DEDUP, "x-cache-ttl": 60_000})
    ch.basic_publish("", "ttl", b"1", props("k"))
    ch.basic_publish("", "ttl", b"2", props("k"))  # within the TTL: a duplicate
    ch.basic_publish("", "ttl", b"3", props("short", **{"x-cache-ttl": 20}))
    sent = time.monotonic()
    ch.basic_publish("", "ttl", b"4", props("short", **{"x-cache-ttl": 20}))
    fast = time.monotonic() - sent < 0.02  # (else "4" may have come after the TTL)
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # the clock passes the 20 ms TTL
        time.sleep(0.005)
    ch.basic_publish("", "ttl", b"5", props("short", **{"x-cache-ttl": 20}))
    ch.basic_publish("", "ttl", b"6", props("k"))  # 60 s: still a duplicate
    got = bodies(ch, "ttl")
    assert got == ([b"1", b"3", b"5"] if fast else [b"1", b"3", b"4", b"5"])
    conn.close()


def test_a_refused_publish_leaves_no_key_so_its_retry_gets_in(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(
        "full",
        arguments={**DEDUP, "x-max-length": 1, "x-overflow": "reject-publish"},
    )
    ch.basic_publish("", "full", b"k1", props("k1"))
    with pytest.raises(NackError):
        ch.basic_publish("", "full", b"k2", props("k2"))
    assert bodies(ch, "full") == [b"k1"]  # room again
    ch.basic_publish("", "full", b"k2", props("k2"))  # the retry gets in
    assert bodies(ch, "full") == [b"k2"]
    conn.close()


def test_transactions_check_at_commit_and_a_rollback_leaves_no_key(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("txq", arguments=DEDUP)
    ch.tx_select()
    ch.basic_publish("", "txq", b"r", props("r"))
    ch.tx_rollback()
    ch.basic_publish("", "txq", b"r2", props("r"))  # the rollback left no key
    ch.basic_publish("", "txq", b"r3", props("r"))
    ch.tx_commit()
    check = conn.channel()
    assert bodies(check, "txq") == [b"r2"]
    conn.close()


def _cache_files(broker: Broker) -> list[str]:
    directory = os.path.join(broker.data_dir, "dedup")
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill-9"])
def test_a_durable_queues_and_a_disk_exchanges_cache_survive(
    broker_factory: Any, crash: bool
) -> None:
    broker: Broker = broker_factory(workers=2)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("keep", durable=True, arguments=DEDUP)
    ch.queue_declare("gone", durable=False, arguments=DEDUP)  # memory: starts empty
    ch.exchange_declare(
        "disk-x",
        "x-message-deduplication",
        durable=True,
        arguments={"x-cache-size": 50, "x-cache-persistence": "disk"},
    )
    ch.queue_declare("out", durable=True)
    ch.queue_bind("out", "disk-x")
    persistent = {"delivery_mode": 2}
    for key in ("p1", "p2"):
        ch.basic_publish("", "keep", key.encode(), props(key, **{}), mandatory=False)
        ch.basic_publish(
            "disk-x",
            "",
            key.encode(),
            pika.BasicProperties(headers={"x-deduplication-header": key}, **persistent),
        )
    ch.basic_publish("", "gone", b"m", props("m"))
    assert len(_cache_files(broker)) == 2  # the durable queue's, the disk exchange's
    conn.close()
    broker.restart(crash=crash)
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("gone", durable=False, arguments=DEDUP)
    for key in ("p1", "p2", "p3"):
        ch.basic_publish("", "keep", key.encode() + b"-after", props(key))
        ch.basic_publish("disk-x", "", key.encode() + b"-after", props(key))
    ch.basic_publish("", "gone", b"m-after", props("m"))
    # Transient messages to the durable queue are gone with the restart;
    # their keys are not.
    assert bodies(ch, "keep") == [b"p3-after"]
    assert bodies(ch, "out") == [b"p1", b"p2", b"p3-after"]
    assert bodies(ch, "gone") == [b"m-after"]
    # Deleting them deletes their caches.
    ch.queue_delete("keep")
    ch.exchange_delete("disk-x")
    assert _cache_files(broker) == []
    conn.close()
