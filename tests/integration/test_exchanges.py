"""Exchanges and bindings with real clients over real sockets, on a broker
with two IO workers: routing by type, exchange-to-exchange bindings, the
alternate exchange, mandatory returns, deletion rules, RabbitMQ's error codes
and texts, a binding made through one worker used at once by a publish
through the other, definitions that outlive the scheduler, and enough
bindings to make the scheduler compact the definitions journal.

Where it matters the declaring and the publishing connections are on
different workers (proven by the `shoal_worker` server property). Publishes
use publisher confirms, so once basic_publish returns the message has been
routed and appended: queue counts are then exact, with no waiting.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import aio_pika
import pika
import pytest

from shoal.shm.catalog import C_EPOCH
from tests.broker_process import Broker, queue_gone, wait_for

ChannelClosed = pika.exceptions.ChannelClosedByBroker


# -------------------------------------------------------------- helpers
def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def worker_of(conn: pika.BlockingConnection) -> int:
    return int(conn._impl.server_properties["shoal_worker"])


class Clients:
    """Connections by worker. The acceptor hands a connection to the least
    loaded worker, so opening a few gets one on each; extras stay open (and
    are closed at the end) so they keep the load even."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.opened: list[pika.BlockingConnection] = []

    def connect(self) -> pika.BlockingConnection:
        conn = connect(self.broker)
        self.opened.append(conn)
        return conn

    def on(self, worker: int) -> pika.BlockingConnection:
        for _ in range(6):
            conn = connect(self.broker)
            self.opened.append(conn)
            if worker_of(conn) == worker:
                return conn
        raise AssertionError(f"no connection landed on worker {worker}")

    def close(self) -> None:
        for conn in self.opened:
            if conn.is_open:
                conn.close()


@pytest.fixture
def clients(broker: Broker) -> Iterator[Clients]:
    c = Clients(broker)
    yield c
    c.close()


def confirming(conn: pika.BlockingConnection) -> Any:
    ch = conn.channel()
    ch.confirm_delivery()
    return ch


