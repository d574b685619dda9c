"""Every AMQP error the broker sends, as RabbitMQ 3.10 sends it: the reply
code, the reply text (rabbit_channel.erl, rabbit_reader.erl,
rabbit_command_assembler.erl) and the class and method ids of the method
that caused it (0, 0 where RabbitMQ names none). Raw pamqp frames over a
socket, since client libraries do not expose the ids.

Not repeated here (tests/integration/test_malformed.py has them): garbage
instead of the protocol header, garbage after the handshake and a bad frame
end (501), a frame far above frame_max (501), a body frame with no publish
(505), an oversized message (406), a client vanishing mid-frame.
Consumer-tag reuse (530), exclusive-consume refusals (403) and consume on a
missing queue (404) are in tests/integration/test_basic.py.

502 SYNTAX_ERROR: RabbitMQ raises it only for a malformed SASL response, and
then closes the socket without a connection.close (a method whose arguments
are truncated is a 501, tested here); Shoal's visible 502 is a method frame
too short for its ids. 541 INTERNAL_ERROR is a broker fault: no client input
provokes one, so a test injects it (SHOAL_FAULT_INTERNAL_QUEUE).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.broker_process import Broker
from tests.integration.test_basic import RawClient, raw_connect

LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'locked' in vhost '/'. "
    "It could be originally declared on another connection or the exclusive property "
    "value does not match that of the original declaration."
)


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def method(channel: int, value: object) -> bytes:
    return pamqp_frame.marshal(value, channel)  # type: ignore[arg-type]


def header(channel: int, body_size: int, class_id: int = 60) -> bytes:
    """A content header with no properties."""
    return frame(2, channel, struct.pack(">HHQH", class_id, 0, body_size, 0))


def body(channel: int, data: bytes) -> bytes:
    return frame(3, channel, data)


def publish(channel: int, **kw: object) -> bytes:
    return method(channel, C.Basic.Publish(**kw))


def fields(close: C.Connection.Close | C.Channel.Close) -> tuple[int, str, int, int]:
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def soft_error(client: RawClient, number: int, data: bytes) -> tuple[int, str, int, int]:
    """Open channel `number`, send `data` on it: the broker should close that
    channel (and only it); answer close-ok. If it answers anything else, say
    what (and close the channel ourselves), so that a test comparing a list
    of these shows every mismatch at once."""
    client.open_channel(number)
    client.send(data)
    got = client.frame()
    assert got is not None, "the broker closed the socket"
    channel, value = got
    if isinstance(value, C.Channel.Close) and channel == number:
        client.method(number, C.Channel.CloseOk())
        return fields(value)
    assert channel == number, f"{value!r} on channel {channel}"
    client.method(number, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    while not isinstance(client.expect(object, number), C.Channel.CloseOk):
        pass  # what the broker still sends on that channel (content frames)
    return 0, f"no channel error, but {type(value).__name__}", 0, 0


def hard_error(port: int, data: bytes, **tune: object) -> tuple[int, str, int, int]:
    """A fresh connection with channel 1 open; `data` must close it."""
    client = raw_connect(port, **tune)  # type: ignore[arg-type]
    client.send(data)
    return fields(client.connection_close())


def alive(client: RawClient) -> None:
    """The connection survived the channel errors before."""
    client.open_channel(99)
    client.method(99, C.Queue.Declare(queue="still-alive"))
    client.expect(C.Queue.DeclareOk, 99)
    client.close()


# ------------------------------------------------------------- 403
@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_refused_is_403(broker: Broker, mechanism: str) -> None:
    if mechanism == "PLAIN":
        response = "\0guest\0wrong"
    else:
        table = pamqp_encode.field_table({"LOGIN": "guest", "PASSWORD": "wrong"})
        response = table[4:].decode("ascii")
    client = RawClient(broker.port)
    # The client announces authentication_failure_close: it gets a close.
    client.start(mechanism=mechanism, response=response)
    # RabbitMQ closes the socket 3 s after a refused login, close-ok or not.
    assert fields(client.connection_close(timeout=5)) == (
        403,
        f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile.",
        0,
        0,
    )


def silence_then_close(client: RawClient) -> float:
    """Seconds until the broker closes the socket, having sent nothing."""
    began = time.monotonic()
    client.sock.settimeout(15)
    try:
        data = client.sock.recv(65536)
    except ConnectionResetError:
        data = b""
    assert data == b"", f"the broker answered: {data!r}"
    return time.monotonic() - began


@pytest.mark.parametrize(
    ("mechanism", "response"), [("PLAIN", ""), ("AMQPLAIN", ""), ("SCRAM-SHA-1", "n,,n=guest")]
)
def test_a_malformed_login_is_closed_silently_after_3_s(
    broker: Broker, mechanism: str, response: str
) -> None:
    """RabbitMQ's answer to a malformed SASL response (php-amqplib sends an
    empty one for an empty password) or a mechanism it did not offer: no
    connection.close, even for a client that asked for one on a refused
    login; the socket dropped after 3 s (no quick retries)."""
    client = RawClient(broker.port)
    client.start(mechanism=mechanism, response=response)
    assert 2.5 <= silence_then_close(client) <= 10


def test_a_refused_login_without_authentication_failure_close_is_not_told(
    broker_factory: Any,
) -> None:
    """A client that did not announce authentication_failure_close (Go's
    amqp091) gets no connection.close for a wrong password: RabbitMQ drops
    the socket 3 s later, which it sees as the refusal (before the handshake
    timeout's 10 s: the Java client gives up after ~5)."""
    broker = broker_factory()
    client = RawClient(broker.port)
    client.start(response="\0guest\0wrong", capabilities={"authentication_failure_close": False})
    assert 2.5 <= silence_then_close(client) <= 5


def test_access_refused_channel_errors(broker: Broker) -> None:
    client = raw_connect(broker.port, channel=None)
    assert soft_error(client, 1, method(1, C.Queue.Declare(queue="amq.mine"))) == (
        403,
        "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'",
        50,
        10,
    )
    assert soft_error(
        client, 2, method(2, C.Exchange.Declare(exchange="amq.mine", exchange_type="direct"))
    ) == (
        403,
        "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'",
        40,
        10,
    )
    assert soft_error(client, 3, method(3, C.Exchange.Delete(exchange="amq.direct"))) == (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed",
        40,
        20,
    )
    assert soft_error(
        client, 4, method(4, C.Exchange.Declare(exchange="", exchange_type="direct"))
    ) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 10)
    client.open_channel(5)
    client.method(5, C.Queue.Declare(queue="bindme"))
    client.expect(C.Queue.DeclareOk, 5)
    client.method(5, C.Queue.Bind(queue="bindme", exchange="", routing_key="bindme"))
    assert fields(client.channel_close(5)) == (
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange",
        50,
        20,
    )
    alive(client)


