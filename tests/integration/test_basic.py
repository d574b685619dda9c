"""The basic class and connection negotiation with real clients (pika,
aio-pika) and a bare pamqp client, over real sockets.

Where RabbitMQ 3.10 and the AMQP 0-9-1 spec differ and Shoal chose the spec
(basic.recover with requeue=false, channel.flow with active=false: RabbitMQ
answers both with 540 NOT_IMPLEMENTED), the tests assert the spec's behaviour
and say so. The reply texts are RabbitMQ's (rabbit_channel.erl, rabbit_reader.erl).
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import time
from typing import Any

import aio_pika
import pika
import pytest
from pamqp import commands as C
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from shoal.broker import VERSION
from tests.broker_process import Broker, wait_for

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_BODY = 3


# --------------------------------------------------------------- raw client
class RawClient:
    """A bare AMQP client: pamqp frames over a socket, with a read buffer (no
    frame that arrives in the same read as another is lost). Every read is
    bounded by the socket timeout."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.frame_max = 131072

    # ---- output
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def method(self, channel: int, method: Any) -> None:
        self.send(pamqp_frame.marshal(method, channel))

    def publish(
        self,
        channel: int,
        body: bytes,
        routing_key: str = "",
        exchange: str = "",
        **flags: bool,
    ) -> None:
        """basic.publish, its content header and its body frames, in one write."""
        frames = [
            pamqp_frame.marshal(
                C.Basic.Publish(exchange=exchange, routing_key=routing_key, **flags), channel
            ),
            pamqp_frame.marshal(
                ContentHeader(body_size=len(body), properties=C.Basic.Properties()), channel
            ),
        ]
        step = self.frame_max - 8
        for off in range(0, len(body), step):
            frames.append(pamqp_frame.marshal(ContentBody(body[off : off + step]), channel))
        self.send(b"".join(frames))

    # ---- input
    def raw_frame(self) -> tuple[int, int, bytes] | None:
        """(frame type, channel, payload), or None once the broker closed."""
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = struct.unpack_from(">BHI", self.buf)
                end = 7 + size + 1
                if len(self.buf) >= end:
                    assert self.buf[end - 1] == 0xCE, "bad frame end from the broker"
                    payload = self.buf[7 : end - 1]
                    self.buf = self.buf[end:]
                    return ftype, channel, payload
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk

    def frame(self) -> tuple[int, Any] | None:
        raw = self.raw_frame()
        if raw is None:
            return None
        ftype, channel, payload = raw
        data = struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"
        _n, number, value = pamqp_frame.unmarshal(data)
        return number, value

    def expect(self, cls: type, channel: int | None = None) -> Any:
        got = self.frame()
        assert got is not None, f"the broker closed the socket; expected {cls.__name__}"
        number, value = got
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
        if channel is not None:
            assert number == channel, f"{cls.__name__} on channel {number}, not {channel}"
        return value

    def closed_by_server(self, timeout: float = 2.0) -> bool:
        """True once the broker closes the socket; False if still open after
        `timeout` (shorter than the broker's 3 s wait for a missing close-ok)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except ConnectionResetError:
                    return True
                except TimeoutError:
                    return False
                if not data:
                    return True
        finally:
            self.sock.settimeout(10.0)

    # ---- handshake
    def start(
        self,
        header: bytes = PROTOCOL_HEADER,
        mechanism: str = "PLAIN",
        response: str = "\0guest\0guest",
        capabilities: dict[str, Any] | None = None,
    ) -> C.Connection.Start:
        self.send(header)
        start = self.expect(C.Connection.Start, 0)
        caps = {"authentication_failure_close": True, "consumer_cancel_notify": True}
        caps.update(capabilities or {})
        self.method(
            0,
            C.Connection.StartOk(
                client_properties={"product": "raw test client", "capabilities": caps},
                mechanism=mechanism,
                response=response,
            ),
        )
        return start  # type: ignore[no-any-return]

    def tune(
        self, channel_max: int | None = None, frame_max: int | None = None, heartbeat: int = 0
    ) -> C.Connection.Tune:
        """Read connection.tune and answer tune-ok (the server's limits where
        the caller gives none, as clients do)."""
        tune = self.expect(C.Connection.Tune, 0)
        self.frame_max = frame_max or tune.frame_max
        self.method(
            0,
            C.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=self.frame_max,
                heartbeat=heartbeat,
            ),
        )
        return tune  # type: ignore[no-any-return]

    def open(self, vhost: str = "/") -> None:
        self.method(0, C.Connection.Open(virtual_host=vhost))
        self.expect(C.Connection.OpenOk, 0)

    def open_channel(self, number: int) -> None:
        self.method(number, C.Channel.Open())
        self.expect(C.Channel.OpenOk, number)

    def connection_close(self, timeout: float = 2.0) -> C.Connection.Close:
        """The broker's connection.close; answer close-ok, as a client must,
        and the broker must then close the socket within `timeout`."""
        close = self.expect(C.Connection.Close, 0)
        self.method(0, C.Connection.CloseOk())
        assert self.closed_by_server(timeout), "the broker kept the connection open"
        return close  # type: ignore[no-any-return]

    def channel_close(self, number: int) -> C.Channel.Close:
        """The broker's channel.close; answer close-ok."""
        close = self.expect(C.Channel.Close, number)
        self.method(number, C.Channel.CloseOk())
        return close  # type: ignore[no-any-return]

    def close(self) -> None:
        self.method(
            0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        self.expect(C.Connection.CloseOk, 0)
        self.sock.close()


def raw_connect(port: int, channel: int | None = 1, **tune: Any) -> RawClient:
    """A raw client through the whole handshake, with `channel` open."""
    client = RawClient(port)
    client.start()
    client.tune(**tune)
    client.open()
    if channel is not None:
        client.open_channel(channel)
    return client


# ---------------------------------------------------------------- helpers
def pika_connection(broker: Broker, **kw: object) -> pika.BlockingConnection:
    query = "&".join(f"{k}={v}" for k, v in kw.items())
    return pika.BlockingConnection(pika.URLParameters(broker.url + ("?" + query if query else "")))


def collect(conn: pika.BlockingConnection, sink: list[Any], n: int, timeout: float = 5) -> None:
    """Process pika's events until `sink` holds `n` items."""
    wait_for(lambda: conn.process_data_events(0.02) or len(sink) >= n, timeout, f"{n} deliveries")


def pump(conn: pika.BlockingConnection, seconds: float = 0.3) -> None:
    """Process events for a while: for checks that something does NOT arrive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(0.02)


def queue_with_consumer(
    conn: pika.BlockingConnection, queue: str, messages: int, prefetch: int = 0
) -> tuple[Any, list[tuple[bytes, bool, int]]]:
    """A channel consuming `queue`, which holds m0..m<messages-1>: the channel,
    and the list its deliveries land in as (body, redelivered, tag)."""
    ch = conn.channel()
    ch.queue_declare(queue)
    for i in range(messages):
        ch.basic_publish("", queue, f"m{i}".encode())
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[bytes, bool, int]] = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append((b, m.redelivered, m.delivery_tag)))
    return ch, got


def ready_count(conn: pika.BlockingConnection, queue: str) -> int:
    ch = conn.channel()
    count = int(ch.queue_declare(queue, passive=True).method.message_count)
    ch.close()
    return count


def run(coro: Any, timeout: float = 20) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ------------------------------------------------------- nack, reject, recover
def test_nack_and_reject_with_requeue_put_the_message_back_first(broker: Broker) -> None:
    conn = pika_connection(broker)
    # prefetch 1: m1 and m2 stay in the queue while m0 is out
    ch, got = queue_with_consumer(conn, "requeue", 3, prefetch=1)
    collect(conn, got, 1)
    assert got == [(b"m0", False, 1)]
    ch.basic_nack(1, requeue=True)
    collect(conn, got, 2)
    assert got[1] == (b"m0", True, 2)  # ahead of m1, flagged, under a new tag
    ch.basic_reject(2, requeue=True)
    collect(conn, got, 3)
    assert got[2] == (b"m0", True, 3)
    ch.basic_ack(3)
    collect(conn, got, 4)
    assert got[3] == (b"m1", False, 4)
    ch.basic_ack(4)
    collect(conn, got, 5)
    assert got[4] == (b"m2", False, 5)
    ch.basic_ack(5)
    ch.close()
    assert ready_count(conn, "requeue") == 0
    conn.close()


def test_nack_and_reject_without_requeue_drop_the_message(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("drop")
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", "drop", body)
    method, _props, body = ch.basic_get("drop")
    assert body == b"a"
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _props, body = ch.basic_get("drop")
    assert (body, method.redelivered, method.message_count) == (b"b", False, 1)
    ch.basic_nack(method.delivery_tag, requeue=False)
    method, _props, body = ch.basic_get("drop")
    assert (body, method.redelivered, method.message_count) == (b"c", False, 0)
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("drop") == (None, None, None)
    ch.close()  # nothing was left unacknowledged: nothing comes back
    assert ready_count(conn, "drop") == 0
    conn.close()


def test_nack_multiple_settles_every_tag_up_to_it(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch, got = queue_with_consumer(conn, "multi", 5)
    collect(conn, got, 5)
    assert [t for _b, _r, t in got] == [1, 2, 3, 4, 5]
    ch.basic_nack(3, multiple=True, requeue=True)  # tags 1, 2 and 3; not 4 and 5
    collect(conn, got, 8)
    assert got[5:] == [(b"m0", True, 6), (b"m1", True, 7), (b"m2", True, 8)]
    pump(conn, 0.2)
    assert len(got) == 8, "m3 and m4 (tags 4 and 5) must stay unacknowledged, not come back"
    ch.basic_nack(8, multiple=True, requeue=False)  # drops all five
    ch.close()  # anything still unacknowledged would be requeued here
    assert ready_count(conn, "multi") == 0
    conn.close()


def test_aio_pika_nack_reject_and_redelivered_flag(broker: Broker) -> None:
    async def scenario() -> None:
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1)
        queue = await ch.declare_queue("aio-nack")
        for i in range(3):
            await ch.default_exchange.publish(
                aio_pika.Message(f"m{i}".encode()), routing_key="aio-nack"
            )
        seen: list[tuple[bytes, bool]] = []
        async with queue.iterator() as it:
            async for message in it:
                seen.append((message.body, message.redelivered))
                if len(seen) == 1:
                    await message.nack(requeue=True)
                elif len(seen) == 2:
                    await message.reject(requeue=False)
                else:
                    await message.ack()
                if len(seen) == 4:
                    break
        assert seen == [(b"m0", False), (b"m0", True), (b"m1", False), (b"m2", False)]
        declared = await ch.declare_queue("aio-nack", passive=True)
        assert declared.declaration_result.message_count == 0
        await conn.close()

    run(scenario())


def test_recover_with_requeue_redelivers_unacked(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch, got = queue_with_consumer(conn, "recover", 2)
    collect(conn, got, 2)
    assert got == [(b"m0", False, 1), (b"m1", False, 2)]
    ch.basic_recover(requeue=True)
    collect(conn, got, 4)
    assert got[2:] == [(b"m0", True, 3), (b"m1", True, 4)]
    ch.basic_ack(4, multiple=True)
    ch.close()
    assert ready_count(conn, "recover") == 0
    conn.close()


def test_recover_without_requeue_redelivers_to_the_same_consumer(broker: Broker) -> None:
    """The spec's recover(requeue=false) (RabbitMQ 3.10 answers 540
    NOT_IMPLEMENTED - requeue=false; Shoal implements it)."""
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("recover-in-place")
    for i in range(3):
        ch.basic_publish("", "recover-in-place", f"m{i}".encode())
    got: list[tuple[str, bytes, bool, int]] = []
    tag = ch.basic_consume(
        "recover-in-place",
        lambda c, m, p, b: got.append((m.consumer_tag, b, m.redelivered, m.delivery_tag)),
    )
    collect(conn, got, 3)
    # A consumer that would win any requeued message: recover(requeue=false)
    # must not requeue, but hand the messages back to their recipient.
    rival: list[bytes] = []
    conn.channel().basic_consume(
        "recover-in-place", lambda c, m, p, b: rival.append(b), arguments={"x-priority": 10}
    )
    ch.basic_ack(2)  # m1 is settled: only m0 and m2 are recovered
    ch.basic_recover(requeue=False)
    collect(conn, got, 5)
    assert got[3:] == [(tag, b"m0", True, 4), (tag, b"m2", True, 5)]
    pump(conn, 0.2)
    assert len(got) == 5 and rival == []
    ch.basic_ack(4)
    ch.basic_ack(5)
    ch.close()  # anything still unacknowledged would be requeued here
    assert ready_count(conn, "recover-in-place") == 0
    conn.close()


# ------------------------------------------------------------------ get
def test_basic_get_ok_fields_get_empty_and_no_ack(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("get")
    assert ch.basic_get("get") == (None, None, None)  # basic.get-empty
    for i in range(3):
        ch.basic_publish("", "get", f"g{i}".encode())
    method, _p, body = ch.basic_get("get")
    assert (body, method.delivery_tag, method.redelivered) == (b"g0", 1, False)
    assert (method.exchange, method.routing_key, method.message_count) == ("", "get", 2)
    method, _p, body = ch.basic_get("get", auto_ack=True)
    assert (body, method.delivery_tag, method.message_count) == (b"g1", 2, 1)
    method, _p, body = ch.basic_get("get")
    assert (body, method.delivery_tag, method.message_count) == (b"g2", 3, 0)
    assert ch.basic_get("get") == (None, None, None)
    ch.close()  # g0 and g2 come back; g1 was taken without acknowledgement
    ch = conn.channel()
    method, _p, body = ch.basic_get("get", auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"g0", True, 1)
    method, _p, body = ch.basic_get("get", auto_ack=True)
    assert (body, method.redelivered, method.message_count) == (b"g2", True, 0)
    assert ch.basic_get("get") == (None, None, None)
    conn.close()


def test_a_get_after_a_publish_finds_the_channel_s_consumer_served_first(
    broker: Broker,
) -> None:
    """RabbitMQ's queue gives a publish to a consumer with credit at once, so
    the same channel's basic.get after it is empty (the Java client's
    BindingLifecycle); past the consumer's credit the get takes the rest."""
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("consumed")
    got: list[bytes] = []
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("consumed", lambda c, m, p, b: got.append(b))
    for i in range(3):
        ch.basic_publish("", "consumed", b"%d" % i)
        if i == 0:
            assert ch.basic_get("consumed") == (None, None, None)
    method, _p, body = ch.basic_get("consumed", auto_ack=True)
    assert (body, method.message_count) == (b"2", 0)
    wait_for(lambda: conn.process_data_events(0.05) or len(got) == 2, 5, "2 deliveries")
    assert got == [b"0", b"1"]
    conn.close()