def count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def bodies(ch: Any, queue: str) -> list[bytes]:
    """Every ready message of `queue`, taken (basic.get until empty)."""
    out: list[bytes] = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def channel_error(ch: Any, call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(ChannelClosed) as exc:
        call()
    assert ch.is_closed
    return exc.value.reply_code, exc.value.reply_text


def topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ's topic matching, written independently of broker/amqp/routing.py:
    '.'-separated words, the empty key has no words, '*' is one word, '#'
    zero or more."""
    p = pattern.split(".") if pattern else []
    k = key.split(".") if key else []

    @functools.cache
    def m(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(m(i + 1, jj) for jj in range(j, len(k) + 1))
        return j < len(k) and p[i] in ("*", k[j]) and m(i + 1, j + 1)

    return m(0, 0)


# ------------------------------------------------------------- routing
def test_direct_fanout_topic_route_to_exactly_the_bound_queues(
    broker: Broker, clients: Clients
) -> None:
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("d", "direct")
    decl.exchange_declare("f", "fanout")
    decl.exchange_declare("t", "topic")
    for q in ("d1", "d2", "d12", "f1", "f2"):
        decl.queue_declare(q)
    decl.queue_bind("d1", "d", "k1")
    decl.queue_bind("d2", "d", "k2")
    decl.queue_bind("d12", "d", "k1")
    decl.queue_bind("d12", "d", "k2")  # two bindings to one queue: one copy
    decl.queue_bind("f1", "f", "ignored")
    decl.queue_bind("f2", "f", "")

    patterns = {
        "t-acs": "a.*.c",
        "t-hc": "#.c",
        "t-all": "#",
        "t-ah": "a.#",
        "t-star": "*",
        "t-abc": "a.b.c",
        "t-stars": "*.*",
        "t-hh": "#.b.#",
    }
    for q, pattern in patterns.items():
        decl.queue_declare(q)
        decl.queue_bind(q, "t", pattern)
    # a second pattern for one queue that overlaps the first: still one copy
    decl.queue_bind("t-abc", "t", "a.b.*")

    for rk in ("k1", "k2", "k3"):
        pub.basic_publish("d", rk, rk.encode())
    for rk in ("x", ""):
        pub.basic_publish("f", rk, b"f" + rk.encode())
    keys = ["a.b.c", "a.c", "a.b.b.c", "c", "a", "x.y", "a.b", "b.c", "b", "a.b.c.d", "a..c"]
    for rk in keys:
        pub.basic_publish("t", rk, rk.encode())

    assert bodies(decl, "d1") == [b"k1"]
    assert bodies(decl, "d2") == [b"k2"]
    assert bodies(decl, "d12") == [b"k1", b"k2"]
    assert bodies(decl, "f1") == [b"fx", b"f"]
    assert bodies(decl, "f2") == [b"fx", b"f"]

    expected = {
        "t-acs": ["a.b.c", "a..c"],
        "t-hc": ["a.b.c", "a.c", "a.b.b.c", "c", "b.c", "a..c"],
        "t-all": keys,
        "t-ah": ["a.b.c", "a.c", "a.b.b.c", "a", "a.b", "a.b.c.d", "a..c"],
        "t-star": ["c", "a", "b"],
        "t-abc": ["a.b.c"],  # "a.b.*" matches it too: one copy
        "t-stars": ["a.c", "x.y", "a.b", "b.c"],
        "t-hh": ["a.b.c", "a.b.b.c", "a.b", "b.c", "b", "a.b.c.d"],
    }
    for q, pattern in patterns.items():
        # (the reference matcher agrees with the table)
        assert expected[q] == [k for k in keys if topic_match(pattern, k)]
        assert bodies(decl, q) == [k.encode() for k in expected[q]], q


def test_fanout_delivers_to_each_bound_queue_once(broker: Broker, clients: Clients) -> None:
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("fan", "fanout")
    for q in ("fa", "fb", "fc"):
        decl.queue_declare(q)
    decl.queue_bind("fa", "fan", "one")
    decl.queue_bind("fa", "fan", "two")  # a second binding of the same queue
    decl.queue_bind("fb", "fan", "")
    for i in range(3):
        pub.basic_publish("fan", f"r{i}", str(i).encode())
    assert bodies(decl, "fa") == bodies(decl, "fb") == [b"0", b"1", b"2"]
    assert count(decl, "fc") == 0


def test_topic_empty_routing_key_has_no_words(broker: Broker, clients: Clients) -> None:
    """RabbitMQ splits "" into zero words: '#' and the empty pattern match
    it, '*' (exactly one word) does not."""
    conn = clients.connect()
    ch = confirming(conn)
    ch.exchange_declare("te", "topic")
    for q, pattern in (("e-all", "#"), ("e-empty", ""), ("e-star", "*"), ("e-hash-star", "#.*")):
        ch.queue_declare(q)
        ch.queue_bind(q, "te", pattern)
    ch.basic_publish("te", "", b"empty")
    ch.basic_publish("te", "w", b"word")
    assert bodies(ch, "e-all") == [b"empty", b"word"]
    assert bodies(ch, "e-empty") == [b"empty"]
    assert bodies(ch, "e-star") == [b"word"]
    assert bodies(ch, "e-hash-star") == [b"word"]
    conn.close()


def test_headers_exchange_match_modes_with_aio_pika(broker: Broker) -> None:
    bindings: dict[str, dict[str, Any]] = {
        "h-all": {"x-match": "all", "fmt": "pdf", "type": "report"},
        "h-any": {"x-match": "any", "fmt": "pdf", "type": "report"},
        "h-default": {"fmt": "pdf"},  # no x-match: all
        "h-all-x": {"x-match": "all-with-x", "x-tenant": "a", "fmt": "pdf"},
        "h-any-x": {"x-match": "any-with-x", "x-tenant": "a"},
        "h-any-only-x": {"x-match": "any", "x-tenant": "a"},  # nothing to match: never
        "h-all-only-x": {"x-match": "all", "x-tenant": "b"},  # nothing to fail: always
        "h-void": {"x-match": "all", "flag": None},  # void: the header is present
        "h-int": {"n": 7},
    }
    messages: list[dict[str, Any] | None] = [
        {"fmt": "pdf", "type": "report"},
        {"fmt": "pdf"},
        {"fmt": "pdf", "x-tenant": "a"},
        {"type": "report", "flag": 0},
        None,
        {"fmt": "doc", "flag": None},
        {"fmt": "pdf", "type": "invoice", "n": 7},
        {"x-tenant": "b", "n": 8},
    ]
    expected = {
        "h-all": [0],
        "h-any": [0, 1, 2, 3, 6],
        "h-default": [0, 1, 2, 6],
        "h-all-x": [2],
        "h-any-x": [2],
        "h-any-only-x": [],
        "h-all-only-x": [0, 1, 2, 3, 4, 5, 6, 7],
        "h-void": [3, 5],
        "h-int": [6],
    }

    async def scenario() -> dict[str, list[int]]:
        decl = await aio_pika.connect(broker.url)
        pub = await aio_pika.connect(broker.url)
        try:
            props = [c.transport.connection.server_properties for c in (decl, pub)]  # type: ignore[union-attr]
            workers = {int(str(p["shoal_worker"])) for p in props}
            assert workers == {0, 1}
            dch = await decl.channel()
            pch = await pub.channel()  # publisher confirms: publish() waits for the ack
            hx = await dch.declare_exchange("hx", aio_pika.ExchangeType.HEADERS)
            queues = {}
            for name, args in bindings.items():
                queues[name] = q = await dch.declare_queue(name)
                await q.bind(hx, routing_key="", arguments=args)
            pub_x = await pch.get_exchange("hx", ensure=False)
            for i, headers in enumerate(messages):
                await pub_x.publish(aio_pika.Message(str(i).encode(), headers=headers), "any")
            got: dict[str, list[int]] = {}
            for name, q in queues.items():
                got[name] = []
                while (m := await q.get(no_ack=True, fail=False)) is not None:
                    got[name].append(int(m.body))
            return got
        finally:
            await decl.close()
            await pub.close()

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == expected


def test_headers_binding_with_an_unknown_x_match_is_refused(
    broker: Broker, clients: Clients
) -> None:
    """RabbitMQ 3.10 validates x-match when the binding is made
    (rabbit_exchange_type_headers:validate_binding): 406, nothing bound."""
    conn = clients.connect()
    ch = confirming(conn)
    ch.exchange_declare("hv", "headers")
    ch.queue_declare("hv-q")
    code, text = channel_error(ch, lambda: ch.queue_bind("hv-q", "hv", "", {"x-match": "bogus"}))
    assert (code, text) == (
        406,
        'PRECONDITION_FAILED - Invalid x-match field value <<"bogus">>; '
        "expected all, any, all-with-x, or any-with-x",
    )
    ch = confirming(conn)
    ch.basic_publish("hv", "", b"x", pika.BasicProperties(headers={"a": 1}))
    assert count(ch, "hv-q") == 0
    ch.exchange_delete("hv", if_unused=True)  # nothing was bound
    conn.close()


def test_amq_exchanges_exist_and_route_and_the_default_exchange_routes_by_name(
    broker: Broker, clients: Clients
) -> None:
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    types = {
        "amq.direct": "direct",
        "amq.fanout": "fanout",
        "amq.topic": "topic",
        "amq.headers": "headers",
        "amq.match": "headers",
    }
    for name, type_ in types.items():
        decl.exchange_declare(name, passive=True)
        decl.exchange_declare(name, type_, durable=True)  # an equivalent redeclare is fine
    decl.queue_declare("amq-q")
    decl.queue_bind("amq-q", "amq.direct", "dk")
    decl.queue_bind("amq-q", "amq.fanout", "")
    decl.queue_bind("amq-q", "amq.topic", "t.#")
    decl.queue_bind("amq-q", "amq.headers", "", {"h": 1})
    decl.queue_bind("amq-q", "amq.match", "", {"x-match": "any", "m": 1, "n": 2})
    pub.basic_publish("amq.direct", "dk", b"direct")
    pub.basic_publish("amq.direct", "other", b"nothing")
    pub.basic_publish("amq.fanout", "whatever", b"fanout")
    pub.basic_publish("amq.topic", "t.x.y", b"topic")
    pub.basic_publish("amq.headers", "", b"headers", pika.BasicProperties(headers={"h": 1}))
    pub.basic_publish("amq.match", "", b"match", pika.BasicProperties(headers={"n": 2}))
    pub.basic_publish("", "amq-q", b"default")
    pub.basic_publish("", "no-such-queue", b"dropped")
    assert bodies(decl, "amq-q") == [
        b"direct",
        b"fanout",
        b"topic",
        b"headers",
        b"match",
        b"default",
    ]


# ------------------------------------------- e2e, alternate, mandatory
def test_exchange_to_exchange_bind_and_unbind(broker: Broker, clients: Clients) -> None:
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("src", "direct")
    decl.exchange_declare("mid", "topic")
    decl.exchange_declare("dst", "fanout")
    for q in ("e2e-mid", "e2e-dst"):
        decl.queue_declare(q)
    decl.exchange_bind("mid", "src", "a.b")  # destination, source
    decl.exchange_bind("dst", "mid", "a.*")
    decl.queue_bind("e2e-mid", "mid", "#")
    decl.queue_bind("e2e-dst", "dst", "")
    # a cycle: each exchange is visited once, each queue gets one copy
    decl.exchange_bind("src", "dst", "a.b")

    pub.basic_publish("src", "a.b", b"1")
    pub.basic_publish("src", "a.c", b"2")  # src has no binding for a.c
    pub.basic_publish("mid", "a.c", b"3")
    pub.basic_publish("mid", "x", b"4")  # mid -> e2e-mid only
    assert bodies(decl, "e2e-mid") == [b"1", b"3", b"4"]
    assert bodies(decl, "e2e-dst") == [b"1", b"3"]

    decl.exchange_unbind("mid", "src", "a.b")
    pub.basic_publish("src", "a.b", b"5")
    pub.basic_publish("mid", "a.b", b"6")
    assert bodies(decl, "e2e-mid") == [b"6"]
    assert bodies(decl, "e2e-dst") == [b"6"]

    # Deleting a destination exchange removes the bindings to it.
    decl.exchange_delete("dst")
    decl.exchange_declare("dst", "fanout")
    decl.queue_bind("e2e-dst", "dst", "")
    pub.basic_publish("mid", "a.b", b"7")
    assert bodies(decl, "e2e-dst") == []
    assert bodies(decl, "e2e-mid") == [b"7"]


def test_cc_and_bcc_keys_route_at_every_exchange_on_the_way(
    broker: Broker, clients: Clients
) -> None:
    """As rabbit_exchange:route: a message's routing keys (its own, CC's,
    BCC's) are matched at each exchange it passes through, not followed one
    by one from the first (the Java client's CcRoutes.boundExchanges)."""
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("cc-direct", "direct")
    decl.exchange_declare("cc-topic", "topic")
    decl.queue_declare("cc-q")
    decl.exchange_bind("cc-topic", "cc-direct", "key1")  # reached by the CC key
    decl.queue_bind("cc-q", "cc-topic", "key2")  # matched by the BCC key there
    headers = {"CC": ["key1"], "BCC": ["key2"]}
    pub.basic_publish("cc-direct", "", b"cc", pika.BasicProperties(headers=headers))
    _method, props, body = decl.basic_get("cc-q", auto_ack=True)
    assert body == b"cc" and props.headers == {"CC": ["key1"]}
    pub.basic_publish("cc-direct", "", b"none", pika.BasicProperties(headers={"CC": ["key2"]}))
    assert count(decl, "cc-q") == 0


def test_alternate_exchange_gets_what_nothing_else_routes(broker: Broker, clients: Clients) -> None:
    decl = clients.on(0).channel()
    pub = clients.on(1).channel()
    pub.confirm_delivery()
    decl.exchange_declare("ae", "fanout")
    decl.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})
    decl.queue_declare("ae-q")
    decl.queue_declare("main-q")
    decl.queue_bind("ae-q", "ae", "")
    decl.queue_bind("main-q", "main", "k")
    pub.basic_publish("main", "k", b"routed")
    pub.basic_publish("main", "other", b"unroutable", mandatory=True)  # the AE takes it
    assert bodies(decl, "main-q") == [b"routed"]
    assert bodies(decl, "ae-q") == [b"unroutable"]

    # An alternate exchange that does not exist routes nothing: returned.
    decl.exchange_declare("main2", "direct", arguments={"alternate-exchange": "missing"})
    with pytest.raises(pika.exceptions.UnroutableError):
        pub.basic_publish("main2", "k", b"lost", mandatory=True)
    # An exchange that routes to another exchange has routed the message,
    # even if that one routes it nowhere: only the other's alternate counts.
    decl.exchange_declare("ae2", "fanout")
    decl.queue_declare("ae2-q")
    decl.queue_bind("ae2-q", "ae2", "")
    decl.exchange_declare("inner", "direct", arguments={"alternate-exchange": "ae2"})
    decl.exchange_declare("inner-bare", "direct")
    decl.exchange_bind("inner", "main", "to-inner")
    decl.exchange_bind("inner-bare", "main", "to-bare")
    pub.basic_publish("main", "to-inner", b"inner", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        pub.basic_publish("main", "to-bare", b"bare", mandatory=True)
    assert bodies(decl, "ae2-q") == [b"inner"]
    assert bodies(decl, "ae-q") == bodies(decl, "main-q") == []


def test_alternate_exchange_redeclare_texts(broker: Broker, clients: Clients) -> None:
    """Another alternate exchange, or one where there was none, is refused;
    RabbitMQ's rabbit_misc:assert_args_equivalence words the two cases
    differently (a value against none shows its type)."""
    conn = clients.connect()
    ch = conn.channel()
    ch.exchange_declare("ae", "fanout")
    ch.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})
    ch.exchange_declare("main", "direct", arguments={"alternate-exchange": "ae"})  # same: ok
    code, text = channel_error(
        ch, lambda: ch.exchange_declare("main", "direct", arguments={"alternate-exchange": "x"})
    )
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'main' in "
        "vhost '/': received 'x' but current is 'ae'",
    )
    ch = conn.channel()
    ch.exchange_declare("plain", "direct")
    code, text = channel_error(
        ch, lambda: ch.exchange_declare("plain", "direct", arguments={"alternate-exchange": "ae"})
    )
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'plain' in "
        "vhost '/': received the value 'ae' of type 'longstr' but current is none",
    )
    conn.close()


