"""Bad input on one connection closes that connection with the right AMQP
error, and a client on the same worker carries on."""

from __future__ import annotations

import socket
import struct

import pika
import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame

from tests.broker_process import Broker, wait_for


def handshake(port: int, capabilities: dict[str, bool] | None = None) -> socket.socket:
    """A raw client that completes the handshake and opens channel 1."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    expect(s, C.Connection.Start)
    start_ok = C.Connection.StartOk(
        client_properties={"capabilities": capabilities or {}},
        mechanism="PLAIN",
        response="\0guest\0guest",
    )
    s.sendall(pamqp_frame.marshal(start_ok, 0))
    expect(s, C.Connection.Tune)
    s.sendall(
        pamqp_frame.marshal(C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0), 0)
    )
    s.sendall(pamqp_frame.marshal(C.Connection.Open(virtual_host="/"), 0))
    expect(s, C.Connection.OpenOk)
    s.sendall(pamqp_frame.marshal(C.Channel.Open(), 1))
    expect(s, C.Channel.OpenOk)
    return s


def read_frame(s: socket.socket) -> object:
    buf = b""
    while True:
        try:
            _consumed, _ch, frame = pamqp_frame.unmarshal(buf)
            return frame
        except Exception:
            pass
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk


def expect(s: socket.socket, cls: type) -> object:
    frame = read_frame(s)
    assert isinstance(frame, cls), f"expected {cls.__name__}, got {frame!r}"
    return frame


def closed_by_server(s: socket.socket, timeout: float = 2.0) -> bool:
    """True once the broker closes the socket; False if it is still open after
    `timeout` (less than the broker's 3 s wait for a missing close-ok)."""
    s.settimeout(timeout)
    while True:
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        if not data:
            return True


@pytest.fixture
def one_worker(broker_factory) -> Broker:  # type: ignore[no-untyped-def]
    return broker_factory(workers=1)


@pytest.fixture
def bystander(one_worker: Broker):  # type: ignore[no-untyped-def]
    conn = pika.BlockingConnection(pika.URLParameters(one_worker.url))
    ch = conn.channel()
    ch.queue_declare("bystander")
    yield ch
    # The bystander, on the same worker, still publishes and consumes.
    ch.basic_publish("", "bystander", b"alive")
    assert ch.basic_get("bystander", auto_ack=True)[2] == b"alive"
    conn.close()


def error_close(s: socket.socket) -> C.Connection.Close:
    """The broker's connection.close; we answer close-ok, as a client must,
    and the broker must then close the socket."""
    frame = expect(s, C.Connection.Close)
    s.sendall(pamqp_frame.marshal(C.Connection.CloseOk(), 0))
    assert closed_by_server(s), "the broker kept the connection open after close-ok"
    return frame  # type: ignore[return-value]


def test_garbage_instead_of_protocol_header(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = socket.create_connection(("127.0.0.1", one_worker.port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert s.recv(8) == b"AMQP\x00\x00\x09\x01"  # the spec: reply with our header, close
    assert closed_by_server(s)


def test_garbage_after_handshake(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = handshake(one_worker.port)
    s.sendall(b"\x07" + b"\xff" * 40)
    close = error_close(s)
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR")


def test_frame_larger_than_frame_max(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = handshake(one_worker.port)
    s.sendall(struct.pack(">BHI", 3, 1, 200_000) + b"x" * 1000)
    close = error_close(s)
    assert close.reply_code == 501
    assert "frame_too_large" in close.reply_text


def test_wrong_frame_end(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = handshake(one_worker.port)
    good = pamqp_frame.marshal(C.Basic.Qos(prefetch_count=1), 1)
    s.sendall(good[:-1] + b"\x00")
    close = error_close(s)
    assert close.reply_code == 501
    assert "invalid_frame_end_marker" in close.reply_text


def test_body_without_publish_is_unexpected_frame(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = handshake(one_worker.port)
    s.sendall(struct.pack(">BHI", 3, 1, 3) + b"abc\xce")
    close = error_close(s)
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME")


def test_the_default_message_size_limit_is_rabbitmqs(broker: Broker) -> None:
    """128 MiB by default, as RabbitMQ 3.8+: clients' own suites publish
    tens of megabytes (Bunny: 23 and 32 MB bodies)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("large")
    body = bytes(range(256)) * (32_432_081 // 256)
    ch.basic_publish("", "large", body)
    _method, _props, got = ch.basic_get("large", auto_ack=True)
    assert got == body
    conn.close()


def test_oversized_message_is_precondition_failed(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=1, args=("--max-message-size", "1000"))
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("big")
    ch.basic_publish("", "big", b"x" * 2000)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("big", passive=True)
    assert exc.value.reply_code == 406
    assert (
        exc.value.reply_text
        == "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
    )
    ch = conn.channel()
    assert ch.queue_declare("big", passive=True).method.message_count == 0
    conn.close()


def test_client_vanishing_mid_frame(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    bystander.queue_declare("half")
    s = handshake(one_worker.port)
    s.sendall(pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="half"), 1))
    header = pamqp_frame.marshal(
        __import__("pamqp.header", fromlist=["ContentHeader"]).ContentHeader(body_size=100_000), 1
    )
    s.sendall(header)
    s.sendall(struct.pack(">BHI", 3, 1, 50_000) + b"y" * 20_000)  # half a frame, then gone
    s.close()
    seg = one_worker.segment()
    from shoal.shm import layout as L

    # The half-written message is never delivered and its space comes back.
    wait_for(
        lambda: seg.atomic.load(seg.layout.arena(0) + L.A_LIVE) == 0,
        10,
        "the partial body to be freed",
    )
    assert bystander.queue_declare("half", passive=True).method.message_count == 0
    wait_for(
        lambda: one_worker.status()["processes"][0]["connections"] == 1, 10, "the connection count"
    )


@pytest.mark.parametrize(
    ("flags", "properties"),
    [
        (0x0100, b"\x0a12"),  # an expiration 10 bytes long, 2 there
        # A table whose length says 12, 10 bytes there.
        (0x2000, struct.pack(">I", 12) + b"\x02CCA" + struct.pack(">I", 2) + b"Qx"),
        # A CC header whose array holds a value of an unknown type.
        (0x2000, struct.pack(">I", 10) + b"\x02CCA" + struct.pack(">I", 2) + b"Qx"),
        (0x2000, struct.pack(">I", 7) + b"\x03abcQxx"),  # an unknown type in the table
        (0x0000, b"\x01\x02\x03"),  # bytes after the last property
    ],
    ids=[
        "truncated-expiration",
        "table-past-end",
        "array-unknown-type",
        "unknown-type",
        "trailing",
    ],
)
def test_malformed_content_header_closes_as_rabbitmq(
    one_worker: Broker,
    bystander,  # type: ignore[no-untyped-def]
    flags: int,
    properties: bytes,
) -> None:
    """RabbitMQ 3.10 decodes every publish's properties; what does not parse
    crashes its channel process: 541 INTERNAL_ERROR, class and method 0
    (measured). The message reaches no queue (the bystander's stays empty
    of it: its client could not parse it)."""
    s = handshake(one_worker.port)
    publish_raw(s, struct.pack(">HHQH", 60, 0, 1, flags) + properties)
    close = error_close(s)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        541,
        "INTERNAL_ERROR",
        0,
        0,
    )


def test_cc_header_must_be_an_array(one_worker: Broker, bystander) -> None:  # type: ignore[no-untyped-def]
    s = handshake(one_worker.port)
    table = b"\x02CCS" + struct.pack(">I", 2) + b"ab"
    publish_raw(s, struct.pack(">HHQH", 60, 0, 1, 0x2000) + struct.pack(">I", len(table)) + table)
    close = expect(s, C.Channel.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (  # type: ignore[attr-defined]
        406,
        'PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}',
        60,
        40,
    )


def publish_raw(s: socket.socket, header: bytes) -> None:
    """basic.publish to the bystander's queue with this content header and a
    body of one byte."""
    s.sendall(pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="bystander"), 1))
    s.sendall(struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce")
    s.sendall(struct.pack(">BHI", 3, 1, 1) + b"x\xce")
