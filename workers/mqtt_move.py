"""A device's connection moved to its subscriber's IO worker (issue 41's
fan-in).

A message from a device on one worker to a subscriber on another costs
both processes a wake-up: the device's worker reads it, the subscriber's
is woken by an eventfd to deliver it (shm/wake.py). At a device's few
messages a second each of those is a sleep and a wake of its own:
measured with 1,000 devices, two workers switched 15,795 times where one
worker (and mosquitto) switched ~8,600 (docs/benchmarks.md). So (on by
default; --no-mqtt-colocate turns it off) an MQTT connection whose
PUBLISHes go to a topic that reaches exactly one queue, watched by its
only consumer on another worker (Waker.watcher, shm/ARCHITECTURE.md 7b),
moves there: its socket
(SCM_RIGHTS over that worker's hand-off socket, as the acceptor hands
connections), its CONNECT, which the new worker replays without a second
CONNACK, and the read with the PUBLISH that moved it, served there. The
client sees nothing: no byte of its stream is lost or answered twice.

Only a device moves: a connection that publishes slowly (its first
MOVE_AFTER PUBLISHes at no more than MOVE_RATE a second; a fast publisher
keeps the two workers' pipeline, its throughput two cores') and has
nothing but its CONNECT to carry: a plain TCP socket (TLS and WebSocket
state cannot move), a session that ends with the connection, a client id
the client chose, no packet before the CONNACK, no subscription, no topic
alias set, nothing under way (a confirm, a QoS 2 exchange, bytes not yet
written). Until it moves or is found to stay, its reads take the Python
path (the C one, DeviceRead, is installed after); it is looked at for its
first MOVE_LOOK reads and no more.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from typing import Any

from uvloop.loop import TCPTransport  # type: ignore[attr-defined]  # (not in its stubs)

from shoal.broker import ipc
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.shm import counters
from shoal.shm.processes import Header, ProcessSlot

log = logging.getLogger("shoal.mqtt")

# The most bytes a move carries (its CONNECT and its read): a hand-off is one
# datagram, read into a buffer of this size.
MOVE_MAX = 65536
MOVE_AFTER = 3  # its PUBLISH reads before it may move (the rate: over the last two gaps)
MOVE_RATE = 20.0  # PUBLISH reads a second, at most, of a connection that moves
MOVE_LOOK = 10  # its reads looked at: after these it stays where it is
# A queue that takes more than this a second (all its publishers) keeps its
# publishers where they are: its consumer's worker delivers them all, and
# the devices' reads on top of that would make it the bottleneck (the
# reads spread over the workers are the others' cores).
QUEUE_RATE_MAX = 20_000.0
_HEADER = struct.Struct("!I")  # the CONNECT's length
# How long a queue's watch seen armed by a worker names its consumer's
# worker while the word is taken (_watcher); a wrong guess costs a move, not
# a message.
WATCH_SEEN_S = 1.0
_SEEN: dict[int, tuple[int, float]] = {}  # qid: (worker, when seen watching)


class Move:
    """A connection that may still move: the bytes it got before its CONNECT
    was taken (the CONNECT alone, or it does not move), its reads since the
    CONNACK and when the first PUBLISH came."""

    __slots__ = ("connect", "first_at", "published_then", "publishes", "qid", "reads")

    def __init__(self) -> None:
        self.connect = b""
        self.reads = 0
        self.publishes = 0
        self.first_at = 0.0
        self.qid = -1  # the one queue its first PUBLISH reached (-1: none, or more)
        self.published_then = 0  # that queue's Q_PUBLISHED at its first PUBLISH


def may_move(ctx: Any) -> Move | None:
    """A new connection's Move, where moving is on and there is a worker to
    move to."""
    if ctx.config.mqtt_colocate and len(ctx.peer_handoffs) > 1:
        return Move()
    return None


def moved_parts(data: bytes) -> tuple[bytes, bytes] | None:
    """A hand-off datagram's CONNECT and read, where it is a move."""
    if data[:1] != ipc.HANDOFF_MQTT_MOVED or len(data) < 1 + _HEADER.size:
        return None
    (length,) = _HEADER.unpack_from(data, 1)
    start = 1 + _HEADER.size
    return data[start : start + length], data[start + length :]


def intercept(conn: Any, data: bytes) -> bool:
    """MqttConnection._read's first look while conn.move is set: the bytes
    before its CONNECT kept; after its CONNACK, its reads counted and, once
    it is found a slow publisher to one watched queue, the read that found
    it moved where it should go. True: the connection went (the read with it)."""
    move = conn.move
    if conn.connect is None:  # (the CONNECT, or part of it)
        move.connect += data
        if len(move.connect) > MOVE_MAX // 2:
            conn.move = None
        return False
    if not conn.open or not _only_connect(move.connect):
        conn.move = None  # (packets before the CONNACK: they were served here)
        return False
    move.reads += 1
    kind = data[0] >> 4
    if kind == P.PINGREQ and len(data) == 2 and move.reads <= MOVE_LOOK:
        return False  # (a keep-alive: it says nothing of the connection)
    if kind != P.PUBLISH or move.reads > MOVE_LOOK:
        conn.move = None  # a subscriber, or not a device: it stays
        return False
    now = time.monotonic()
    move.publishes += 1
    if move.publishes == 1:
        move.first_at = now
        move.qid = _queue_of(conn, data)
        move.published_then = _published(conn, move.qid)
    if move.publishes < MOVE_AFTER:
        return False
    elapsed = max(now - move.first_at, 1e-6)
    if (move.publishes - 1) / elapsed > MOVE_RATE:
        conn.move = None  # a fast publisher: the two workers' pipeline is its
        return False
    qid = _queue_of(conn, data)
    if qid < 0 or qid != move.qid:
        return False  # (not yet: no one queue, or another than the first's)
    if (_published(conn, qid) - move.published_then) / elapsed > QUEUE_RATE_MAX:
        conn.move = None  # a busy queue: its consumer's worker has enough to do
        return False
    target = _target(conn, data, qid)
    if target is None:
        return False  # (not yet: something under way, the subscriber not watching)
    conn.move = None
    return _hand_over(conn, target, move.connect, data)