def test_mandatory_publish_without_a_matching_binding_is_returned(
    broker: Broker, clients: Clients
) -> None:
    decl = clients.on(0).channel()
    conn = clients.on(1)
    pub = conn.channel()
    decl.exchange_declare("m", "direct")
    decl.queue_declare("m-q")
    decl.queue_bind("m-q", "m", "yes")
    returned: list[tuple[Any, bytes]] = []
    pub.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method, body)))
    pub.basic_publish("m", "no", b"back", mandatory=True)
    pub.basic_publish("m", "yes", b"kept", mandatory=True)
    pub.basic_publish("m", "no", b"silently dropped")  # not mandatory
    wait_for(lambda: conn.process_data_events(0.05) or returned, 5, "basic.return")
    method, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key, body) == ("m", "no", b"back")
    # A round trip on the same channel: anything else would have come first.
    assert pub.queue_declare("m-q", passive=True).method.message_count == 1
    conn.process_data_events(0)
    assert len(returned) == 1
    # The default exchange too, for a queue that does not exist.
    pub.basic_publish("", "no-such-queue", b"nowhere", mandatory=True)
    wait_for(lambda: conn.process_data_events(0.05) or len(returned) > 1, 5, "basic.return")
    method, body = returned[1]
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
        312,
        "NO_ROUTE",
        "",
        "no-such-queue",
    )


