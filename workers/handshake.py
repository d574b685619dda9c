"""A connection's handshake (workers/connection.py's first part): the
protocol header, connection.start / start-ok (the login: broker/amqp/access.py),
tune / tune-ok and open (the virtual host and the user's access to it).
The rules without IO are workers/negotiation.py's."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

from pamqp import commands as C

from shoal.broker import ipc, node_name
from shoal.broker.amqp import errors
from shoal.broker.config import Config
from shoal.workers import amqp_0_8, framing, negotiation
from shoal.workers.connection_access import ConnectionAccess
from shoal.workers.context import RemoteError, WorkerConnection
from shoal.workers.memory_guard import MemoryGuard
from shoal.workers.routes import Routes

AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(7)

log = logging.getLogger("shoal.connection")


# connection.start as written, by what its table and mechanisms hold: the
# server-properties table (a dozen entries, the capabilities' table inside)
# encoded once per worker, not at each connection. An MQTT client's inner
# connection writes one too: pamqp's encoding of it was 6 % of a connect's
# CPU in a storm of 8,000 (docs/benchmarks.md).
_START_FRAMES: dict[tuple[int, int, bool, str, str], bytes] = {}


def start_frame(worker: int, old: bool, mechanisms: str) -> bytes:
    """connection.start's frame for worker `worker`'s connection: AMQP 0-8's
    (`old`) or 0-9-1's, offering `mechanisms`."""
    # (the pid and the node's name are in the table: a fork, adopt)
    key = (worker, os.getpid(), old, mechanisms, node_name.node_name())
    frame = _START_FRAMES.get(key)
    if frame is None:
        properties = negotiation.server_properties(worker)
        if old:
            properties = amqp_0_8.server_properties(properties)
        frame = framing.encode_method(
            0,
            C.Connection.Start(
                version_major=8 if old else 0,
                version_minor=0 if old else 9,
                server_properties=properties,
                mechanisms=mechanisms,
                locales="en_US",
            ),
        )
        if len(_START_FRAMES) >= 16:  # (a bound: keys change only with the configuration)
            _START_FRAMES.clear()
        _START_FRAMES[key] = frame
    return frame


class HandshakeBlocks(Protocol):
    """What the handshake uses of its connection's publisher blocks
    (workers/blocking.py): the read hold while the open is checked, and the
    alarm a new connection learns of."""

    def hold_reading(self, holder: object, reason: str | None = "") -> None: ...
    def release_reading(self, holder: object) -> None: ...
    def alarm(self, bits: int) -> None: ...


class HandshakeContext(Protocol):
    """What the handshake uses of its worker: the settings, the users and
    vhosts (through routing's catalog), the memory alarms a new connection
    learns of, and the scheduler, which counts the open."""

    @property
    def index(self) -> int: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def config(self) -> Config: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def guard(self) -> MemoryGuard: ...
    def request(self, message: ipc.ConnOpen) -> asyncio.Future[ipc.Ok]: ...
    def request_later(self, message: ipc.ConnOpen) -> asyncio.Future[ipc.Ok]: ...


class HandshakeConnection(Protocol):
    """What the handshake reads and sets of its connection (workers/connection.py)."""

    transport: Any
    state: int
    head: bytes
    reader: framing.FrameReader
    frame_max: int
    channel_max: int
    heartbeat: int
    vhost: str
    vhost_id: int
    user: str
    peer_host: str
    certificate_user: str  # the CN of a verified TLS client certificate
    auth_mechanism: str
    client_properties: dict[str, Any]
    access: ConnectionAccess
    capabilities: dict[str, Any]
    obeys_channel_flow: bool
    timer: asyncio.TimerHandle | None
    protocol: str  # "AMQP 0-9-1", or 0-8's (workers/amqp_0_8.py)

    id: int
    opened: bool  # counted by the scheduler (CONN_OPEN sent)
    closed: bool

    @property
    def ctx(self) -> HandshakeContext: ...
    def write(self, data: bytes) -> None: ...

    @property
    def blocks(self) -> HandshakeBlocks: ...

    def fail(self, exc: errors.AMQPError) -> None: ...

    def heartbeat_tick(self) -> None: ...


