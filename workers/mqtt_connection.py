"""One MQTT client (3.1.1 or 5.0), served through an AMQP connection of its
own inside this worker, as RabbitMQ's MQTT plugin long did (issue 41).

The client's packets (broker/mqtt/packets.py) become AMQP methods that the
worker's own `Connection` (workers/connection.py) handles as if a client had
sent them, and what that connection writes back becomes MQTT packets. So an
MQTT client gets everything an AMQP one has, unchanged: users, vhosts
(RabbitMQ's `vhost:user` user names) and permissions, routing through
`amq.topic`, queues in the shared store, confirms, flow control, metrics and
the management API's connection rows.

    CONNECT          protocol header, start-ok (PLAIN; EXTERNAL for a TLS client
                     certificate and no user name), tune-ok, open, channel 1,
                     confirm.select, basic.qos; the session (workers/mqtt_session.py)
                     and its queues; then CONNACK (session present; a refused
                     login: the CONNACK code for it)
    PUBLISH          basic.publish to amq.topic, the topic as the routing key
                     ('/' -> '.'; 5.0: a topic alias resolved); QoS 1: PUBACK
                     once confirmed; QoS 2: PUBREC once confirmed and its packet
                     id written to the session, PUBCOMP on PUBREL, never
                     published twice
    SUBSCRIBE        queues and bindings (workers/mqtt_subscriptions.py)
    a delivery       PUBLISH at QoS 0, 1 or 2 (workers/mqtt_outbound.py)
    PINGREQ          PINGRESP; keep-alive: closed after 1.5 x its interval
    DISCONNECT       closed without the will; any other end publishes the will
                     (5.0: after its will delay, unless the client comes back)
    RETAIN           kept by the scheduler once confirmed (ipc.Retain); a new
                     subscription gets what its filter matches (ipc.RetainedFor)
    the client id    connecting again: its older connection, on any worker, goes
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import commands as C
from pamqp import frame as amqp_frame

from shoal.broker import ipc
from shoal.broker.mqtt import amqp_frames as F
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.topics import TopicAliases
from shoal.shm import stats
from shoal.workers import framing
from shoal.workers.connection import Connection
from shoal.workers.context import WorkerContext
from shoal.workers.mqtt_outbound import Outbound
from shoal.workers.mqtt_session import Session
from shoal.workers.mqtt_subscriptions import Subscriptions
from shoal.workers.mqtt_transport import AmqpSide

log = logging.getLogger("shoal.mqtt")

# QoS 1 and 2 deliveries in flight per queue (RabbitMQ's mqtt.prefetch is 10,
# mosquitto's max_inflight_messages 20: 100 keeps a fast subscriber's link full;
# a 5.0 client bounds it with its receive maximum).
PREFETCH = 100
PACKET_OVERHEAD = 1 << 16  # a packet's topic, properties and headers beyond its payload
MAX_CLIENT_ID = 233  # "mqtt-subscription-" + id + "qos1" within a queue name's 255 bytes
CONNECT_TIMEOUT_S = 10.0
EXCHANGE = M.EXCHANGE.encode()
TOPIC_ALIAS_MAXIMUM = 64  # the 5.0 topic aliases a client may set (CONNACK says so)

# CONNACK codes: (3.1.1, 5.0)
BAD_PROTOCOL = (1, 0x84)
BAD_CLIENT_ID = (2, 0x85)
UNAVAILABLE = (3, 0x88)
BAD_LOGIN = (4, 0x86)
NOT_AUTHORIZED = (5, 0x87)
BAD_AUTH_METHOD = (5, 0x8C)  # 5.0 enhanced authentication: none is offered


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
        self.out: list[bytes] | None = None  # packets of a batch, written at its end
        self.held: list[P.Packet] = []  # packets that came before the CONNACK
        self.early: list[tuple[Any, Any, bytes]] = []  # deliveries that came before it
        self.busy = False  # a SUBSCRIBE or UNSUBSCRIBE under way: later packets wait
        self.confirm_seq = 0
        # Channel 1 is in confirm mode: every publish has a seq, and those
        # that wait for their confirm are here: (the ack to send: packet
        # type and id, or None; the retained message to keep, or None).
        self.confirms: dict[int, tuple[tuple[int, int] | None, ipc.Retain | None]] = {}
        # QoS 2 publishes whose PUBREC waits: for the confirm, the session's write, or both.
        self.pubrec_waits: dict[int, int] = {}
        self.topic_aliases = TopicAliases(TOPIC_ALIAS_MAXIMUM)  # 5.0: the client's
        self.session = Session.in_memory()
        self.subscriptions = Subscriptions(self)
        self.outbound: Outbound | None = None
        self.delivery: list[Any] | None = None  # [Delivered, (size, properties), bytearray]
        self.properties_cache = F.PropertiesCache()  # deliveries' content headers
        # The content header properties of PUBLISHes without 5.0 properties,
        # by (QoS, retain, publisher).
        self.known_properties: dict[tuple[int, bool, str | None], bytes] = {}
        self.will_timer: asyncio.TimerHandle | None = None  # 5.0: a will delay under way
        self.taken = False  # the client connected again elsewhere
        self.client_id = ""  # once CONNECT gave (or was given) one
        # 5.0's session expiry interval (s; 0xFFFFFFFF: never), None for 3.1.1.
        self.session_expiry: int | None = None
        self.last_recv = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        self.login: tuple[str, bytes, str] = ("", b"", "/")  # user, password, vhost
        self.external = False  # log in with the TLS client certificate (SASL EXTERNAL)

    # ------------------------------------------------------------ the socket
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.ctx.stats.v[stats.MQTT_CONNECTIONS] += 1  # (`shoal status`, the metrics)
        self.timer = self.ctx.loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        batch = self.out is None
        if batch:  # what this read's packets answer goes out in one write
            self.out = []
        try:
            for ptype, flags, body in self.reader.feed(data):
                if self.closed:
                    return
                if self.connect is None and ptype != P.CONNECT:
                    raise P.ProtocolError("the first packet is not CONNECT")  # MQTT-3.1.0-1
                self._packet(P.decode(ptype, flags, body, self.level))
        except P.PacketError as exc:
            log.info("mqtt client %s: %s", self.client_id or "(not connected)", exc.text)
            self._disconnect(exc.reason)
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self.client_id or "(not connected)")
            self._disconnect(0x83)  # implementation specific error
        finally:
            if batch:
                self._flush()

    def taken_over(self) -> None:
        """The client connected again (a takeover): this connection goes,
        5.0's with reason 0x8E, its will published (but a delayed one: the
        client is back). The session is the new connection's to write."""
        log.info(
            "mqtt client %s: taken over by a new connection", self.client_id or "(not connected)"
        )
        self.session.detached = True
        self.taken = True
        if self.will_timer is not None:  # gone already, its will delayed: not sent
            self.will_timer.cancel()
            self.will_timer = None
            self._end_amqp()
            return
        self._disconnect(0x8E)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.ctx.stats.v[stats.MQTT_CONNECTIONS] -= 1
        self.closed = True
        if self.open and self.persistent:
            self.session.end(self.session_expiry)
        if not self._will_at_end():
            self._end_amqp()

    def _end_amqp(self) -> None:
        if self.connect is not None and self.amqp is not None:
            key = (self.amqp.vhost, self.connect.client_id)
            if self.ctx.mqtt_clients.get(key) is self:
                del self.ctx.mqtt_clients[key]
        amqp, self.amqp = self.amqp, None
        if amqp is not None:
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
            self._publish_will(will)
            return False
        if self.taken:
            return False  # (the client is back already)
        for queue in list(self.subscriptions.consumed):
            self.call(C.Basic.Cancel(consumer_tag=queue), _ignore)

        def publish() -> None:
            self.will_timer = None
            self._publish_will(will)
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
            self.transport.write(data)

    def _flush(self) -> None:
        """One write (one system call) for the packets a read of either side
        made: a run of deliveries, or a device's PUBACKs."""
        out, self.out = self.out, None
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def _close(self) -> None:
        self._flush()  # (a DISCONNECT may be waiting in the batch)
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _disconnect(self, reason: int) -> None:
        """End the connection for a fault: a 5.0 client hears why (3.1.1
        servers just close, MQTT-4.8.0-1); the will is published (at the
        connection's end)."""
        if self.closed:
            return
        if self.level == P.MQTT_5 and self.connect is not None:
            self.send(P.encode_disconnect(reason))
        self._close()

    def _connect_timeout(self) -> None:
        if not self.open:
            self._close()
            return
        keep_alive = self.connect.keep_alive if self.connect is not None else 0
        if keep_alive and time.monotonic() - self.last_recv > keep_alive * 1.5:
            log.info(
                "mqtt client %s: keep-alive of %d s passed",
                self.client_id or "(not connected)",
                keep_alive,
            )
            self._disconnect(0x8D)  # keep alive timeout
            return
        self.timer = self.ctx.loop.call_later(max(1.0, keep_alive / 2), self._connect_timeout)

    # -------------------------------------------------------------- packets
    def _packet(self, packet: P.Packet) -> None:
        if isinstance(packet, P.Connect):
            if self.connect is not None:
                raise P.ProtocolError("a second CONNECT")  # MQTT-3.1.0-2
            self._on_connect(packet)
        elif not self.open or self.busy:
            # Served once the CONNACK is out, or once the (UN)SUBACK is: a
            # PUBLISH after a SUBSCRIBE sees the subscription made.
            self.held.append(packet)
        elif isinstance(packet, P.Publish):
            self._on_publish(packet)
        elif isinstance(packet, P.Ack):
            if packet.kind == P.PUBREL:
                self._on_pubrel(packet.packet_id)
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
                if not self.persistent and expiry:  # MQTT-3.14.2-2
                    raise P.ProtocolError("a session expiry set at DISCONNECT, 0 at CONNECT")
                self.session_expiry = expiry
            self._close()
        else:  # AUTH: enhanced authentication is not offered (none was asked for)
            raise P.ProtocolError("AUTH without an authentication method")

    def _refuse(self, code: tuple[int, int]) -> None:
        self.send(P.encode_connack(self.level, False, code[self.level == P.MQTT_5]))
        self._close()

    def _on_connect(self, packet: P.Connect) -> None:
        self.connect = packet
        if packet.level not in (P.MQTT_311, P.MQTT_5) or packet.protocol_name != "MQTT":
            self._refuse(BAD_PROTOCOL)  # (3.1's "MQIsdp" included)
            return
        self.level = packet.level
        if "authentication_method" in packet.properties:
            self._refuse(BAD_AUTH_METHOD)  # 5.0 enhanced authentication (4.12)
            return
        if not packet.client_id:
            if not packet.clean and packet.level == P.MQTT_311:
                self._refuse(BAD_CLIENT_ID)  # MQTT-3.1.3-8
                return
            packet.client_id = "shoal-" + os.urandom(8).hex()
        if len(packet.client_id.encode()) > MAX_CLIENT_ID:
            self._refuse(BAD_CLIENT_ID)
            return
        self.client_id = packet.client_id
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
        vhost, user = config.default_vhost, packet.username
        if user is not None and ":" in user:
            vhost, user = user.split(":", 1)
        if user is None:
            user, password = config.default_user, config.default_pass.encode()
        else:
            password = packet.password or b""
        self.amqp = Connection(self.ctx)
        self.amqp.protocol = "MQTT 5.0" if self.level == P.MQTT_5 else "MQTT 3.1.1"
        if self.transport.get_extra_info("websocket"):
            self.amqp.protocol = "Web " + self.amqp.protocol  # RabbitMQ's web-mqtt says so
        self.amqp.connection_made(AmqpSide(self))
        # A TLS client certificate and no user name: the certificate's user
        # (SASL EXTERNAL, RabbitMQ's mqtt.ssl_cert_login).
        self.external = packet.username is None and bool(self.amqp.certificate_user)
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
        self.session, present = Session.open(
            self.ctx.config.data_path(), key[0], key[1], self.persistent, self.connect.clean
        )
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
        if self.connect.clean:  # an earlier persistent session's queues go
            earlier = f"mqtt-subscription-{self.connect.client_id}qos"
            self.call(
                C.Queue.Delete(queue=earlier + "0"),
                lambda _r: self.call(
                    C.Queue.Delete(queue=earlier + "1"),
                    lambda _r: self.call(
                        C.Queue.Delete(queue=earlier + "2"), lambda _r: accepted()
                    ),
                ),
            )
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
                "receive_maximum": 65535,
                "maximum_packet_size": self.max_packet,
            }
            if not self.connect.username and self.connect.client_id.startswith("shoal-"):
                props["assigned_client_identifier"] = self.connect.client_id
        self.send(P.encode_connack(self.level, present, 0, props))
        self.outbound.resume()
        early, self.early = self.early, []
        for delivery in early:
            self.outbound.deliver(*delivery)
        if self.timer is not None:
            self.timer.cancel()
        keep_alive = self.connect.keep_alive
        if keep_alive:
            self.timer = self.ctx.loop.call_later(keep_alive / 2, self._connect_timeout)
        self.serve_held()

    def serve_held(self) -> None:
        """The packets held while the CONNACK or a (UN)SUBACK was coming, in order."""
        self.busy = False
        while self.held and not self.busy and not self.closed:
            self._packet(self.held.pop(0))

    def _on_publish(self, packet: P.Publish) -> None:
        packet_id = packet.packet_id
        if packet.qos == 2 and packet_id in self.session.received:
            # A resend: published once already. PUBREC again, unless what
            # it waits for (the confirm, the session's write) sends it.
            assert packet_id is not None
            if packet_id not in self.pubrec_waits:
                self.send(P.encode_ack(self.level, P.PUBREC, packet_id))
            return
        topic = self.topic_aliases.topic(packet)
        if not self._may_publish(M.mqtt_to_amqp(topic), packet):
            return
        props = self._properties(packet)
        ack = None
        if packet.qos:
            assert packet_id is not None
            ack = (P.PUBACK if packet.qos == 1 else P.PUBREC, packet_id)
            if packet.qos == 2:  # PUBREC once confirmed and written (until PUBREL)
                self.session.received.add(packet_id)
                self.pubrec_waits[packet_id] = 2
                self.session.save(lambda: self._pubrec_step(packet_id))
        retain = None
        if packet.retain:  # kept once the broker has taken the message
            kept = {k: v for k, v in packet.properties.items() if k in M.FORWARDED_PROPERTIES}
            plain = ipc.RetainedMessage(topic, packet.payload, packet.qos, kept)
            retain = ipc.Retain(self.amqp.vhost if self.amqp is not None else "", plain)
        self._publish(M.mqtt_to_amqp(topic), packet.payload, props, ack, retain)

    def _may_publish(self, routing_key: str, packet: P.Publish) -> bool:
        """Write on amq.topic and the topic permissions, as RabbitMQ's plugin
        checks them: refused, a 5.0 client's QoS 1 or 2 message gets its
        PUBACK or PUBREC with 0x87 and a QoS 0 one is dropped; a 3.1.1
        client, which has no way to hear it, is disconnected."""
        if self.amqp is None:
            return False
        access = self.amqp.access
        access.refresh()
        if access.may_publish(M.EXCHANGE.encode(), routing_key.encode()):
            return True
        log.info(
            "mqtt client %s: publish to %r refused",
            self.client_id or "(not connected)",
            packet.topic,
        )
        if self.level != P.MQTT_5:
            self._disconnect(0x87)
        elif packet.qos and packet.packet_id is not None:
            kind = P.PUBACK if packet.qos == 1 else P.PUBREC
            self.send(P.encode_ack(self.level, kind, packet.packet_id, 0x87))
        return False

    def may_subscribe(self, routing_key: str) -> bool:
        return self.amqp is not None and self.amqp.access.may_bind_topic(M.EXCHANGE, routing_key)

    def _pubrec_step(self, packet_id: int) -> None:
        left = self.pubrec_waits.get(packet_id)
        if left is None:
            return
        if left > 1:
            self.pubrec_waits[packet_id] = left - 1
            return
        del self.pubrec_waits[packet_id]
        self.send(P.encode_ack(self.level, P.PUBREC, packet_id))

    def _on_pubrel(self, packet_id: int) -> None:
        """The QoS 2 exchange ends: PUBCOMP once the session no longer holds
        its packet id (else a new message with the id would be taken for a
        resend after a restart)."""
        if packet_id not in self.session.received:
            self.send(
                P.encode_ack(
                    self.level, P.PUBCOMP, packet_id, 0x92 if self.level == P.MQTT_5 else 0
                )
            )
            return
        self.session.received.discard(packet_id)
        self.session.save(lambda: self.send(P.encode_ack(self.level, P.PUBCOMP, packet_id)))

    def _publish(
        self,
        routing_key: str,
        payload: bytes,
        properties: bytes,
        ack: tuple[int, int] | None = None,
        retain: ipc.Retain | None = None,
    ) -> None:
        """basic.publish to amq.topic on channel 1; `properties`: the content
        header's (amqp_frames.properties_bytes)."""
        self.confirm_seq += 1  # (every publish: channel 1 confirms them all)
        if ack is not None or retain is not None:
            self.confirms[self.confirm_seq] = (ack, retain)
        self._to_amqp(
            F.publish(1, EXCHANGE, routing_key.encode(), properties, payload, self.frame_max)
        )

    def _properties(self, packet: P.Publish) -> bytes:
        """The content header's properties of a PUBLISH: those of a message
        with no 5.0 properties are the same bytes for every one alike (kept)."""
        publisher = self.client_id if self.subscriptions.no_local else None
        if packet.properties:
            props = M.amqp_properties(packet.qos, packet.properties, packet.retain, publisher)
            return F.properties_bytes(props)
        key = (packet.qos, packet.retain, publisher)
        known = self.known_properties.get(key)
        if known is None:
            props = M.amqp_properties(packet.qos, {}, packet.retain, publisher)
            known = self.known_properties[key] = F.properties_bytes(props)
        return known

    def _publish_will(self, will: P.Will) -> None:
        if self.amqp is None:
            return
        props = M.amqp_properties(will.qos, will.properties)  # (5.0: its will properties)
        self._publish(M.mqtt_to_amqp(will.topic), will.payload, F.properties_bytes(props))

    def send_retained(self, topic_filter: str, qos: int) -> None:
        """The retained messages `topic_filter` matches, for its new subscription."""
        if self.amqp is None:
            return
        asked = self.ctx.request(ipc.RetainedFor(self.amqp.vhost, topic_filter))
        subs = [self.session.state.subscriptions[topic_filter]]

        def got(future: asyncio.Future[ipc.RetainedList]) -> None:
            if self.closed or future.cancelled() or future.exception() is not None:
                return
            assert self.outbound is not None
            for message in future.result().messages:
                self.outbound.send_retained(message, qos, subs)

        asked.add_done_callback(got)

    # ------------------------------------------------------- the AMQP side
    def _to_amqp(self, data: bytes) -> None:
        if self.amqp is not None:
            self.amqp.data_received(data)

    def ack(self, delivery_tag: int) -> None:
        self._to_amqp(F.ack(1, delivery_tag))

    def method(self, method: Any, channel: int = 1) -> None:
        self._to_amqp(amqp_frame.marshal(method, channel))

    def call(self, method: Any, then: Callable[[Any], None]) -> None:
        """A synchronous method on channel 1; `then` gets its reply."""
        self.expect.append(then)
        self.method(method)

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
                end = at + 8 + int.from_bytes(buffer[at + 3 : at + 7], "big")
                if end > len(buffer):
                    break
                kind = buffer[at]
                payload = bytes(buffer[at + 7 : end - 1])
                delivery = self.delivery
                if kind == F.BODY and delivery is not None and delivery[1] is not None:
                    delivery[2] += payload
                    if len(delivery[2]) >= delivery[1][0]:
                        self._deliver()
                elif kind == F.HEADER and delivery is not None:
                    delivery[1] = self.properties_cache.header(payload)
                    if delivery[1][0] == 0:
                        self._deliver()
                elif kind == F.METHOD and F.is_deliver(payload):
                    self.delivery = [F.deliver(payload), None, bytearray()]
                elif kind == F.METHOD and (confirm := F.confirm_of(payload)) is not None:
                    self._confirmed(*confirm)
                else:
                    _used, channel, frame = amqp_frame.unmarshal(bytes(buffer[at:end]))
                    self._from_amqp(channel, frame)
                at = end
        except Exception:
            # A bug in handling one client must cost that client only.
            log.exception("mqtt client %s: internal error", self.client_id or "(not connected)")
            self._disconnect(0x83)
        finally:
            del buffer[:at]
            if batch:
                self._flush()

    def _from_amqp(self, channel: int, frame: Any) -> None:
        if isinstance(frame, C.Connection.Start):
            user, password, _vhost = self.login
            mechanism, response = "PLAIN", b"\x00" + user.encode() + b"\x00" + password
            if self.external:
                mechanism, response = "EXTERNAL", b""
            assert self.connect is not None
            props: dict[str, Any] = {
                "product": "Shoal MQTT",
                "client_id": self.connect.client_id,
            }
            self.method(
                C.Connection.StartOk(
                    client_properties=props, mechanism=mechanism, response=response.decode()
                ),
                0,
            )
        elif isinstance(frame, C.Connection.Tune):
            self.frame_max = frame.frame_max or self.frame_max
            self.method(C.Connection.TuneOk(frame.channel_max, frame.frame_max, 0), 0)
            self.method(C.Connection.Open(virtual_host=self.login[2]), 0)
        elif isinstance(frame, C.Connection.OpenOk):
            self.method(C.Channel.Open(), 1)
        elif isinstance(frame, C.Channel.OpenOk):
            self.call(C.Confirm.Select(), lambda _r: self._flow_control())
        elif isinstance(frame, C.Connection.Close):
            self._amqp_refused(frame.reply_code or 0, frame.reply_text or "")
        elif isinstance(frame, C.Channel.Close):
            log.info("mqtt client %s: %s", self.client_id or "(not connected)", frame.reply_text)
            self.method(C.Channel.CloseOk(), 1)
            self._disconnect(0x87 if frame.reply_code == 403 else 0x80)
        elif channel == 1 and self.expect:
            self.expect.popleft()(frame)

    def _amqp_refused(self, code: int, text: str) -> None:
        log.info("mqtt client %s: %s", self.client_id or "(not connected)", text)
        self.method(C.Connection.CloseOk(), 0)
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
                self.session.received.discard(packet_id)
                self.pubrec_waits.pop(packet_id, None)
                if self.level == P.MQTT_5:
                    self.send(P.encode_ack(self.level, kind, packet_id, 0x80))
                    continue
                self._disconnect(0x80)
                return
            if kind == P.PUBREC:
                self._pubrec_step(packet_id)
            else:
                self.send(P.encode_ack(self.level, kind, packet_id))

    def _deliver(self) -> None:
        assert self.delivery is not None and self.outbound is not None
        deliver, (_size, properties), payload = self.delivery
        self.delivery = None
        if not self.open:  # a returning session's queues deliver before its CONNACK is out
            self.early.append((deliver, properties, bytes(payload)))
            return
        self.outbound.deliver(deliver, properties, bytes(payload))

    def _flow_control(self) -> None:
        """QoS 1 and 2 deliveries in flight: PREFETCH per queue, and over all
        queues at most the 5.0 client's receive maximum (MQTT-3.3.4-9; the
        channel's global prefetch). QoS 0 queues go without acks."""
        assert self.connect is not None
        receive_maximum = self.connect.properties.get("receive_maximum")
        then = lambda _r: self._session()  # noqa: E731
        if receive_maximum is not None:
            limit = C.Basic.Qos(prefetch_count=receive_maximum, global_=True)
            then = lambda _r: self.call(limit, lambda _q: self._session())  # noqa: E731
        self.call(C.Basic.Qos(prefetch_count=PREFETCH), then)


def _ignore(_reply: Any) -> None:
    pass