# --------------------------------------------------- deletion rules
def test_unbind_stops_routing(broker: Broker, clients: Clients) -> None:
    decl = clients.on(0).channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("u", "topic")
    decl.queue_declare("u-q")
    decl.queue_bind("u-q", "u", "a.*")
    decl.queue_bind("u-q", "u", "b.#", {"tag": 1})
    pub.basic_publish("u", "a.x", b"1")
    decl.queue_unbind("u-q", "u", "a.*")
    pub.basic_publish("u", "a.x", b"2")
    pub.basic_publish("u", "b.x", b"3")
    decl.queue_unbind("u-q", "u", "b.#")  # other arguments: another binding, kept
    pub.basic_publish("u", "b.y", b"4")
    decl.queue_unbind("u-q", "u", "b.#", {"tag": 1})
    decl.queue_unbind("u-q", "u", "b.#", {"tag": 1})  # unbinding what is not bound: ok
    pub.basic_publish("u", "b.z", b"5")
    assert bodies(decl, "u-q") == [b"1", b"3", b"4"]


def test_deleting_a_queue_removes_its_bindings(broker: Broker, clients: Clients) -> None:
    dconn = clients.on(0)
    decl = dconn.channel()
    pub = confirming(clients.on(1))
    decl.exchange_declare("qd", "direct")
    decl.exchange_declare("qt", "topic")
    decl.queue_declare("victim")
    decl.queue_bind("victim", "qd", "k")
    decl.queue_bind("victim", "qt", "#")
    pub.basic_publish("qd", "k", b"before")  # warm the publisher's routing cache
    assert count(decl, "victim") == 1
    decl.queue_delete("victim")
    decl.queue_declare("victim")  # same name, new queue: not bound
    pub.basic_publish("qd", "k", b"after")
    pub.basic_publish("qt", "k", b"after")
    assert count(decl, "victim") == 0
    # The exchanges have no binding left: if-unused deletion succeeds.
    decl.exchange_delete("qd", if_unused=True)
    decl.exchange_delete("qt", if_unused=True)

    # An exclusive queue goes with its connection, and its bindings with it.
    decl.exchange_declare("qx", "fanout")
    owner = clients.connect()
    owner.channel().queue_declare("mine", exclusive=True)
    owner.channel().queue_bind("mine", "qx", "")
    pub.basic_publish("qx", "", b"while owned")
    assert count(owner.channel(), "mine") == 1
    owner.close()
    wait_for(lambda: queue_gone(dconn, "mine"), 5, "the exclusive queue to go")
    decl.queue_declare("mine")
    pub.basic_publish("qx", "", b"after")
    assert count(decl, "mine") == 0
    decl.exchange_delete("qx", if_unused=True)


