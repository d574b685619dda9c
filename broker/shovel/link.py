"""One shovel at work: consume from its source, publish to its destination,
settle each message at the source as its `ack-mode` says, as RabbitMQ
3.10's rabbit_amqp091_shovel.erl does:

- `on-confirm` (the default): the destination's channel is in confirm mode;
  a message is acked at the source only once the destination confirmed it,
  and nacked there (requeued) if the destination nacked it. A broker killed
  on either side loses nothing: what was not confirmed is still unacked at
  the source, and comes again, flagged redelivered.
- `on-publish`: acked at the source once published.
- `no-ack`: consumed without acks.

The source is a queue (declared durable if it does not exist), or an
exchange, through an exclusive server-named queue bound with
`src-exchange-key`. A broken connection on either side ends the session;
the shovel says why (`terminated`), waits `reconnect-delay` and starts again.
With `src-delete-after`, it stops after that many messages and removes its
own parameter (`on_done`).

The AMQP client is pika's asyncio adapter: it passes a message's properties
on as they came (aiormq would add a message id to every message).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.channel
import pika.exceptions
import pika.spec
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.compat import long

from shoal.broker.amqp.shovel_definition import ShovelSpec

log = logging.getLogger("shoal.shovel")

ROUTING_HEADER = "x-shovelled"
TIMESTAMP_HEADER = "x-shovelled-timestamp"
CONNECT_TIMEOUT = 15.0  # s: a connection attempt, handshake included
CLOSE_TIMEOUT = 5.0


MAX_BACKOFF = 30.0  # s: the longest wait between attempts that keep failing


def backoff(reconnect_delay: float, failures: int) -> float:
    """The wait before the next session: `reconnect-delay` after a session
    that ran, doubled for each attempt in a row that could not connect, up to
    MAX_BACKOFF (or the reconnect-delay itself, if longer): a broker that is
    down for long is not hammered, one back soon is found soon."""
    if failures <= 1:
        return reconnect_delay
    return min(reconnect_delay * 2 ** (failures - 1), max(reconnect_delay, MAX_BACKOFF))


class SessionEnded(Exception):
    """A connection or channel of the session closed: why, in words."""


class Endpoints:
    """Where a shovel connects: each of its URIs as pika's parameters. A URI
    without a host (`amqp://`) is this broker, reached on its own listener
    as its default user (RabbitMQ's direct connection has no socket)."""

    def __init__(self, local_port: int, local_user: str, local_password: str) -> None:
        self.local_port = local_port
        self.local_user = local_user
        self.local_password = local_password

    def parameters(self, uri: str, shovel: str) -> pika.URLParameters:
        parts = urlsplit(uri)
        if not parts.hostname:
            credentials = f"{self.local_user}:{self.local_password}@" if self.local_user else ""
            netloc = f"{credentials}127.0.0.1:{self.local_port}"
            uri = urlunsplit((parts.scheme or "amqp", netloc, parts.path, parts.query, ""))
        params = pika.URLParameters(uri)
        params.connection_attempts = 1
        params.socket_timeout = CONNECT_TIMEOUT
        params.client_properties = {"connection_name": f"Shovel {shovel}"}
        return params


def without_credentials(uri: str) -> str:
    """A URI as the status and x-shovelled show it: no user, password or
    query (amqp_uri:remove_credentials)."""
    parts = urlsplit(uri)
    if not parts.hostname:
        return uri
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Peer:
    """One open connection of a session, with awaitable channel calls over
    pika's callbacks. Any close fails every call waiting on it."""

    def __init__(self, side: str) -> None:
        self.side = side
        self.connection: AsyncioConnection | None = None
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._channel_closed: dict[int, asyncio.Future[str]] = {}

    async def open(self, params: pika.URLParameters) -> None:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()

        def on_open(_c: Any) -> None:
            if not opened.done():
                opened.set_result(None)

        def on_open_error(_c: Any, exc: BaseException) -> None:
            if not opened.done():
                opened.set_exception(SessionEnded(f"{self.side}: cannot connect: {exc!r}"))

        def on_close(_c: Any, reason: BaseException) -> None:
            self._ended(f"{self.side} connection closed: {reason!r}")

        self.connection = AsyncioConnection(
            params, on_open, on_open_error, on_close, custom_ioloop=loop
        )
        try:
            await asyncio.wait_for(opened, CONNECT_TIMEOUT)
        except TimeoutError:
            self.close()
            raise SessionEnded(f"{self.side}: no connection in {CONNECT_TIMEOUT:g} s") from None

    def _ended(self, why: str) -> None:
        if not self.closed.done():
            self.closed.set_result(why)

    async def wait(self, future: Awaitable[Any]) -> Any:
        """`future`'s result, or SessionEnded if this peer closes first."""
        task = asyncio.ensure_future(future)
        done, _ = await asyncio.wait({task, self.closed}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        raise SessionEnded(self.closed.result())

    async def channel(self, quiet_close: bool = False) -> pika.channel.Channel:
        """A new channel; its close ends the session unless `quiet_close`
        (a call on it still fails)."""
        assert self.connection is not None
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[pika.channel.Channel] = loop.create_future()
        closed: asyncio.Future[str] = loop.create_future()

        def on_close(_ch: Any, reason: BaseException) -> None:
            why = f"{self.side} channel closed: {reason!r}"
            if not closed.done():
                closed.set_result(why)
            if not opened.done():
                opened.set_exception(SessionEnded(why))
            elif not quiet_close:
                self._ended(why)

        def on_open(ch: pika.channel.Channel) -> None:
            ch.add_on_close_callback(on_close)
            self._channel_closed[ch.channel_number] = closed
            opened.set_result(ch)

        self.connection.channel(on_open_callback=on_open)
        channel: pika.channel.Channel = await self.wait(opened)
        return channel

    async def call(
        self, channel: pika.channel.Channel, start: Callable[[Callable[[Any], None]], None]
    ) -> Any:
        """Start a synchronous method on `channel` (`start(callback)`) and
        wait for its -ok; SessionEnded if the channel closes first."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answered(frame: Any) -> None:
            if not done.done():
                done.set_result(frame)

        start(answered)
        closed = self._channel_closed[channel.channel_number]
        finished, _ = await asyncio.wait(
            {done, closed, self.closed}, return_when=asyncio.FIRST_COMPLETED
        )
        if done in finished:
            return done.result()
        done.cancel()
        raise SessionEnded(closed.result() if closed.done() else self.closed.result())

    async def ensure_queue(self, name: str, arguments: dict[str, Any]) -> int:
        """A queue by that name: its message count if it exists; declared
        durable with `arguments` if it does not (rabbit_shovel_parameters'
        ensure_queue: a passive declare first, on a channel of its own)."""
        probe = await self.channel(quiet_close=True)
        try:
            frame = await self.call(
                probe, lambda cb: probe.queue_declare(name, passive=True, callback=cb)
            )
        except SessionEnded as exc:
            if "404" not in str(exc) and "NOT_FOUND" not in str(exc):
                raise
        else:
            with contextlib.suppress(pika.exceptions.AMQPError):
                probe.close()
            return int(frame.method.message_count)
        declarer = await self.channel(quiet_close=True)
        frame = await self.call(
            declarer,
            lambda cb: declarer.queue_declare(name, durable=True, arguments=arguments, callback=cb),
        )
        with contextlib.suppress(pika.exceptions.AMQPError):
            declarer.close()
        return int(frame.method.message_count)

    def close(self) -> None:
        connection = self.connection
        if connection is not None and not (connection.is_closed or connection.is_closing):
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


class Shovel:
    """A shovel: sessions one after another until it is stopped or done."""

    def __init__(
        self,
        vhost: str,
        name: str,
        spec: ShovelSpec,
        endpoints: Endpoints,
        cluster_name: str,
        on_done: Callable[[Shovel], Awaitable[None]],
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.spec = spec
        self.endpoints = endpoints
        self.cluster_name = cluster_name
        self.on_done = on_done
        self.state = "starting"
        self.reason = ""
        self.since = time.time()
        self.src_uri = spec.src_uris[0]
        self.dest_uri = spec.dest_uris[0]
        self.forwarded = 0  # messages settled at the source, all sessions
        # Deliveries the source flagged redelivered: the only messages a
        # shovel may bring twice (after a broker on either side died).
        self.redelivered = 0
        self.remaining: int | None = None  # None: no src-delete-after
        self._task: asyncio.Task[None] | None = None
        self._peers: list[Peer] = []

    # ------------------------------------------------------------- control
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        for peer in self._peers:
            peer.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, CLOSE_TIMEOUT)

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    # ------------------------------------------------------------ sessions
    async def _run(self) -> None:
        failures = 0  # sessions in a row that never ran
        while True:
            self._set_state("starting")
            try:
                finished = await self._session()
            except SessionEnded as exc:
                reason = str(exc)
            except (pika.exceptions.AMQPError, OSError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if finished:
                    await self.on_done(self)
                    return
                reason = "session ended"
            finally:
                for peer in self._peers:
                    peer.close()
                self._peers = []
            if self.state == "running":
                # As RabbitMQ's: a shovel that ran says why it stopped; one
                # that could not connect stays "starting" (its log says why).
                self._set_state("terminated", reason)
                failures = 0
            else:
                failures += 1
            delay = backoff(self.spec.reconnect_delay, failures)
            log.warning(
                "shovel %r in vhost %r: %s; again in %g s", self.name, self.vhost, reason, delay
            )
            if self.spec.reconnect_delay <= 0:
                return  # RabbitMQ's "temporary" child: never restarted
            await asyncio.sleep(delay)

    async def _session(self) -> bool:
        """One session; True once src-delete-after's count is moved."""
        spec = self.spec
        self.src_uri = random.choice(spec.src_uris)
        self.dest_uri = random.choice(spec.dest_uris)
        src, dest = Peer("source"), Peer("destination")
        self._peers = [src, dest]
        await src.open(self.endpoints.parameters(self.src_uri, self.name))
        await dest.open(self.endpoints.parameters(self.dest_uri, self.name))
        if spec.dest_queue is not None:
            await dest.ensure_queue(spec.dest_queue, spec.dest_queue_args)
        out = await dest.channel()
        confirming = spec.ack_mode == "on-confirm"
        if confirming:
            await self._confirm_select(dest, out)
        into = await src.channel()
        if spec.src_queue is not None:
            queue = spec.src_queue
            length = await src.ensure_queue(queue, spec.src_queue_args)
        else:
            frame = await src.call(
                into, lambda cb: into.queue_declare("", exclusive=True, callback=cb)
            )
            queue = frame.method.queue
            await src.call(
                into,
                lambda cb: into.queue_bind(
                    queue, spec.src_exchange or "", spec.src_exchange_key, callback=cb
                ),
            )
            length = 0
        if spec.ack_mode != "no-ack":
            await src.call(
                into, lambda cb: into.basic_qos(prefetch_count=spec.prefetch_count, callback=cb)
            )
        if self.remaining is None:
            if spec.delete_after == "queue-length":
                self.remaining = length
            elif isinstance(spec.delete_after, int):
                self.remaining = spec.delete_after
        if self.remaining == 0:
            return True
        session = _Forwarding(self, into, out, confirming)
        await src.call(
            into,
            lambda cb: into.basic_consume(
                queue, session.on_message, auto_ack=spec.ack_mode == "no-ack", callback=cb
            ),
        )
        self._set_state("running")
        log.info("shovel %r in vhost %r running", self.name, self.vhost)
        waits: set[asyncio.Future[Any]] = {session.finished, src.closed, dest.closed}
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if session.finished in done:
            return True
        why = next(f for f in (src.closed, dest.closed) if f.done()).result()
        raise SessionEnded(why)

    async def _confirm_select(self, dest: Peer, out: pika.channel.Channel) -> None:
        selected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._confirms: Callable[[Any], None] = lambda frame: None

        def on_confirm(frame: Any) -> None:
            self._confirms(frame)

        def on_selected(_frame: Any) -> None:
            if not selected.done():
                selected.set_result(None)

        out.confirm_delivery(on_confirm, callback=on_selected)
        await dest.wait(selected)

    # ------------------------------------------------------------- status
    def status(self, node: str) -> dict[str, Any]:
        """The row of GET /api/shovels (rabbit_shovel_mgmt_util:format):
        a starting shovel's names and state, a terminated one's reason, a
        running one's ends."""
        t = time.localtime(self.since)
        row: dict[str, Any] = {
            "node": node,
            # RabbitMQ's format: local time, the hour not zero-padded.
            "timestamp": f"{t.tm_year}-{t.tm_mon:02}-{t.tm_mday:02} "
            f"{t.tm_hour}:{t.tm_min:02}:{t.tm_sec:02}",
            "name": self.name,
            "vhost": self.vhost,
            "type": "dynamic",
            "state": self.state,
        }
        if self.state == "terminated":
            row["reason"] = self.reason
        if self.state != "running":
            return row
        row["src_uri"] = without_credentials(self.src_uri)
        row["src_protocol"] = "amqp091"
        row["dest_protocol"] = "amqp091"
        row["dest_uri"] = without_credentials(self.dest_uri)
        # As RabbitMQ 3.12's `forwarded`; `redelivered` is Shoal's own.
        row["forwarded"] = self.forwarded
        row["redelivered"] = self.redelivered
        return row | dict(self._ends())

    def _ends(self) -> list[tuple[str, str]]:
        """The source's and the destination's names, as the status and the
        x-shovelled header list them."""
        spec = self.spec
        if spec.src_queue is not None:
            ends = [("src_queue", spec.src_queue)]
        else:
            ends = [
                ("src_exchange", spec.src_exchange or ""),
                ("src_exchange_key", spec.src_exchange_key),
            ]
        for key, value in (
            ("dest_exchange", spec.dest_exchange),
            ("dest_exchange_key", spec.dest_exchange_key),
            ("dest_queue", spec.dest_queue),
        ):
            if value is not None:
                ends.append((key, value))
        return ends

    # ------------------------------------------------------------ headers
    def forward_headers(self) -> dict[str, str]:
        """x-shovelled's fields (rabbit_shovel_util:update_headers), in its order."""
        fields = {
            "shovelled-by": self.cluster_name,
            "shovel-type": "dynamic",
            "shovel-name": self.name,
            "shovel-vhost": self.vhost,
            "src-uri": without_credentials(self.src_uri),
            "dest-uri": without_credentials(self.dest_uri),
        }
        return fields | {key.replace("_", "-"): value for key, value in self._ends()}


class _Forwarding:
    """One session's message path: each delivery published on, settled at
    the source by the ack mode, counted against src-delete-after."""

    def __init__(
        self,
        shovel: Shovel,
        into: pika.channel.Channel,
        out: pika.channel.Channel,
        confirming: bool,
    ) -> None:
        self.shovel = shovel
        self.spec = shovel.spec
        self.into = into
        self.out = out
        self.confirming = confirming
        self.published = 0  # the destination's publish sequence number
        self.unconfirmed: dict[int, int] = {}  # publish seq -> source delivery tag
        self.to_publish = shovel.remaining  # None: no limit
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if confirming:
            shovel._confirms = self.on_confirm

    def on_message(
        self,
        _ch: Any,
        deliver: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        if self.to_publish == 0:
            return  # enough published: left unacked, requeued when the session closes
        if deliver.redelivered:
            self.shovel.redelivered += 1
        spec = self.spec
        if spec.dest_queue is not None:
            exchange, key = "", spec.dest_queue
        else:
            exchange = spec.dest_exchange if spec.dest_exchange is not None else deliver.exchange
            key = (
                spec.dest_exchange_key
                if spec.dest_exchange_key is not None
                else deliver.routing_key
            )
        self.out.basic_publish(exchange, key, body, self._properties(properties))
        self.published += 1
        if self.to_publish is not None:
            self.to_publish -= 1
        tag = deliver.delivery_tag
        if spec.ack_mode == "on-confirm":
            self.unconfirmed[self.published] = tag
            return
        if spec.ack_mode == "on-publish":
            self.into.basic_ack(tag)
        self._settled(1)

    def _properties(self, properties: pika.spec.BasicProperties) -> pika.spec.BasicProperties:
        spec = self.spec
        for key, value in spec.publish_properties.items():
            setattr(properties, key, value)
        if spec.add_forward_headers:
            table = self.shovel.forward_headers()
            headers = dict(properties.headers or {})
            earlier = headers.get(ROUTING_HEADER)
            headers[ROUTING_HEADER] = [table, *(earlier if isinstance(earlier, list) else [])]
            properties.headers = headers
        if spec.add_timestamp_header:
            headers = dict(properties.headers or {})
            headers[TIMESTAMP_HEADER] = long(int(time.time()))  # AMQP's long ("l")
            properties.headers = headers
        return properties

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        seq, multiple = method.delivery_tag, method.multiple
        tag = self.unconfirmed.get(seq)
        if tag is None:
            return
        if isinstance(method, pika.spec.Basic.Ack):
            self.into.basic_ack(tag, multiple=multiple)
        else:
            self.into.basic_nack(tag, multiple=multiple, requeue=True)
        settled = [s for s in self.unconfirmed if s <= seq] if multiple else [seq]
        for s in settled:
            del self.unconfirmed[s]
        self._settled(len(settled))

    def _settled(self, count: int) -> None:
        shovel = self.shovel
        shovel.forwarded += count
        if shovel.remaining is None:
            return
        shovel.remaining -= count
        if shovel.remaining <= 0 and not self.finished.done():
            self.finished.set_result(None)
