"""Control messages between IO workers and the scheduler.

Each IO worker slot has one SOCK_SEQPACKET socketpair, created by the
supervisor before any fork and kept open by it. The scheduler inherits every
scheduler end, worker N inherits its worker end. Because the supervisor holds
both ends, a restart of either side reuses the same channel: nothing has to
reconnect, and SEQPACKET keeps each message whole, so a process killed in the
middle of a send never leaves half a message for its replacement.

Every message is a class below: a msgspec Struct encoded as a msgpack array
whose first item is the message's code (its tag), then its fields in the
order they are declared. Each end decodes into the classes of its own
direction (`ToScheduler`, `ToWorker`), so a field of the wrong type is
caught where it arrives, with its name. Everything sent during one
event-loop iteration leaves as one datagram (an array of messages), so a
burst of acks or notifications costs one system call, not one each.

A request (a `Request` subclass) carries a `req` id, set by the worker's
`WorkerContext.request` and echoed by the scheduler's `Reply`; it is encoded
last, after the message's own fields.

The classes are gc=False: none refers back to itself or to anything that
refers to it, so the cycle collector need not track them (cheaper to make,
and a burst of DONEs does not trigger collections).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, Union

import msgspec

log = logging.getLogger("shoal.ipc")


class Message(msgspec.Struct, array_like=True, gc=False):
    """Base of every control message."""


class Request(Message, kw_only=True):
    """A message the scheduler answers with a `Reply` of the same `req`."""

    # 0 until WorkerContext.request numbers it (a request sent with a plain
    # send() gets a reply nobody waits for).
    req: int = 0


class ConsumerRecord(msgspec.Struct, array_like=True, gc=False):
    """What a worker tells a (new) scheduler about one of its consumers."""

    cid: int
    qid: int
    priority: int
    acquiring: bool
    exclusive: bool
    interested: bool
    since: int  # CLOCK_MONOTONIC ns of its registration; 0: CONSUME not answered yet


# ------------------------------------------------------ worker -> scheduler
class Hello(Message, tag=1):
    """A worker (re)introduces itself with every consumer it has, its open
    connections, [conn_id, vhost, user] each, and its MQTT clients, [conn_id,
    vhost, client id] each (broker/scheduler/mqtt_clients.py)."""

    worker: int
    incarnation: int
    consumers: list[ConsumerRecord]
    connections: list[tuple[int, str, str]] = []
    mqtt_clients: list[tuple[int, str, str]] = []


class Declare(Request, tag=2):
    """queue.declare. Reply: [qid, name, ready, consumers]."""

    vhost: str
    name: bytes  # b"": the scheduler makes up an amq.gen- name
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    owner: int  # the connection id of an exclusive queue, else 0
    conn_id: int
    arguments: dict[str, Any]


class Consume(Request, tag=3):
    """basic.consume. Reply: [since] (or [] for one HELLO registered already)."""

    cid: int
    qid: int
    priority: int
    acquiring: bool
    exclusive: bool
    interested: bool
    conn_id: int


class Cancel(Message, tag=4):
    cid: int


class Interest(Message, tag=5):
    """A consumer's readiness (credit, a writable socket) changed."""

    cid: int
    interested: bool


class Done(Message, tag=6):
    """A notified consumer's turn is over."""

    cid: int
    changes: int  # the queue's CHANGES read before the scan that found nothing; -1: yielded


class ConnClosed(Request, tag=7):
    """A connection closed: its exclusive queues go; the reply lets close-ok out."""

    conn_id: int


class Delete(Request, tag=8):
    """queue.delete. Reply: the count of ready messages it held."""

    vhost: str
    name: bytes
    if_unused: bool
    if_empty: bool
    conn_id: int


class Purge(Request, tag=9):
    """queue.purge. Reply: the count of messages purged."""

    vhost: str
    name: bytes
    conn_id: int