def test_bind_shortcuts_use_the_last_declared_queue(broker: Broker, clients: Clients) -> None:
    """AMQP 0-9-1: an empty queue name in queue.bind/unbind means the
    channel's last declared queue, and with it an empty routing key means
    the queue's name (RabbitMQ's expand_*_shortcut)."""
    conn = clients.connect()
    ch = confirming(conn)
    ch.exchange_declare("sc", "direct")
    code, text = channel_error(ch, lambda: ch.queue_bind("", "sc", "k"))
    assert (code, text) == (404, "NOT_FOUND - no previously declared queue")
    ch = confirming(conn)
    name = ch.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    ch.queue_bind("", "sc", "")  # bound with its own name as the key
    ch.queue_bind("", "sc", "k2")
    ch.basic_publish("sc", name, b"by name")
    ch.basic_publish("sc", "k2", b"by k2")
    ch.basic_publish("sc", "", b"not bound")
    assert bodies(ch, name) == [b"by name", b"by k2"]
    ch.queue_unbind("", "sc", "")
    ch.basic_publish("sc", name, b"unbound")
    assert count(ch, name) == 0
    conn.close()


def test_exchange_delete_if_unused(broker: Broker, clients: Clients) -> None:
    conn = clients.connect()
    ch = conn.channel()
    ch.exchange_declare("x", "direct")
    ch.queue_declare("xq")
    ch.queue_bind("xq", "x", "k")
    code, text = channel_error(ch, lambda: ch.exchange_delete("x", if_unused=True))
    assert (code, text) == (406, "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use")
    ch = conn.channel()
    ch.exchange_declare("x", passive=True)  # still there
    # Being a binding's destination does not count as in use.
    ch.exchange_declare("y", "fanout")
    ch.exchange_bind("y", "x", "k")
    ch.queue_unbind("xq", "x", "k")
    ch.exchange_delete("y", if_unused=True)
    code, text = channel_error(ch, lambda: ch.exchange_declare("y", passive=True))
    assert code == 404
    ch = conn.channel()
    ch.exchange_delete("x", if_unused=True)  # its binding to y went with y
    code, text = channel_error(ch, lambda: ch.exchange_declare("x", passive=True))
    assert (code, text) == (404, "NOT_FOUND - no exchange 'x' in vhost '/'")
    # Deleting a missing exchange succeeds.
    ch = conn.channel()
    ch.exchange_delete("never-declared")
    ch.exchange_delete("x")
    conn.close()


def test_auto_delete_exchange_goes_with_its_last_binding(broker: Broker, clients: Clients) -> None:
    conn = clients.connect()
    ch = conn.channel()
    ch.exchange_declare("ad", "direct", auto_delete=True)
    ch.exchange_declare("ad", passive=True)  # no binding yet: it stays
    ch.queue_declare("ad-q1")
    ch.queue_declare("ad-q2")
    ch.queue_bind("ad-q1", "ad", "a")
    ch.queue_bind("ad-q2", "ad", "b")
    ch.queue_unbind("ad-q1", "ad", "a")
    ch.exchange_declare("ad", passive=True)  # one binding left
    ch.queue_unbind("ad-q2", "ad", "b")
    code, text = channel_error(ch, lambda: ch.exchange_declare("ad", passive=True))
    assert (code, text) == (404, "NOT_FOUND - no exchange 'ad' in vhost '/'")

    # Its last binding going with a deleted queue, or with a deleted
    # destination exchange, counts too.
    ch = conn.channel()
    ch.exchange_declare("ad2", "fanout", auto_delete=True)
    ch.queue_bind("ad-q1", "ad2", "")
    ch.queue_delete("ad-q1")
    code, _text = channel_error(ch, lambda: ch.exchange_declare("ad2", passive=True))
    assert code == 404
    ch = conn.channel()
    ch.exchange_declare("ad3", "fanout", auto_delete=True)
    ch.exchange_declare("ad3-dst", "fanout")
    ch.exchange_bind("ad3-dst", "ad3", "")
    ch.exchange_delete("ad3-dst")
    code, _text = channel_error(ch, lambda: ch.exchange_declare("ad3", passive=True))
    assert code == 404
    conn.close()