# ------------------------------------------------------------- 404
def test_not_found_channel_errors(broker: Broker) -> None:
    client = raw_connect(broker.port, channel=None)
    no_queue = "NOT_FOUND - no queue 'nope' in vhost '/'"
    no_exchange = "NOT_FOUND - no exchange 'nope' in vhost '/'"
    data = publish(1, exchange="nope", routing_key="k") + header(1, 1) + body(1, b"x")
    assert soft_error(client, 1, data) == (404, no_exchange, 60, 40)
    assert soft_error(client, 2, method(2, C.Basic.Get(queue="nope"))) == (404, no_queue, 60, 70)
    assert soft_error(client, 3, method(3, C.Queue.Purge(queue="nope"))) == (404, no_queue, 50, 30)
    assert soft_error(
        client, 4, method(4, C.Queue.Bind(queue="nope", exchange="amq.direct", routing_key="k"))
    ) == (404, no_queue, 50, 20)
    client.open_channel(5)
    client.method(5, C.Queue.Declare(queue="here"))
    client.expect(C.Queue.DeclareOk, 5)
    client.method(5, C.Queue.Bind(queue="here", exchange="nope", routing_key="k"))
    assert fields(client.channel_close(5)) == (404, no_exchange, 50, 20)
    assert soft_error(
        client,
        6,
        method(6, C.Exchange.Declare(exchange="nope", exchange_type="direct", passive=True)),
    ) == (404, no_exchange, 40, 10)
    assert soft_error(
        client, 7, method(7, C.Exchange.Bind(destination="amq.fanout", source="nope"))
    ) == (404, no_exchange, 40, 30)
    # The queue-name shortcut on a channel that declared no queue.
    assert soft_error(client, 8, method(8, C.Basic.Consume(queue=""))) == (
        404,
        "NOT_FOUND - no previously declared queue",
        60,
        20,
    )
    alive(client)


