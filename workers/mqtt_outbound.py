"""Messages to an MQTT client (issue 41): a delivery of the inner AMQP
connection, or a retained message, as a PUBLISH, and the client's answers.

    QoS 0    sent; a delivery from a queue consumed with acks is acked at once
    QoS 1    PUBLISH with a packet id; the client's PUBACK acks the delivery
    QoS 2    the packet id and the message's fingerprint are written to the
             session (workers/mqtt_session.py) before the PUBLISH goes; PUBREC:
             the id is written as released, then PUBREL goes and the delivery
             is acked; PUBCOMP ends it. A redelivery (requeued, or recovered
             after a crash) of a message under way goes again with its packet
             id and DUP; one the client has already taken (released) is acked
             and not sent: never delivered twice. Only redeliveries are
             checked: two messages alike both go

5.0: the subscription identifiers of the filters that matched, no local (a
client's own message is not sent back on such a subscription), retain as
published, topic aliases (the first `topic_alias_maximum` topics the client
allows get one), and a message larger than the client's maximum packet size
dropped as if delivered (MQTT-3.1.2-25).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.amqp_frames import Delivered
from shoal.workers._mqtt_wire import deliveries, pubacks
from shoal.workers.mqtt_client import MqttClient
from shoal.workers.mqtt_session import fingerprint
from shoal.workers.mqtt_subscriptions import Subscriptions
from shoal.workers.unmade import UNMADE

NOTHING_TO_ACK = -1  # the delivery tag of a retained message's PUBLISH (no AMQP delivery)
ID_NOT_FOUND = 0x92  # 5.0: packet identifier not found
PLANS = 1024  # deliveries' plans kept (Outbound._plan)


class Outbound:
    __slots__ = (
        "alias_max",
        "aliases",
        "conn",
        "empty_properties",
        "heads",
        "line",
        "max_packet",
        "miss",
        "next_packet_id",
        "planned",
        "planned_for",
        "plans",
        "subscriptions",
        "unacked",
    )

    def __init__(self, conn: MqttClient, subscriptions: Subscriptions, props: P.Properties) -> None:
        self.conn = conn
        self.subscriptions = subscriptions
        self.next_packet_id = 1
        # PUBLISHes with a packet id and no PUBACK / PUBREC yet: id -> delivery tag.
        self.unacked: dict[int, int] = {}
        self.alias_max: int = props.get("topic_alias_maximum", 0)
        self.aliases: dict[str, int] = {}
        self.max_packet: int | None = props.get("maximum_packet_size")
        self.line: deque[list[Any]] = UNMADE  # [ready, packet] in delivery order
        # (queue, routing key, id(properties)) -> (properties, subscriptions' version, plan)
        self.plans: dict[tuple[str, str, int], tuple[Any, int, Any]] = {}
        # PUBLISH heads without properties, by (topic, flags, payload size): P.publish_head.
        self.heads: dict[tuple[str, int, int], bytes] = {}
        self.empty_properties = b"\x00" if conn.level == P.MQTT_5 else b""
        # The C path's plans (`run`): a delivery's (queue, routing key,
        # properties) as framed -> (topic, QoS, retain), or None where it
        # needs Python; for the subscriptions' version `planned_for`.
        self.planned: dict[bytes, tuple[bytes, int, bool] | None] = {}
        self.planned_for = -1
        self.miss: bytes | None = None  # the key of the delivery `run` left to deliver()

    def resume(self) -> None:
        """A returning session's PUBRELs go again (MQTT-4.4.0-1)."""
        for packet_id in self.conn.session.state.released:
            self.conn.send(P.encode_ack(self.conn.level, P.PUBREL, packet_id))

    # ----------------------------------------------------------- deliveries
    def run(self, buffer: bytearray, at: int) -> int:
        """The inner connection's run of deliveries at `at`, as far as it is
        planned, as PUBLISHes in one C call (workers/_mqtt_wire.c): where
        Python's path goes on. Only where nothing but the plan decides a
        PUBLISH's bytes: no topic aliases, no maximum packet size, no QoS 2
        message under way (its packet ids and order are the session's)."""
        self.miss = None  # (only the delivery at `at`, from this call, may be planned)
        state = self.conn.session.state
        if self.alias_max or self.max_packet is not None or self.line:
            return at
        if state.sent or state.released:
            return at
        version = self.subscriptions.version
        if self.planned_for != version:
            self.planned.clear()
            self.planned_for = version
        at, self.next_packet_id, packets, self.miss = deliveries(
            buffer, at, self.planned, self.unacked, self.next_packet_id, self.conn.level == P.MQTT_5
        )
        if packets is not None:
            self.conn.send(packets)
        return at

    def deliver(self, deliver: Delivered, props: C.Basic.Properties, payload: bytes) -> None:
        conn = self.conn
        tag = deliver.delivery_tag
        queue = deliver.consumer_tag
        routing_key = deliver.routing_key
        queue_qos = self.subscriptions.consumed.get(queue, 0)
        plan = self._plan(queue, routing_key, props)
        miss, self.miss = self.miss, None
        if plan is None:  # a $-topic, or only no-local subscriptions matched
            if miss is not None:
                self._learn(miss, None)
            self._settle(tag, queue_qos)
            return
        topic, qos, out, retain = plan
        if queue_qos < qos:
            qos = queue_qos
        if miss is not None:
            # What run may do for the next alike: QoS 0 or 1 as the plan
            # says, unless a 5.0 property, an expiry or an ack at once is in it.
            plain = not out and qos < 2 and not (queue_qos and not qos)
            if plain and M.EXPIRES_HEADER not in (props.headers or {}):
                self._learn(miss, (topic.encode(), qos, retain))
            else:
                self._learn(miss, None)
        if qos < 2:
            packet_id = None
            if qos:
                packet_id = self._packet_id()
                self.unacked[packet_id] = tag
            elif queue_qos:  # a QoS 0 message on a queue consumed with acks: settled now
                conn.ack(tag)
            self._send(
                topic,
                payload,
                qos,
                retain,
                bool(deliver.redelivered) and qos > 0,
                packet_id,
                out,
                tag,
            )
            return
        state = conn.session.state
        seen = fingerprint(routing_key, payload, props.headers or {})
        if deliver.redelivered:  # (a message under way again: requeued, or recovered)
            if state.released and seen in state.released.values():
                conn.ack(tag)  # the client has it (PUBREC'd)
                return
            for packet_id, sent in state.sent.items():
                if sent == seen and packet_id not in self.unacked:  # the same id again, DUP
                    self.unacked[packet_id] = tag
                    self._send(topic, payload, 2, retain, True, packet_id, out, tag)
                    return
        packet_id = self._packet_id()
        state.sent[packet_id] = seen
        self.unacked[packet_id] = tag
        # Sent once the session has it; what is delivered after it waits in
        # line behind it (the client gets its messages in the queue's order).
        entry: list[Any] = [
            False,
            (topic, payload, 2, retain, bool(deliver.redelivered), packet_id, out, tag),
        ]
        if self.line is UNMADE:
            self.line = deque()
        self.line.append(entry)

        def written() -> None:
            entry[0] = True
            while self.line and self.line[0][0]:
                self._write(*self.line.popleft()[1])

        conn.session.save(written)

    def _plan(
        self, queue: str, routing_key: str, props: C.Basic.Properties
    ) -> tuple[str, int, P.Properties, bool] | None:
        """What a delivery from `queue` with this key and these properties
        goes out as: (topic, the QoS it was published with, its 5.0
        properties, retain), or None where no subscription takes it. The
        same for every message alike, so kept (PLANS of them) until the
        subscriptions change: a fan-out sends one message to many clients,
        and a device's stream repeats its topic. Not kept for a message
        with an expiry: what is left of it goes out."""
        subscriptions = self.subscriptions
        key = (queue, routing_key, id(props))
        known = self.plans.get(key)
        if known is not None and known[0] is props and known[1] == subscriptions.version:
            return known[2]
        conn = self.conn
        headers = props.headers or {}
        topic = M.amqp_to_mqtt(routing_key)
        subs = subscriptions.matching(queue, topic)
        plan: tuple[str, int, P.Properties, bool] | None = None
        if subs or topic[:1] != "$":  # "#" and "+/..." bind to it, but match no $-topic
            wanted = subs  # (MQTT-4.7.2-1)
            if subscriptions.no_local and headers.get(M.PUBLISHER_HEADER) == conn.client_id:
                wanted = [sub for sub in subs if not sub.no_local]
            if not subs or wanted:  # else: only no-local subscriptions matched
                out = M.mqtt_properties(props) if conn.level == P.MQTT_5 else {}
                identifiers = [sub.identifier for sub in wanted if sub.identifier]
                if identifiers:
                    out["subscription_identifier"] = identifiers
                retain = bool(headers.get(M.RETAIN_HEADER)) and any(
                    sub.retain_as_published for sub in wanted
                )
                plan = (topic, M.published_qos(props), out, retain)
        if M.EXPIRES_HEADER not in headers:
            if len(self.plans) >= PLANS:
                self.plans.clear()
            # (props kept with it: its id is not reused while the plan lives)
            self.plans[key] = (props, subscriptions.version, plan)
        return plan

    def _learn(self, key: bytes, plan: tuple[bytes, int, bool] | None) -> None:
        if len(self.planned) >= PLANS:
            self.planned.clear()
        self.planned[key] = plan

    def send_retained(self, message: ipc.RetainedMessage, qos: int, subs: list[Any]) -> None:
        """A retained message for a new subscription, RETAIN set (MQTT-3.3.1-6);
        not one whose 5.0 expiry has passed, else with what is left of it."""
        left = M.expiry_left(message.expires_at) if message.expires_at else 0
        if message.expires_at and left <= 0:
            return
        qos = min(qos, message.qos)
        packet_id = None
        if qos:
            packet_id = self._packet_id()
            self.unacked[packet_id] = NOTHING_TO_ACK
        out: P.Properties = dict(message.properties) if self.conn.level == P.MQTT_5 else {}
        if left and out:
            out["message_expiry_interval"] = left
        identifiers = [sub.identifier for sub in subs if sub.identifier]
        if identifiers:
            out["subscription_identifier"] = identifiers
        self._send(message.topic, message.payload, qos, True, False, packet_id, out, NOTHING_TO_ACK)

    def _send(self, *packet: Any) -> None:
        if self.line:  # behind a QoS 2 PUBLISH being written to the session
            self.line.append([True, packet])
        else:
            self._write(*packet)

    def _write(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        props: P.Properties,
        tag: int,
    ) -> None:
        conn = self.conn
        if conn.closed:
            return
        name, new_alias = topic, False
        if self.alias_max:
            alias = self.aliases.get(topic)
            if alias is not None:
                name = ""  # the alias stands for it (5.0 3.3.2.3.4)
            elif len(self.aliases) < self.alias_max:
                alias, new_alias = len(self.aliases) + 1, True
            if alias is not None:
                props = {**props, "topic_alias": alias}
        if props:
            packet = P.encode_publish(conn.level, name, payload, qos, retain, dup, packet_id, props)
        else:
            flags = (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
            key = (name, flags, len(payload))
            head = self.heads.get(key)
            if head is None:
                if len(self.heads) >= PLANS:
                    self.heads.clear()
                head = self.heads[key] = P.publish_head(conn.level, name, flags, len(payload))
            if packet_id is not None:
                head += packet_id.to_bytes(2, "big")
            packet = head + self.empty_properties + payload
        if self.max_packet is not None and len(packet) > self.max_packet:
            # Larger than the 5.0 client takes: dropped, as if delivered
            # (and a new alias not given: the client never saw it).
            if packet_id is not None:
                self.unacked.pop(packet_id, None)
                self.conn.session.state.sent.pop(packet_id, None)
            self._settle(tag, 1)
            return
        if new_alias:
            self.aliases[topic] = props["topic_alias"]
        conn.send(packet)

    def _settle(self, tag: int, queue_qos: int) -> None:
        if queue_qos and tag != NOTHING_TO_ACK:
            self.conn.ack(tag)

    # ------------------------------------------------------ the client's acks
    def puback_run(self, data: bytes, acks: list[int]) -> int:
        """A read's leading run of PUBACKs with success (puback's, in one C
        call): their deliveries' tags join `acks`, the read's batch
        (MqttConnection.ack's). Returns how many bytes it took."""
        at, tags = pubacks(data, 0, self.unacked, NOTHING_TO_ACK)
        acks += tags
        return at

    def puback(self, packet_id: int) -> None:
        """A QoS 1 delivery's PUBACK: it is acked (an unknown id: nothing)."""
        self._settle(self.unacked.pop(packet_id, NOTHING_TO_ACK), 1)

    def on_ack(self, packet: P.Ack) -> None:
        conn = self.conn
        packet_id = packet.packet_id
        if packet.kind == P.PUBACK:
            self.puback(packet_id)
        elif packet.kind == P.PUBREC:
            tag = self.unacked.pop(packet_id, None)
            session = conn.session
            seen = session.state.sent.pop(packet_id, None)
            if tag is None and seen is None:
                if packet_id in session.state.released:  # a PUBREC again: PUBREL again
                    conn.send(P.encode_ack(conn.level, P.PUBREL, packet_id))
                else:
                    conn.send(P.encode_ack(conn.level, P.PUBREL, packet_id, ID_NOT_FOUND))
                return
            if packet.reason >= 0x80:  # 5.0: the client would not take it; it is done
                self._settle(tag or NOTHING_TO_ACK, 1)
                session.save()
                return
            session.state.released[packet_id] = seen or b""

            def released() -> None:
                self._settle(tag or NOTHING_TO_ACK, 1)
                if not conn.closed:
                    conn.send(P.encode_ack(conn.level, P.PUBREL, packet_id))

            session.save(released)
        else:  # PUBCOMP
            if conn.session.state.released.pop(packet_id, None) is not None:
                conn.session.save()

    def _packet_id(self) -> int:
        taken = (
            self.conn.session.ids_in_use()
            if self.conn.session.state.sent or self.conn.session.state.released
            else ()
        )
        for _ in range(65535):
            packet_id = self.next_packet_id
            self.next_packet_id = packet_id % 65535 + 1
            if packet_id not in self.unacked and packet_id not in taken:
                return packet_id
        raise P.ProtocolError("no packet identifier free")