def test_aio_pika_get(broker: Broker) -> None:
    async def scenario() -> None:
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel()
        queue = await ch.declare_queue("aio-get")
        assert await queue.get(fail=False) is None
        with pytest.raises(aio_pika.exceptions.QueueEmpty):
            await queue.get()
        for i in range(2):
            await ch.default_exchange.publish(
                aio_pika.Message(f"x{i}".encode(), content_type="text/plain"),
                routing_key="aio-get",
            )
        first = await queue.get(no_ack=True)
        assert (first.body, first.content_type, first.message_count) == (b"x0", "text/plain", 1)
        second = await queue.get()
        assert (second.body, second.redelivered, second.message_count) == (b"x1", False, 0)
        await second.ack()
        assert await queue.get(fail=False) is None
        await conn.close()

    run(scenario())


# -------------------------------------------------------- mandatory, returns
def test_mandatory_unroutable_is_returned_non_mandatory_dropped(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("exists")
    returned: list[tuple[Any, ...]] = []
    ch.add_on_return_callback(
        lambda c, m, p, b: returned.append(
            (m.reply_code, m.reply_text, m.exchange, m.routing_key, p.content_type, p.headers, b)
        )
    )
    props = pika.BasicProperties(content_type="text/plain", headers={"n": 7})
    ch.basic_publish("", "nowhere", b"lost", props, mandatory=True)
    ch.basic_publish("", "exists", b"kept", mandatory=True)
    ch.basic_publish("", "nowhere-either", b"dropped")  # not mandatory: silently dropped
    ch.basic_publish("", "nowhere-marker", b"marker", mandatory=True)
    # Returns come in publish order: once the marker is back, any return for
    # the non-mandatory publish would have come before it.
    collect(conn, returned, 2)
    assert returned == [
        (312, "NO_ROUTE", "", "nowhere", "text/plain", {"n": 7}, b"lost"),
        (312, "NO_ROUTE", "", "nowhere-marker", None, None, b"marker"),
    ]
    assert ch.queue_declare("exists", passive=True).method.message_count == 1
    conn.close()


def test_return_comes_before_the_publisher_confirm(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("confirmed")
    ch.confirm_delivery()
    # pika raises UnroutableError only if basic.return arrives before basic.ack.
    with pytest.raises(pika.exceptions.UnroutableError) as exc:
        ch.basic_publish("", "nowhere", b"x", mandatory=True)
    (message,) = exc.value.messages
    assert (message.method.reply_code, message.method.reply_text, message.body) == (
        312,
        "NO_ROUTE",
        b"x",
    )
    ch.basic_publish("", "nowhere", b"y")  # unroutable, not mandatory: just confirmed
    ch.basic_publish("", "confirmed", b"z", mandatory=True)
    assert ch.queue_declare("confirmed", passive=True).method.message_count == 1
    conn.close()


def test_a_return_follows_the_confirms_of_earlier_publishes(broker: Broker) -> None:
    """RabbitMQ flushes a channel's confirms after each method, so a basic.return
    never overtakes an earlier publish's ack (php-amqp's suite counts acks in
    that order): two unroutable publishes in one write, the second mandatory,
    give ack(1), return(2), ack(2), none multiple."""
    client = raw_connect(broker.port)
    client.method(1, C.Confirm.Select())
    client.expect(C.Confirm.SelectOk, 1)
    client.method(1, C.Exchange.Declare(exchange="no-bindings", exchange_type="fanout"))
    client.expect(C.Exchange.DeclareOk, 1)
    publish = C.Basic.Publish(exchange="no-bindings", routing_key="")
    header = ContentHeader(body_size=1, properties=C.Basic.Properties())
    frames = b""
    for mandatory in (False, True):
        publish.mandatory = mandatory
        frames += pamqp_frame.marshal(publish, 1) + pamqp_frame.marshal(header, 1)
        frames += pamqp_frame.marshal(ContentBody(b"m"), 1)
    client.send(frames)
    first = client.expect(C.Basic.Ack, 1)
    assert (first.delivery_tag, first.multiple) == (1, True)
    assert client.expect(C.Basic.Return, 1).reply_code == 312
    client.expect(ContentHeader, 1)
    client.expect(ContentBody, 1)
    second = client.expect(C.Basic.Ack, 1)
    assert (second.delivery_tag, second.multiple) == (2, True)


# ------------------------------------------------------------- consumers
def test_consumer_tags_server_generated_and_reuse(broker: Broker) -> None:
    client = raw_connect(broker.port)
    client.method(1, C.Queue.Declare(queue="tags"))
    client.expect(C.Queue.DeclareOk, 1)
    tags = []
    for _ in range(2):
        client.method(1, C.Basic.Consume(queue="tags", consumer_tag=""))
        tags.append(client.expect(C.Basic.ConsumeOk, 1).consumer_tag)
    # RabbitMQ's form: 16 random bytes in URL-safe base64 after the prefix.
    assert all(re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag) for tag in tags), tags
    assert tags[0] != tags[1]
    client.method(1, C.Basic.Consume(queue="tags", consumer_tag="x"))
    assert client.expect(C.Basic.ConsumeOk, 1).consumer_tag == "x"
    # Tags are per channel: another channel may use "x" too.
    client.open_channel(2)
    client.method(2, C.Basic.Consume(queue="tags", consumer_tag="x"))
    assert client.expect(C.Basic.ConsumeOk, 2).consumer_tag == "x"
    client.method(1, C.Basic.Consume(queue="tags", consumer_tag="x"))
    close = client.connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        "NOT_ALLOWED - attempt to reuse consumer tag 'x'",
        60,
        20,
    )