# ------------------------------------------------------------- 405
def test_resource_locked_for_another_connection_s_exclusive_queue(broker: Broker) -> None:
    owner = raw_connect(broker.port)
    owner.method(1, C.Queue.Declare(queue="locked", exclusive=True))
    owner.expect(C.Queue.DeclareOk, 1)
    owner.publish(1, b"private", routing_key="locked")
    other = raw_connect(broker.port, channel=None)
    attempts = [
        C.Queue.Declare(queue="locked", passive=True),
        C.Basic.Get(queue="locked"),
        C.Queue.Purge(queue="locked"),
        C.Queue.Delete(queue="locked"),
        C.Basic.Consume(queue="locked"),
        C.Queue.Bind(queue="locked", exchange="amq.direct", routing_key="k"),
    ]
    got = [soft_error(other, n, method(n, value)) for n, value in enumerate(attempts, 1)]
    assert got == [
        (405, LOCKED, 50, 10),
        (405, LOCKED, 60, 70),
        (405, LOCKED, 50, 30),
        (405, LOCKED, 50, 40),
        (405, LOCKED, 60, 20),
        (405, LOCKED, 50, 20),
    ]
    alive(other)
    # The owner still has its queue and its message.
    owner.method(1, C.Queue.Declare(queue="locked", passive=True))
    assert owner.expect(C.Queue.DeclareOk, 1).message_count == 1
    owner.close()


# ------------------------------------------------------------- 406
def test_precondition_failed_channel_errors(broker: Broker) -> None:
    client = raw_connect(broker.port, channel=None)
    got = [
        soft_error(client, 1, method(1, C.Basic.Ack(delivery_tag=42))),
        soft_error(client, 2, method(2, C.Basic.Reject(delivery_tag=42))),
        soft_error(client, 3, method(3, C.Basic.Nack(delivery_tag=42))),
        soft_error(client, 4, method(4, C.Basic.Nack(delivery_tag=42, multiple=True))),
        soft_error(client, 5, method(5, C.Tx.Commit())),
    ]
    unknown = "PRECONDITION_FAILED - unknown delivery tag 42"
    assert got == [
        (406, unknown, 60, 80),
        (406, unknown, 60, 90),
        (406, unknown, 60, 120),
        (406, unknown, 60, 120),
        (406, "PRECONDITION_FAILED - channel is not transactional", 90, 20),
    ]
    # A tag acknowledged twice is unknown the second time.
    client.open_channel(6)
    client.method(6, C.Queue.Declare(queue="twice"))
    client.expect(C.Queue.DeclareOk, 6)
    client.publish(6, b"x", routing_key="twice")
    client.method(6, C.Basic.Get(queue="twice"))
    tag = client.expect(C.Basic.GetOk, 6).delivery_tag
    client.expect(ContentHeader, 6)
    client.expect(ContentBody, 6)
    client.method(6, C.Basic.Ack(delivery_tag=tag))
    client.method(6, C.Basic.Ack(delivery_tag=tag))
    assert fields(client.channel_close(6)) == (
        406,
        f"PRECONDITION_FAILED - unknown delivery tag {tag}",
        60,
        80,
    )
    # A multiple ack (or nack) of a tag not outstanding: RabbitMQ looks for
    # that tag (only 0 means all), settles nothing and closes the channel;
    # the outstanding message goes back to its queue (Bunny's basic_ack_spec).
    client.open_channel(10)
    for number, settle, method_id in (
        (8, C.Basic.Ack(delivery_tag=82, multiple=True), 80),
        (9, C.Basic.Nack(delivery_tag=82, multiple=True, requeue=False), 120),
    ):
        client.open_channel(number)
        client.publish(number, b"kept", routing_key="twice")
        client.method(number, C.Basic.Get(queue="twice"))
        client.expect(C.Basic.GetOk, number)
        client.expect(ContentHeader, number)
        client.expect(ContentBody, number)
        client.method(number, settle)
        assert fields(client.channel_close(number)) == (
            406,
            "PRECONDITION_FAILED - unknown delivery tag 82",
            60,
            method_id,
        )
        client.method(10, C.Queue.Declare(queue="twice", passive=True))
        assert client.expect(C.Queue.DeclareOk, 10).message_count == 1  # not settled
        client.method(10, C.Queue.Purge(queue="twice"))
        client.expect(C.Queue.PurgeOk, 10)
    client.open_channel(7)
    client.method(7, C.Exchange.Declare(exchange="typed", exchange_type="direct"))
    client.expect(C.Exchange.DeclareOk, 7)
    client.method(7, C.Exchange.Declare(exchange="typed", exchange_type="fanout"))
    assert fields(client.channel_close(7)) == (
        406,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'typed' in vhost '/': "
        "received 'fanout' but current is 'direct'",
        40,
        10,
    )
    alive(client)