class WorkerGone(Message, tag=10):
    """Written by the supervisor into a dead worker's end (see `encode`).
    `retired`: the worker count went down and no one replaces it, so the
    scheduler stops sending to its link until it says HELLO again."""

    worker: int
    retired: bool = False


class ExchangeDeclare(Request, tag=11):
    vhost: str
    name: str
    exchange_type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


class ExchangeDelete(Request, tag=12):
    vhost: str
    name: str
    if_unused: bool


class Binding(Request):
    """queue.bind/unbind or exchange.bind/unbind."""

    vhost: str
    source: str
    kind: str  # "q": dest is a queue, "e": an exchange
    dest: str
    routing_key: str
    arguments: dict[str, Any]
    conn_id: int


class Bind(Binding, tag=13):
    pass


class Unbind(Binding, tag=14):
    pass


class Level(Request, tag=15):
    """A publisher needs the log of one priority level of a priority queue.
    Reply: [that level's qid], [-1] if the queue is gone."""

    qid: int
    level: int


class Consumers(Message, tag=16):
    """A worker's answer to INSPECT: Consumer.inspect() of each consumer."""

    req: int
    consumers: list[dict[str, Any]]


class ConnOpen(Request, tag=17):
    """connection.open: counted for the vhost's and user's max-connections.
    With `check`, the reply refuses (530) one over a limit (the worker waits
    for it); without, the worker does not wait and it is only counted."""

    conn_id: int
    vhost: str
    user: str
    check: bool


# ------------------------------------------------------ scheduler -> worker
# What a request's reply carries: one Struct per kind of answer, and
# `Refused` for a request the scheduler refused (an AMQP error, RabbitMQ's
# words). WorkerContext.request's overloads say which request gets which.
class QueueDeclared(Message, tag=40):
    """queue.declare's answer (Declare)."""

    qid: int
    name: bytes
    ready: int
    consumers: int


class Registered(Message, tag=41):
    """basic.consume's answer (Consume): when the consumer registered, or
    None for one a restarted scheduler's HELLO had registered already."""

    since: int | None


class Counted(Message, tag=42):
    """The messages a queue.delete found ready or a queue.purge removed."""

    count: int


class LevelLog(Message, tag=43):
    """The log of a priority level (Level): its qid, -1 if the queue is gone."""

    qid: int


class Ok(Message, tag=44):
    """Done, nothing to say (exchanges, bindings, a connection counted or closed)."""


class Refused(Message, tag=45):
    """The request was refused: the AMQP error the client gets."""

    reply_code: int
    reply_text: str


class RetainedMessage(msgspec.Struct, array_like=True, gc=False):
    """An MQTT retained message: the last one published with RETAIN to its topic."""

    topic: str
    payload: bytes
    qos: int
    properties: dict[str, Any]  # MQTT 5.0's (content type, user properties...)
    # 5.0's message expiry: the wall clock's second it expires at (0: never). Not
    # handed to a subscription after it; before it, with what is left of it.
    expires_at: int = 0


class RetainedList(Message, tag=50):
    """The retained messages a topic filter matches."""

    messages: list[RetainedMessage]


Answer = Union[QueueDeclared, Registered, Counted, LevelLog, Ok, Refused, RetainedList]  # noqa: UP007


class Reply(Message, tag=20):
    req: int
    answer: Answer


class Notify(Message, tag=21):
    cid: int


class Watch(Message, tag=46):
    """The scheduler hands a queue's only consumer the queue's watch (`own`:
    its worker arms Q_WATCH itself when the consumer runs dry and is woken
    directly by publishers, no DONE, no NOTIFY), or takes it back (another
    consumer came): the worker answers with the DONE that ends the turn.
    `taken`: the scheduler found the watch armed and took it off Q_WATCH
    itself (the consumer was idle), so the DONE comes without a pull.
    shm/ARCHITECTURE.md 7b."""

    cid: int
    own: bool
    taken: bool = False


