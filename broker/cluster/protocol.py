"""The replication stream between a leader and a follower: messages and
their framing, apart from any socket (issue 29).

A frame is `u32 length | msgpack` of one message, tagged by its type. The
follower opens the connection and says who it is and what it has (`Hello`);
the leader answers `Welcome` or `Refused`, then sends operations on its data
directory (`Append`, `Truncate`, `Reset`, `Commit`, `Delete`) and, after each batch, a
`Mark`. The follower acknowledges a mark (`Ack`) once everything before it
is written and synced (store/mirror.py). While there is nothing to send, the
leader sends a `Heartbeat` every second, so that a follower notices a
connection that died without a FIN.
"""

from __future__ import annotations

import struct

import msgspec

LENGTH = struct.Struct("<I")
MAX_FRAME = 64 << 20


class Identity(msgspec.Struct, frozen=True):
    """Who a node is to the other end of a replication connection: its data
    directory, its id (store/mirror.py node_id), its cluster's name and the
    cluster's secret (kept in etcd). The shipper and the receiver both
    take one."""

    root: str
    node: str
    cluster: str
    secret: str

    def hello(self, files: dict[str, tuple[int, int]]) -> Hello:
        """A follower's greeting: who it is and what it has."""
        return Hello(self.cluster, self.secret, self.node, files)

    def admits(self, hello: Hello) -> bool:
        """Whether a follower's greeting is of this cluster."""
        return hello.cluster == self.cluster and hello.secret == self.secret


class Hello(msgspec.Struct, tag=True):
    cluster: str
    secret: str
    node: str
    files: dict[str, tuple[int, int]]  # path -> (size, crc32): store/mirror.py listing


class Welcome(msgspec.Struct, tag=True):
    leader: str


class Refused(msgspec.Struct, tag=True):
    reason: str


class Append(msgspec.Struct, tag=True):
    path: str
    offset: int
    data: bytes
    sync: bool = True  # False: not fdatasynced at the next mark (shipped acks)


class Truncate(msgspec.Struct, tag=True):
    """The leader cut the file to `size` (a torn tail, a failed write):
    the follower cuts its copy too, durably at the next mark."""

    path: str
    size: int


class Reset(msgspec.Struct, tag=True):
    path: str


class Commit(msgspec.Struct, tag=True):
    path: str


class Delete(msgspec.Struct, tag=True):
    path: str


class Mark(msgspec.Struct, tag=True):
    seq: int


class Ack(msgspec.Struct, tag=True):
    seq: int


class Heartbeat(msgspec.Struct, tag=True):
    """Sent by the leader every HEARTBEAT seconds: a follower that hears
    nothing for SILENCE seconds takes its connection for dead (a partition,
    or a NAT that forgot the flow, sends no FIN) and connects again."""


HEARTBEAT = 1.0  # s between a leader's heartbeats to each follower
SILENCE = 5.0  # s without a byte from the leader before a follower reconnects


Message = (
    Hello | Welcome | Refused | Append | Truncate | Reset | Commit | Delete | Mark | Ack | Heartbeat
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def frame(message: Message) -> bytes:
    body = _encoder.encode(message)
    return LENGTH.pack(len(body)) + body


def decode(body: bytes) -> Message:
    return _decoder.decode(body)


class FrameReader:
    """Frames out of a byte stream fed in pieces (no IO here)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        buf = self._buf
        at = 0
        while len(buf) - at >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buf, at)
            if length > MAX_FRAME:
                raise ValueError(f"replication frame of {length} bytes")
            if len(buf) - at - LENGTH.size < length:
                break
            start = at + LENGTH.size
            out.append(decode(bytes(buf[start : start + length])))
            at = start + length
        del buf[:at]
        return out