# ------------------------------------------------------------- 501
def test_frame_max_boundary(broker: Broker) -> None:
    """RabbitMQ accepts a payload of up to frame_max bytes (it forgives the
    8 bytes of framing many clients forget), and refuses one more."""
    client = raw_connect(broker.port, frame_max=4096)
    client.method(1, C.Queue.Declare(queue="edge"))
    client.expect(C.Queue.DeclareOk, 1)
    client.send(publish(1, routing_key="edge") + header(1, 4096) + body(1, b"e" * 4096))
    client.method(1, C.Basic.Get(queue="edge", no_ack=True))
    client.expect(C.Basic.GetOk, 1)
    client.expect(ContentHeader, 1)
    received = b""
    while len(received) < 4096:
        received += client.expect(ContentBody, 1).value
    assert received == b"e" * 4096
    client.send(publish(1, routing_key="edge") + header(1, 4097) + body(1, b"e" * 4097))
    # A fatal frame error: RabbitMQ closes the socket 3 s later, close-ok or not.
    assert fields(client.connection_close(timeout=5)) == (
        501,
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}",
        0,
        0,
    )


def test_truncated_method_arguments_are_a_frame_error(broker: Broker) -> None:
    # basic.qos wants 7 bytes of arguments; give it 3.
    data = frame(1, 1, struct.pack(">HH", 60, 10) + b"\0\0\0")
    assert hard_error(broker.port, data) == (
        501,
        "FRAME_ERROR - cannot decode <<0,0,0>>",
        60,
        10,
    )


# ------------------------------------------------------------- 503
def test_connection_method_on_a_channel_is_command_invalid(broker: Broker) -> None:
    data = method(1, C.Connection.Open(virtual_host="/"))
    assert hard_error(broker.port, data) == (
        503,
        "COMMAND_INVALID - unimplemented method",
        10,
        40,
    )


def test_unknown_exchange_type_is_command_invalid(broker: Broker) -> None:
    data = method(1, C.Exchange.Declare(exchange="odd", exchange_type="x-nope"))
    assert hard_error(broker.port, data) == (
        503,
        "COMMAND_INVALID - unknown exchange type 'x-nope'",
        40,
        10,
    )


def test_a_channel_method_on_channel_0_is_rabbitmqs_channel_error(broker: Broker) -> None:
    assert hard_error(broker.port, method(0, C.Queue.Declare(queue="q"))) == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
        50,
        10,
    )


