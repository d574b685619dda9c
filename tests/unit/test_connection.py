"""The connection state machine without sockets: a fake transport records
what the broker writes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody as Body
from pamqp.header import ContentHeader

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.amqp.definitions import Op
from shoal.broker.config import Config
from shoal.broker.scheduler.durable import Restored
from shoal.shm import layout as L
from shoal.shm.catalog import CatalogWriter
from shoal.shm.segment import Segment
from shoal.workers import connection as connection_module
from shoal.workers.connection import Connection
from shoal.workers.context import WorkerContext


class FakeTransport:
    def __init__(self) -> None:
        self.data = b""
        self.closed = False
        self.eof = False  # write_eof: our end shut for writing
        self.paused = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, parts: list[bytes]) -> None:
        self.data += b"".join(parts)

    def close(self) -> None:
        self.closed = True

    def write_eof(self) -> None:
        self.eof = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Client:
    """Drives one Connection and decodes what it writes."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.loop = ctx.loop
        self.transport = FakeTransport()
        self.conn = Connection(ctx)
        self.conn.connection_made(self.transport)

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)
        self.loop.run_until_complete(asyncio.sleep(0))  # run the scheduled flush

    def scheduler_answers(self) -> None:
        """Play the scheduler: answer every request in flight (with None)."""
        ctx = self.conn.ctx
        for req in list(ctx._pending):
            ctx.on_reply(req, ipc.Ok())
        for _ in range(3):  # the futures' callbacks, then the flush
            self.loop.run_until_complete(asyncio.sleep(0))

    def method(self, channel: int, method: Any) -> None:
        self.send(pamqp_frame.marshal(method, channel))

    def received(self) -> list[tuple[int, Any]]:
        out, data = [], self.transport.data
        self.transport.data = b""
        while data:
            n, channel, frame = pamqp_frame.unmarshal(data)
            out.append((channel, frame))
            data = data[n:]
        return out

    def open(self) -> None:
        self.send(b"AMQP\x00\x00\x09\x01")
        self.method(0, C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
        self.method(0, C.Connection.TuneOk(channel_max=100, frame_max=131072, heartbeat=0))
        self.method(0, C.Connection.Open(virtual_host="/"))
        frames = [type(f) for _ch, f in self.received()]
        assert frames == [C.Connection.Start, C.Connection.Tune, C.Connection.OpenOk]


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from worker_context(
        tmp_path, L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    )


def worker_context(
    tmp_path: Path, limits: L.Limits, definitions: Sequence[Any] = (), config: Config | None = None
) -> Iterator[WorkerContext]:
    """One IO worker's context on a fresh segment (removed after), its
    journal holding `definitions` after the defaults."""
    seg = Segment.create(str(tmp_path / "seg"), limits)
    # What a broker's first start journals: the default vhost and guest.
    ops = Restored().operations("/", "guest", "guest")
    CatalogWriter(seg, Op).compact([*ops, *definitions])
    loop = asyncio.new_event_loop()
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    yield WorkerContext(config or Config(), seg, 0, 1, efd, loop)
    loop.close()
    os.close(efd)
    seg.unlink()


def test_start_advertises_capabilities_and_the_worker(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    ((_ch, start),) = client.received()
    props = start.server_properties
    assert props["product"] == "Shoal" and props["shoal_worker"] == "0"
    for capability in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert props["capabilities"][capability] is True
    assert start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]


def test_09_header_is_accepted_and_a_bad_one_answered(ctx: WorkerContext) -> None:
    old = Client(ctx)
    old.send(b"AMQP\x01\x01\x00\x09")
    assert isinstance(old.received()[0][1], C.Connection.Start)
    bad = Client(ctx)
    bad.send(b"HTTP/1.1")
    assert bad.transport.data == b"AMQP\x00\x00\x09\x01" and bad.transport.closed


ASKS_FOR_A_CLOSE = {"capabilities": {"authentication_failure_close": True}}


def test_bad_password_is_403(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.received()
    client.method(
        0,
        C.Connection.StartOk(
            client_properties=ASKS_FOR_A_CLOSE, mechanism="PLAIN", response="\0guest\0nope"
        ),
    )
    ((_ch, close),) = client.received()
    assert isinstance(close, C.Connection.Close) and close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused")


def silent_close_in(client: Client) -> float:
    """Seconds until the connection, which wrote nothing, closes its socket."""
    conn = client.conn
    assert client.received() == [] and not client.transport.closed
    assert conn.timer is not None
    return conn.timer.when() - client.loop.time()


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        ("PLAIN", ""),  # what clients send for an empty password (php-amqplib)
        ("PLAIN", "guest\0guest"),
        ("AMQPLAIN", "\x05LOGINS\x00\x00\x00\x05guest"),  # no PASSWORD
        ("CRAM-MD5", "guest"),  # a mechanism not offered
        ("EXTERNAL", ""),  # offered only with a TLS client certificate
    ],
)
def test_a_login_rabbitmq_does_not_trust_gets_no_frame_and_a_close_3_s_later(
    ctx: WorkerContext, mechanism: str, response: str
) -> None:
    """RabbitMQ answers a malformed response or a mechanism it did not offer
    with silence (syntax_error / command_invalid in the starting state): it
    drops the socket after ?SILENT_CLOSE_DELAY, whatever the client asked."""
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.received()
    start_ok = C.Connection.StartOk(
        client_properties=ASKS_FOR_A_CLOSE, mechanism=mechanism, response=response
    )
    client.method(0, start_ok)
    assert silent_close_in(client) == pytest.approx(3.0, abs=0.1)
    client.method(0, C.Connection.TuneOk(channel_max=100, frame_max=131072, heartbeat=0))
    assert client.received() == []  # (input is dropped meanwhile)
    assert client.conn.eof_received() is None  # the client's close ends it at once


