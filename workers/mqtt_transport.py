"""The transport an MQTT client's inner AMQP connection writes to
(workers/mqtt_connection.py): its writes go to the bridge, which turns them
into MQTT packets; reading is paused and resumed on the client's socket.
And how that socket closes (Linger)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from shoal.workers._mqtt_wire import DeliveryFlush
from shoal.workers.connection import LINGER_TIMEOUT

log = logging.getLogger("shoal.mqtt")

# What the inner connection may ask of the client's socket: its addresses, and
# over TLS the session and the client's certificate (EXTERNAL logins, the
# connection rows' ssl fields). Not "socket": its writes are the bridge's.
_FORWARDED = frozenset({"peername", "sockname", "ssl_object", "peercert", "cipher"})


class Bridge(Protocol):
    client_id: str
    transport: Any  # the MQTT client's socket transport (uvloop's)
    closed: bool
    amqp_out: bytearray  # what the inner connection wrote and the bridge has not read
    amqp_reading: bool  # a read of amqp_out is due (from_amqp scheduled it)

    def from_amqp(self, data: bytes) -> None: ...
    def read_amqp(self) -> None: ...
    def amqp_closed(self) -> None: ...
    def disconnect(self, reason: int) -> None: ...


def flush_failed(bridge: Bridge, exc: Exception) -> None:
    """The inner connection's scheduled flush raised (its C path or the
    chain): part of its output may be lost (taken from it, not yet read
    into packets), and the deliveries in it would wait unseen. The client
    is disconnected (0x83, implementation specific error), as a fault in
    its read is answered: its unacknowledged deliveries go back to their
    queues, and no other client is touched."""
    log.error("mqtt client %s: internal error in a flush", bridge.client_id, exc_info=exc)
    bridge.disconnect(0x83)


class AmqpSide:
    """The transport the inner AMQP connection writes to: its bytes go to
    the bridge, its reads are the MQTT socket's."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in _FORWARDED and self.bridge.transport is not None:
            return self.bridge.transport.get_extra_info(name)
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def scheduled_flush(self, amqp: Any) -> Callable[[], None]:
        """The inner connection `amqp`'s flush at the end of a loop turn:
        where it has only planned deliveries to write and the bridge reads
        nothing else, one C call writes them as PUBLISHes to the client's
        socket (workers/_mqtt_flush.h); else flush_then_read's chain. A
        failure of either disconnects the client (flush_failed)."""
        bridge = self.bridge
        failed = functools.partial(flush_failed, bridge)
        return DeliveryFlush(bridge, amqp, self.flush_then_read(amqp.flush), failed)

    def flush_then_read(self, flush: Callable[[], None]) -> Callable[[], None]:
        """The inner connection's flush at the end of a loop turn, and the
        bridge's read of what it wrote right after it, in the same callback:
        a delivery's MQTT packets leave one loop turn sooner (not after the
        next turn's reads: fan-in's devices) and without a callback of their
        own. Only this flush, the one the loop calls: one made inside the
        inner connection's own methods (a close, a heartbeat) leaves its
        read to from_amqp's callback, as the bridge must not re-enter them."""
        bridge = self.bridge

        def flush_then_read() -> None:
            if bridge.amqp_reading:
                flush()  # an earlier write's read is scheduled: it reads this too
                return
            bridge.amqp_reading = True  # (from_amqp: no callback of its own)
            try:
                flush()
            finally:
                if bridge.amqp_out:
                    bridge.read_amqp()
                else:
                    bridge.amqp_reading = False

        return flush_then_read

    def write(self, data: bytes) -> None:
        self.bridge.from_amqp(data)

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.bridge.from_amqp(part)

    def pause_reading(self) -> None:
        if self.bridge.transport is not None and not self.bridge.closed:  # (Linger reads)
            self.bridge.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.bridge.transport is not None:
            self.bridge.transport.resume_reading()

    def close(self) -> None:
        self.bridge.amqp_closed()

    abort = close

    def is_closing(self) -> bool:
        return self.bridge.closed

    def write_eof(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        transport = self.bridge.transport
        return 0 if transport is None else int(transport.get_write_buffer_size())


class Linger:
    """The broker closes a client's socket so that the client reads what was
    last written (5.0's DISCONNECT and its reason): our FIN goes at once
    (write_eof), and the client's input is read and dropped (the bridge's
    data_received, once closed) until the client closes its end or
    LINGER_TIMEOUT passes. Closing a socket with input unread sends a RST
    instead, which can overtake the DISCONNECT: the client's next read fails
    and the reason is lost (Eclipse Paho's test_flow_control2 sends on while
    the broker disconnects it). TLS and WebSocket transports close at once."""

    @staticmethod
    def starts(transport: Any, loop: asyncio.AbstractEventLoop) -> bool:
        """True where the socket lingers; False: it is closed (or closing)."""
        can = getattr(transport, "can_write_eof", None)
        if transport.is_closing() or can is None or not can():
            transport.close()
            return False
        try:
            transport.write_eof()
            transport.resume_reading()  # (the inner connection may have paused it)
        except (OSError, RuntimeError):  # the socket is already gone
            transport.close()
            return False
        loop.call_later(LINGER_TIMEOUT, transport.close)
        return True