class ConsumerGone(Message, tag=22):
    """Its queue was deleted."""

    cid: int


class Resync(Message, tag=23):
    """A (new) scheduler asks for HELLO."""


class Inspect(Message, tag=24):
    """The scheduler asks for the worker's consumers (`shoal status`), or
    with `what` "connections" its connections and their channels (`shoal
    ctl list_connections`, the management API), or "exchanges" the messages
    published into each exchange (the management API's message_stats);
    answered by CONSUMERS."""

    req: int
    what: str = "consumers"


class Unblock(Message, tag=25):
    """The queue fell to its resume size: release its publishers."""

    qid: int


class Disconnect(Message, tag=26):
    """Close (320 CONNECTION_FORCED, `text`) the connections of `vhost` and
    of `user` ("": any), or the one `conn_id` (0: any): a vhost or user
    deleted, `shoal ctl close_connection`."""

    vhost: str
    user: str
    conn_id: int
    text: str


class ChannelCounts(Message, tag=18):
    """A worker's open channels per user, those that changed since its last
    report (0: none left), every stats flush: users' max-channels limits
    count channels over all workers (workers/user_channels.py)."""

    counts: dict[str, int]


class ChannelTotals(Message, tag=27):
    """The scheduler's answer to every worker: the users' channels over all
    workers, those that changed (`replace`: all of them, after a HELLO)."""

    totals: dict[str, int]
    replace: bool = False


class ClientIdConnected(Message, tag=47):
    """An MQTT client connected with client id `client_id` in `vhost`
    (connection `conn_id`): the scheduler tells the worker of its older
    connection, if another worker holds one (TakeOver)."""

    vhost: str
    client_id: str
    conn_id: int


class Retain(Request, tag=49):
    """An MQTT PUBLISH with RETAIN: kept for topic `message.topic` in
    `vhost` (an empty payload takes the topic's message out). Reply: Ok,
    once it is on disk (the client's PUBACK waits for it)."""

    vhost: str
    message: RetainedMessage


class RetainedFor(Request, tag=51):
    """The retained messages of `vhost` that `topic_filter` matches. Reply:
    RetainedList."""

    vhost: str
    topic_filter: str


class TakeOver(Message, tag=48):
    """Close any connection of MQTT client id `client_id` in `vhost` but
    `conn_id`, the new one (MQTT-3.1.4-2)."""

    vhost: str
    client_id: str
    conn_id: int


# The one byte the acceptor sends with a connection's socket (SCM_RIGHTS):
# which listener accepted it.
HANDOFF_PLAIN, HANDOFF_TLS, HANDOFF_MQTT, HANDOFF_MQTTS = b"c", b"t", b"m", b"s"
HANDOFF_MQTT_WS = b"w"  # MQTT over WebSocket (workers/mqtt_websocket.py)
# An MQTT connection moved from another IO worker: its CONNECT's length (4
# bytes, big-endian), the CONNECT and the read that moved it follow
# (workers/mqtt_move.py).
HANDOFF_MQTT_MOVED = b"v"


# What each end receives. A Union, not `A | B`: mypy takes it as a type alias.
ToScheduler = Union[  # noqa: UP007
    Hello,
    Declare,
    Consume,
    Cancel,
    Interest,
    Done,
    ConnClosed,
    Delete,
    Purge,
    WorkerGone,
    ExchangeDeclare,
    ExchangeDelete,
    Bind,
    Unbind,
    Level,
    Consumers,
    ConnOpen,
    ChannelCounts,
    ClientIdConnected,
    Retain,
    RetainedFor,
]
ToWorker = Union[  # noqa: UP007
    Reply,
    Notify,
    Watch,
    ConsumerGone,
    Resync,
    Inspect,
    Unblock,
    Disconnect,
    ChannelTotals,
    TakeOver,
]

M = TypeVar("M")


