"""One client connection: the only code that touches a client's transport.

`asyncio.Protocol` (not streams: 2.5-4x faster at frame ingest). Bytes go to a
sans-IO FrameReader; frames go to channel 0 (connection methods, here) or to
a Channel. Output is batched: everything written during one loop iteration
leaves in one `writelines`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.listeners import socket_address
from shoal.shm import stats
from shoal.workers import amqp_0_8, describe, device_gate, fanout_turns, framing, negotiation, tls
from shoal.workers._wire import DeviceRead
from shoal.workers.blocking import PublisherBlocks
from shoal.workers.channel import Channel
from shoal.workers.channel_state import AMQP_0_9_1, ChannelCore, Confirms
from shoal.workers.connection_access import ConnectionAccess
from shoal.workers.connection_slots import CONNECTION_SLOTS
from shoal.workers.context import WorkerContext
from shoal.workers.fanout_turns import FANOUT_PER_TURN
from shoal.workers.framing import PUBLISH_WHOLE
from shoal.workers.handshake import (
    AWAIT_HEADER,
    AWAIT_OPEN,
    AWAIT_START_OK,
    AWAIT_TUNE_OK,
    CLOSED,
    CLOSING,
    OPEN,
    Handshake,
    may_handshake,
)
from shoal.workers.lane import PublishLane
from shoal.workers.pacing import Pacer
from shoal.workers.pull import update_interest

log = logging.getLogger("shoal.connection")


CLOSE_OK_TIMEOUT = 3.0
# After the close handshake: how long the client may take to close its end of
# the socket before we close ours anyway (see _close_gracefully).
LINGER_TIMEOUT = 2.0
# The longest a confirm waits for the delivery to the publishing channel's own
# consumer, which RabbitMQ sends first (Publisher._consumes): the scheduler may
# hand the message to another consumer, or be slow.
CONFIRM_HOLD = 0.01
# How long after a client's channel.close what it still sends on that channel
# is dropped rather than a connection error (Connection.closed_by_client).
LATE_FRAMES = 1.0


class Connection(asyncio.Protocol):
    __slots__ = CONNECTION_SLOTS

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.id = ctx.next_connection_id()
        self.transport: Any = None  # uvloop's TCPTransport
        self.state = AWAIT_HEADER
        self.reader = framing.FrameReader(framing.FRAME_MIN_SIZE)  # (until tune-ok)
        self.head = b""
        self.channels: dict[int, Channel] = {}
        # Channels the client closed, and when: what it sent on one after its
        # channel.close, up to LATE_FRAMES seconds later, is dropped, not a
        # connection error (RabbitMQ's channel process still takes it until
        # the reader has forgotten the channel; a client acks the deliveries
        # it still had before it sees the close-ok).
        self.closed_by_client: dict[int, float] = {}
        self.frame_max = ctx.config.frame_max
        self.channel_max = ctx.config.channel_max
        self.heartbeat = 0
        self.vhost = ctx.config.default_vhost
        self.vhost_id = 0
        self.user = ""  # logged in as (connection.start-ok)
        self.peer_host = ""
        self.certificate_user = ""
        self.opened = False  # see opened_as
        self.auth_mechanism = ""
        self.client_properties: dict[str, Any] = {}
        # What list_connections says it speaks (an MQTT client's own
        # connection: "MQTT 3.1.1" or "MQTT 5.0", workers/mqtt_connection.py).
        self.protocol = AMQP_0_9_1
        self.connected_at = int(time.time() * 1000)  # ms, as RabbitMQ's connected_at
        # Bytes and socket reads/writes, as RabbitMQ's recv_oct/send_oct/recv_cnt/send_cnt.
        self.recv_oct = self.send_oct = self.recv_cnt = self.send_cnt = 0
        self.accepted_at = time.monotonic()  # the TLS handshake counts against handshake_timeout
        self.access = ConnectionAccess(ctx.routes, "", "")  # no rights until connection.open
        self.capabilities: dict[str, Any] = {}
        self.obeys_channel_flow = False  # see _obeys_channel_flow
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.scheduled_flush: Callable[[], None] = self.flush  # (an MQTT bridge's reads it too)
        self.write_paused = False
        # Its parts: the handshake until connection.open-ok, and what holds
        # its publishers back (workers/blocking.py), whose entry points the
        # channels, the memory guard and the scheduler's messages call here.
        self.handshake = Handshake(self)
        # Queues over capacity this connection published to (shm/flow.py):
        # while any, its channels keep their publishes for later (qid ->
        # the queue's Q_STATE then, ALARM -> 0). Read on every publish;
        # its part, `blocks`, keeps it.
        self.flow_blocked: dict[int, int] = {}
        self.blocks = PublisherBlocks(self)
        self.closed = False
        self.eof_sent = False  # close-ok sent: nothing more goes out (_close_gracefully)
        self.eof_received_early = False  # the client shut its end before our close-ok
        self.released = False  # see _release
        self.last_recv = time.monotonic()
        self.sent_since_tick = False  # (heartbeat_tick)
        self.heartbeat_sent = False
        self.timer: asyncio.TimerHandle | None = None
        self.confirm_channels: set[Confirms] = set()  # the publishers of channels in confirm mode
        self.confirm_timer: asyncio.TimerHandle | None = None  # see flush_confirms
        # A protocol bridge's confirms without frames (MQTT's Inbound): called
        # (channel, highest tag) where this connection has nothing unwritten;
        # False has the basic.ack written after all.
        self.confirm_sink: Callable[[int, int], bool] | None = None
        # queue.delete requests in flight on this connection's channels, and
        # the server basic.cancel frames held until their delete-ok is out.
        self.deletes_in_flight = 0
        self.held_cancels: list[tuple[ChannelCore, bytes]] = []
        # The publish lane (workers/lane.py); None where the segment's atomics
        # are the crash tests' interposer.
        self.publish_lane = PublishLane(self) if PublishLane.usable(ctx) else None
        self.pacer = Pacer(self, ctx.shared, ctx.loop)  # workers/pacing.py
        # Appends of messages that reached several queues in this read (or
        # in its deferred rest's turn: workers/fanout_turns.py).
        self.fanout_work = 0
        self.device_gate: DeviceRead | None = None  # an MQTT device's (workers/device_gate.py)

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: Any) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport
        self.ctx.stats.v[stats.CONNECTIONS_OPENED] += 1
        self.peer_host = socket_address(transport.get_extra_info("peername"))[0]
        if transport.get_extra_info("ssl_object") is not None:  # AMQPS, handshake done
            self.certificate_user = tls.certificate_user(transport.get_extra_info("peercert"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)
        self.ctx.connections.add(self)
        if not may_handshake(self.ctx.handshaking, self.ctx.config.max_handshaking, self):
            self._close_transport()  # too many still logging in: this one is not served
            return
        timeout = self.ctx.config.handshake_timeout - (time.monotonic() - self.accepted_at)
        self.timer = self.ctx.loop.call_later(max(0.0, timeout), self._handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ctx.handshaking.discard(self)
        device_gate.shut(self)
        if self.closed:
            return
        self.closed = True
        self.state = CLOSED
        if self.timer is not None:
            self.timer.cancel()
        if self.confirm_timer is not None:
            self.confirm_timer.cancel()
        self._release()
        # Only now: a worker stopping gracefully waits for its connections'
        # sockets, those in their close handshake's linger included.
        self.ctx.connections.discard(self)

    def eof_received(self) -> bool | None:
        """The client shut its end: if still owed close-ok (_client_close), keep ours open."""
        if self.state == CLOSED and not self.eof_sent and not self.closed:
            self.eof_received_early = True
            return True
        return None

    def _release(self) -> asyncio.Future[Any] | None:
        """Once, when the connection ends (its close handshake, or the socket going): give
        back its channels (unacked messages requeued, consumers cancelled) and its place in
        the worker's counts (its census), and tell the scheduler, which deletes its
        exclusive queues. The future is the scheduler's answer (None if already released)."""
        if self.released:
            return None
        self.released = True
        ctx = self.ctx
        for channel in self.channels.values():
            channel.release()
            ctx.census.left(channel)
        ctx.stats.v[stats.CHANNELS_CLOSED] += len(self.channels)
        ctx.stats.v[stats.CONNECTIONS_CLOSED] += 1
        self.channels.clear()
        self.confirm_channels.clear()
        self.blocks.released()
        ctx.process.count_connections(-1)
        return ctx.request(ipc.ConnClosed(self.id))

    def opened_as(self) -> tuple[int, str, str]:
        """(id, vhost, user) once counted by the scheduler, else (0, "", "")."""
        return (self.id, self.vhost, self.user) if self.opened else (0, "", "")

    # What the channels, the registry and the management rows read of the
    # publisher blocks (workers/blocking.py).
    @property
    def held_bytes(self) -> int:
        return self.blocks.held_bytes

    @held_bytes.setter
    def held_bytes(self, size: int) -> None:
        self.blocks.held_bytes = size

    @property
    def alarm_reason(self) -> str:
        return self.blocks.alarm_reason

    @property
    def blocked_sent(self) -> bool:
        return self.blocks.blocked_sent

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for channel in self.channels.values():
            for consumer in channel.delivery.consumers.values():
                update_interest(self.ctx, consumer)

    def can_deliver(self) -> bool:
        return not self.write_paused and self.state == OPEN

    # What is written during one loop iteration leaves as one buffer (flush).
    # Its first write shuts a device's gate: a close, a channel's end, a
    # frame for the client each come with one (docs/mqtt.md; so does wp_write).
    def write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.ctx.flush_soon(self.scheduled_flush)
            if self.device_gate is not None:
                self.device_gate.shut_gate()

    def write_many(self, frames: list[bytes]) -> None:
        self.out += frames
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.ctx.flush_soon(self.scheduled_flush)
            if self.device_gate is not None:
                self.device_gate.shut_gate()

    def flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if out and self.transport is not None and not self.closed and not self.eof_sent:
            # One buffer: the transport's cost is per buffer, a join's per byte.
            buffer = out[0] if len(out) == 1 else b"".join(out)
            self.transport.write(buffer)
            # Per write, not per frame: the management UI's data rates.
            self.send_oct += len(buffer)
            self.send_cnt += 1
            self.sent_since_tick = True
        self.out = []

    # ---------------------------------------------------------------- input
    def data_received(self, data: bytes) -> None:
        if self.state == CLOSED:
            return  # what the client sent before it saw our close-ok: discarded
        try:
            self._data_received(data)
        except Exception as exc:
            # A bug in handling one client must cost that client only.
            log.exception("connection %x: internal error", self.id)
            self.fail(errors.ConnectionError_(errors.INTERNAL_ERROR, f"{type(exc).__name__}"))

    def _data_received(self, data: bytes) -> None:
        if self.device_gate is not None:  # (an MQTT client's frames: its Python path)
            self.device_gate.shut_gate()
        self.last_recv = time.monotonic()
        self.recv_oct += len(data)  # per read: the management UI's data rates
        self.recv_cnt += 1
        if self.state == AWAIT_HEADER:
            data = self.handshake.protocol_header(data)
            if not data:
                return
        self.access.refresh()  # a permission changed applies from this read on
        self.fanout_work = 0  # the fan-out budget is a read's (workers/fanout_turns.py)
        publish_lane = self.publish_lane
        lane = publish_lane.arm() if publish_lane is not None else None
        try:
            frames = self.reader.feed(data, lane)
        except framing.FrameError as exc:
            self.fail(connection_error(exc))
            return
        finally:
            if lane is not None:
                for qid, count, _watcher, _x in publish_lane.account():  # type: ignore[union-attr]
                    self.pacer.published(qid, count)
        self.dispatch(frames)

    def method_from_bridge(self, number: int, payload: bytes) -> None:
        """One method frame's payload from a protocol bridge in this worker
        (an MQTT client's PUBACK as basic.ack): handled as a read of the
        frame would be, without the read (its framing, its publish lane)."""
        device_gate.shut(self)
        if self.state == CLOSED:
            return
        try:
            self._frame(framing.FRAME_METHOD, number, memoryview(payload))
        except errors.ConnectionError_ as exc:
            self.fail(exc)

    def dispatch(self, frames: list[Any]) -> None:
        """A read's frames (or what is left of them a loop turn later), then
        the confirms they allow."""
        channels = self.channels
        try:
            for i, frame in enumerate(frames):
                if self.fanout_work >= FANOUT_PER_TURN:  # (workers/fanout_turns.py)
                    fanout_turns.defer(self, frames[i:], self.ctx.loop, FANOUT_PER_TURN)
                    return
                if frame[0] == PUBLISH_WHOLE:
                    # A whole publish, decoded by workers/_wire.c scan: the fast
                    # path for an idle channel, else its three frames one by one.
                    if self.state == OPEN:
                        channel = channels.get(frame[1])
                        if channel is not None and channel.fast_publish(frame):
                            publisher = channel.publisher
                            if publisher.confirm:
                                self.confirm_channels.add(publisher)
                            continue
                    for ftype, number, payload in framing.publish_frames(frame):
                        self._frame(ftype, number, payload)
                        if self.state == CLOSED:
                            return
                    continue
                self._frame(*frame)
                if self.state == CLOSED:
                    return
        except errors.ConnectionError_ as exc:
            self.fail(exc)
        except framing.FrameError as exc:
            self.fail(connection_error(exc))
        finally:
            for confirming in self.confirm_channels:
                self.flush_confirms(confirming)

    def _frame(self, ftype: int, number: int, payload: memoryview) -> None:
        if self.state != OPEN:
            if self.state == CLOSED:
                return
            # While closing only connection.close/close-ok matter.
            if number == 0:
                self._channel_zero(ftype, payload)
            elif self.state != CLOSING:
                self._on_channel_frame(ftype, number, payload)
            return
        if number == 0:
            self._channel_zero(ftype, payload)
        else:
            self._on_channel_frame(ftype, number, payload)

    def _on_channel_frame(self, ftype: int, number: int, payload: memoryview) -> None:
        channel = self.channels.get(number)
        if channel is not None:
            channel.handle(ftype, payload)
            publisher = channel.publisher
            if publisher.confirm:
                self.confirm_channels.add(publisher)
            return
        if self.state != OPEN:
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID, "channel frame before connection.open"
            )
        index = framing.method_index(payload) if ftype == framing.FRAME_METHOD else 0
        if index == C.Channel.Open.index:
            negotiation.check_channel_max(len(self.channels), self.channel_max)
            self.closed_by_client.pop(number, None)
            ctx = self.ctx
            census, users = ctx.census, ctx.routes.definitions.users
            ctx.user_channels.check_open(self.user, users, census.per_user)
            self.channels[number] = channel = Channel(self, number)
            census.opened(channel, self.user)
            ctx.stats.v[stats.CHANNELS_OPENED] += 1
            if self.protocol == amqp_0_8.PROTOCOL:
                self.write(amqp_0_8.channel_open_ok(number))
            else:
                self.write(framing.encode_channel_open_ok(number))
            return
        if ftype == framing.FRAME_HEARTBEAT:
            raise errors.ConnectionError_(
                errors.FRAME_ERROR, "heartbeat frame on a non-zero channel"
            )
        closed = self.closed_by_client.get(number)
        if closed is not None and time.monotonic() - closed < LATE_FRAMES:
            return  # sent right after the client's own channel.close
        raise errors.ConnectionError_(
            errors.CHANNEL_ERROR, "expected 'channel.open'", *divmod(index, 0x10000)
        )

    def flush_confirms(self, publisher: Confirms, force: bool = False) -> None:
        """One cumulative basic.ack per channel per read, not one per message,
        up to what is durable (Publisher.confirmable, workers/publish.py).
        Held (unless forced) while the channel's own consumer is about to get
        one: until a delivery is written (deliveries_written), at most
        CONFIRM_HOLD."""
        high = publisher.confirmable()
        if high > publisher.confirm_sent and self._open_publisher(publisher):
            if publisher.confirm_held and not force:
                if self.confirm_timer is None:
                    self.confirm_timer = self.ctx.loop.call_later(
                        CONFIRM_HOLD, self.deliveries_written
                    )
                return
            publisher.confirm_held = False
            count = high - publisher.confirm_sent
            self.ctx.stats.v[stats.CONFIRMED] += count
            publisher.confirm_sent = high
            sink = self.confirm_sink
            # (Not past frames still unwritten: the bridge reads them in order.)
            if sink is None or self.out or not sink(publisher.number, high):
                # Always multiple, even for one (RabbitMQ sends one alone
                # with multiple false): every tag up to `high` is confirmed,
                # so it means the same to a client, and a client that looks
                # for a tag's callback only after its publish is written
                # (amqp-client.cr's on_confirm: a check, then an insert)
                # loses a single confirm that beats it, and waits for good
                # (lavinmqperf's confirm window stalled at Shoal's speed).
                self.write(framing.encode_ack(publisher.number, high, True))

    def _open_publisher(self, publisher: Confirms) -> bool:
        """Whether `publisher` is that of a channel still open here."""
        channel = self.channels.get(publisher.number)
        return channel is not None and channel.publisher is publisher

    def deliveries_written(self) -> None:
        """Deliveries are queued for writing (or CONFIRM_HOLD passed): the
        held confirms follow them."""
        if self.confirm_timer is None:
            return
        self.confirm_timer.cancel()
        self.confirm_timer = None
        for publisher in self.confirm_channels:
            if publisher.confirm_held:
                self.flush_confirms(publisher, force=True)

    def write_cancel(self, channel: ChannelCore, frame: bytes) -> None:
        """A server basic.cancel (its queue was deleted). While this
        connection deletes a queue, the cancels wait for the delete-ok, as in
        RabbitMQ: py-amqp (kombu, Celery) would raise ConsumerCancelled inside
        its wait for delete-ok otherwise."""
        if self.deletes_in_flight:
            self.held_cancels.append((channel, frame))
        else:
            self.write(frame)

    def queue_delete_started(self) -> None:
        self.deletes_in_flight += 1

    def queue_delete_done(self) -> None:
        """The delete-ok (or the error) is written: send the held cancels of
        channels still open."""
        self.deletes_in_flight -= 1
        if self.deletes_in_flight:
            return
        held, self.held_cancels = self.held_cancels, []
        for channel, frame in held:
            if self.channels.get(channel.number) is channel and not channel.closing:
                self.write(frame)

    def forget_channel(self, number: int, by_client: bool = False) -> None:
        """The channel is gone; `by_client`: the client's channel.close closed
        it (what it still sends on it for LATE_FRAMES is dropped)."""
        if by_client:
            self.closed_by_client[number] = time.monotonic()
        channel = self.channels.pop(number, None)
        if channel is not None:
            self.ctx.stats.v[stats.CHANNELS_CLOSED] += 1
            self.ctx.census.left(channel)
            self.confirm_channels.discard(channel.publisher)
            self.blocks.release_reading(channel)

    # ------------------------------------------------------------ channel 0
    def _channel_zero(self, ftype: int, payload: memoryview) -> None:
        if ftype == framing.FRAME_HEARTBEAT:
            return
        if ftype != framing.FRAME_METHOD:
            raise errors.ConnectionError_(
                errors.UNEXPECTED_FRAME, f"frame type {ftype} on channel 0"
            )
        if self.protocol == amqp_0_8.PROTOCOL:
            payload = amqp_0_8.inbound(payload)  # type: ignore[assignment]
        method = framing.decode_method(payload)
        if self.state == CLOSING:
            if isinstance(method, C.Connection.CloseOk | C.Connection.Close):
                if isinstance(method, C.Connection.Close):
                    self.write(amqp_0_8.close_ok(self.protocol))
                self._release()
                self._close_gracefully(fin=True)  # ours was the first close
            return
        expected = {
            AWAIT_START_OK: C.Connection.StartOk,
            AWAIT_TUNE_OK: C.Connection.TuneOk,
            AWAIT_OPEN: C.Connection.Open,
        }.get(self.state)
        if isinstance(method, C.Connection.Close):
            self._client_close()
            return
        if expected is not None and not isinstance(method, expected):
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID,
                f"expected {expected.__name__}, got {method.name}",
                *divmod(method.index, 0x10000),
            )
        if isinstance(method, C.Connection.StartOk):
            self.handshake.start_ok(method)
        elif isinstance(method, C.Connection.TuneOk):
            self.handshake.tune_ok(method)
        elif isinstance(method, C.Connection.Open):
            self.handshake.open(method)
        elif isinstance(method, C.Connection.UpdateSecret):
            self.write(framing.encode_method(0, C.Connection.UpdateSecretOk()))
        elif isinstance(method, C.Connection.Blocked | C.Connection.Unblocked):
            pass
        else:
            raise errors.ConnectionError_(  # (rabbit_reader's words)
                errors.CHANNEL_ERROR,
                "unexpected method in connection state running",
                *divmod(method.index, 0x10000),
            )

    def _client_close(self) -> None:
        """connection.close from the client. As RabbitMQ does, close-ok goes
        once the connection's channels are closed and its exclusive queues
        deleted, so that the client may at once declare them again
        elsewhere; what it sends meanwhile is discarded."""
        self.state = CLOSED
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        released = self._release()
        if released is None:
            self._send_close_ok()
            return
        # Bounded: a scheduler being restarted answers once it is back (the
        # request is sent again), but the client need not wait for that.
        self.timer = self.ctx.loop.call_later(CLOSE_OK_TIMEOUT, self._send_close_ok)
        released.add_done_callback(lambda _released: self._send_close_ok())

    def _send_close_ok(self) -> None:
        if not self.closed and not self.eof_sent:
            self.write(amqp_0_8.close_ok(self.protocol))
            self._close_gracefully()  # cancels the timer

    # ------------------------------------------------------------- timers
    def _handshake_timeout(self) -> None:
        self.timer = None
        if self.state != OPEN and not self.closed:
            self._close_transport()

    def heartbeat_tick(self) -> None:
        if self.closed:
            return
        interval = self.heartbeat
        if time.monotonic() - self.last_recv > 2 * interval:
            # RabbitMQ closes without a close frame: the peer is gone.
            self._close_transport()
            return
        if not self.sent_since_tick or not self.heartbeat_sent:
            # As RabbitMQ's sender: at the first tick whatever went out, then
            # whenever nothing did; written now, so that it is not itself
            # counted as traffic (a client that gives up after one interval
            # of silence, as amqp-client.js, hears from us every half one).
            self.heartbeat_sent = True
            self.write(framing.HEARTBEAT_FRAME)
            self.flush()
        self.sent_since_tick = False
        self.timer = self.ctx.loop.call_later(interval / 2, self.heartbeat_tick)

    # ------------------------------------------------------------ closing
    def fail(self, exc: errors.AMQPError) -> None:
        """A connection exception: send connection.close and wait for close-ok."""
        device_gate.shut(self)
        if self.state in (CLOSING, CLOSED):
            return
        if self.state == AWAIT_HEADER:
            self._close_transport()
            return
        if self.timer is not None:
            self.timer.cancel()
        if isinstance(exc, errors.SilentClose):  # a handshake RabbitMQ answers with no frame
            log.info("connection %x from %s: %s", self.id, self.peer_host, exc.reply_text)
            self.state = CLOSED
            self.eof_sent = True  # nothing goes out; the client's EOF closes ours (eof_received)
            self.out = []
            self.timer = self.ctx.loop.call_later(exc.delay, self._close_transport)
            return
        for channel in self.channels.values():
            channel.release()
        self.state = CLOSING
        close = C.Connection.Close(
            reply_code=exc.reply_code,
            reply_text=errors.fit_shortstr(exc.reply_text),
            class_id=exc.class_id,
            method_id=exc.method_id,
        )
        self.write(amqp_0_8.for_client(self.protocol, framing.encode_method(0, close)))
        self.timer = self.ctx.loop.call_later(CLOSE_OK_TIMEOUT, self._close_transport)

    def describe(self) -> dict[str, Any]:
        """What list_connections / list_channels show of an open connection
        (workers/describe.py); {} before it is open."""
        if self.state != OPEN or self.transport is None:
            return {}
        if self.device_gate is not None:  # (an MQTT device's reads, counted in C)
            self.device_gate.fold()
        channels = [channel.describe() for channel in self.channels.values()]
        return describe.connection_row(self, self.transport, channels)

    def matches(self, vhost: str, user: str, conn_id: int) -> bool:
        """Whether a Disconnect for these (""/0: any) is for this connection."""
        return (
            (self.state == OPEN or (self.opened and self.state == AWAIT_OPEN))  # or being counted
            and (not vhost or vhost == self.vhost)
            and (not user or user == self.user)
            and (not conn_id or conn_id == self.id)
        )

    def force_close(self, text: str) -> None:
        """An operator's doing: 320 CONNECTION_FORCED, as RabbitMQ closes."""
        if self.state in (OPEN, AWAIT_OPEN) and not self.closed:
            self.fail(errors.ConnectionError_(errors.CONNECTION_FORCED, text))
            self.flush()  # written now: the scheduler's next question is answered after it

    def shutdown(self) -> None:
        """Broker shutdown: close with 320 CONNECTION_FORCED, as RabbitMQ does."""
        if self.state == OPEN:
            self.fail(
                errors.ConnectionError_(
                    errors.CONNECTION_FORCED,
                    "broker forced connection closure with reason 'shutdown'",
                )
            )
        else:
            self._close_transport()

    def _close_gracefully(self, fin: bool = False) -> None:
        """The close handshake is over: send what is queued, then read and
        discard until the client closes its end (eof_received closes ours)
        or LINGER_TIMEOUT passes. Closing at once would leave the client's
        last frames (a second close from another thread, a heartbeat) unread
        or arriving at a closed socket: a RST, which can overtake close-ok.
        After the client's close no FIN of ours either, as RabbitMQ (which
        waits up to 30 s): a client closing from several threads (Go's) can
        see the EOF before the thread that got close-ok marked the
        connection closed ("501 EOF"). After ours (`fin`: the client's
        close-ok was its last frame), a FIN at once."""
        self.state = CLOSED
        self.flush()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        transport = self.transport
        if transport is None or self.closed:
            return
        if self.eof_received_early:  # nothing more comes: close once written
            self._close_transport()
            self.eof_sent = True  # and nothing more goes (no second close-ok)
            return
        self.eof_sent = True  # nothing more goes; the client's EOF closes ours
        if fin:
            try:
                transport.write_eof()
            except (OSError, RuntimeError):  # the socket is already gone
                self._close_transport()
                return
        self.timer = self.ctx.loop.call_later(LINGER_TIMEOUT, self._close_transport)

    def _close_transport(self) -> None:
        self.flush()
        if self.transport is not None:
            self.transport.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def connection_error(exc: framing.FrameError) -> errors.ConnectionError_:
    """A framing fault as the connection error that closes the connection."""
    return errors.ConnectionError_(exc.reply_code, exc.reply_text, exc.class_id, exc.method_id)