def test_a_refused_login_without_authentication_failure_close_gets_no_close(
    tmp_path: Path,
) -> None:
    """A client that did not announce authentication_failure_close (Go's
    amqp091) hears nothing of a refused login from RabbitMQ: its socket is
    closed 3 s later, whatever the handshake timeout (the Java client's
    SaslMechanisms tests wait ~5 s for it)."""
    limits = L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    for ctx in worker_context(tmp_path, limits, config=Config(handshake_timeout=7.0)):
        client = Client(ctx)
        client.send(b"AMQP\x00\x00\x09\x01")
        client.received()
        client.method(0, C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0nope"))
        assert silent_close_in(client) == pytest.approx(errors.SILENT_CLOSE_DELAY, abs=0.1)


def test_frames_on_a_channel_that_is_not_open(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.open()
    client.method(3, C.Basic.Qos(prefetch_count=1))
    ((_ch, close),) = client.received()
    assert close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"


def test_frames_right_after_the_clients_channel_close_are_dropped(ctx: WorkerContext) -> None:
    """What a client sends on a channel after its own channel.close, before it
    saw the close-ok (lavinmqperf acks the deliveries it still had), is
    dropped as RabbitMQ's channel process takes it, not a connection error;
    LATE_FRAMES later the channel is closed: 504 as before."""
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(2, C.Channel.Open())
    client.received()
    client.send(
        pamqp_frame.marshal(C.Channel.Close(200, "bye", 0, 0), 1)
        + pamqp_frame.marshal(C.Basic.Ack(delivery_tag=250, multiple=True), 1)
        + pamqp_frame.marshal(C.Basic.Qos(prefetch_count=5), 2)
    )
    frames = client.received()
    assert [(ch, type(f)) for ch, f in frames] == [(1, C.Channel.CloseOk), (2, C.Basic.QosOk)]
    client.method(1, C.Basic.Ack(delivery_tag=500, multiple=True))  # a later read
    client.method(2, C.Basic.Qos(prefetch_count=6))
    assert [type(f) for _ch, f in client.received()] == [C.Basic.QosOk]
    client.method(1, C.Channel.Open())  # a new channel of that number ...
    client.method(1, C.Channel.Close(200, "bye", 0, 0))
    client.received()
    client.conn.closed_by_client[1] -= connection_module.LATE_FRAMES  # ... a while ago
    client.method(1, C.Basic.Ack(delivery_tag=1))
    ((_ch, close),) = client.received()
    assert (close.reply_code, close.reply_text) == (
        504,
        "CHANNEL_ERROR - expected 'channel.open'",
    )


def test_second_channel_open_is_a_channel_error(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(1, C.Channel.Open())
    frames = client.received()
    assert isinstance(frames[0][1], C.Channel.OpenOk)
    assert frames[1][1].reply_code == 504
    assert frames[1][1].reply_text == "CHANNEL_ERROR - second 'channel.open' seen"


def test_publish_to_unknown_exchange_closes_only_the_channel(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(1, C.Basic.Publish(exchange="nope", routing_key="x"))
    # Routing waits for the content header (a headers exchange needs it).
    header = ContentHeader(0, 2, C.Basic.Properties())
    client.send(pamqp_frame.marshal(header, 1))
    client.send(pamqp_frame.marshal(Body(b"hi"), 1))
    frames = client.received()
    close = frames[-1][1]
    assert frames[-1][0] == 1 and isinstance(close, C.Channel.Close)
    assert (close.reply_code, close.reply_text) == (
        404,
        "NOT_FOUND - no exchange 'nope' in vhost '/'",
    )
    # The connection is fine: another channel opens.
    client.method(2, C.Channel.Open())
    assert isinstance(client.received()[0][1], C.Channel.OpenOk)


def test_heartbeats_go_every_half_interval_of_silence_the_first_at_once(
    ctx: WorkerContext,
) -> None:
    """RabbitMQ's heartbeat sender (rabbit_heartbeat.erl) wakes every half
    interval: it sends at its first wake whatever went out before, then
    whenever nothing else went out since the last wake, its own heartbeats
    not counted. CloudAMQP's amqp-client.js closes after one interval of
    silence: a heartbeat per interval (counting our own as traffic) lost it
    the connection half the time."""
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.method(0, C.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
    client.method(0, C.Connection.TuneOk(channel_max=100, frame_max=131072, heartbeat=60))
    client.method(0, C.Connection.Open(virtual_host="/"))
    client.received()  # start, tune, open-ok: traffic, but the first tick sends all the same
    conn = client.conn
    assert conn.timer is not None  # the first tick, half an interval on
    assert conn.timer.when() - client.loop.time() == pytest.approx(30, abs=1)
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    for _ in range(3):  # an idle connection: one at every tick
        conn.heartbeat_tick()
        assert client.transport.data == heartbeat
        client.transport.data = b""
    client.method(1, C.Channel.Open())  # channel.open-ok goes out: the next tick is quiet
    assert client.transport.data == b"\x01\x00\x01\x00\x00\x00\x08\x00\x14\x00\x0b" + (
        b"\x00\x00\x00\x00\xce"  # (its reserved long string empty, as RabbitMQ's)
    )
    client.transport.data = b""
    conn.heartbeat_tick()
    assert client.transport.data == b""
    conn.heartbeat_tick()
    assert client.transport.data == heartbeat


def test_heartbeat_on_a_channel_is_a_frame_error(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.open()
    client.send(b"\x08\x00\x05\x00\x00\x00\x00\xce")
    ((_ch, close),) = client.received()
    assert close.reply_code == 501


def test_method_on_channel_zero_out_of_order(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.received()
    client.method(0, C.Connection.Open(virtual_host="/"))
    ((_ch, close),) = client.received()
    assert close.reply_code == 503


def test_after_close_ok_the_broker_keeps_its_end_open_and_discards(ctx: WorkerContext) -> None:
    """Closing the socket at once would meet the client's last frames with a
    RST, and a FIN of ours could reach a client closing from several threads
    before the thread that got close-ok marked the connection closed: the
    broker sends close-ok, no FIN, and discards what still comes until the
    client closes its end."""
    client = Client(ctx)
    client.open()
    close = C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    client.method(0, close)
    assert client.received() == [], "close-ok waits for the scheduler (exclusive queues)"
    client.scheduler_answers()
    assert [type(f) for _ch, f in client.received()] == [C.Connection.CloseOk]
    assert not client.transport.eof and not client.transport.closed
    client.method(0, close)  # a second close (another thread of the client)
    client.send(b"\x08\x00\x00\x00\x00\x00\x00\xce")  # a heartbeat
    assert client.received() == [] and not client.transport.closed
    client.conn.timer.cancel()  # type: ignore[union-attr]


def test_after_the_brokers_close_the_clients_close_ok_gets_a_fin(ctx: WorkerContext) -> None:
    """After a close of the broker's the client's close-ok is its last frame:
    the broker's FIN follows at once, and the client's EOF closes the socket."""
    client = Client(ctx)
    client.open()
    client.send(b"\x08\x00\x05\x00\x00\x00\x00\xce")  # a heartbeat on channel 5: 501
    ((_ch, close),) = client.received()
    assert close.reply_code == 501 and not client.transport.eof
    client.method(0, C.Connection.CloseOk())
    assert client.transport.eof and not client.transport.closed
    # None: asyncio's transport closes itself on the client's EOF
    assert client.conn.eof_received() is None
    client.conn.timer.cancel()  # type: ignore[union-attr]


def test_crossing_channel_close_is_part_of_the_handshake(ctx: WorkerContext) -> None:
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(2, C.Channel.Open())
    client.received()
    client.method(1, C.Basic.Get(queue="missing"))  # the broker closes channel 1
    client.method(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    frames = client.received()
    assert [(ch, type(f)) for ch, f in frames] == [(1, C.Channel.Close), (1, C.Channel.CloseOk)]
    client.method(1, C.Channel.CloseOk())  # the client's answer to the broker's close
    client.method(2, C.Basic.Qos(prefetch_count=5))
    assert [(ch, type(f)) for ch, f in client.received()] == [(2, C.Basic.QosOk)]
    client.method(1, C.Channel.Open())
    assert [(ch, type(f)) for ch, f in client.received()] == [(1, C.Channel.OpenOk)]


def unroutable_publishes(client: Client, count: int) -> bytes:
    """`count` whole publishes to a queue that does not exist (each confirmed
    at once, as RabbitMQ confirms an unroutable message), as one read."""
    header = pamqp_frame.marshal(ContentHeader(0, 2, C.Basic.Properties()), 1)
    one = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="nowhere"), 1)
        + header
        + pamqp_frame.marshal(Body(b"hi"), 1)
    )
    return one * count


def confirm_channel(client: Client) -> None:
    client.open()
    client.method(1, C.Channel.Open())
    client.method(1, C.Confirm.Select())
    assert [type(f) for _ch, f in client.received()] == [C.Channel.OpenOk, C.Confirm.SelectOk]


@pytest.mark.parametrize("taken", [True, False])
def test_a_bridges_confirm_sink_takes_the_confirms_instead_of_a_basic_ack(
    ctx: WorkerContext, taken: bool
) -> None:
    """An MQTT client's inner connection hands its confirms to the bridge
    (Inbound.confirmed_at_once) rather than writing basic.ack; where the sink
    declines, the basic.ack is written as for any client."""
    client = Client(ctx)
    confirm_channel(client)
    sunk: list[tuple[int, int]] = []

    def sink(channel: int, tag: int) -> bool:
        sunk.append((channel, tag))
        return taken

    client.conn.confirm_sink = sink
    client.send(unroutable_publishes(client, 3))
    assert sunk == [(1, 3)]  # one cumulative confirm for the read
    frames = [f for _ch, f in client.received()]
    if taken:
        assert frames == []
    else:
        assert len(frames) == 1 and isinstance(frames[0], C.Basic.Ack)
        assert (frames[0].delivery_tag, frames[0].multiple) == (3, True)


def test_a_confirm_does_not_overtake_frames_not_yet_written(ctx: WorkerContext) -> None:
    """Frames the connection wrote earlier in the loop iteration are still
    in its buffer: the confirm follows them as a basic.ack, the sink is not
    asked (the bridge reads what was written in order)."""
    client = Client(ctx)
    confirm_channel(client)
    sunk: list[tuple[int, int]] = []
    client.conn.confirm_sink = lambda channel, tag: sunk.append((channel, tag)) or True
    client.conn.write(pamqp_frame.marshal(C.Basic.Cancel(consumer_tag="earlier"), 1))
    client.send(unroutable_publishes(client, 1))
    assert sunk == []
    frames = [f for _ch, f in client.received()]
    assert [type(f) for f in frames] == [C.Basic.Cancel, C.Basic.Ack]


def test_connections_logging_in_are_bounded_per_worker(tmp_path: Path) -> None:
    """--max-handshaking: more connections still logging in than the limit
    are closed at once; those past connection.open, or gone, free a slot
    (the worker keeps the handshaking ones in a set, pruned when full)."""
    limits = L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 16)
    for ctx in worker_context(tmp_path, limits, config=Config(max_handshaking=2)):
        opened = [Client(ctx), Client(ctx)]
        assert not any(c.transport.closed for c in opened)
        assert Client(ctx).transport.closed  # a third one logging in
        for client in opened:
            client.open()
        waiting = [Client(ctx), Client(ctx)]  # the opened ones no longer count
        assert not any(c.transport.closed for c in waiting)
        assert Client(ctx).transport.closed
        waiting[0].conn.connection_lost(None)  # a slot freed by a client that went
        assert not Client(ctx).transport.closed
        assert Client(ctx).transport.closed