@pytest.mark.parametrize(
    ("data", "text"),
    [
        pytest.param(
            frame(9, 1, b"ab"),
            'FRAME_ERROR - type 9, all octets = <<"ab">>: unknown_frame',
            id="unknown-type",
        ),
        pytest.param(
            method(1, C.Basic.Qos())[:-1] + b"\x00",
            "FRAME_ERROR - type 1, all octets = <<0,60,0,10,0,0,0,0,0,0,0>>: "
            "{invalid_frame_end_marker,0}",
            id="bad-frame-end",
        ),
        pytest.param(
            frame(1, 1, b"0123456789abcdefXYZ")[:-1] + b"\x01",
            'FRAME_ERROR - type 1, first 16 octets = <<"0123456789abcdef">>: '
            "{invalid_frame_end_marker,1}",
            id="bad-frame-end-long-payload",
        ),
    ],
)
def test_frame_errors_show_the_payload_as_rabbitmq(broker: Broker, data: bytes, text: str) -> None:
    """rabbit_reader's frame_error: the frame's type, its payload (up to 16
    octets) as Erlang prints a binary, the error."""
    assert hard_error(broker.port, data) == (501, text, 0, 0)


def test_a_reply_text_over_255_bytes_is_cut_as_rabbitmqs(broker: Broker) -> None:
    """rabbit_binary_generator: 252 bytes and "..." (a cut at 255 lost the
    text's end without saying so)."""
    client = raw_connect(broker.port, channel=None)
    name = "q" * 240
    code, text, _c, _m = soft_error(client, 1, method(1, C.Queue.Declare(queue=name, passive=True)))
    assert code == 404
    full = f"NOT_FOUND - no queue '{name}' in vhost '/'"
    assert text == full[:252] + "..." and len(text.encode()) == 255


# ------------------------------------------------------------- 504
def test_method_on_a_channel_that_is_not_open(broker: Broker) -> None:
    data = method(5, C.Basic.Qos(prefetch_count=1))
    assert hard_error(broker.port, data) == (
        504,
        "CHANNEL_ERROR - expected 'channel.open'",
        60,
        10,
    )


def test_second_channel_open(broker: Broker) -> None:
    assert hard_error(broker.port, method(1, C.Channel.Open())) == (
        504,
        "CHANNEL_ERROR - second 'channel.open' seen",
        20,
        10,
    )


# ------------------------------------------------------------- 505
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            publish(1, routing_key="q") + method(1, C.Basic.Qos()),
            ("expected content header for class 60, got non content header frame instead", 60, 40),
            id="method-instead-of-header",
        ),
        pytest.param(
            publish(1, routing_key="q") + header(1, 10) + method(1, C.Basic.Qos()),
            ("expected content body, got non content body frame instead", 60, 40),
            id="method-instead-of-body",
        ),
        pytest.param(
            publish(1, routing_key="q") + header(1, 10, class_id=50),
            ("expected content header for class 60, got one for class 50 instead", 60, 40),
            id="header-of-another-class",
        ),
        pytest.param(
            header(1, 10),
            ("expected method frame, got non method frame instead", 0, 0),
            id="header-without-publish",
        ),
        pytest.param(
            publish(1, routing_key="q") + body(1, b"xyz"),
            ("expected content header for class 60, got non content header frame instead", 60, 40),
            id="body-instead-of-header",
        ),
        pytest.param(
            publish(1, routing_key="q") + header(1, 10) + header(1, 10),
            ("expected content body, got non content body frame instead", 60, 40),
            id="header-instead-of-body",
        ),
        pytest.param(
            frame(8, 1, b""),  # the Java client's UnexpectedFrames.heartbeatOnChannel
            ("type 8, all octets = <<>>", 0, 0),
            id="heartbeat-on-a-channel",
        ),
    ],
)
def test_unexpected_frame(broker: Broker, data: bytes, expected: tuple[str, int, int]) -> None:
    text, class_id, method_id = expected
    assert hard_error(broker.port, data) == (
        505,
        f"UNEXPECTED_FRAME - {text}",
        class_id,
        method_id,
    )


