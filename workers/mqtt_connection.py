"""One MQTT client (3.1.1 or 5.0), served through an AMQP connection of its
own inside this worker, as RabbitMQ's MQTT plugin long did (issue 41).

The client's packets (broker/mqtt/packets.py) become AMQP methods that the
worker's own `Connection` (workers/connection.py) handles as if a client had
sent them, and what it writes back becomes MQTT packets. So an MQTT client
gets all an AMQP one has: users, vhosts (`vhost:user` user names) and
permissions, routing through `amq.topic`, queues in the shared store,
confirms, flow control, metrics and the management API's connection rows.

    CONNECT          protocol header, start-ok (PLAIN; EXTERNAL for a TLS client
                     certificate and no user name, if enabled), tune-ok, open, channel 1,
                     confirm.select, basic.qos; the session (workers/mqtt_session.py)
                     and its queues; then CONNACK (session present; a refused
                     login: the CONNACK code for it)
    PUBLISH          basic.publish to amq.topic, the topic as the routing key
                     ('/' -> '.'), acked per its QoS (workers/mqtt_inbound.py)
    SUBSCRIBE        queues and bindings (workers/mqtt_subscriptions.py)
    a delivery       PUBLISH at QoS 0, 1 or 2 (workers/mqtt_outbound.py)
    PINGREQ          PINGRESP; keep-alive: closed after 1.5 x its interval
    DISCONNECT       closed without the will; any other end publishes the will
                     (5.0: after its will delay, unless the client comes back)
    RETAIN           kept by the scheduler once confirmed, on disk before the ack
                     (ipc.Retain); a new subscription gets what its filter matches
    the client id    connecting again: its older connection, on any worker, goes
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.mqtt import amqp_frames as F
from shoal.broker.mqtt import inner_frames
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.shm import stats
from shoal.shm.subscribe_barrier import ALL_TOPICS
from shoal.workers import mqtt_inner as inner
from shoal.workers._wire import MqttFront, read_topics
from shoal.workers.connection import Connection
from shoal.workers.connection_slots import MQTT_CONNECTION_SLOTS
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_acks import ack_read
from shoal.workers.mqtt_front import counted, failed, install
from shoal.workers.mqtt_inbound import TOPIC_ALIAS_MAXIMUM, Inbound
from shoal.workers.mqtt_lane import device_read
from shoal.workers.mqtt_move import intercept, may_move
from shoal.workers.mqtt_outbound import Outbound
from shoal.workers.mqtt_session import Session, open_owned
from shoal.workers.mqtt_subscriptions import Subscriptions, hold_for_subscribes
from shoal.workers.mqtt_transport import LINGER_TIMEOUT, AmqpSide, Linger

log = logging.getLogger("shoal.mqtt")

PACKET_OVERHEAD = 1 << 16  # a packet's topic, properties and headers beyond its payload
CONNECT_TIMEOUT_S = 10.0
# A read this long holds a run of packets: its QoS 0 publishes wake their
# subscribers' workers at once (Inbound.publish, shm/wake.py at_once).
LONG_READ = 1024
clock = time.monotonic_ns
INBOUND_EXCHANGE = M.EXCHANGE.encode()


class MqttConnection(asyncio.Protocol):
    __slots__ = MQTT_CONNECTION_SLOTS

    def __init__(self, ctx: WorkerContext, moved: tuple[bytes, bytes] | None = None) -> None:
        self.ctx = ctx
        self.moved = moved  # from another worker: its CONNECT and first read (mqtt_move.py)
        self.move = may_move(ctx) if moved is None else None  # (for its first reads)
        self.transport: Any = None
        # The largest packet taken (a --max-message-size message; 5.0 CONNACK says so).
        self.max_packet = ctx.config.max_message_size + PACKET_OVERHEAD
        self.reader = P.PacketReader(self.max_packet)
        self.level = P.MQTT_311
        self.connect: P.Connect | None = None
        self.open = False
        self.closed = False
        self.ended = False  # connection_lost ran (at _close, or at the socket's end)
        self.will: P.Will | None = None
        self.amqp: Connection | None = None
        self.amqp_out = bytearray()
        self.amqp_reading = False
        self.counted_out = False
        self.conn_id = 0  # the AMQP connection's id, once it is open
        self.persistent = False  # the session outlives the connection
        self.frame_max = 131072
        self.expect: list[Callable[[Any], None]] = []  # channel 1's sync replies, in order
        self.out: list[bytes] | None = None  # packets of a batch, written at its end
        self.acks: list[int] = []  # deliveries a batch settled, acked at its end
        self.held: list[P.Packet] = []  # packets that came before the CONNACK
        self.at_eof = False  # the client closed its side with packets held: served, then closed
        self.early: list[tuple[Any, Any, bytes]] = []  # deliveries that came before it
        self.busy = False  # a SUBSCRIBE or UNSUBSCRIBE under way: later packets wait
        self.prefetch = ctx.config.mqtt_prefetch  # (as of its CONNECT)
        self.session = Session.in_memory()
        self.subscriptions = Subscriptions(
            self, ctx.shared.catalog, ctx.routes, ctx.subscribe_barrier, ctx.header
        )
        self.inbound = Inbound(self, self.subscriptions, ctx.waker, ctx.config.mqtt_receive_maximum)
        self.outbound: Outbound | None = None
        self.delivery: list[Any] | None = None  # [Delivered, (size, properties), bytearray]
        self.properties_cache = F.PropertiesCache()  # deliveries' content headers
        self.will_timer: asyncio.TimerHandle | None = None  # 5.0: a will delay under way
        self.taken = False  # the client connected again elsewhere
        self.client_id = ""  # once CONNECT gave (or was given) one
        self.assigned_id = False  # the broker chose the client id
        # 5.0's session expiry interval (s; 0xFFFFFFFF: never), None for 3.1.1.
        self.session_expiry: int | None = None
        self.last_recv = time.monotonic()
        self.long_read = False  # the read being handled is LONG_READ or more
        self.timer: asyncio.TimerHandle | None = None
        self.login: tuple[str, bytes, str] = ("", b"", "/")  # user, password, vhost
        self.external = False  # log in with the TLS client certificate (SASL EXTERNAL)
        self.server_keep_alive = 0  # 5.0: CONNACK's, where --mqtt-max-keep-alive cut it
        words = ctx.subscribe_barrier.front_words
        self.front = MqttFront(self, MqttConnection._read, counted, failed, LONG_READ, *words)

    # ------------------------------------------------------------ the socket
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.ctx.stats.v[stats.MQTT_CONNECTIONS] += 1  # (`shoal status`, the metrics)
        self.timer = self.ctx.loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)
        install(self.front, transport, self.ctx)  # (its reads: the front, workers/mqtt_front.py)
        if self.moved is not None:  # (before any read of its own)
            for part in self.moved:
                self.data_received(part)

    def data_received(self, data: bytes) -> None:  # (TLS's, WebSocket's: the front's too)
        self.front.data_received(data)

    def _read(self, data: bytes) -> None:
        """A read, or what the front's fast read (front.fast) left of it."""
        if self.closed or not data:  # (an empty WebSocket message: nothing)
            return  # (a closed connection's socket lingers: its input is dropped)
        if self.move is not None and intercept(self, data):
            return  # (it went to its subscriber's worker)
        if data[0] == 0x82:  # A SUBSCRIBE's read, if at a packet's start (not in a held
            # one's payload): the barrier's up before it is decoded (the front
            # raised its word), as others' publishes race it by microseconds.
            subscriptions, reader = self.subscriptions, self.reader
            subscriptions.begin(self.open and not (subscriptions.binding or reader.buffer))
        self.last_recv = time.monotonic()
        self.long_read = len(data) >= LONG_READ
        batch = self.out is None
        if batch:  # what this read's packets answer goes out in one write
            self.out = []
        try:
            barrier, subs = self.ctx.subscribe_barrier, self.subscriptions  # (others' SUBSCRIBEs)
            if subs.held_topics is not None:  # (held for them: its publishes' topics join)
                subs.held_topics |= ALL_TOPICS if self.reader.buffer else read_topics(data)
            elif (
                self.open
                and not (self.busy or subs.binding)
                and barrier.recent(now := clock())  # (its publishes' topics: if not mid-packet)
                and barrier.holds(
                    now, now, t := ALL_TOPICS if self.reader.buffer else read_topics(data)
                )
            ):
                hold_for_subscribes(self, now, t)
            if self.open and not (self.busy or self.closed or self.acks or self.reader.buffer):
                if data[0] == 0x40 and self.outbound is not None:  # (a run of PUBACKs in C)
                    at = self.outbound.puback_run(data, self.acks)
                    if at == len(data):  # the next such reads in one C call
                        self.front.fast = ack_read(self)
                else:
                    at = self.inbound.publish_run(data, self.reader.max_size, self.amqp)  # (in C)
                    if self.inbound.lane_whole and self.amqp is not None and self.move is None:
                        self.front.fast = device_read(self, self.inbound, self.amqp)
                data = data[at:] if at else data
            for ptype, flags, body in self.reader.feed(data):
                if self.closed:
                    return
                if (
                    ptype == P.PUBACK
                    and not flags
                    and len(body) == 2
                    and self.open
                    and not self.busy
                ):
                    # A subscriber's commonest packet, without a Packet object:
                    # 3.1.1's PUBACK, 5.0's short form (success, no properties).
                    packet_id = int.from_bytes(body, "big")
                    if packet_id and self.outbound is not None:  # (id 0: refused by decode)
                        self.outbound.puback(packet_id)
                        continue
                if ptype == P.PUBLISH and self.open and not self.busy:
                    if self.acks:
                        self._settle_acks()  # (as _packet does first)
                    if self.inbound.publish_plain(flags, body):
                        continue
                self.inbound.feed_plain()
                if self.connect is None and ptype != P.CONNECT:
                    raise P.ProtocolError("the first packet is not CONNECT")  # MQTT-3.1.0-1
                self._packet(P.decode(ptype, flags, body, self.level))
        except P.PacketError as exc:
            self._malformed(exc)
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self.client_id or "(not connected)")
            self.inbound.feed_plain()
            self.disconnect(0x83)  # implementation specific error
        finally:
            self.inbound.feed_plain()
            self.long_read = False  # (neither it nor at_once outlives the read)
            self.ctx.waker.at_once = False  # (a QoS 0 publish here may have left it set)
            if batch:
                self._end_batch()

    def taken_over(self) -> None:
        """The client connected again (a takeover): this connection goes,
        5.0's with reason 0x8E, its will published (but a delayed one: the
        client is back). The session is the new connection's to write."""
        log.info("mqtt client %s: taken over by a new connection", self.client_id or "-")
        self.taken = True
        if self.will_timer is not None:  # gone already, its will delayed: not sent
            self.will_timer.cancel()
            self.will_timer = None
            self._end_amqp()
        self.disconnect(0x8E)  # (its _close shows the session's state in the file)
        self.session.let_go()  # the newer connection reads it now (open_owned)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.subscriptions.bound()  # (a SUBSCRIBE under way no longer holds others)
        if self.timer is not None:
            self.timer.cancel()
        self.ctx.stats.v[stats.MQTT_CONNECTIONS] -= 1
        self.closed = True
        self.front.fast = None
        waits = ends_now = False
        try:
            if self.open and self.persistent:
                self.inbound.received_at_end(self.amqp)  # (before the session's last write)
                self.session.end(self.session_expiry)
                ends_now = self.session_expiry == 0 and not self.session.detached
            waits = self._will_at_end()
        except Exception:
            # A bug here must not leave the inner connection or the registry entry behind.
            log.exception("mqtt client %s: at its end", self.client_id)
        finally:
            if ends_now:  # (no will waits: 0 s; bounded: the inner connection may not answer)
                self.subscriptions.delete_session_queues(self._end_amqp)
                self.ctx.loop.call_later(LINGER_TIMEOUT, self._end_amqp)
            elif not waits:
                self._end_amqp()
            self.session.release_owner()  # (one that never opened: before its CONNACK)

    def _end_amqp(self) -> None:
        if self.connect is not None and self.amqp is not None:
            key = (self.amqp.vhost, self.connect.client_id)
            if self.ctx.mqtt_clients.get(key) is self:
                del self.ctx.mqtt_clients[key]
        amqp, self.amqp = self.amqp, None
        if amqp is not None:
            self.counted_out = True  # (a second call does nothing)
            amqp.connection_lost(None)  # its channels and exclusive queues go; counted out
        elif not self.counted_out:
            self.counted_out = True
            self.ctx.process.count_connections(-1)  # (the acceptor counted it in)

    def _will_at_end(self) -> bool:
        """The will, at the connection's end without DISCONNECT: published
        now, or (5.0) after its will delay or at the session's end, whichever
        comes first, unless the client is back by then (MQTT-3.1.3-9). True:
        it waits, and the inner connection stays open to publish it (its
        consumers cancelled)."""
        will, self.will = self.will, None
        if will is None or not self.open or self.amqp is None:
            return False
        delay = will.properties.get("will_delay_interval", 0) if self.persistent else 0
        expiry = self.session_expiry
        if expiry is not None and expiry != 0xFFFFFFFF:
            delay = min(delay, expiry)
        if not delay:
            self.inbound.publish_will(will)
            return False
        if self.taken:
            return False  # (the client is back already)
        for queue in list(self.subscriptions.consumed):
            self.call(C.Basic.Cancel(consumer_tag=queue), inner.ignore_reply)

        def publish() -> None:
            self.will_timer = None
            self.inbound.publish_will(will)
            self._end_amqp()

        self.will_timer = self.ctx.loop.call_later(delay, publish)
        return True

    def pause_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.pause_writing()

    def resume_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.resume_writing()

    def send(self, data: bytes) -> None:
        if self.out is not None:  # in a batch: written at its end
            self.out.append(data)
        elif self.transport is not None and not self.closed:
            self.front.flush_acks()  # (a device's PUBACKs held: first)
            self.transport.write(data)

    def _end_batch(self) -> None:
        if self.acks:
            self._settle_acks()
        if self.subscriptions.narrowing is not None:  # (a SUBSCRIBE decoded in it)
            self.subscriptions.narrowed()
        self._flush()

    def _flush(self) -> None:
        """One write (one system call) for the packets a read of either side
        made: a run of deliveries, or a device's PUBACKs."""
        out, self.out = self.out, None
        if not self.closed and not self.transport.is_closing():
            self.front.flush_acks()  # (a device's PUBACKs held: first, and before a close)
            if out:
                self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _close(self) -> None:
        """The client's connection ends now, its socket lingers (Linger)."""
        if self.acks:  # (before the inner connection's end requeues them)
            self._settle_acks()
        self._flush()  # (a DISCONNECT may be waiting in the batch)
        self.closed = True
        self.front.fast = None  # (it holds this connection: no cycle left behind)
        if self.open and self.persistent:  # before the client sees the close: a reconnect reads it
            self.inbound.received_at_end(self.amqp)
            self.session.show()
        if self.transport is not None and Linger.starts(self.transport, self.ctx.loop):
            self.ctx.loop.call_soon(self.connection_lost, None)  # (ends now, not re-entered)

    def disconnect(self, reason: int) -> None:
        """End the connection for a fault: a 5.0 client hears why (3.1.1
        servers just close, MQTT-4.8.0-1); the will is published (at the
        connection's end)."""
        if self.closed:
            return
        if self.level == P.MQTT_5 and self.open:  # (never a DISCONNECT before the CONNACK)
            self.send(P.encode_disconnect(reason))
        self._close()

    def _connect_timeout(self) -> None:
        if not self.open:
            self._close()
            return
        keep_alive = self.connect.keep_alive if self.connect is not None else 0
        # MQTT-3.1.2-24: nothing for 1.5x the keep-alive. Woken at that deadline, not
        # every half keep-alive (an idle fleet's timers: a third as many).
        left = max(self.last_recv, self.front.last_fast_read) + keep_alive * 1.5 - time.monotonic()
        if not keep_alive:
            return
        if left < 0:
            log.info("mqtt client %s: keep-alive of %d s passed", self.client_id, keep_alive)
            self.disconnect(0x8D)  # keep alive timeout
            return
        self.timer = self.ctx.loop.call_later(max(0.1, left), self._connect_timeout)

    # -------------------------------------------------------------- packets
    def _packet(self, packet: P.Packet) -> None:
        if self.acks and not isinstance(packet, P.Ack):
            self._settle_acks()  # (what the packet does comes after them)
        if isinstance(packet, P.Connect):
            if self.connect is not None:
                raise P.ProtocolError("a second CONNECT")  # MQTT-3.1.0-2
            self._on_connect(packet)
        elif not self.open or self.busy:
            # Served once the CONNACK is out, or once the (UN)SUBACK is: a
            # PUBLISH after a SUBSCRIBE sees the subscription made.
            self.held.append(packet)
            if isinstance(packet, P.Subscribe):
                self.subscriptions.held_behind()
        elif isinstance(packet, P.Publish):
            self.inbound.publish(packet)
        elif isinstance(packet, P.Ack):
            if packet.kind == P.PUBREL:
                self.inbound.pubrel(packet.packet_id)
            elif self.outbound is not None:
                self.outbound.on_ack(packet)
        elif isinstance(packet, P.Subscribe):
            self.busy = True
            self.subscriptions.subscribe(packet)
        elif isinstance(packet, P.Unsubscribe):
            self.busy = True
            self.subscriptions.unsubscribe(packet)
        elif isinstance(packet, P.PingReq):
            self.send(P.encode_pingresp())
        elif isinstance(packet, P.Disconnect):
            if not (self.level == P.MQTT_5 and packet.reason == 0x04):  # "with will"
                self.will = None
            expiry = packet.properties.get("session_expiry_interval")
            if expiry is not None and self.connect is not None:
                if expiry and not self.connect.properties.get("session_expiry_interval"):
                    # MQTT-3.14.2-2 (0 at CONNECT, even where a session resumed)
                    raise P.ProtocolError("a session expiry set at DISCONNECT, 0 at CONNECT")
                self.session_expiry = expiry
            self._close()
        else:  # AUTH: enhanced authentication is not offered (none was asked for)
            raise P.ProtocolError("AUTH without an authentication method")

    def refuse(self, code: tuple[int, int]) -> None:
        if self.moved is None:  # (a moved one's client had its CONNACK: it just goes)
            self.send(P.encode_connack(self.level, False, code[self.level == P.MQTT_5]))
        self._close()

    def _on_connect(self, packet: P.Connect) -> None:
        self.connect = packet
        if packet.level not in (P.MQTT_311, P.MQTT_5) or packet.protocol_name != "MQTT":
            self.refuse(M.BAD_PROTOCOL)  # (3.1's "MQIsdp" included)
            return
        self.level = packet.level
        maximum = self.ctx.config.mqtt_max_keep_alive
        refusal = M.connect_refusal(packet, maximum)
        if refusal is not None:
            self.refuse(refusal)
            return
        if not packet.client_id:  # (3.1.1 with clean session, or 5.0: refused above if not)
            packet.client_id = "shoal-" + os.urandom(8).hex()
            self.assigned_id = True
        self.client_id = packet.client_id
        if M.keep_alive_over(packet.keep_alive, maximum):  # (5.0: 3.1.1 is refused)
            packet.keep_alive = self.server_keep_alive = maximum
        if packet.level == P.MQTT_5:
            self.session_expiry = int(packet.properties.get("session_expiry_interval", 0))
        self.will = packet.will
        # A session outlives its connection: 3.1.1 without clean session;
        # 5.0 with a session expiry interval (whatever clean start says).
        if packet.level == P.MQTT_5:
            self.persistent = bool(packet.properties.get("session_expiry_interval"))
        else:
            self.persistent = not packet.clean
        config = self.ctx.config
        login = M.login_of(packet, config.default_vhost, config.default_user, config.default_pass)
        vhost, user, password, anonymous = login
        if not M.sasl_text(password):
            log.info("mqtt client %s: login refused, the password is not text", self.client_id)
            self.refuse(M.BAD_LOGIN)
            return
        self.amqp = Connection(self.ctx)
        self.amqp.protocol = "MQTT 5.0" if self.level == P.MQTT_5 else "MQTT 3.1.1"
        if self.transport.get_extra_info("websocket"):
            self.amqp.protocol = "Web " + self.amqp.protocol  # RabbitMQ's web-mqtt says so
        side = AmqpSide(self)
        self.amqp.connection_made(side)
        self.amqp.scheduled_flush = side.scheduled_flush(self.amqp)
        self.amqp.confirm_sink = self.inbound.confirmed_at_once
        # Anonymous, a TLS client certificate, EXTERNAL on: its user (mqtt.ssl_cert_login).
        cert_login = "EXTERNAL" in self.ctx.config.auth_mechanisms
        self.external = anonymous and cert_login and bool(self.amqp.certificate_user)
        self.login = (user, password, vhost)
        inner.log_in(self)

    def start_session(self) -> None:
        """A clean session starts with no queue of an earlier one; a
        persistent one consumes its queues at once (what came while it was
        away is delivered). Then the CONNACK. First, any other connection
        of this client id, on any worker, is closed (MQTT-3.1.4-2)."""
        assert self.connect is not None and self.amqp is not None
        self.conn_id = self.amqp.id
        key = (self.amqp.vhost, self.connect.client_id)
        older = self.ctx.mqtt_clients.get(key)
        self.ctx.mqtt_clients[key] = self
        if older is not None and older is not self:
            older.taken_over()
        connected = ipc.ClientIdConnected(key[0], key[1], self.conn_id)
        if self.connect.clean and not self.persistent:  # (no session to wait for: later)
            self.ctx.send_later(connected)
        else:
            self.ctx.send(connected)
        modes, where = (self.persistent, self.connect.clean), (self.ctx.config.data_path(), *key)
        open_owned(self.ctx.loop, where, modes, lambda: self.closed, self._opened, self.refuse)

    def _opened(self, session: Session, present: bool) -> None:
        assert self.connect is not None
        self.session = session
        if present and not self.persistent:  # 5.0, no expiry: resumed, ends with it
            self.persistent = True
        self.session.failed = lambda: self.disconnect(0x80)
        self.outbound = Outbound(self, self.subscriptions, self.connect.properties)
        if self.persistent:  # on disk before anything: a reconnect finds it
            self.session.save(lambda: self._start(present))
        else:
            self._start(present)

    def _start(self, present: bool) -> None:
        assert self.connect is not None
        if self.closed:
            return
        accepted = lambda: self._accepted(present)  # noqa: E731
        if self.connect.clean or not present:  # an earlier session's queues go
            self.subscriptions.delete_session_queues(accepted)
        elif present:
            self.subscriptions.resume(accepted)
        else:
            accepted()

    def _accepted(self, present: bool) -> None:
        assert self.connect is not None and self.outbound is not None
        self.open = True
        props: P.Properties | None = None
        if self.level == P.MQTT_5:
            props = {
                "topic_alias_maximum": TOPIC_ALIAS_MAXIMUM,
                "receive_maximum": self.inbound.receive_maximum,
                "maximum_packet_size": self.max_packet,
            }
            if self.assigned_id:  # MQTT-3.2.2-16
                props["assigned_client_identifier"] = self.connect.client_id
            if self.server_keep_alive:  # MQTT-3.2.2-21: the client uses it
                props["server_keep_alive"] = self.server_keep_alive
        if self.moved is None:  # (a moved connection's client has had its CONNACK)
            self.send(P.encode_connack(self.level, present, 0, props))
        self.outbound.resume()
        early, self.early = self.early, []
        for delivery in early:
            self.outbound.deliver(*delivery)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None  # (keep alive 0: no timer, none kept)
        keep_alive = self.connect.keep_alive
        if keep_alive:
            self.timer = self.ctx.loop.call_later(keep_alive * 1.5, self._connect_timeout)
        self.serve_held()

    def eof_received(self) -> bool:
        """The client closed its side with packets still waiting (a CONNECT,
        a PUBLISH and a DISCONNECT in one write, then close; mosquitto serves
        them): they are served as if it had waited, then the connection ends.
        True keeps the transport (asyncio.Protocol)."""
        waiting = self.held or self.busy or (self.connect is not None and not self.open)
        tls = self.transport.get_extra_info("sslcontext") is not None  # (no half-close there)
        self.at_eof = bool(waiting) and not self.closed and not tls
        return self.at_eof

    def serve_held(self) -> None:
        """The packets held (for a CONNACK, a (UN)SUBACK, others' SUBSCRIBEs), in
        order; one wrong only now (a topic alias not set) ends it as if read."""
        self.busy = False
        try:
            while self.held and not self.busy and not self.closed:
                self._packet(self.held.pop(0))
            if self.at_eof and not (self.held or self.busy or self.closed):
                self._close()  # (its will, if no DISCONNECT came: as at the socket's end)
        except P.PacketError as exc:
            self._malformed(exc)
        finally:
            self.ctx.waker.at_once = False  # (as after a read: a held PUBLISH sets it)

    def _malformed(self, exc: P.PacketError) -> None:
        log.info("mqtt client %s: %s", self.client_id or "(not connected)", exc.text)
        self.inbound.feed_plain()  # (what came before it is published)
        self.disconnect(exc.reason)

    def may_publish(self, routing_key: bytes | None) -> bool:
        """Write on amq.topic and its topic permissions for this key (None: any)."""
        if self.amqp is None:
            return False
        access = self.amqp.access
        access.refresh()
        return access.may_publish(INBOUND_EXCHANGE, routing_key)

    @property
    def vhost(self) -> str:
        return self.amqp.vhost if self.amqp is not None else ""

    def ask(self, request: Any) -> asyncio.Future[Any]:
        """The scheduler's answer to `request` (a retained message kept: once on disk)."""
        return self.ctx.request(request)

    def may_subscribe(self, routing_key: str) -> bool:
        return self.amqp is not None and self.amqp.access.may_bind_topic(M.EXCHANGE, routing_key)

    # ------------------------------------------------------- the AMQP side
    def to_amqp(self, data: bytes) -> None:
        self.inbound.feed_plain()  # (first: the client's order)
        if self.amqp is not None:
            self.amqp.data_received(data)

    def ack(self, delivery_tag: int) -> None:
        if self.out is not None:  # in a batch: the PUBACKs of a read acked together
            self.acks.append(delivery_tag)
        elif self.amqp is not None:
            self.amqp.method_from_bridge(1, F.ack_method(delivery_tag))

    def _settle_acks(self) -> None:
        """The batch's acks, in one go where channel 1 takes them at once
        (else as frames, as one by one they would have been)."""
        tags, self.acks = self.acks, []
        amqp = self.amqp
        if amqp is None:
            return
        channel = amqp.channels.get(1)
        if channel is None or not channel.acks_from_bridge(tags):
            for tag in tags:
                amqp.method_from_bridge(1, F.ack_method(tag))

    def method(self, method: Any, channel: int = 1) -> None:
        self.to_amqp(inner_frames.encoded(method, channel))

    def call(self, method: Any, then: Callable[[Any], None]) -> None:
        """A synchronous method on channel 1; `then` gets its reply."""
        self.expect.append(then)
        self.method(method)

    def amqp_closed(self) -> None:
        """The inner connection closed its transport: so does the client's."""
        if not self.closed:
            self.disconnect(0x80)

    def from_amqp(self, data: bytes) -> None:
        """Inner frames: read once their write returns (inside its flush: no re-entry)."""
        if not self.amqp_reading:
            self.amqp_reading = True
            self.ctx.loop.call_soon(self.read_amqp)
        self.amqp_out += data

    def read_amqp(self) -> None:
        """Each whole frame the inner connection wrote (type, channel, size,
        payload, end byte), one at a time: a message's frames and confirms
        by hand (broker/mqtt/amqp_frames.py), the rest through pamqp."""
        self.amqp_reading = False
        buffer = self.amqp_out
        at = 0
        batch = self.out is None
        if batch:
            self.out = []
        try:
            while len(buffer) - at >= 8:
                kind, _channel, size = F.FRAME_HEAD.unpack_from(buffer, at)
                end = at + 8 + size
                if end > len(buffer):
                    break
                delivery = self.delivery
                if kind == F.METHOD and delivery is None and buffer[at + 7 : at + 11] == F.DELIVER:
                    if self.open and self.outbound:  # a planned run in C, as far as it goes
                        taken = self.outbound.run(buffer, at)
                        if taken > at:
                            at = taken
                            continue
                    # A delivery's three frames in one go, where they are all here.
                    whole = F.whole_delivery(buffer, at, end)
                    if whole is not None:
                        method, header, body, at = whole
                        props = self.properties_cache.header(header)[1]
                        self._deliver(F.deliver(method), props, body)
                        continue
                payload = bytes(buffer[at + 7 : end - 1])
                if kind == F.BODY and delivery is not None and delivery[1] is not None:
                    delivery[2] += payload
                    if len(delivery[2]) >= delivery[1][0]:
                        self._deliver_gathered()
                elif kind == F.HEADER and delivery is not None:
                    delivery[1] = self.properties_cache.header(payload)
                    if delivery[1][0] == 0:
                        self._deliver_gathered()
                elif kind == F.METHOD and F.is_deliver(payload):
                    self.delivery = [F.deliver(payload), None, bytearray()]
                elif kind == F.METHOD and (confirm := F.confirm_of(payload)) is not None:
                    self.inbound.confirmed(*confirm)
                else:
                    channel, frame = inner_frames.decoded(bytes(buffer[at:end]))
                    inner.answer(self, channel, frame)
                at = end
        except P.PacketError as exc:  # (a packet served only now, held or half done)
            self._malformed(exc)
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self.client_id or "(not connected)")
            self.disconnect(0x83)
        finally:
            del buffer[:at]
            if batch:
                self._end_batch()

    def _deliver_gathered(self) -> None:
        """The delivery whose frames were read one by one (self.delivery)."""
        assert self.delivery is not None
        deliver, (_size, properties), payload = self.delivery
        self.delivery = None
        self._deliver(deliver, properties, bytes(payload))

    def _deliver(self, deliver: F.Delivered, properties: Any, payload: bytes) -> None:
        assert self.outbound is not None
        if not self.open:  # a returning session's queues deliver before its CONNACK is out
            self.early.append((deliver, properties, payload))
            return
        self.outbound.deliver(deliver, properties, payload)
