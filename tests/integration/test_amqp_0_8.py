"""AMQP 0-8 for clients that ask for it (workers/amqp_0_8.py): py-amqplib
1.0.2 opens with `AMQP 1 1 9 1`, others with `AMQP 1 1 8 0`, and RabbitMQ
3.10.8 answers both in 0-8 (measured with the same raw frames): version
8-0 and no capabilities in connection.start, channel.open-ok without a
field, basic.consume without an arguments table, connection.close and
close-ok as 10/60 and 10/61. py-amqplib's own suite then passes as on
RabbitMQ (45 of 48, the same three failing on both: docs/interop.md)."""

from __future__ import annotations

import json
import socket
import struct

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame

from tests.broker_process import Broker
from tests.clients import shoal
from tests.integration.test_compat import strict_08_table


class Raw:
    def __init__(self, port: int, header: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.sock.sendall(header)

    def send(self, channel: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce")

    def method(self, channel: int, method: object) -> None:
        self.send(channel, pamqp_frame.marshal(method, channel)[7:-1])  # type: ignore[arg-type]

    def read(self) -> tuple[int, bytes]:
        """(channel, payload) of the next method frame."""
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = struct.unpack_from(">BHI", self.buf)
                if len(self.buf) >= size + 8:
                    payload = self.buf[7 : 7 + size]
                    self.buf = self.buf[size + 8 :]
                    assert ftype == 1, ftype
                    return channel, payload
            chunk = self.sock.recv(65536)
            assert chunk, "the broker closed the connection"
            self.buf += chunk

    def open(self) -> dict[str, object]:
        """Through connection.open-ok; connection.start's server properties."""
        channel, start = self.read()
        assert (channel, start[:4], start[4:6]) == (0, b"\x00\x0a\x00\x0a", b"\x08\x00")
        (size,) = struct.unpack_from(">I", start, 6)
        properties = strict_08_table(start[10 : 10 + size])
        self.method(
            0,
            C.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
            ),
        )
        assert self.read()[1][:4] == b"\x00\x0a\x00\x1e"  # tune
        self.method(0, C.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
        self.method(0, C.Connection.Open(virtual_host="/"))
        assert self.read()[1][:4] == b"\x00\x0a\x00\x29"  # open-ok
        return properties


@pytest.mark.parametrize("header", [b"AMQP\x01\x01\x09\x01", b"AMQP\x01\x01\x08\x00"])
def test_a_client_that_asks_for_0_8_is_answered_in_0_8(broker: Broker, header: bytes) -> None:
    client = Raw(broker.port, header)
    properties = client.open()
    assert properties["capabilities"] == {} and properties["product"] == "Shoal"
    client.method(1, C.Channel.Open())
    assert client.read() == (1, b"\x00\x14\x00\x0b")  # channel.open-ok: no field
    client.method(1, C.Queue.Declare(queue="old-08"))
    assert client.read()[1][:4] == b"\x00\x32\x00\x0b"
    consume = pamqp_frame.marshal(C.Basic.Consume(queue="old-08", consumer_tag="t1"), 1)
    client.send(1, consume[7:-1][:-4])  # 0-8's basic.consume: no arguments table
    assert client.read() == (1, b"\x00\x3c\x00\x15\x02t1")
    (listed,) = json.loads(
        shoal(broker, "ctl", "list_connections", "protocol", "--formatter", "json").stdout
    )
    assert listed == {"protocol": "AMQP 0-8"}
    client.send(0, b"\x00\x0a\x00\x3c" + struct.pack(">HB2sHH", 200, 2, b"ok", 0, 0))
    assert client.read() == (0, b"\x00\x0a\x00\x3d")  # close-ok, 10/61


def test_the_broker_closes_a_0_8_connection_with_0_8_s_close(broker: Broker) -> None:
    client = Raw(broker.port, b"AMQP\x01\x01\x09\x01")
    client.open()
    client.method(1, C.Channel.Open())
    client.read()
    client.method(1, C.Exchange.Declare(exchange="x08", exchange_type="no-such-type"))
    channel, close = client.read()
    assert (channel, close[:4]) == (0, b"\x00\x0a\x00\x3c")  # 10/60: close, not redirect
    (code,) = struct.unpack_from(">H", close, 4)
    text = close[7 : 7 + close[6]].decode()
    assert (code, text) == (503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")
    client.send(0, b"\x00\x0a\x00\x3d")  # close-ok: the broker ends the connection
    client.sock.settimeout(5)
    assert client.sock.recv(65536) == b""