# ------------------------------------------------------------- 530
def test_unknown_vhost_is_not_allowed(broker: Broker) -> None:
    client = RawClient(broker.port)
    client.start()
    client.tune()
    client.method(0, C.Connection.Open(virtual_host="nope"))
    assert fields(client.connection_close()) == (
        530,
        "NOT_ALLOWED - vhost nope not found",
        10,
        40,
    )


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param({"frame_max": 262144}, id="frame_max-too-large"),
        pytest.param({"frame_max": 1024}, id="frame_max-too-small"),
        pytest.param({"channel_max": 3000}, id="channel_max-too-large"),
        pytest.param({"channel_max": 0}, id="channel_max-no-limit"),
    ],
)
def test_tune_ok_outside_the_server_s_limits_is_closed_silently(
    broker: Broker, tune: dict[str, int]
) -> None:
    """RabbitMQ 3.10.8 (measured): no connection.close for a tune-ok beyond
    what it offered (a 0, "no limit", included where it has a limit), the
    socket dropped 3 s later, as for any handshake error before open."""
    client = RawClient(broker.port)
    client.start()
    client.tune(**tune)
    client.method(0, C.Connection.Open(virtual_host="/"))
    assert 2.5 <= silence_then_close(client) <= 10


# ------------------------------------------------------------- 540
def test_immediate_publish_is_not_implemented(broker: Broker) -> None:
    data = publish(1, routing_key="q", immediate=True) + header(1, 1) + body(1, b"x")
    assert hard_error(broker.port, data) == (
        540,
        "NOT_IMPLEMENTED - immediate=true",
        60,
        40,
    )


# ------------------------------------------------------------- 502
def test_method_frame_without_a_method_id_is_a_syntax_error(broker: Broker) -> None:
    """RabbitMQ sends 502 only for a malformed login response, and then
    closes the socket without a frame; Shoal answers a method frame too short
    to hold a class and method id with 502, which a client can see."""
    assert hard_error(broker.port, frame(1, 1, b"\x00\x3c")) == (
        502,
        "SYNTAX_ERROR - method frame shorter than its method id",
        0,
        0,
    )


# ------------------------------------------------------------- 541
def test_internal_error_costs_only_its_own_connection(broker_factory: Any) -> None:
    """A bug while handling one client (injected: declaring the queue named
    by SHOAL_FAULT_INTERNAL_QUEUE raises in the worker) closes that client's
    connection with 541; the worker and a bystander on it carry on."""
    broker = broker_factory(workers=1, env={"SHOAL_FAULT_INTERNAL_QUEUE": "boom"})
    bystander = raw_connect(broker.port)
    bystander.method(1, C.Queue.Declare(queue="bystander"))
    bystander.expect(C.Queue.DeclareOk, 1)
    data = method(1, C.Queue.Declare(queue="boom"))
    assert hard_error(broker.port, data) == (
        541,
        "INTERNAL_ERROR - RuntimeError: injected fault",
        50,
        10,
    )
    alive(bystander)


def test_a_frame_over_4096_bytes_before_tune_ok_is_refused(broker: Broker) -> None:
    """Until tune-ok settles frame_max, AMQP's smallest (4096) holds: a
    connection.start-ok of 5,000 bytes is refused (the Java client's
    FrameMax.rejectLargeFramesDuringConnectionNegotiation), one under it
    is not."""
    big = RawClient(broker.port)
    big.sock.sendall(b"AMQP\x00\x00\x09\x01")
    big.expect(C.Connection.Start)
    start_ok = C.Connection.StartOk(
        client_properties={"padding": "x" * 5000}, mechanism="PLAIN", response="\0guest\0guest"
    )
    big.send(pamqp_frame.marshal(start_ok, 0))
    assert big.closed_by_server(5)
    small = RawClient(broker.port)
    small.sock.sendall(b"AMQP\x00\x00\x09\x01")
    small.expect(C.Connection.Start)
    start_ok.client_properties = {"padding": "x" * 3000}
    small.send(pamqp_frame.marshal(start_ok, 0))
    small.expect(C.Connection.Tune)
    small.close()