def _published(conn: Any, qid: int) -> int:
    """Queue `qid`'s messages published, all its publishers'."""
    return counters.published(conn.ctx.shared, qid) if qid >= 0 else 0


def _only_connect(raw: bytes) -> bool:
    """Whether `raw` is one whole packet (the CONNECT) and nothing more."""
    length, shift, at = 0, 0, 1
    while at < len(raw) and at <= 4:
        byte = raw[at]
        length |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return at + length == len(raw)
        shift += 7
    return False


def _queue_of(conn: Any, data: bytes) -> int:
    """The one queue `data`'s PUBLISH reaches (amq.topic), or -1."""
    topic = _topic(data)
    if not topic or conn.amqp is None:
        return -1
    ctx = conn.ctx
    vhost = conn.amqp.vhost
    vhost_id = ctx.routes.vhost_id(vhost)
    if vhost_id is None:
        return -1
    try:
        key = M.mqtt_to_amqp(topic.decode()).encode()
        qids = ctx.routes.route(vhost, vhost_id, b"amq.topic", key, b"")
    except Exception:  # (a missing exchange, a bad topic: the PUBLISH's own path answers)
        return -1
    return qids[0] if len(qids) == 1 else -1


def _target(conn: Any, data: bytes, qid: int) -> int | None:
    """The worker `data`'s PUBLISH should be read on, if not this one:
    that of queue `qid`'s only consumer, watching it."""
    if (
        len(data) > MOVE_MAX // 2
        or (data[0] >> 1) & 3 > 1  # QoS 2: its ids are this connection's at once
        or conn.persistent
        or conn.assigned_id
        or conn.held
        or conn.busy
        or conn.reader.buffer
        or conn.subscriptions.consumed
        or conn.inbound.confirms
        or conn.inbound.qos2_publishing
        or conn.inbound.topic_aliases.topics
        or conn.acks
        or conn.out
        or conn.will_timer is not None
        or type(conn.transport) is not TCPTransport
        or conn.transport.get_extra_info("sslcontext") is not None
        or conn.transport.get_write_buffer_size()  # (bytes the client must still get)
        or conn.amqp is None
    ):
        return None
    ctx = conn.ctx
    worker = _watcher(ctx, qid)
    if worker < 0:
        return None
    if worker == ctx.index:
        conn.move = None  # (its subscriber is here: it stays, on the C path from this read on)
        return None
    if worker >= min(len(ctx.peer_handoffs), Header(ctx.seg).workers()):
        return None  # (a watch left by a worker retired since)
    slot = ProcessSlot(ctx.seg, worker)
    if not slot.ready() or slot.retiring():
        return None  # (starting again, or going: the connection stays)
    return worker


def _watcher(ctx: Any, qid: int) -> int:
    """The worker whose consumer, queue `qid`'s only one, watches it: armed
    now, or (taken by a publisher that woke it, not armed again yet) armed
    when last looked at, within WATCH_SEEN_S. A busy consumer's watch is off
    for most of its wake-ups: looking only at the word would leave a device
    that should move waiting for a read that finds it armed (reads on
    Python's path meanwhile, and the moves spread over seconds)."""
    now = time.monotonic()
    worker = ctx.waker.watcher(qid)
    if worker >= 0:
        _SEEN[qid] = (worker, now)
        return worker
    seen = _SEEN.get(qid)
    if (
        seen is None
        or now - seen[1] > WATCH_SEEN_S
        or ctx.waker.watched(qid)  # (the scheduler's watch: more consumers, or none)
        or ctx.shared.table.consumer_count(qid) != 1
    ):
        return -1
    return seen[0]


def _topic(data: bytes) -> bytes | None:
    """A whole PUBLISH's topic name at the start of `data`."""
    length, shift, at = 0, 0, 1
    while True:
        if at >= len(data) or at > 4:
            return None
        byte = data[at]
        length |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            break
        shift += 7
    if at + length > len(data) or length < 2:
        return None
    size = int.from_bytes(data[at : at + 2], "big")
    if 2 + size > length:
        return None
    return data[at + 2 : at + 2 + size]


def _hand_over(conn: Any, worker: int, connect: bytes, data: bytes) -> bool:
    """The socket, the CONNECT and the read to `worker`; this connection
    ends without a word to the client (the new one keeps its will)."""
    ctx = conn.ctx
    sock = conn.transport.get_extra_info("socket")
    payload = ipc.HANDOFF_MQTT_MOVED + _HEADER.pack(len(connect)) + connect + data
    fd = os.dup(sock.fileno())
    try:
        socket.send_fds(ctx.peer_handoffs[worker], [payload], [fd], socket.MSG_DONTWAIT)
    except OSError as exc:  # (its queue full: it stays)
        log.debug("mqtt client %s: not moved to worker %d: %s", conn.client_id, worker, exc)
        return False
    finally:
        os.close(fd)
    ProcessSlot(ctx.seg, worker).count_connections(1)  # (as the acceptor counts)
    conn.will = None  # (the new connection has it)
    key = (conn.amqp.vhost, conn.client_id)
    if ctx.mqtt_clients.get(key) is conn:
        del ctx.mqtt_clients[key]  # (the new one's registration takes over nothing)
    conn.closed = True
    conn.front.fast = None
    conn.transport.abort()  # (its descriptor only: the new worker's keeps the connection)
    return True