class Handshake:
    """A connection's handshake, from the protocol header to connection.open-ok:
    the part of the connection that answers channel 0 until it is open. It
    sets what it negotiates on its connection (the user, the vhost and its
    access, frame and channel limits, heartbeat, the client's capabilities)."""

    __slots__ = ("conn",)

    def __init__(self, conn: HandshakeConnection) -> None:
        self.conn = conn

    def protocol_header(self, data: bytes) -> bytes:
        conn = self.conn
        conn.head += data
        if len(conn.head) < 8:
            return b""
        header, rest = conn.head[:8], conn.head[8:]
        conn.head = b""
        old = header in amqp_0_8.HEADERS
        if header not in framing.ACCEPTED_HEADERS and not old:
            # The spec: answer with the header we support, then close.
            assert conn.transport is not None
            conn.transport.write(framing.PROTOCOL_HEADER)
            conn.transport.close()
            conn.state = CLOSED
            return b""
        conn.state = AWAIT_START_OK
        if old:  # (as RabbitMQ: 8-0, no capabilities)
            conn.protocol = amqp_0_8.PROTOCOL
        mechanisms = negotiation.mechanisms(conn.certificate_user, conn.ctx.config.auth_mechanisms)
        conn.write(start_frame(conn.ctx.index, old, mechanisms))
        return rest

    def open_in_place(self, start_ok: C.Connection.StartOk, vhost: str) -> bool:
        """A protocol bridge's login in this worker (an MQTT client's inner
        connection): start-ok, tune-ok (the broker's own limits, no
        heartbeat) and open handled as their frames would be, with no frame
        either way: no protocol header, connection.start, tune or open-ok
        written or read (in a storm of MQTT connects, their encoding,
        decoding and three turns of the bridge's reading were a tenth to a third of a
        connect's CPU). True: open now; False: the scheduler checks a
        connection limit first, and connection.open-ok is written once it
        agrees. A refusal closes the connection as for any client: its
        connection.close frame, which the bridge answers."""
        conn = self.conn
        if conn.state != AWAIT_HEADER:
            raise RuntimeError("a login in place on a connection past its start")
        config = conn.ctx.config
        try:
            conn.state = AWAIT_START_OK
            self.start_ok(start_ok, tune=False)
            self.tune_ok(C.Connection.TuneOk(config.channel_max, config.frame_max, 0))
            return self.open(C.Connection.Open(virtual_host=vhost), answer=False)
        except errors.ConnectionError_ as exc:
            conn.fail(exc)
        except Exception as exc:  # (as a read's: a bug costs this client only)
            log.exception("connection %x: internal error", conn.id)
            conn.fail(errors.ConnectionError_(errors.INTERNAL_ERROR, f"{type(exc).__name__}"))
        return False

    def start_ok(self, method: C.Connection.StartOk, tune: bool = True) -> None:
        """The login; then connection.tune, unless `tune` is False (a
        bridge's login in place: open_in_place)."""
        conn = self.conn
        props = method.client_properties or {}
        caps = props.get("capabilities")
        conn.capabilities = caps if isinstance(caps, dict) else {}
        conn.obeys_channel_flow = negotiation.obeys_channel_flow(props)
        config = conn.ctx.config
        routes = conn.ctx.routes
        routes.sync()
        conn.auth_mechanism = method.mechanism
        conn.client_properties = dict(props)
        try:
            conn.user = negotiation.login(
                method,
                routes.definitions.users,
                conn.peer_host,
                config.loopback_users,
                conn.certificate_user,
                config.auth_mechanisms,
            )
        except errors.SilentClose:
            raise
        except errors.ConnectionError_ as refused:
            if conn.capabilities.get("authentication_failure_close") is True:
                raise  # connection.close 403, as the client asked
            # RabbitMQ's answer to a client that did not ask: no frame, the
            # socket closed 3 s later (rabbit_reader's close_connection
            # timer, its ?NORMAL_TIMEOUT before tune), or by the client.
            raise errors.SilentClose(refused.reply_code, refused.reply_text) from None
        conn.state = AWAIT_TUNE_OK
        if not tune:
            return
        conn.write(
            framing.encode_method(
                0,
                C.Connection.Tune(
                    channel_max=config.channel_max,
                    frame_max=config.frame_max,
                    heartbeat=config.heartbeat,
                ),
            )
        )

    def tune_ok(self, method: C.Connection.TuneOk) -> None:
        conn = self.conn
        config = conn.ctx.config
        negotiation.check_tune_ok(method, config.frame_max, config.channel_max)
        conn.frame_max = method.frame_max or config.frame_max
        conn.reader.frame_max = conn.frame_max
        conn.channel_max = method.channel_max or config.channel_max
        conn.heartbeat = method.heartbeat
        conn.state = AWAIT_OPEN

    def open(self, method: C.Connection.Open, answer: bool = True) -> bool:
        """The virtual host and the user's access to it. True: open now
        (connection.open-ok written, unless not `answer`: a bridge's login in
        place); False: the scheduler checks a connection limit first, and
        open-ok is written once it agrees."""
        conn = self.conn
        if conn.opened:  # a second connection.open while the first is answered
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID, "expected none, got connection.open", 10, 40
            )
        routes = conn.ctx.routes
        routes.sync()
        definitions = routes.definitions
        conn.vhost_id = negotiation.check_vhost_access(
            method.virtual_host, conn.user, definitions.vhost_ids, definitions.permissions
        )
        conn.vhost = vhost = method.virtual_host
        conn.access = ConnectionAccess(routes, conn.user, vhost)
        # Counted by the scheduler for max-connections; waited for only when
        # a limit applies (a round trip, the socket unread meanwhile). Else
        # the count may come a little later: a limit set meanwhile counts
        # it at most NOTICE_DELAY late, and the scheduler wakes once for a
        # storm's connects, and for a client's connect and its first requests.
        check = negotiation.connection_limited(vhost, conn.user, definitions)
        opening = ipc.ConnOpen(conn.id, vhost, conn.user, check)
        conn.opened = True
        if not check:
            conn.ctx.request_later(opening).add_done_callback(_ignore_result)
            self._opened(answer)
            return True
        conn.blocks.hold_reading(OPENING, None)
        conn.ctx.request(opening).add_done_callback(self._open_answered)
        return False

    def _open_answered(self, answer: asyncio.Future[Any]) -> None:
        conn = self.conn
        conn.blocks.release_reading(OPENING)
        if conn.closed or conn.state != AWAIT_OPEN:
            return  # closed or refused meanwhile
        exc = answer.exception()
        if isinstance(exc, RemoteError):
            conn.opened = False
            conn.fail(errors.ConnectionError_(exc.reply_code, exc.reply_text, 10, 40))
        else:
            self._opened()

    def _opened(self, answer: bool = True) -> None:
        conn = self.conn
        conn.state = OPEN
        if answer:
            conn.write(OPEN_OK)
        if conn.ctx.guard.alarms:
            conn.blocks.alarm(conn.ctx.guard.alarms)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if conn.heartbeat:
            conn.timer = conn.ctx.loop.call_later(conn.heartbeat / 2, conn.heartbeat_tick)


def _ignore_result(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # retrieved: no "never retrieved" warning


OPENING = "opening"  # the read holder while the scheduler counts the connection
OPEN_OK = framing.encode_method(0, C.Connection.OpenOk())  # (the same bytes for every client)


def may_handshake(handshaking: set[WorkerConnection], limit: int, conn: WorkerConnection) -> bool:
    """Whether fewer than `limit` (max_handshaking) connections of this
    worker are logging in (`handshaking`, its set); if so `conn` counts
    among them. Not a scan of every connection per accept: 10,000 devices
    reconnecting to a worker after a restart would make that 50 million
    looks. The set is pruned of those past their handshake only when it is
    full: a look at the limit's worth of connections per `limit` accepted,
    unless they are all still logging in (a flood, refused one by one as
    before)."""
    if len(handshaking) >= limit:
        for other in [c for c in handshaking if c.state >= OPEN]:
            handshaking.discard(other)
        if len(handshaking) >= limit:
            return False
    handshaking.add(conn)
    return True
