"""A bare MQTT client on this repository's codec (broker/mqtt/packets.py),
for what paho-mqtt does for itself (acks, packet ids, DUP) or will not send,
so a test can hold an exchange at any step."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

import psutil

from shoal.broker.mqtt import packets as P

if TYPE_CHECKING:
    from tests.broker_process import Broker

WAIT_S = 10


class RawClient:
    def __init__(self, port: int, level: int = P.MQTT_5) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.level = level
        self.reader = P.PacketReader()
        self.got: list[tuple[int, int, bytes]] = []

    def connect(
        self,
        client_id: str,
        props: dict[str, Any] | None = None,
        clean: bool = True,
        username: str | None = None,
        password: bytes | None = None,
        will: tuple[str, bytes, int, dict[str, Any]] | None = None,
        keep_alive: int = 60,
    ) -> tuple[bool, int, dict[str, Any]]:
        """CONNECT; CONNACK's (session present, code, 5.0 properties)."""
        flags = 0x02 if clean else 0
        if will is not None:
            flags |= 0x04 | (will[2] << 3)
        if username is not None:
            flags |= 0x80
        if password is not None:
            flags |= 0x40
        body = P.string("MQTT") + bytes((self.level, flags)) + keep_alive.to_bytes(2, "big")
        if self.level == P.MQTT_5:
            body += P.encode_properties(props or {})
        body += P.string(client_id)
        if will is not None:
            if self.level == P.MQTT_5:
                body += P.encode_properties(will[3])
            body += P.string(will[0]) + P.binary(will[1])
        if username is not None:
            body += P.string(username)
        if password is not None:
            body += P.binary(password)
        self.sock.sendall(P.packet(P.CONNECT, 0, body))
        connack = self.read(P.CONNACK)[2]
        got = P.decode_properties(connack[2:], P.CONNACK) if self.level == P.MQTT_5 else {}
        return bool(connack[0] & 1), connack[1], got

    def subscribe(
        self,
        topic_filter: str,
        options: int,
        packet_id: int = 1,
        props: dict[str, Any] | None = None,
    ) -> bytes:
        """SUBSCRIBE one filter (`options`: the QoS and 5.0's option bits); SUBACK's codes."""
        body = packet_id.to_bytes(2, "big")
        if self.level == P.MQTT_5:
            body += P.encode_properties(props or {})
        self.sock.sendall(
            P.packet(P.SUBSCRIBE, 2, body + P.string(topic_filter) + bytes((options,)))
        )
        suback = self.read(P.SUBACK)[2]
        if self.level == P.MQTT_5:
            return suback[2 + 1 + suback[2] :]  # (packet id, properties' length, properties)
        return suback[2:]

    def unsubscribe(self, topic_filter: str, packet_id: int = 1) -> bytes:
        """UNSUBSCRIBE one filter; 5.0's UNSUBACK codes (3.1.1's has none)."""
        body = packet_id.to_bytes(2, "big")
        if self.level == P.MQTT_5:
            body += P.encode_properties({})
        self.sock.sendall(P.packet(P.UNSUBSCRIBE, 2, body + P.string(topic_filter)))
        unsuback = self.read(P.UNSUBACK)[2]
        if self.level == P.MQTT_5:
            return unsuback[2 + 1 + unsuback[2] :]
        return b""

    def publish(
        self, topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None, **kw: Any
    ) -> None:
        self.sock.sendall(
            P.encode_publish(self.level, topic, payload, qos, packet_id=packet_id, **kw)
        )

    def ack(self, kind: int, packet_id: int) -> None:
        self.sock.sendall(P.encode_ack(self.level, kind, packet_id))

    def read(self, kind: int, *or_kinds: int) -> tuple[int, int, bytes]:
        """The next packet of type `kind` (or of one of `or_kinds`)."""
        kinds = (kind, *or_kinds)
        while True:
            for i, packet in enumerate(self.got):
                if packet[0] in kinds:
                    return self.got.pop(i)
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.got += self.reader.feed(data)

    def received(self) -> tuple[int, P.Publish]:
        """The next PUBLISH from the broker: (its flags, the packet) (read
        without the client-side checks: a server's PUBLISH may carry
        subscription identifiers)."""
        _kind, flags, body = self.read(P.PUBLISH)
        cur = P._Cursor(body)
        topic = cur.string()
        qos = (flags >> 1) & 3
        packet_id = cur.u16() if qos else None
        props = cur.properties(frozenset(range(256))) if self.level == P.MQTT_5 else {}
        payload = bytes(cur.take(cur.left()))
        return flags, P.Publish(
            topic, payload, qos, bool(flags & 1), bool(flags & 8), packet_id, props
        )

    def closed_by_broker(self) -> bool:
        """Whether the broker closed the socket (within WAIT_S); what it sent first is kept."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.got += self.reader.feed(data)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def worker_of(broker: Broker, client: RawClient) -> int:
    """The pid of the IO worker that holds `client`'s connection."""
    here = client.sock.getsockname()
    for pid in broker.pids("io-worker").values():
        if any(c.raddr and tuple(c.raddr) == here for c in psutil.Process(pid).net_connections()):
            return pid
    raise AssertionError("no worker holds the connection")


def worker_counts(broker: Broker) -> list[int]:
    """Each IO worker's connections, as the acceptor counts them."""
    workers = [p for p in broker.status()["processes"] if p["role"] == "io-worker"]
    return [p["connections"] for p in sorted(workers, key=lambda p: p["index"])]