# ------------------------------------------------------------- errors
def test_errors_have_rabbitmq_codes_and_texts(broker: Broker, clients: Clients) -> None:
    conn = clients.on(0)
    other = clients.on(1)

    def fails(call: Callable[[Any], Any]) -> tuple[int, str]:
        ch = conn.channel()
        return channel_error(ch, lambda: call(ch))

    assert fails(lambda ch: ch.exchange_declare("x", passive=True)) == (
        404,
        "NOT_FOUND - no exchange 'x' in vhost '/'",
    )
    conn.channel().exchange_declare("x", "direct")
    assert fails(lambda ch: ch.exchange_declare("x", "fanout")) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': "
        "received 'fanout' but current is 'direct'",
    )
    assert fails(lambda ch: ch.exchange_declare("x", "direct", durable=True)) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x' in vhost '/': "
        "received 'true' but current is 'false'",
    )
    assert fails(lambda ch: ch.exchange_declare("amq.foo", "direct")) == (
        403,
        "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'",
    )
    default = (403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    conn.channel().queue_declare("q0")
    assert fails(lambda ch: ch.exchange_declare("", "direct")) == default
    assert fails(lambda ch: ch.exchange_delete("")) == default
    assert fails(lambda ch: ch.queue_bind("q0", "", "q0")) == default
    assert fails(lambda ch: ch.queue_unbind("q0", "", "q0")) == default
    assert fails(lambda ch: ch.exchange_bind("x", "", "k")) == default
    assert fails(lambda ch: ch.exchange_bind("", "x", "k")) == default
    assert fails(lambda ch: ch.exchange_delete("amq.direct")) == (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed",
    )
    assert fails(lambda ch: ch.queue_bind("q", "x", "k")) == (
        404,
        "NOT_FOUND - no queue 'q' in vhost '/'",
    )
    assert fails(lambda ch: ch.queue_bind("q0", "nox", "k")) == (
        404,
        "NOT_FOUND - no exchange 'nox' in vhost '/'",
    )
    assert fails(lambda ch: ch.exchange_bind("nodst", "x", "k")) == (
        404,
        "NOT_FOUND - no exchange 'nodst' in vhost '/'",
    )
    assert fails(lambda ch: ch.exchange_bind("x", "nosrc", "k")) == (
        404,
        "NOT_FOUND - no exchange 'nosrc' in vhost '/'",
    )

    # Publishing to a missing or an internal exchange closes the channel.
    def publish_fails(exchange: str) -> tuple[int, str]:
        ch = conn.channel()
        ch.queue_declare("q0")
        ch.basic_publish(exchange, "k", b"x")
        # The next round trip meets the channel.close.
        return channel_error(ch, lambda: ch.queue_declare("q0"))

    assert publish_fails("nope") == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    conn.channel().exchange_declare("i", "fanout", internal=True)
    conn.channel().queue_bind("q0", "i", "")
    assert publish_fails("i") == (
        403,
        "ACCESS_REFUSED - cannot publish to internal exchange 'i' in vhost '/'",
    )
    # ... but an internal exchange is a fine destination of another exchange.
    ch = confirming(conn)
    ch.exchange_bind("i", "x", "to-i")
    ch.basic_publish("x", "to-i", b"via x")
    assert bodies(ch, "q0") == [b"via x"]

    # Binding another connection's exclusive queue (on the other worker).
    other.channel().queue_declare("excl", exclusive=True)
    assert fails(lambda ch: ch.queue_bind("excl", "x", "k")) == (
        405,
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'excl' in vhost "
        "'/'. It could be originally declared on another connection or the exclusive "
        "property value does not match that of the original declaration.",
    )
    other.channel().queue_bind("excl", "x", "k")  # its owner may

    # Everything above closed channels only.
    assert conn.is_open and other.is_open
    conn.channel().exchange_declare("x", passive=True)


def test_unknown_exchange_type_closes_the_connection(broker: Broker, clients: Clients) -> None:
    conn = clients.connect()
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
        ch.exchange_declare("typo", "foo")
    assert (exc.value.reply_code, exc.value.reply_text) == (
        503,
        "COMMAND_INVALID - unknown exchange type 'foo'",
    )
    assert conn.is_closed
    # Nothing was declared.
    conn = clients.connect()
    ch = conn.channel()
    code, _text = channel_error(ch, lambda: ch.exchange_declare("typo", passive=True))
    assert code == 404
    conn.close()


# ------------------------------------------- visibility across workers
def test_binding_made_through_one_worker_routes_at_once_on_the_other(
    broker: Broker, clients: Clients
) -> None:
    """No waiting: the publish goes out right after bind-ok (or unbind-ok)
    returns, on a connection served by the other worker, whose routing
    cache for the same exchange and key is warm."""
    a, b = clients.on(0), clients.on(1)
    sides = [(a.channel(), confirming(b)), (b.channel(), confirming(a))]
    for decl, _pub in sides:
        decl.exchange_declare("vis", "direct")
    sides[0][0].queue_declare("vis-q")
    for i in range(40):
        decl, pub = sides[i % 2]
        key = f"k{i}"
        pub.basic_publish("vis", key, b"-")  # cached: routes nowhere
        decl.queue_bind("vis-q", "vis", key)
        pub.basic_publish("vis", key, str(i).encode())
        decl.queue_unbind("vis-q", "vis", key)
        pub.basic_publish("vis", key, b"-")
    assert bodies(sides[0][0], "vis-q") == [str(i).encode() for i in range(40)]

    # A new exchange too: declare-ok, then a publish through the other worker.
    for i in range(10):
        decl, pub = sides[i % 2]
        decl.exchange_declare(f"new{i}", "fanout")
        decl.queue_bind("vis-q", f"new{i}", "")
        pub.basic_publish(f"new{i}", "", str(i).encode())
        decl.exchange_delete(f"new{i}")
        code, _text = channel_error(pub, functools.partial(pub.basic_publish, f"new{i}", "", b"-"))
        assert code == 404
        sides[i % 2] = (decl, confirming(b if i % 2 == 0 else a))
    assert bodies(sides[0][0], "vis-q") == [str(i).encode() for i in range(10)]


# -------------------------------------------------- scheduler kill -9
def test_definitions_survive_a_scheduler_kill(broker: Broker, clients: Clients) -> None:
    a, b = clients.on(0), clients.on(1)
    decl = a.channel()
    decl.exchange_declare("sk-ae", "fanout")
    decl.exchange_declare("sk-d", "direct", arguments={"alternate-exchange": "sk-ae"})
    decl.exchange_declare("sk-t", "topic")
    decl.exchange_declare("sk-ad", "fanout", auto_delete=True)
    for q in ("sk-1", "sk-2", "sk-ae-q"):
        decl.queue_declare(q)
    decl.queue_bind("sk-1", "sk-d", "one")
    decl.queue_bind("sk-2", "sk-t", "*.two.#")
    decl.queue_bind("sk-ae-q", "sk-ae", "")
    decl.exchange_bind("sk-t", "sk-d", "x.two")
    decl.queue_bind("sk-1", "sk-ad", "")

    def check(pub: Any, tag: str) -> None:
        pub.basic_publish("sk-d", "one", f"{tag}1".encode())
        pub.basic_publish("sk-t", "a.two.b", f"{tag}2".encode())
        pub.basic_publish("sk-d", "x.two", f"{tag}3".encode())  # via the e2e binding
        pub.basic_publish("sk-d", "zzz", f"{tag}4".encode())  # to the alternate
        pub.basic_publish("sk-ad", "", f"{tag}5".encode())

    decl.queue_declare("sk-4")
    old = broker.pids("scheduler")[0]
    # Stopped first, so that what follows surely happens without it.
    os.kill(old, signal.SIGSTOP)
    try:
        # Workers route from the shared journal: no scheduler needed to publish.
        for conn, tag in ((a, "a"), (b, "b")):
            check(confirming(conn), tag)
        # A bind sent to the stopped scheduler is answered by the next one.
        bound: list[Any] = []
        b.channel()._impl.queue_bind("sk-4", "sk-t", "during.#", callback=bound.append)
        for _ in range(5):
            b.process_data_events(0.01)
        assert not bound
    finally:
        os.kill(old, signal.SIGKILL)
    wait_for(lambda: b.process_data_events(0.05) or bound, 15, "bind-ok from the new scheduler")
    confirming(a).basic_publish("sk-t", "during.kill", b"bound")
    assert count(a.channel(), "sk-4") == 1
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 15, "a new scheduler to be ready")
    for conn, tag in ((a, "A"), (b, "B")):
        check(confirming(conn), tag)
    ch = a.channel()
    assert bodies(ch, "sk-1") == [b"a1", b"a5", b"b1", b"b5", b"A1", b"A5", b"B1", b"B5"]
    assert bodies(ch, "sk-2") == [b"a2", b"a3", b"b2", b"b3", b"A2", b"A3", b"B2", b"B3"]
    assert bodies(ch, "sk-ae-q") == [b"a4", b"b4", b"A4", b"B4"]

    # The new scheduler knows the definitions: checks, refusals, changes.
    ch.exchange_declare("sk-t", "topic")
    code, _text = channel_error(ch, lambda: ch.exchange_declare("sk-t", "direct"))
    assert code == 406
    ch = a.channel()
    code, _text = channel_error(ch, lambda: ch.exchange_delete("sk-d", if_unused=True))
    assert code == 406
    ch = b.channel()
    ch.exchange_declare("sk-new", "direct")
    ch.queue_declare("sk-3")
    ch.queue_bind("sk-3", "sk-new", "k")
    ch.queue_unbind("sk-2", "sk-t", "*.two.#")
    ch.queue_unbind("sk-1", "sk-ad", "")  # its last binding: the exchange goes
    code, _text = channel_error(ch, lambda: ch.exchange_declare("sk-ad", passive=True))
    assert code == 404
    pub = confirming(a)
    pub.basic_publish("sk-new", "k", b"new")
    pub.basic_publish("sk-t", "a.two.b", b"unbound")
    ch = b.channel()
    assert bodies(ch, "sk-3") == [b"new"]
    assert count(ch, "sk-2") == 0


