"""A connection's handshake (workers/connection.py's first part): the
protocol header, connection.start / start-ok (the login: broker/amqp/access.py),
tune / tune-ok and open (the virtual host and the user's access to it).
The rules without IO are workers/negotiation.py's."""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.workers import framing, negotiation
from shoal.workers.access import ConnectionAccess
from shoal.workers.context import RemoteError, WorkerContext

AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(7)


class Handshake:
    """Connection's handshake methods, over the connection's own state."""

    ctx: WorkerContext
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

    id: int
    opened: bool  # counted by the scheduler (CONN_OPEN sent)
    closed: bool

    def write(self, data: bytes) -> None:
        raise NotImplementedError  # connection.py

    def hold_reading(self, holder: object, reason: str | None = "") -> None:
        raise NotImplementedError  # connection.py

    def release_reading(self, holder: object) -> None:
        raise NotImplementedError  # connection.py

    def fail(self, exc: errors.AMQPError) -> None:
        raise NotImplementedError  # connection.py

    def alarm(self, bits: int) -> None:
        raise NotImplementedError  # connection.py

    def _heartbeat_tick(self) -> None:
        raise NotImplementedError  # connection.py

    def _protocol_header(self, data: bytes) -> bytes:
        self.head += data
        if len(self.head) < 8:
            return b""
        header, rest = self.head[:8], self.head[8:]
        self.head = b""
        if header not in framing.ACCEPTED_HEADERS:
            # The spec: answer with the header we support, then close.
            assert self.transport is not None
            self.transport.write(framing.PROTOCOL_HEADER)
            self.transport.close()
            self.state = CLOSED
            return b""
        self.state = AWAIT_START_OK
        self.write(
            framing.encode_method(
                0,
                C.Connection.Start(
                    version_major=0,
                    version_minor=9,
                    server_properties=negotiation.server_properties(self.ctx.index),
                    mechanisms=negotiation.mechanisms(self.certificate_user),
                    locales="en_US",
                ),
            )
        )
        return rest

    def _start_ok(self, method: C.Connection.StartOk) -> None:
        props = method.client_properties or {}
        caps = props.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        self.obeys_channel_flow = negotiation.obeys_channel_flow(props)
        config = self.ctx.config
        routes = self.ctx.routes
        routes.sync()
        self.auth_mechanism = method.mechanism
        self.client_properties = dict(props)
        self.user = negotiation.login(
            method,
            routes.definitions.users,
            self.peer_host,
            config.loopback_users,
            self.certificate_user,
        )
        self.state = AWAIT_TUNE_OK
        self.write(
            framing.encode_method(
                0,
                C.Connection.Tune(
                    channel_max=config.channel_max,
                    frame_max=config.frame_max,
                    heartbeat=config.heartbeat,
                ),
            )
        )

    def _tune_ok(self, method: C.Connection.TuneOk) -> None:
        config = self.ctx.config
        negotiation.check_tune_ok(method, config.frame_max, config.channel_max)
        self.frame_max = method.frame_max or config.frame_max
        self.reader.frame_max = self.frame_max
        self.channel_max = method.channel_max or config.channel_max
        self.heartbeat = method.heartbeat
        self.state = AWAIT_OPEN

    def _open(self, method: C.Connection.Open) -> None:
        if self.opened:  # a second connection.open while the first is answered
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID, "expected none, got connection.open", 10, 40
            )
        routes = self.ctx.routes
        routes.sync()
        definitions = routes.definitions
        self.vhost_id = negotiation.check_vhost_access(
            method.virtual_host, self.user, definitions.vhost_ids, definitions.permissions
        )
        self.vhost = vhost = method.virtual_host
        self.access = ConnectionAccess(routes, self.user, vhost)
        # Counted by the scheduler for max-connections; waited for only when
        # a limit applies (a round trip, the socket unread meanwhile).
        check = negotiation.connection_limited(vhost, self.user, definitions)
        opened = self.ctx.request(ipc.ConnOpen(self.id, vhost, self.user, check))
        self.opened = True
        if not check:
            opened.add_done_callback(_ignore_result)
            self._opened()
            return
        self.hold_reading(OPENING, None)
        opened.add_done_callback(self._open_answered)

    def _open_answered(self, answer: asyncio.Future[Any]) -> None:
        self.release_reading(OPENING)
        if self.closed or self.state != AWAIT_OPEN:
            return  # closed or refused meanwhile
        exc = answer.exception()
        if isinstance(exc, RemoteError):
            self.opened = False
            self.fail(errors.ConnectionError_(exc.reply_code, exc.reply_text, 10, 40))
        else:
            self._opened()

    def _opened(self) -> None:
        self.state = OPEN
        self.write(framing.encode_method(0, C.Connection.OpenOk()))
        if self.ctx.guard.alarms:
            self.alarm(self.ctx.guard.alarms)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.heartbeat:
            self.timer = self.ctx.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def opened_as(self) -> tuple[int, str, str]:
        """(id, vhost, user) once counted by the scheduler, else (0, "", "")."""
        return (self.id, self.vhost, self.user) if self.opened else (0, "", "")


def _ignore_result(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # retrieved: no "never retrieved" warning


OPENING = "opening"  # the read holder while the scheduler counts the connection