def test_exclusive_consumer_and_consume_on_a_missing_queue(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("shared")
    ch.queue_declare("mine")
    got: list[bytes] = []
    ch.basic_consume("shared", lambda c, m, p, b: got.append(b))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        conn.channel().basic_consume("shared", lambda *a: None, exclusive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403,
        "ACCESS_REFUSED - queue 'shared' in vhost '/' in exclusive use",
    )
    ch.basic_consume("mine", lambda *a: None, exclusive=True)
    other = pika_connection(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        other.channel().basic_consume("mine", lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403,
        "ACCESS_REFUSED - queue 'mine' in vhost '/' in exclusive use",
    )
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        other.channel().basic_consume("missing", lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        404,
        "NOT_FOUND - no queue 'missing' in vhost '/'",
    )
    # The first consumer was not disturbed.
    other.channel().basic_publish("", "shared", b"still consuming")
    collect(conn, got, 1)
    assert got == [b"still consuming"]
    other.close()
    conn.close()


@pytest.mark.parametrize(("value", "kind"), [("high", "longstr"), (True, "bool")])
def test_a_consumer_priority_that_is_no_integer_is_refused(
    broker: Broker, value: object, kind: str
) -> None:
    """In RabbitMQ 3.10.8's words (measured): a consumer's x-priority is
    checked as a queue's integer arguments are, and named with its queue."""
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("prio_bad")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.basic_consume("prio_bad", lambda *a: None, arguments={"x-priority": value})
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'prio_bad' in vhost '/': "
        f'"expected integer, got {kind}"',
    )
    conn.channel().queue_delete("prio_bad")
    conn.close()


def test_consumer_priority_wins_while_it_has_credit(broker: Broker) -> None:
    conn = pika_connection(broker)
    pub = conn.channel()
    pub.queue_declare("prio")
    high_ch = conn.channel()
    high_ch.basic_qos(prefetch_count=5)
    low_ch = conn.channel()
    high: list[bytes] = []
    low: list[bytes] = []
    low_ch.basic_consume("prio", lambda c, m, p, b: low.append(b), arguments={"x-priority": 1})
    high_ch.basic_consume("prio", lambda c, m, p, b: high.append(b), arguments={"x-priority": 10})
    for i in range(4):
        pub.basic_publish("", "prio", f"m{i}".encode())
    collect(conn, high, 4)
    pump(conn)
    assert (high, low) == ([b"m0", b"m1", b"m2", b"m3"], [])
    # One credit left: m4 still goes to the high-priority consumer, the rest
    # to the low-priority one once the high one is out of credit.
    for i in range(4, 10):
        pub.basic_publish("", "prio", f"m{i}".encode())
    wait_for(
        lambda: conn.process_data_events(0.02) or len(high) + len(low) >= 10, 5, "10 deliveries"
    )
    pump(conn)
    assert high == [f"m{i}".encode() for i in range(5)]
    assert low == [f"m{i}".encode() for i in range(5, 10)]
    conn.close()


def test_channel_flow_pauses_and_resumes_deliveries(broker: Broker) -> None:
    """channel.flow from the client, as the spec has it (RabbitMQ 3.10
    answers active=false with 540 NOT_IMPLEMENTED; Shoal implements it)."""
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("flow")
    got: list[bytes] = []
    ch.basic_consume("flow", lambda c, m, p, b: got.append(b))
    assert ch.flow(False) is False
    pub = conn.channel()
    for i in range(5):
        pub.basic_publish("", "flow", f"m{i}".encode())
    # declare-ok comes after the publishes on that channel: none was delivered.
    assert pub.queue_declare("flow", passive=True).method.message_count == 5
    pump(conn)
    assert got == []
    assert ch.flow(True) is True
    collect(conn, got, 5)
    assert got == [f"m{i}".encode() for i in range(5)]
    conn.close()


# ------------------------------------------------------- publisher confirms
def confirmed_tags(confirms: list[tuple[int, bool]]) -> set[int]:
    """The sequence numbers a series of basic.ack covers; each ack must
    confirm something not confirmed before."""
    done: set[int] = set()
    for tag, multiple in confirms:
        new = set(range(1, tag + 1)) - done if multiple else {tag} - done
        assert new, f"basic.ack {tag} (multiple={multiple}) confirms nothing new"
        done |= new
    return done


def test_publisher_confirms_pika_cover_every_sequence_number(broker: Broker) -> None:
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("confirms")
    acks: list[tuple[int, bool]] = []
    nacks: list[Any] = []
    selected: list[bool] = []

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            acks.append((method.delivery_tag, method.multiple))
        else:
            nacks.append(method)

    # The channel underneath BlockingChannel: publishes do not wait one by one.
    ch._impl.confirm_delivery(
        ack_nack_callback=on_confirm, callback=lambda _f: selected.append(True)
    )
    wait_for(lambda: conn.process_data_events(0.02) or selected, 5, "confirm.select-ok")
    for i in range(1000):
        ch._impl.basic_publish("", "confirms", str(i).encode())
    wait_for(
        lambda: conn.process_data_events(0.02) or (acks and max(t for t, _m in acks) >= 1000),
        10,
        "the confirm of publish 1000",
    )
    pump(conn, 0.1)
    assert nacks == []
    assert confirmed_tags(acks) == set(range(1, 1001))
    assert ch.queue_declare("confirms", passive=True).method.message_count == 1000
    conn.close()


def test_confirms_are_cumulative_and_a_nack_says_requeue_as_rabbitmqs(
    broker: Broker,
) -> None:
    """A confirm is basic.ack(tag, multiple true) even for one publish: every
    tag up to it is confirmed, so it means what rabbit_channel's
    send_confirms' multiple-false ack of one means, and a client that
    registers a tag's callback after writing its publish (amqp-client.cr)
    cannot lose a single confirm that arrives first. A publisher nack
    (reject-publish) carries the field's default, requeue true."""
    conn = pika_connection(broker)
    ch = conn.channel()
    ch.queue_declare("one-confirm")
    ch.queue_declare("full-1", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    got: list[tuple[str, int, bool, bool]] = []

    def on_confirm(frame: Any) -> None:
        m = frame.method
        got.append((type(m).__name__, m.delivery_tag, m.multiple, getattr(m, "requeue", False)))

    selected: list[bool] = []
    ch._impl.confirm_delivery(
        ack_nack_callback=on_confirm, callback=lambda _f: selected.append(True)
    )
    wait_for(lambda: conn.process_data_events(0.02) or selected, 5, "confirm.select-ok")
    for expected in (1, 2, 3):
        ch._impl.basic_publish("", "one-confirm" if expected == 1 else "full-1", b"m")
        wait_for(lambda n=expected: conn.process_data_events(0.02) or len(got) >= n, 5, "a confirm")
    assert got == [("Ack", 1, True, False), ("Ack", 2, True, False), ("Nack", 3, False, True)]
    conn.close()


def test_publisher_confirms_aio_pika(broker: Broker) -> None:
    async def scenario() -> None:
        conn = await aio_pika.connect(broker.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("aio-confirms")
        # aiormq maps each ack (multiple or not) to the publishes it covers:
        # a sequence number never confirmed leaves its publish waiting.
        results = await asyncio.gather(
            *(
                ch.default_exchange.publish(
                    aio_pika.Message(str(i).encode()), routing_key="aio-confirms"
                )
                for i in range(1000)
            )
        )
        assert all(isinstance(r, C.Basic.Ack) for r in results)
        declared = await ch.declare_queue("aio-confirms", passive=True)
        assert declared.declaration_result.message_count == 1000
        await conn.close()

    run(scenario())


# ------------------------------------------------------ connection methods
def test_update_secret_is_answered(broker: Broker) -> None:
    client = raw_connect(broker.port)
    client.method(0, C.Connection.UpdateSecret(new_secret="guest", reason="token refresh"))
    client.expect(C.Connection.UpdateSecretOk, 0)
    client.method(1, C.Queue.Declare(queue="after-update-secret"))
    client.expect(C.Queue.DeclareOk, 1)
    client.close()


def test_access_request_gets_ticket_1_as_in_rabbitmq(broker: Broker) -> None:
    """access.request (class 30, AMQP 0-8's realms) from an old client: the
    answer is access.request-ok with ticket 1 and the channel goes on (it
    was a 540 connection error)."""
    client = raw_connect(broker.port)
    client.send(struct.pack(">BHI", 1, 1, 9) + b"\x00\x1e\x00\x0a\x01/\x00\x01\x00" + b"\xce")
    assert client.raw_frame() == (1, 1, b"\x00\x1e\x00\x0b\x00\x01")
    client.send(pamqp_frame.marshal(C.Queue.Declare(queue="after-access"), 1))
    assert client.expect(C.Queue.DeclareOk, 1).queue == "after-access"
    client.close()


def test_server_properties_and_capabilities(broker: Broker) -> None:
    conn = pika_connection(broker)
    props = conn._impl.server_properties
    for key in ("product", "version", "platform"):
        assert isinstance(props[key], str) and props[key], key
    # The RabbitMQ version it answers as (clients compare it), its own beside.
    assert props["product"] == "Shoal" and props["version"] == "3.10.8"
    assert props["shoal_version"] == VERSION
    capabilities = props["capabilities"]
    for name in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
        "consumer_priorities",
        "direct_reply_to",  # (RabbitMQ 3.10's list, whole)
    ):
        assert capabilities.get(name) is True, f"capability {name!r}"
    conn.close()
    raw = RawClient(broker.port)
    start = raw.start()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert {"PLAIN", "AMQPLAIN"} <= set(start.mechanisms.split())
    assert "en_US" in start.locales.split()
    raw.sock.close()


def test_tune_and_negotiated_frame_max(broker: Broker) -> None:
    client = RawClient(broker.port)
    client.start()
    tune = client.tune(channel_max=10, frame_max=8192)
    # RabbitMQ's defaults.
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    client.open()
    client.open_channel(1)
    client.method(1, C.Queue.Declare(queue="big"))
    client.expect(C.Queue.DeclareOk, 1)
    body = bytes(range(256)) * 80  # 20480 bytes
    client.publish(1, body, routing_key="big")  # in body frames of 8184 bytes
    client.method(1, C.Basic.Get(queue="big", no_ack=True))
    client.expect(C.Basic.GetOk, 1)
    assert client.expect(ContentHeader, 1).body_size == len(body)
    sizes, received = [], b""
    while len(received) < len(body):
        raw = client.raw_frame()
        assert raw is not None and raw[:2] == (FRAME_BODY, 1), raw
        sizes.append(len(raw[2]))
        received += raw[2]
    # Body frames within the negotiated frame_max (8 bytes of framing each).
    assert sizes == [8184, 8184, 4112]
    assert received == body
    client.close()


def test_heartbeat_asked_by_the_client_is_used(broker: Broker) -> None:
    client = RawClient(broker.port, timeout=3)
    client.start()
    client.tune(heartbeat=1)
    client.open()
    # An idle connection: the next frame is a heartbeat, well within the
    # socket's 3 s timeout (the server's own proposal, 60 s, would not be).
    got = client.frame()
    assert got is not None and got[0] == 0 and isinstance(got[1], Heartbeat), got
    client.close()


def test_channel_max_limits_the_number_of_open_channels(broker: Broker) -> None:
    client = raw_connect(broker.port, channel=None, channel_max=10)
    for number in range(1, 11):
        client.open_channel(number)
    client.method(11, C.Channel.Open())
    close = client.connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        "NOT_ALLOWED - number of channels opened (10) has reached the negotiated channel_max (10)",
        0,
        0,
    )


def test_channel_number_above_channel_max_is_accepted_like_rabbitmq(broker: Broker) -> None:
    """RabbitMQ 3.10 bounds how many channels are open (rabbit_reader:
    create_channel), not their numbers: channel 11 under channel_max 10 opens
    while fewer than 10 channels are open."""
    client = raw_connect(broker.port, channel=None, channel_max=10)
    client.open_channel(11)
    client.method(11, C.Queue.Declare(queue="on-channel-11"))
    client.expect(C.Queue.DeclareOk, 11)
    client.close()


def test_amqplain_login(broker: Broker) -> None:
    table = pamqp_encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})
    client = RawClient(broker.port)
    # AMQPLAIN's response is a field table without its 4-byte length.
    client.start(mechanism="AMQPLAIN", response=table[4:].decode("ascii"))
    client.tune()
    client.open()
    client.open_channel(1)
    client.method(1, C.Queue.Declare(queue="amqplain"))
    client.expect(C.Queue.DeclareOk, 1)
    client.close()


def test_amqp_0_9_protocol_header_is_served_as_0_9_1(broker: Broker) -> None:
    """The unit test (tests/unit/test_connection.py) checks connection.start;
    here a whole session runs over a real socket after the 0-9 header."""
    client = RawClient(broker.port)
    start = client.start(header=b"AMQP\x01\x01\x00\x09")
    assert (start.version_major, start.version_minor) == (0, 9)
    client.tune()
    client.open()
    client.open_channel(1)
    client.method(1, C.Queue.Declare(queue="zero-nine"))
    client.expect(C.Queue.DeclareOk, 1)
    client.publish(1, b"old header", routing_key="zero-nine")
    client.method(1, C.Basic.Get(queue="zero-nine", no_ack=True))
    client.expect(C.Basic.GetOk, 1)
    client.expect(ContentHeader, 1)
    assert client.expect(ContentBody, 1).value == b"old header"
    client.close()
