"""One MQTT client (3.1.1 or 5.0), served through an AMQP connection of its
own inside this worker, as RabbitMQ's MQTT plugin long did (issue 41, first
step).

The client's packets (broker/mqtt/packets.py) become AMQP methods that the
worker's own `Connection` (workers/connection.py) handles as if a client had
sent them, and what that connection writes back becomes MQTT packets. So an
MQTT client gets everything an AMQP one has, unchanged: users, vhosts
(RabbitMQ's `vhost:user` user names) and permissions, routing through
`amq.topic`, queues in the shared store, confirms, flow control, metrics and
the management API's connection rows.

    CONNECT          protocol header, start-ok (PLAIN), tune-ok, open, channel 1,
                     confirm.select, basic.qos; then CONNACK (a refused login:
                     the CONNACK code for it)
    PUBLISH          basic.publish to amq.topic, the topic as the routing key
                     ('/' -> '.'); QoS 1: PUBACK once confirmed; QoS 2: PUBREC
                     once confirmed, PUBCOMP on PUBREL, never published twice
    SUBSCRIBE        the session's queue for that QoS (mqtt-subscription-<id>qos0
                     or qos1, RabbitMQ's names), declared and consumed once, and
                     a binding ('+' -> '*'); SUBACK with the QoS granted (2 -> 1)
    UNSUBSCRIBE      the bindings removed; UNSUBACK
    a delivery       PUBLISH (QoS 1: a packet id; the client's PUBACK acks it)
    PINGREQ          PINGRESP; keep-alive: closed after 1.5 x its interval
    DISCONNECT       closed without the will; any other end publishes the will
    RETAIN           kept by the scheduler once confirmed (ipc.Retain); a new
                     subscription gets what its filter matches (ipc.RetainedFor)
    the client id    connecting again: its older connection, on any worker, goes

A session's queues are exclusive (gone with the connection) but for a
persistent session's (3.1.1 without clean session; 5.0 with a session
expiry interval: the queues' x-expires): durable, they outlive it.

Not yet (issue 41, docs/mqtt.md): QoS 2 deliveries (granted as 1), 5.0's
topic aliases, subscription identifiers, shared
subscriptions and enhanced auth, the WebSocket and TLS listeners. A 5.0
client is told so in its CONNACK (maximum QoS 1, topic alias maximum 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import body as amqp_body
from pamqp import commands as C
from pamqp import frame as amqp_frame
from pamqp import header as amqp_header

from shoal.broker import ipc
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.workers import framing
from shoal.workers.connection import Connection
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_transport import AmqpSide

log = logging.getLogger("shoal.mqtt")

PREFETCH = 10  # deliveries in flight per QoS 1 queue (RabbitMQ's mqtt.prefetch)
PACKET_OVERHEAD = 1 << 16  # a packet's topic, properties and headers beyond its payload
MAX_CLIENT_ID = 233  # "mqtt-subscription-" + id + "qos1" within a queue name's 255 bytes
CONNECT_TIMEOUT_S = 10.0
NOTHING_TO_ACK = -1  # the delivery tag of a retained message's PUBLISH (no AMQP delivery)

# CONNACK codes: (3.1.1, 5.0)
BAD_PROTOCOL = (1, 0x84)
BAD_CLIENT_ID = (2, 0x85)
UNAVAILABLE = (3, 0x88)
BAD_LOGIN = (4, 0x86)
NOT_AUTHORIZED = (5, 0x87)


class MqttConnection(asyncio.Protocol):
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.transport: Any = None
        # The largest packet taken: a message of --max-message-size and its
        # topic and properties (5.0 CONNACK says so; the rest is refused
        # before its body is buffered).
        self.max_packet = ctx.config.max_message_size + PACKET_OVERHEAD
        self.reader = P.PacketReader(self.max_packet)
        self.level = P.MQTT_311
        self.connect: P.Connect | None = None
        self.open = False
        self.closed = False
        self.will: P.Will | None = None
        self.amqp: Connection | None = None
        self.amqp_out = bytearray()
        self.amqp_reading = False
        self.counted_out = False
        self.conn_id = 0  # the AMQP connection's id, once it is open
        self.persistent = False  # the session outlives the connection
        self.frame_max = 131072
        self.expect: deque[Callable[[Any], None]] = deque()  # channel 1's sync replies
        self.held: list[P.Packet] = []  # packets that came before the CONNACK
        self.confirm_seq = 0
        # Channel 1 is in confirm mode: every publish has a seq, and those
        # that wait for their confirm are here: (the ack to send: packet
        # type and id, or None; the retained message to keep, or None).
        self.confirms: dict[int, tuple[tuple[int, int] | None, ipc.Retain | None]] = {}
        self.qos2_received: set[int] = set()
        self.next_packet_id = 1
        self.unacked: dict[int, int] = {}  # packet id -> delivery tag
        self.consumed: dict[str, int] = {}  # queue -> QoS
        self.bound: dict[str, str] = {}  # topic filter -> queue
        self.delivery: list[Any] | None = None  # [deliver, header, bytearray]
        self.last_recv = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.login: tuple[str, bytes, str] = ("", b"", "/")  # user, password, vhost

    # ------------------------------------------------------------ the socket
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.timer = self.ctx.loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        try:
            for ptype, flags, body in self.reader.feed(data):
                if self.closed:
                    return
                if self.connect is None and ptype != P.CONNECT:
                    raise P.ProtocolError("the first packet is not CONNECT")  # MQTT-3.1.0-1
                self._packet(P.decode(ptype, flags, body, self.level))
        except P.PacketError as exc:
            log.info("mqtt client %s: %s", self._who(), exc.text)
            self._disconnect(exc.reason)
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self._who())
            self._disconnect(0x83)  # implementation specific error

    def taken_over(self) -> None:
        """The client connected again (a takeover): this connection goes,
        5.0's with reason 0x8E, its will published."""
        log.info("mqtt client %s: taken over by a new connection", self._who())
        self._disconnect(0x8E)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.connect is not None and self.amqp is not None:
            key = (self.amqp.vhost, self.connect.client_id)
            if self.ctx.mqtt_clients.get(key) is self:
                del self.ctx.mqtt_clients[key]
        if not self.closed:
            self.closed = True
            if self.will is not None and self.open:
                self._publish_will()
        amqp, self.amqp = self.amqp, None
        if amqp is not None:
            amqp.connection_lost(None)  # its channels and exclusive queues go; counted out
        elif not self.counted_out:
            self.counted_out = True
            self.ctx.process.count_connections(-1)  # (the acceptor counted it in)

    def pause_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.pause_writing()

    def resume_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.resume_writing()

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _disconnect(self, reason: int) -> None:
        """End the connection for a fault: a 5.0 client hears why (3.1.1
        servers just close, MQTT-4.8.0-1); the will is published."""
        if self.closed:
            return
        if self.level == P.MQTT_5 and self.connect is not None:
            self._send(P.encode_disconnect(reason))
        if self.will is not None and self.open:
            self._publish_will()
        self._close()

    def _who(self) -> str:
        return self.connect.client_id if self.connect is not None else "(not connected)"

    def _connect_timeout(self) -> None:
        if not self.open:
            self._close()
            return
        keep_alive = self.connect.keep_alive if self.connect is not None else 0
        if keep_alive and time.monotonic() - self.last_recv > keep_alive * 1.5:
            log.info("mqtt client %s: keep-alive of %d s passed", self._who(), keep_alive)
            self._disconnect(0x8D)  # keep alive timeout
            return
        self.timer = self.ctx.loop.call_later(max(1.0, keep_alive / 2), self._connect_timeout)

    # -------------------------------------------------------------- packets
    def _packet(self, packet: P.Packet) -> None:
        if isinstance(packet, P.Connect):
            if self.connect is not None:
                raise P.ProtocolError("a second CONNECT")  # MQTT-3.1.0-2
            self._on_connect(packet)
        elif not self.open:
            self.held.append(packet)  # served once the CONNACK is out
        elif isinstance(packet, P.Publish):
            self._on_publish(packet)
        elif isinstance(packet, P.Ack):
            self._on_ack(packet)
        elif isinstance(packet, P.Subscribe):
            self._on_subscribe(packet)
        elif isinstance(packet, P.Unsubscribe):
            self._on_unsubscribe(packet)
        elif isinstance(packet, P.PingReq):
            self._send(P.encode_pingresp())
        elif isinstance(packet, P.Disconnect):
            if not (self.level == P.MQTT_5 and packet.reason == 0x04):  # "with will"
                self.will = None
            self._close()
        else:  # AUTH: enhanced authentication is not offered
            raise P.ProtocolError("AUTH without an authentication method")

    def _refuse(self, code: tuple[int, int]) -> None:
        self._send(P.encode_connack(self.level, False, code[self.level == P.MQTT_5]))
        self._close()

    def _on_connect(self, packet: P.Connect) -> None:
        self.connect = packet
        if packet.level not in (P.MQTT_311, P.MQTT_5) or packet.protocol_name != "MQTT":
            self._refuse(BAD_PROTOCOL)  # (3.1's "MQIsdp" included)
            return
        self.level = packet.level
        if not packet.client_id:
            if not packet.clean and packet.level == P.MQTT_311:
                self._refuse(BAD_CLIENT_ID)  # MQTT-3.1.3-8
                return
            packet.client_id = "shoal-" + os.urandom(8).hex()
        if len(packet.client_id.encode()) > MAX_CLIENT_ID:
            self._refuse(BAD_CLIENT_ID)
            return
        self.will = packet.will
        # A session outlives its connection: 3.1.1 without clean session;
        # 5.0 with a session expiry interval (whatever clean start says).
        if packet.level == P.MQTT_5:
            self.persistent = bool(packet.properties.get("session_expiry_interval"))
        else:
            self.persistent = not packet.clean
        config = self.ctx.config
        vhost, user = config.default_vhost, packet.username
        if user is not None and ":" in user:
            vhost, user = user.split(":", 1)
        if user is None:
            user, password = config.default_user, config.default_pass.encode()
        else:
            password = packet.password or b""
        self.amqp = Connection(self.ctx)
        self.amqp.protocol = "MQTT 5.0" if self.level == P.MQTT_5 else "MQTT 3.1.1"
        self.amqp.connection_made(AmqpSide(self))
        self.login = (user, password, vhost)
        self._to_amqp(framing.PROTOCOL_HEADER)

    def _session(self) -> None:
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
        self.ctx.send(ipc.ClientIdConnected(key[0], key[1], self.conn_id))
        resume = lambda: self._consume(  # noqa: E731
            self._queue(0), 0, lambda: self._consume(self._queue(1), 1, self._accepted)
        )
        if self.connect.clean:  # an earlier persistent session's queues go
            earlier = f"mqtt-subscription-{self.connect.client_id}qos"
            then = resume if self.persistent else self._accepted
            self._call(
                C.Queue.Delete(queue=earlier + "0"),
                lambda _r: self._call(C.Queue.Delete(queue=earlier + "1"), lambda _r: then()),
            )
        elif self.persistent:
            resume()
        else:
            self._accepted()

    def _accepted(self) -> None:
        assert self.connect is not None
        self.open = True
        props: P.Properties | None = None
        if self.level == P.MQTT_5:
            props = {
                "maximum_qos": 1,
                "topic_alias_maximum": 0,
                "subscription_identifier_available": 0,
                "shared_subscription_available": 0,
                "receive_maximum": 65535,
                "maximum_packet_size": self.max_packet,
            }
            if not self.connect.username and self.connect.client_id.startswith("shoal-"):
                props["assigned_client_identifier"] = self.connect.client_id
        self._send(P.encode_connack(self.level, False, 0, props))
        if self.timer is not None:
            self.timer.cancel()
        keep_alive = self.connect.keep_alive
        if keep_alive:
            self.timer = self.ctx.loop.call_later(keep_alive / 2, self._connect_timeout)
        held, self.held = self.held, []
        for packet in held:
            if not self.closed:
                self._packet(packet)

    def _on_publish(self, packet: P.Publish) -> None:
        if packet.qos == 2 and packet.packet_id in self.qos2_received:
            # A resend: published once already. PUBREC again if it was
            # confirmed, else the confirm sends it.
            waiting = (P.PUBREC, packet.packet_id)
            if all(ack != waiting for ack, _r in self.confirms.values()):
                self._send(P.encode_ack(self.level, P.PUBREC, packet.packet_id))
            return
        props = M.amqp_properties(packet.qos, packet.properties)
        ack = None
        if packet.qos:
            assert packet.packet_id is not None
            ack = (P.PUBACK if packet.qos == 1 else P.PUBREC, packet.packet_id)
            if packet.qos == 2:
                self.qos2_received.add(packet.packet_id)  # until its PUBREL
        retain = None
        if packet.retain:  # kept once the broker has taken the message
            kept = {k: v for k, v in packet.properties.items() if k in M.FORWARDED_PROPERTIES}
            plain = ipc.RetainedMessage(packet.topic, packet.payload, packet.qos, kept)
            retain = ipc.Retain(self.amqp.vhost if self.amqp is not None else "", plain)
        self._publish(M.mqtt_to_amqp(packet.topic), packet.payload, props, ack, retain)

    def _publish(
        self,
        routing_key: str,
        payload: bytes,
        props: C.Basic.Properties,
        ack: tuple[int, int] | None = None,
        retain: ipc.Retain | None = None,
    ) -> None:
        self.confirm_seq += 1  # (every publish: channel 1 confirms them all)
        if ack is not None or retain is not None:
            self.confirms[self.confirm_seq] = (ack, retain)
        frames = [
            amqp_frame.marshal(C.Basic.Publish(exchange=M.EXCHANGE, routing_key=routing_key), 1),
            amqp_frame.marshal(amqp_header.ContentHeader(0, len(payload), props), 1),
        ]
        step = self.frame_max - 8
        for at in range(0, len(payload), step):
            frames.append(amqp_frame.marshal(amqp_body.ContentBody(payload[at : at + step]), 1))
        self._to_amqp(b"".join(frames))

    def _publish_will(self) -> None:
        will, self.will = self.will, None
        if will is None or self.amqp is None:
            return
        props = M.amqp_properties(will.qos, will.properties)  # (5.0: its will properties)
        self._publish(M.mqtt_to_amqp(will.topic), will.payload, props)

    def _on_ack(self, packet: P.Ack) -> None:
        if packet.kind == P.PUBACK:
            tag = self.unacked.pop(packet.packet_id, None)
            if tag is not None and tag != NOTHING_TO_ACK:
                self._method(C.Basic.Ack(delivery_tag=tag))
        elif packet.kind == P.PUBREL:
            self.qos2_received.discard(packet.packet_id)
            self._send(P.encode_ack(self.level, P.PUBCOMP, packet.packet_id))
        else:  # PUBREC / PUBCOMP: no QoS 2 deliveries are made
            raise P.ProtocolError(f"packet type {packet.kind} for no QoS 2 delivery")

    def _on_subscribe(self, packet: P.Subscribe) -> None:
        codes: list[int] = []
        steps = [(sub.topic_filter, min(sub.qos, 1)) for sub in packet.subscriptions]
        granted = list(steps)

        def next_step(_reply: Any = None) -> None:
            if not steps:
                self._send(P.encode_suback(self.level, packet.packet_id, codes))
                for topic_filter, qos in granted:  # then what is retained there
                    self._send_retained(topic_filter, qos)
                return
            topic_filter, qos = steps.pop(0)
            queue = self._queue(qos)
            old = self.bound.get(topic_filter)

            def bound(_reply: Any) -> None:
                self.bound[topic_filter] = queue
                codes.append(qos)
                next_step()

            def bind() -> None:
                key = M.mqtt_to_amqp(topic_filter)
                self._call(C.Queue.Bind(queue=queue, exchange=M.EXCHANGE, routing_key=key), bound)

            if old is not None and old != queue:  # a new QoS for the filter: moved
                unbind = C.Queue.Unbind(
                    queue=old, exchange=M.EXCHANGE, routing_key=M.mqtt_to_amqp(topic_filter)
                )
                self._call(unbind, lambda _r: self._consume(queue, qos, bind))
            else:
                self._consume(queue, qos, bind)

        next_step()

    def _send_retained(self, topic_filter: str, qos: int) -> None:
        """The retained messages `topic_filter` matches, with RETAIN set
        (MQTT-3.3.1-6), each at min(its QoS, the subscription's)."""
        if self.amqp is None:
            return
        asked = self.ctx.request(ipc.RetainedFor(self.amqp.vhost, topic_filter))

        def got(future: asyncio.Future[ipc.RetainedList]) -> None:
            if self.closed or future.cancelled() or future.exception() is not None:
                return
            for message in future.result().messages:
                message_qos = min(qos, message.qos, 1)
                packet_id = None
                if message_qos:
                    packet_id = self._packet_id()
                    self.unacked[packet_id] = NOTHING_TO_ACK
                props = message.properties if self.level == P.MQTT_5 else None
                self._send(
                    P.encode_publish(
                        self.level,
                        message.topic,
                        message.payload,
                        qos=message_qos,
                        retain=True,
                        packet_id=packet_id,
                        properties=props or None,
                    )
                )

        asked.add_done_callback(got)

    def _queue(self, qos: int) -> str:
        """RabbitMQ's name for a persistent session's queue. A clean
        session's are its connection's own (their names end in its id): an
        older connection of the client id, being taken over, may still hold
        its exclusive queues when this one declares."""
        assert self.connect is not None
        name = f"mqtt-subscription-{self.connect.client_id}qos{qos}"
        return name if self.persistent else f"{name}-{self.conn_id:x}"

    def _consume(self, queue: str, qos: int, then: Callable[[], None]) -> None:
        """Queue `queue` declared and consumed (once per connection), then `then`."""
        if queue in self.consumed:
            then()
            return
        self.consumed[queue] = qos
        if self.persistent:
            # 5.0: the session ends its expiry interval after its last
            # connection (the queue's x-expires, as RabbitMQ 3.13 does).
            expiry = (
                self.connect.properties.get("session_expiry_interval") if self.connect else None
            )
            arguments = {} if not expiry or expiry == 0xFFFFFFFF else {"x-expires": expiry * 1000}
            declare = C.Queue.Declare(queue=queue, durable=True, arguments=arguments)
        else:
            declare = C.Queue.Declare(queue=queue, exclusive=True, auto_delete=True)

        def declared(_reply: Any) -> None:
            consume = C.Basic.Consume(queue=queue, consumer_tag=queue, no_ack=qos == 0)
            self._call(consume, lambda _r: then())

        self._call(declare, declared)

    def _on_unsubscribe(self, packet: P.Unsubscribe) -> None:
        filters = list(packet.topic_filters)
        codes: list[int] = []

        def next_step(_reply: Any = None) -> None:
            if not filters:
                self._send(P.encode_unsuback(self.level, packet.packet_id, codes))
                return
            topic_filter = filters.pop(0)
            queue = self.bound.pop(topic_filter, None)
            # (A persistent session's bindings of an earlier connection are
            # not known here: unbinding one that is not there changes nothing.)
            queues = [queue] if queue is not None else list(self.consumed)
            if not queues:
                codes.append(0x11)  # no subscription existed
                next_step()
                return
            codes.append(0)
            key = M.mqtt_to_amqp(topic_filter)
            for one in queues[:-1]:
                self._call(C.Queue.Unbind(queue=one, exchange=M.EXCHANGE, routing_key=key), _ignore)
            unbind = C.Queue.Unbind(queue=queues[-1], exchange=M.EXCHANGE, routing_key=key)
            self._call(unbind, next_step)

        next_step()

    # ------------------------------------------------------- the AMQP side
    def _to_amqp(self, data: bytes) -> None:
        if self.amqp is not None:
            self.amqp.data_received(data)

    def _method(self, method: Any, channel: int = 1) -> None:
        self._to_amqp(amqp_frame.marshal(method, channel))

    def _call(self, method: Any, then: Callable[[Any], None]) -> None:
        """A synchronous method on channel 1; `then` gets its reply."""
        self.expect.append(then)
        self._method(method)

    def amqp_closed(self) -> None:
        """The inner connection closed its transport: so does the client's."""
        if not self.closed:
            self._disconnect(0x80)

    def from_amqp(self, data: bytes) -> None:
        """What the inner connection wrote: read once its write returns (it
        is inside its flush, which must not be re-entered)."""
        if not self.amqp_reading:
            self.amqp_reading = True
            self.ctx.loop.call_soon(self._read_amqp)
        self.amqp_out += data

    def _read_amqp(self) -> None:
        """Each whole frame the inner connection wrote (type, channel, size,
        payload, end byte), one at a time: its bytes only are decoded."""
        self.amqp_reading = False
        buffer = self.amqp_out
        at = 0
        try:
            while len(buffer) - at >= 8:
                end = at + 8 + int.from_bytes(buffer[at + 3 : at + 7], "big")
                if end > len(buffer):
                    break
                _used, channel, frame = amqp_frame.unmarshal(bytes(buffer[at:end]))
                at = end
                self._from_amqp(channel, frame)
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self._who())
            self._disconnect(0x83)
        finally:
            del buffer[:at]

    def _from_amqp(self, channel: int, frame: Any) -> None:
        if isinstance(frame, C.Basic.Deliver):
            self.delivery = [frame, None, bytearray()]
        elif isinstance(frame, amqp_header.ContentHeader):
            if self.delivery is not None:
                self.delivery[1] = frame
                if frame.body_size == 0:
                    self._deliver()
        elif isinstance(frame, amqp_body.ContentBody):
            if self.delivery is not None and self.delivery[1] is not None:
                self.delivery[2] += frame.value
                if len(self.delivery[2]) >= self.delivery[1].body_size:
                    self._deliver()
        elif isinstance(frame, C.Basic.Ack):
            self._confirmed(frame.delivery_tag, frame.multiple, True)
        elif isinstance(frame, C.Basic.Nack):
            self._confirmed(frame.delivery_tag, frame.multiple, False)
        elif isinstance(frame, C.Connection.Start):
            user, password, _vhost = self.login
            response = b"\x00" + user.encode() + b"\x00" + password
            assert self.connect is not None
            props: dict[str, Any] = {
                "product": "Shoal MQTT",
                "client_id": self.connect.client_id,
            }
            self._method(
                C.Connection.StartOk(
                    client_properties=props, mechanism="PLAIN", response=response.decode()
                ),
                0,
            )
        elif isinstance(frame, C.Connection.Tune):
            self.frame_max = frame.frame_max or self.frame_max
            self._method(C.Connection.TuneOk(frame.channel_max, frame.frame_max, 0), 0)
            self._method(C.Connection.Open(virtual_host=self.login[2]), 0)
        elif isinstance(frame, C.Connection.OpenOk):
            self._method(C.Channel.Open(), 1)
        elif isinstance(frame, C.Channel.OpenOk):
            self._call(
                C.Confirm.Select(),
                lambda _r: self._call(
                    C.Basic.Qos(prefetch_count=self._prefetch()), lambda _q: self._session()
                ),
            )
        elif isinstance(frame, C.Connection.Close):
            self._amqp_refused(frame.reply_code or 0, frame.reply_text or "")
        elif isinstance(frame, C.Channel.Close):
            log.info("mqtt client %s: %s", self._who(), frame.reply_text)
            self._method(C.Channel.CloseOk(), 1)
            self._disconnect(0x87 if frame.reply_code == 403 else 0x80)
        elif channel == 1 and self.expect:
            self.expect.popleft()(frame)

    def _amqp_refused(self, code: int, text: str) -> None:
        log.info("mqtt client %s: %s", self._who(), text)
        self._method(C.Connection.CloseOk(), 0)
        if self.open:
            self._disconnect(0x80)
        elif code == 403 and "Login was refused" in text:
            self._refuse(BAD_LOGIN)
        elif code in (403, 530):
            self._refuse(NOT_AUTHORIZED)
        else:
            self._refuse(UNAVAILABLE)

    def _confirmed(self, tag: int, multiple: bool, ack: bool) -> None:
        seqs = [s for s in self.confirms if s <= tag] if multiple else [tag]
        for seq in sorted(seqs):
            got = self.confirms.pop(seq, None)
            if got is None:
                continue
            waiting, retain = got
            if ack and retain is not None:
                self.ctx.send(retain)
            if waiting is None:
                continue
            kind, packet_id = waiting
            if not ack:  # the broker could not take it: the client sends it again
                self.qos2_received.discard(packet_id)
                if self.level == P.MQTT_5:
                    self._send(P.encode_ack(self.level, kind, packet_id, 0x80))
                    continue
                self._disconnect(0x80)
                return
            self._send(P.encode_ack(self.level, kind, packet_id))

    def _deliver(self) -> None:
        assert self.delivery is not None
        deliver, content, payload = self.delivery
        self.delivery = None
        queue_qos = self.consumed.get(deliver.consumer_tag, 0)
        qos = min(queue_qos, M.published_qos(content.properties), 1)
        packet_id = None
        if qos:
            packet_id = self._packet_id()
            self.unacked[packet_id] = deliver.delivery_tag
        elif queue_qos:  # a QoS 0 message on the QoS 1 queue: settled now
            self._method(C.Basic.Ack(delivery_tag=deliver.delivery_tag))
        props = M.mqtt_properties(content.properties) if self.level == P.MQTT_5 else None
        packet = P.encode_publish(
            self.level,
            M.amqp_to_mqtt(deliver.routing_key),
            bytes(payload),
            qos=qos,
            dup=bool(deliver.redelivered) and qos > 0,
            packet_id=packet_id,
            properties=props,
        )
        limit = self.connect.properties.get("maximum_packet_size") if self.connect else None
        if limit is not None and len(packet) > limit:
            # Larger than the 5.0 client takes: dropped, as if delivered
            # (MQTT-3.1.2-25).
            if packet_id is not None:
                self._on_ack(P.Ack(P.PUBACK, packet_id))
            return
        self._send(packet)

    def _prefetch(self) -> int:
        """QoS 1 deliveries in flight: at most the 5.0 client's receive
        maximum (MQTT-3.3.4-9); only the QoS 1 queue is consumed with acks."""
        assert self.connect is not None
        return min(PREFETCH, self.connect.properties.get("receive_maximum", PREFETCH))

    def _packet_id(self) -> int:
        for _ in range(65535):
            packet_id = self.next_packet_id
            self.next_packet_id = packet_id % 65535 + 1
            if packet_id not in self.unacked:
                return packet_id
        raise P.ProtocolError("no packet identifier free")


def _ignore(_reply: Any) -> None:
    pass
