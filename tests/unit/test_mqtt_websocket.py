"""workers/mqtt_websocket.py without a broker: a fake socket transport and a
fake MQTT side (MqttConnection's Protocol methods only), a wsproto client
on the other end. What the integration tests cannot steer: the MQTT side
pausing in the middle of a read, and frames fed one byte at a time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Message, Request

from shoal.workers import mqtt_websocket
from shoal.workers.mqtt_websocket import MqttWebSocket


class FakeSocket:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closing = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closing
        self.out += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def get_write_buffer_size(self) -> int:
        return len(self.out)


class FakeMqtt:
    """The MQTT side: what it was given, and a pause after `pause_after` bytes."""

    def __init__(self, _ctx: Any) -> None:
        self.transport: Any = None
        self.received = bytearray()
        self.pause_after = 0
        self.lost = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += data
        if self.pause_after and len(self.received) >= self.pause_after:
            self.pause_after = 0
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class Timer:
    def cancel(self) -> None:
        pass


@pytest.fixture
def counted() -> list[int]:
    return []


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, counted: list[int]) -> tuple[MqttWebSocket, FakeSocket]:
    monkeypatch.setattr(mqtt_websocket, "MqttConnection", FakeMqtt)
    ctx: Any = SimpleNamespace(
        config=SimpleNamespace(handshake_timeout=10.0),
        loop=SimpleNamespace(call_later=lambda *_args: Timer()),
        process=SimpleNamespace(count_connections=counted.append),
    )
    protocol, sock = MqttWebSocket(ctx), FakeSocket()
    protocol.connection_made(sock)  # type: ignore[arg-type]
    return protocol, sock


def upgraded(protocol: MqttWebSocket, sock: FakeSocket) -> tuple[WSConnection, FakeMqtt]:
    client = WSConnection(ConnectionType.CLIENT)
    request = client.send(Request(host="localhost", target="/ws", subprotocols=["mqtt"]))
    protocol.data_received(request)
    client.receive_data(bytes(sock.out))
    sock.out.clear()
    (accepted,) = client.events()
    assert isinstance(accepted, AcceptConnection) and accepted.subprotocol == "mqtt"
    assert isinstance(protocol.mqtt, FakeMqtt)
    return client, protocol.mqtt


def test_fragments_fed_a_byte_at_a_time_reach_the_mqtt_side_as_one_stream(
    server: tuple[MqttWebSocket, FakeSocket],
) -> None:
    protocol, sock = server
    client, mqtt = upgraded(protocol, sock)
    wire = b"".join(
        client.send(Message(data=part, message_finished=last))
        for part, last in ((b"\x10\x0c", False), (b"\x00\x04MQ", False), (b"TT", True))
    )
    for i in range(len(wire)):
        protocol.data_received(wire[i : i + 1])
    assert bytes(mqtt.received) == b"\x10\x0c\x00\x04MQTT"


def test_a_pause_holds_the_rest_of_a_read_until_resumed(
    server: tuple[MqttWebSocket, FakeSocket],
) -> None:
    protocol, sock = server
    client, mqtt = upgraded(protocol, sock)
    mqtt.pause_after = 3
    protocol.data_received(client.send(Message(data=b"one")) + client.send(Message(data=b"two")))
    assert (bytes(mqtt.received), sock.paused) == (b"one", True)  # "two" waits
    mqtt.transport.resume_reading()
    assert (bytes(mqtt.received), sock.paused) == (b"onetwo", False)


def test_writes_are_binary_messages_and_close_sends_a_close_frame(
    server: tuple[MqttWebSocket, FakeSocket],
) -> None:
    protocol, sock = server
    client, mqtt = upgraded(protocol, sock)
    mqtt.transport.write(b"\x20\x02\x00\x00")
    mqtt.transport.close()
    client.receive_data(bytes(sock.out))
    message, close = client.events()
    assert isinstance(message, BytesMessage) and message.data == b"\x20\x02\x00\x00"
    assert isinstance(close, CloseConnection) and close.code == 1000
    assert sock.closing and mqtt.transport.is_closing()
    mqtt.transport.write(b"late")  # after close: dropped, not an error
    protocol.connection_lost(None)
    assert mqtt.lost


def test_a_connection_never_upgraded_is_counted_out_here(
    server: tuple[MqttWebSocket, FakeSocket], counted: list[int]
) -> None:
    protocol, sock = server
    protocol.data_received(b"GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.out.startswith(b"HTTP/1.1 400 ") and sock.closing
    protocol.connection_lost(None)
    assert counted == [-1]