class Inbound(Generic[M]):
    """How one end decodes its datagrams: all at once, or (when one message
    in a datagram is malformed) one by one."""

    __slots__ = ("batch", "one")

    def __init__(
        self, batch: msgspec.msgpack.Decoder[list[M]], one: msgspec.msgpack.Decoder[M]
    ) -> None:
        self.batch = batch
        self.one = one


SCHEDULER_INBOUND: Inbound[ToScheduler] = Inbound(
    msgspec.msgpack.Decoder(list[ToScheduler]), msgspec.msgpack.Decoder(ToScheduler)
)
WORKER_INBOUND: Inbound[ToWorker] = Inbound(
    msgspec.msgpack.Decoder(list[ToWorker]), msgspec.msgpack.Decoder(ToWorker)
)

_encode = msgspec.msgpack.Encoder().encode
_raw_batch = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode

MAX_MESSAGE = 1 << 20  # a HELLO lists every consumer of a worker


def encode(message: Message) -> bytes:
    """One message as a datagram of its own (for the supervisor, which has no loop)."""
    return _encode([message])


def salvage(inbound: Inbound[M], data: bytes) -> list[M]:
    """The messages of a datagram that did not decode as a whole: one
    malformed message (a sender's bug) must not cost the others."""
    out = []
    for raw in _raw_batch(data):
        try:
            out.append(inbound.one.decode(raw))
        except msgspec.ValidationError as exc:
            log.error("dropped a malformed control message: %s", exc)
    return out


class Link(Generic[M]):
    """One end of a SEQPACKET socketpair, driven by an asyncio loop."""

    __slots__ = (
        "_batch",
        "_inbound",
        "_inbox",
        "_loop",
        "_on_message",
        "_out",
        "_timer",
        "_writing",
        "sock",
    )

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[M], None],
        inbound: Inbound[M],
    ) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._loop = loop
        self._on_message = on_message
        self._inbound = inbound
        self._out: deque[bytes] = deque()
        self._batch: list[Message] = []
        self._inbox = bytearray(MAX_MESSAGE)
        self._writing = False
        # The flush of a batch of notices only (send_later), until a message
        # that goes at once joins them.
        self._timer: asyncio.TimerHandle | None = None
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: Message) -> None:
        if self._timer is not None:  # (the notices waiting go with it, in order)
            self._timer.cancel()
            self._timer = None
            self._loop.call_soon(self.flush)
        elif not self._batch:
            self._loop.call_soon(self.flush)
        self._batch.append(message)

    def send_later(self, message: Message, delay: float) -> None:
        """A notice nobody waits for: sent with the next message that goes
        at once, or after `delay` seconds. Each datagram wakes the other
        process; a worker's connects and their subscriptions' requests
        share one (and a storm's connects their few)."""
        if not self._batch:
            self._timer = self._loop.call_later(delay, self.flush)
        self._batch.append(message)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, []
        # Keep each datagram well under the socket buffer.
        for start in range(0, len(batch), 512):
            data = _encode(batch[start : start + 512])
            if self._out:
                self._out.append(data)
                continue
            try:
                self.sock.send(data)
            except BlockingIOError:
                self._out.append(data)
                self._start_writing()

    def _start_writing(self) -> None:
        if not self._writing:
            self._writing = True
            self._loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        while self._out:
            try:
                self.sock.send(self._out[0])
            except BlockingIOError:
                return
            self._out.popleft()
        self._writing = False
        self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        decode = self._inbound.batch.decode
        for _ in range(256):  # bounded, so one busy link cannot starve the loop
            try:
                n = self.sock.recv_into(self._inbox)
            except BlockingIOError:
                return
            if not n:
                return
            data = memoryview(self._inbox)[:n]
            try:
                messages = decode(data)
            except msgspec.ValidationError:
                messages = salvage(self._inbound, bytes(data))
            for message in messages:
                self._on_message(message)

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
        self.sock.close()


def socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.set_inheritable(True)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return a, b