# ------------------------------------ many bindings, journal compaction
PAD = "p" * 180  # long routing keys: the 1 MiB journal fills in a few thousand changes


def many_patterns() -> list[tuple[str, str]]:
    """2,000 (queue, pattern) bindings over 4 queues."""
    out = []
    for i in range(2000):
        a, b = i % 40, i // 40
        if i % 100 == 0:
            pattern = f"*.m{b}.{PAD}"
        elif i % 100 == 50:
            pattern = f"k{a}.m{b}.#"
        else:
            pattern = f"k{a}.m{b}.{PAD}"
        out.append((f"many-{i % 4}", pattern))
    return out


def test_thousands_of_bindings_through_journal_compaction(broker_factory: Any) -> None:
    broker = broker_factory(workers=2, args=("--catalog-mb", "1"))
    seg = broker.segment()
    assert seg.layout.limits.catalog_bytes == 1 << 20  # the flag was honoured

    def epoch() -> int:
        return seg.atomic.load(seg.layout.catalog + C_EPOCH)

    c = Clients(broker)
    try:
        a, b = c.on(0), c.on(1)
        decl = a.channel()
        decl.exchange_declare("many", "topic")
        queues = [f"many-{i}" for i in range(4)]
        for q in queues:
            decl.queue_declare(q)
        bindings = many_patterns()
        publishers = [(0, confirming(a)), (1, confirming(b))]
        keys = [f"k{x}.m{y}.{PAD}" for x in range(0, 40, 3) for y in range(0, 50, 7)]
        keys += [f"zz.m3.{PAD}", "k1.m2.x", "k1.m2", f"k50.m1.{PAD}", "nothing"]

        def publish_all(tag: str) -> None:
            for w, pub in publishers:
                for n, key in enumerate(keys):
                    pub.basic_publish("many", key, f"{tag}{w}:{n}".encode())

        def expect(bound: list[tuple[str, str]], tag: str) -> dict[str, list[bytes]]:
            reached = [
                {
                    q
                    for q, p in bound
                    if (p == key if "*" not in p and "#" not in p else topic_match(p, key))
                }
                for key in keys
            ]
            want: dict[str, list[bytes]] = {q: [] for q in queues}
            for w, _pub in publishers:
                for n in range(len(keys)):
                    for q in sorted(reached[n]):
                        want[q].append(f"{tag}{w}:{n}".encode())
            return want

        def verify(live: list[tuple[str, str]], tag: str) -> None:
            publish_all(tag)
            want = expect(live, tag)
            assert {q: bodies(decl, q) for q in queues} == want

        # Half of the bindings; both workers route through them (and have
        # replayed the journal up to here).
        for q, pattern in bindings[:1000]:
            decl.queue_bind(q, "many", pattern)
        verify(bindings[:1000], "w")

        # The other half, minus some of the first half (the compacted journal
        # must not have them, and neither must the workers that knew them).
        start = epoch()
        for q, pattern in bindings[1000:]:
            decl.queue_bind(q, "many", pattern)
        removed = [(q, p) for q, p in bindings[:1000] if q == "many-3"]
        for q, pattern in removed:
            decl.queue_unbind(q, "many", pattern)
        # Churn (unbind, rebind) until the journal has been compacted.
        churned = 0
        while epoch() < start + 2:
            q, pattern = bindings[1000 + churned % 1000]
            decl.queue_unbind(q, "many", pattern)
            decl.queue_bind(q, "many", pattern)
            churned += 1
            assert churned <= 2000, "2,000 unbind/rebind pairs and still no compaction"
        assert epoch() % 2 == 0
        gone = set(removed)
        verify([x for x in bindings if x not in gone], "c")

        # All 2,000, then every other binding of many-0 dropped.
        for q, pattern in removed:
            decl.queue_bind(q, "many", pattern)
        verify(bindings, "f")
        dropped = set([(q, p) for q, p in bindings if q == "many-0"][::2])
        for q, pattern in dropped:
            decl.queue_unbind(q, "many", pattern)
        verify([x for x in bindings if x not in dropped], "d")
    finally:
        c.close()


