"""MQTT over WebSocket (issue 41), as RabbitMQ's web-mqtt plugin serves it:
an HTTP upgrade on path /ws with the subprotocol `mqtt`, then MQTT packets
in binary messages, served by the same `MqttConnection` as a TCP client.

    the socket <-> MqttWebSocket (HTTP upgrade, WebSocket frames: wsproto)
               <-> WebSocketTransport <-> MqttConnection (a byte stream)

The framing and the handshake are wsproto's (python-hyper, sans-IO): a
well-kept implementation of RFC 6455 (masking, fragments, control frames,
close codes, UTF-8 checks) rather than one written here. MQTT needs no
message boundaries (MQTT-6.0.0-2: a packet may span messages, a message may
hold several), so each message's bytes go to the MQTT side as they come,
fragment by fragment, never buffered whole.

Refused as RabbitMQ does: another path with 404, an upgrade that offers
neither `mqtt` nor `mqttv3.1` with 400 (MQTT-6.0.0-3; RabbitMQ 3.12 and
later, which takes `mqttv3.1` too since 4.1.7, for old Paho clients), any
other bad request with 400; text messages close the connection (1003,
MQTT-6.0.0-1), as a malformed frame does (1002).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_connection import MqttConnection

log = logging.getLogger("shoal.mqtt")

PATH = "/ws"  # RabbitMQ's web_mqtt.ws_path
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# The answer to a request wsproto cannot answer itself (h11 refused it).
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
CLOSE = [(b"connection", b"close")]
NORMAL_CLOSE = (CloseReason.NORMAL_CLOSURE, CloseReason.GOING_AWAY, CloseReason.NO_STATUS_RCVD)


class MqttWebSocket(asyncio.Protocol):
    """The protocol of the accepted socket: the handshake, then frames."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.ws = WSConnection(ConnectionType.SERVER)
        self.sock: asyncio.Transport | None = None
        self.mqtt: MqttConnection | None = None  # once upgraded
        self.timer: asyncio.TimerHandle | None = None
        # The MQTT side paused reading: what the last read still held for
        # it waits here, as a TCP transport would not deliver it either.
        self.paused = False
        self.held = bytearray()

    # ------------------------------------------------------------ the socket
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sock = cast(asyncio.Transport, transport)
        # The HTTP request must come within the handshake timeout, as an
        # AMQP client's login must (after it, MQTT's CONNECT timeout runs).
        timeout = self.ctx.config.handshake_timeout
        self.timer = self.ctx.loop.call_later(timeout, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        try:
            self.ws.receive_data(data)
        except RemoteProtocolError as exc:  # not an HTTP request, or not an upgrade
            self._log(exc)
            self._refuse(exc.event_hint)
            return
        except LocalProtocolError:  # more after the close handshake: nothing to say
            self._close_socket()
            return
        for event in self.ws.events():
            if self._closing():
                return
            self._event(event)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.mqtt is not None:
            self.mqtt.connection_lost(exc)  # it counts the connection out
        else:
            self.ctx.process.count_connections(-1)  # (the acceptor counted it in)

    def pause_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.resume_writing()

    # ------------------------------------------------------------ WebSocket
    def _event(self, event: Event) -> None:
        if isinstance(event, BytesMessage):
            self._to_mqtt(event.data)
        elif isinstance(event, Request):
            self._upgrade(event)
        elif isinstance(event, Ping):
            self._send(event.response())
        elif isinstance(event, CloseConnection):
            # The client's close (then connection_lost: the will, as for a
            # TCP client gone without DISCONNECT), or a frame wsproto could
            # not parse (a code of 1002 or so, state still OPEN).
            if event.code not in NORMAL_CLOSE:
                self._log(event.reason or event.code)
            if self.ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                self._send(event.response())
            self._close_socket()
        elif isinstance(event, TextMessage):
            self._log("a text message")
            self.close(CloseReason.UNSUPPORTED_DATA)
        # A Pong needs nothing.

    def _upgrade(self, request: Request) -> None:
        if urlsplit(request.target).path != PATH:
            self._refuse(RejectConnection(status_code=404, headers=CLOSE))
            return
        # The first of the client's subprotocols that is MQTT, answered as
        # it was asked (RabbitMQ's choice).
        chosen = next((p for p in request.subprotocols if p in SUBPROTOCOLS), None)
        if chosen is None:
            self._log(f"'mqtt' not among its subprotocols {request.subprotocols}")
            self._refuse(RejectConnection(status_code=400, headers=CLOSE))
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # No extensions (permessage-deflate is not offered back): MQTT
        # packets are small and binary. Bytes a client sent after its request
        # without waiting for this answer are dropped by wsproto; RFC 6455
        # (4.1) has it wait, as MQTT.js, paho and browsers do.
        self._send(AcceptConnection(subprotocol=chosen))
        assert self.sock is not None
        self.mqtt = MqttConnection(self.ctx)
        self.mqtt.connection_made(WebSocketTransport(self, self.sock))

    def _refuse(self, response: Event | None) -> None:
        try:
            data = self.ws.send(response) if response is not None else BAD_REQUEST
        except LocalProtocolError:  # h11 will not answer a request it could not parse
            data = BAD_REQUEST
        if self.sock is not None:
            self.sock.write(data)
        self._close_socket()

    def _handshake_timeout(self) -> None:
        self.timer = None
        self._log("no upgrade request in time")
        self._close_socket()

    # ------------------------------------------------------------ the MQTT side
    def _to_mqtt(self, data: bytes | bytearray) -> None:
        if self.paused:
            self.held += data
        elif self.mqtt is not None:
            self.mqtt.data_received(bytes(data))

    def pause_reading(self) -> None:
        if not self.paused and self.sock is not None:
            self.paused = True
            self.sock.pause_reading()

    def resume_reading(self) -> None:
        if not self.paused:
            return
        self.paused = False
        # What the last read held first; the MQTT side may pause again.
        while self.held and not self.paused and not self._closing() and self.mqtt is not None:
            data, self.held = bytes(self.held), bytearray()
            self.mqtt.data_received(data)
        if not self.paused and self.sock is not None:
            self.sock.resume_reading()

    def write(self, data: bytes) -> None:
        """An MQTT write (whole packets, several for a batch): a binary
        message per packet, as mosquitto and RabbitMQ's web-mqtt frame them,
        in one socket write. Eclipse Paho's C client reads one packet of a
        message and leaves the rest unread until more data comes: a PUBACK
        behind a PUBLISH in one message hung its tests."""
        sock = self.sock
        if self.ws.state is ConnectionState.OPEN and sock is not None and not sock.is_closing():
            send = self.ws.send
            sock.write(b"".join(send(BytesMessage(data=p)) for p in mqtt_packets(data)))

    def close(self, code: int = CloseReason.NORMAL_CLOSURE) -> None:
        """A close frame (if the WebSocket is still open), then the socket
        (its buffered writes first)."""
        if self.ws.state is ConnectionState.OPEN and not self._closing():
            self._send(CloseConnection(code=code))
        self._close_socket()

    # ------------------------------------------------------------ helpers
    def _send(self, event: Event) -> None:
        if self.sock is not None and not self.sock.is_closing():
            self.sock.write(self.ws.send(event))

    def _closing(self) -> bool:
        return self.sock is None or self.sock.is_closing()

    def _close_socket(self) -> None:
        if self.sock is not None and not self.sock.is_closing():
            self.sock.close()

    def _log(self, what: object) -> None:
        peer = self.sock.get_extra_info("peername") if self.sock is not None else None
        log.info("mqtt over websocket from %s: %s", peer, what)


def mqtt_packets(data: bytes) -> list[bytes]:
    """`data` (whole MQTT packets) cut at their boundaries: each packet's
    fixed header, its remaining length (a varint), that many bytes."""
    packets = []
    at, size = 0, len(data)
    while at < size:
        i, length, shift = at + 1, 0, 0
        while i < size:
            byte = data[i]
            i += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        end = min(i + length, size)
        packets.append(data[at:end] if at or end < size else data)
        at = end
    return packets


class WebSocketTransport:
    """What MqttConnection writes to and closes: its writes become binary
    messages, its close a close frame; the rest is the socket's."""

    def __init__(self, owner: MqttWebSocket, sock: asyncio.Transport) -> None:
        self.owner = owner
        self.sock = sock

    def write(self, data: bytes) -> None:
        self.owner.write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.owner.write(b"".join(parts))

    def close(self) -> None:
        self.owner.close()

    def abort(self) -> None:
        self.sock.abort()

    def is_closing(self) -> bool:
        return self.sock.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket":  # (the connection rows say "Web MQTT", as RabbitMQ's)
            return True
        return self.sock.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.owner.pause_reading()

    def resume_reading(self) -> None:
        self.owner.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self.sock.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.sock.set_write_buffer_limits(high, low)