def test_unbinding_what_is_gone_succeeds(broker: Broker, clients: Clients) -> None:
    """As RabbitMQ (rabbit_binding:remove): unbind-ok for a binding that does
    not exist, even when its queue and its auto-delete exchange went first —
    aio-pika's cleanups (delete the queue, then unbind it) and its RPC
    pattern's close() rely on it. A binding that exists still needs both."""
    ch = clients.connect().channel()
    ch.exchange_declare("ad-x", "direct", auto_delete=True)
    ch.queue_declare("ad-q")
    ch.queue_bind("ad-q", "ad-x", "k")
    ch.queue_delete("ad-q")  # its last binding: the exchange goes too
    assert channel_error(ch, lambda: ch.exchange_declare("ad-x", passive=True))[0] == 404
    ch = clients.connect().channel()
    ch.queue_declare("ad-q2")
    ch.queue_unbind("ad-q2", "ad-x", "k")  # exchange missing, binding too: ok
    ch.queue_unbind("ad-q2", "amq.direct", "never-bound")
    ch.exchange_unbind("amq.fanout", "amq.direct", "never-bound")
    assert channel_error(ch, lambda: ch.queue_bind("ad-q2", "ad-x", "k")) == (
        404,
        "NOT_FOUND - no exchange 'ad-x' in vhost '/'",
    )
