"""What an MQTT client publishes (issue 41): a PUBLISH as basic.publish on
the inner AMQP connection's channel 1 (in confirm mode), and the acks the
client gets for it.

    QoS 0    published
    QoS 1    PUBACK once confirmed
    QoS 2    PUBREC once confirmed and then its packet id written to the
             session (workers/mqtt_session.py); a resend of the id before PUBREL is
             not published again, also after a reconnect or a crash; PUBCOMP
             on PUBREL, once the session no longer holds the id
    RETAIN   the message kept by the scheduler once confirmed (ipc.Retain); the
             ack waits until it is on disk

5.0: topic aliases resolved (broker/mqtt/topics.py), properties carried as
AMQP's (broker/mqtt/mapping.py), a refused publish answered with 0x87. Its
frames are made by hand (broker/mqtt/amqp_frames.py); the content header of a
message with no 5.0 properties is the same bytes every time, kept per (QoS,
retain, publisher).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING

from shoal.broker import ipc
from shoal.broker.mqtt import amqp_frames as F
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.topics import TopicAliases
from shoal.shm.wake import Waker
from shoal.workers._mqtt_wire import publishes
from shoal.workers.mqtt_client import MqttClient
from shoal.workers.mqtt_lane import lane_run
from shoal.workers.mqtt_subscriptions import Subscriptions
from shoal.workers.unmade import UNMADE_SET, made_set

if TYPE_CHECKING:
    from shoal.workers.connection import Connection

log = logging.getLogger("shoal.mqtt")

EXCHANGE = M.EXCHANGE.encode()
TOPIC_ALIAS_MAXIMUM = 64  # the 5.0 topic aliases a client may set (CONNACK says so)
# 5.0's Receive Maximum (CONNACK says so): the QoS 1 and 2 PUBLISHes a client
# may have unacknowledged. Enforced for QoS 2, whose packet ids wait in the
# session (written to disk with it) until the client's PUBREL: a client that
# never sends one would grow it without bound. (QoS 1 PUBACKs follow the
# broker's own confirms: the broker bounds those itself.) The count is
# --mqtt-receive-maximum, read once per connection: a reload does not change
# what an open connection's CONNACK said.
RECEIVE_MAXIMUM_EXCEEDED = 0x93
MAX_ROUTING_KEY = 255  # an AMQP shortstr: a longer topic cannot be routed (5.0: 0x90)
PLAIN_TOPICS_MAX = 64  # the topics a connection publishes to that publish_plain knows
# A PUBLISH's flags (DUP, QoS, RETAIN) that publish_plain takes: QoS 0, and
# QoS 1 with DUP or without; none retained.
_PLAIN_FLAGS = frozenset({0x00, 0x02, 0x0A})
# A PUBACK with success, without its packet id: 3.1.1's, and 5.0's short
# form (3.4.2.1), the same bytes (encode_ack's).
_PUBACK_HEAD = bytes((P.PUBACK << 4, 2))


# The content header properties of PUBLISHes without 5.0 properties and
# without a publisher's name (no no-local subscription): the same bytes for
# every connection, encoded once per worker, not at each connection's first
# PUBLISH (pamqp's encoding was a few percent of a connect or a move).
_ANYONES_PROPERTIES: dict[tuple[int, bool, str | None], bytes] = {}


class Inbound:
    __slots__ = (
        "confirm_seq",
        "confirms",
        "conn",
        "known_properties",
        "lane_whole",
        "plain",
        "plain_topics",
        "plain_wake",
        "qos2_publishing",
        "receive_maximum",
        "subscriptions",
        "topic_aliases",
        "waker",
    )

    def __init__(
        self, conn: MqttClient, subscriptions: Subscriptions, waker: Waker, receive_maximum: int
    ) -> None:
        self.conn = conn
        self.subscriptions = subscriptions
        self.waker = waker  # (what a publish wakes, at once: see publish)
        self.confirm_seq = 0
        # Channel 1 is in confirm mode: every publish has a seq, and those
        # that wait for their confirm are here: (the ack to send: packet
        # type and id, or None; the retained message to keep, or None).
        self.confirms: dict[int, tuple[tuple[int, int] | None, ipc.Retain | None]] = {}
        # QoS 2 publishes on their way to PUBREC: the confirm, then the session's write.
        self.qos2_publishing: set[int] = UNMADE_SET  # (made by the first)
        self.receive_maximum = receive_maximum  # (CONNACK says it)
        self.topic_aliases = TopicAliases(TOPIC_ALIAS_MAXIMUM)  # 5.0: the client's
        # The content header properties of PUBLISHes without 5.0 properties,
        # by (QoS, retain, publisher).
        self.known_properties: dict[tuple[int, bool, str | None], bytes] = {}
        # Topics published to before, which passed decode's checks and the
        # routing key's length: topic bytes -> (routing key, its basic.publish
        # method frame), for publish_plain.
        self.plain_topics: dict[bytes, tuple[bytes, bytes]] = {}
        # A read's plain publishes, framed, not yet given to the inner
        # connection (feed_plain), and whether one asks for a wake-up now.
        self.plain: list[bytes] = []
        self.plain_wake = False
        # The lane's last run took its read whole, confirmed at once: the
        # next reads' way in C (workers/mqtt_lane.py device_read, given to
        # MqttConnection.front) until a read it does not take.
        self.lane_whole = False

    def publish(self, packet: P.Publish) -> None:
        packet_id = packet.packet_id
        if packet.qos == 2 and (
            packet_id in self.conn.session.received or packet_id in self.qos2_publishing
        ):
            # A resend: published once already. PUBREC again, unless it is
            # still on its way (the confirm, then the session's write).
            assert packet_id is not None
            if packet_id not in self.qos2_publishing:
                self.conn.send(P.encode_ack(self.conn.level, P.PUBREC, packet_id))
            return
        topic = self.topic_aliases.topic(packet)
        routing_key = M.mqtt_to_amqp(topic)
        key = routing_key.encode()
        if len(key) > MAX_ROUTING_KEY:
            self._refuse(packet, 0x90, f"a topic of over {MAX_ROUTING_KEY} bytes")
            return
        if not self._may_publish(key, packet):
            return
        if packet.topic and len(self.plain_topics) < PLAIN_TOPICS_MAX:
            method = F.publish_method(1, EXCHANGE, key)
            self.plain_topics[packet.topic.encode()] = (key, method)
        props = self._properties(packet)
        ack = None
        if packet.qos:
            assert packet_id is not None
            ack = (P.PUBACK if packet.qos == 1 else P.PUBREC, packet_id)
            if packet.qos == 2:
                unreleased = len(self.conn.session.received) + len(self.qos2_publishing)
                if unreleased >= self.receive_maximum:
                    self.conn.disconnect(RECEIVE_MAXIMUM_EXCEEDED)  # (5.0 4.9)
                    return
                # Its id goes to the session once the message is confirmed,
                # then PUBREC (a crash in between: the client sends it again,
                # a duplicate rather than a loss); until then a resend is
                # recognised here.
                made_set(self, "qos2_publishing").add(packet_id)
        if not (packet.qos and self.conn.long_read):
            # The subscriber's worker is woken now, not when this read is
            # done: a short read's (a device's message or few) reaches it
            # while this worker writes the PUBACK; a long run of QoS 0
            # publishes has no PUBACK to wait for, what limits it is how soon
            # its messages are delivered. (A long run of QoS 1 and 2 ones
            # waits for the acks sent at the read's end: this worker keeps
            # the CPU.) fan-in, 1,000 devices: CPU 0.92x, p99 0.54 -> 0.44 ms
            # (docs/benchmarks.md).
            self.waker.at_once = True
        retain = None
        if packet.retain:  # kept once the broker has taken the message
            kept = {k: v for k, v in packet.properties.items() if k in M.FORWARDED_PROPERTIES}
            plain = ipc.RetainedMessage(topic, packet.payload, packet.qos, kept, M.expires_at(kept))
            retain = ipc.Retain(self.conn.vhost, plain)
        self.amqp_publish(routing_key, packet.payload, props, ack, retain)

    def publish_plain(self, flags: int, body: bytes) -> bool:
        """A device's commonest PUBLISH without a Packet object: QoS 0 or 1,
        not retained, no 5.0 properties, to a topic it published to before
        (whose checks passed then: `plain_topics`); the permission is asked
        again. False for any other PUBLISH, untouched: the decoder takes it
        (and refuses what is malformed, as before)."""
        if flags not in _PLAIN_FLAGS or len(body) < 2:
            return False
        at = 2 + (body[0] << 8 | body[1])
        size = len(body)
        known = self.plain_topics.get(body[2:at]) if size >= at else None
        if known is None:
            return False
        conn = self.conn
        ack = None
        if flags:
            packet_id = body[at] << 8 | body[at + 1] if size >= at + 2 else 0
            if not packet_id:
                return False  # (no id, or 0: malformed)
            ack = (P.PUBACK, packet_id)
            at += 2
        if conn.level == P.MQTT_5:
            if size <= at or body[at]:
                return False  # (properties: decoded)
            at += 1
        routing_key, method = known
        publisher = conn.client_id if self.subscriptions.no_local else None
        properties = self.known_properties.get((flags >> 1, False, publisher))
        if properties is None or not conn.may_publish(routing_key):
            return False  # (a refusal is the decoder's path's to say)
        if not (flags and conn.long_read):
            self.plain_wake = True  # (as publish does: see there)
        self.confirm_seq += 1
        if ack is not None:
            self.confirms[self.confirm_seq] = (ack, None)
        self.plain.append(F.with_content(method, 1, properties, body[at:], conn.frame_max))
        return True

    def publish_run(self, data: bytes, max_packet: int, amqp: Connection | None) -> int:
        """A read's leading run of plain publishes (publish_plain's), where
        the user may publish to every routing key (no topic permissions):
        straight into their queues through the inner connection's publish
        lane where it takes them (workers/mqtt_lane.py), the rest in one C
        call as the inner connection's frames (workers/_mqtt_wire.c). How
        many bytes of `data` it took, 0 for none. What it stops at is the
        packet loop's."""
        topics = self.plain_topics
        conn = self.conn
        if not topics or not conn.may_publish(None):
            return 0  # (one refused: the packet loop says so)
        publisher = conn.client_id if self.subscriptions.no_local else None
        known = self.known_properties
        props0, props1 = known.get((0, False, publisher)), known.get((1, False, publisher))
        at = 0
        if amqp is not None and not self.plain:
            at = lane_run(self, amqp, data, props0, props1, max_packet)
            if at == len(data):
                return at
        at, frames, ids = publishes(
            data, at, topics, props0, props1, conn.level == P.MQTT_5, max_packet, conn.frame_max
        )
        if frames is None:
            return at
        seq, confirms = self.confirm_seq, self.confirms
        for packet_id in ids:
            seq += 1
            if packet_id:
                confirms[seq] = ((P.PUBACK, packet_id), None)
        self.confirm_seq = seq
        if ids and (not conn.long_read or 0 in ids):
            self.plain_wake = True  # (as publish does: see there)
        self.plain.append(frames)
        return at

    def feed_plain(self) -> None:
        """The plain publishes held so far, to the inner connection in one
        read of its own: its per-read work (permissions, the publish lane's
        arming and accounting, the confirms) once for a run of them, not per
        message. Called before anything else goes to it (to_amqp), at the
        end of the client's read, and before the client is disconnected:
        the inner connection sees every frame in the client's order."""
        frames = self.plain
        if not frames:
            return
        self.plain = []
        if self.plain_wake:
            self.plain_wake = False
            self.waker.at_once = True
        self.conn.to_amqp(b"".join(frames) if len(frames) > 1 else frames[0])

    def _may_publish(self, routing_key: bytes, packet: P.Publish) -> bool:
        """Write on amq.topic and the topic permissions, as RabbitMQ's plugin
        checks them: refused, a 5.0 client's QoS 1 or 2 message gets its
        PUBACK or PUBREC with 0x87 and a QoS 0 one is dropped; a 3.1.1
        client, which has no way to hear it, is disconnected."""
        conn = self.conn
        if conn.may_publish(routing_key):
            return True
        self._refuse(packet, 0x87, "not authorized")
        return False

    def _refuse(self, packet: P.Publish, reason: int, why: str) -> None:
        """A PUBLISH the broker will not take: a 5.0 client's QoS 1 or 2 one
        gets its PUBACK or PUBREC with `reason`, a QoS 0 one is dropped; a
        3.1.1 client, which has no way to hear it, is disconnected."""
        log.info(
            "mqtt client %s: PUBLISH to %r refused: %s", self.conn.client_id, packet.topic, why
        )
        if self.conn.level != P.MQTT_5:
            self.conn.disconnect(reason)
        elif packet.qos and packet.packet_id is not None:
            kind = P.PUBACK if packet.qos == 1 else P.PUBREC
            self.conn.send(P.encode_ack(self.conn.level, kind, packet.packet_id, reason))

    def _pubrec(self, packet_id: int) -> None:
        """A QoS 2 message confirmed: its id in the session, on disk, then PUBREC."""
        session = self.conn.session
        made_set(session, "received").add(packet_id)

        def written() -> None:
            self.qos2_publishing.discard(packet_id)
            self.conn.send(P.encode_ack(self.conn.level, P.PUBREC, packet_id))

        session.save(written)

    def received_at_end(self, amqp: Connection | None) -> None:
        """The connection ends (a DISCONNECT right after QoS 2 PUBLISHes)
        before their confirms (a sync under way): those the inner
        connection took, in their queues, count as received in the
        session's last write, so their resends after a reconnect are not
        published again (MQTT-4.3.3; Eclipse Paho's test45 pending tokens).
        Those past its confirm_high (held, not appended) are not: their
        resends publish them. (One refused by a full queue, its nack still
        on its way, counts too: its resend is not tried again.)"""
        channel = amqp.channels.get(1) if amqp is not None and self.qos2_publishing else None
        if channel is None:
            return
        taken = channel.publisher.confirm_high
        for seq, (waiting, _retain) in self.confirms.items():
            if seq > taken:
                break  # (in ascending order)
            if waiting is not None and waiting[0] == P.PUBREC:
                made_set(self.conn.session, "received").add(waiting[1])

    def pubrel(self, packet_id: int) -> None:
        """The QoS 2 exchange ends: PUBCOMP once the session no longer holds
        its packet id (else a new message with the id would be taken for a
        resend after a restart)."""
        if packet_id not in self.conn.session.received:
            self.conn.send(
                P.encode_ack(
                    self.conn.level,
                    P.PUBCOMP,
                    packet_id,
                    0x92 if self.conn.level == P.MQTT_5 else 0,
                )
            )
            return
        self.conn.session.received.discard(packet_id)
        self.conn.session.save(
            lambda: self.conn.send(P.encode_ack(self.conn.level, P.PUBCOMP, packet_id))
        )

    def amqp_publish(
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
        self.conn.to_amqp(
            F.publish(1, EXCHANGE, routing_key.encode(), properties, payload, self.conn.frame_max)
        )

    def _properties(self, packet: P.Publish) -> bytes:
        """The content header's properties of a PUBLISH: those of a message
        with no 5.0 properties are the same bytes for every one alike (kept)."""
        publisher = self.conn.client_id if self.subscriptions.no_local else None
        if packet.properties:
            props = M.amqp_properties(packet.qos, packet.properties, packet.retain, publisher)
            return F.properties_bytes(props)
        key = (packet.qos, packet.retain, publisher)
        known = self.known_properties.get(key)
        if known is None:
            known = _ANYONES_PROPERTIES.get(key) if publisher is None else None
            if known is None:
                props = M.amqp_properties(packet.qos, {}, packet.retain, publisher)
                known = F.properties_bytes(props)
                if publisher is None:
                    _ANYONES_PROPERTIES[key] = known
            self.known_properties[key] = known
        return known

    def publish_will(self, will: P.Will) -> None:
        props = M.amqp_properties(will.qos, will.properties)  # (5.0: its will properties)
        self.amqp_publish(M.mqtt_to_amqp(will.topic), will.payload, F.properties_bytes(props))

    def confirmed_at_once(self, channel: int, tag: int) -> bool:
        """The inner connection's confirms (its confirm_sink), taken without
        a basic.ack frame to write and read back, unless something it wrote
        earlier is still unread (they would be overtaken): a device's PUBACK
        then leaves in the write of the read that published, not two loop
        callbacks later (issue 41's fan-in)."""
        if channel != 1 or self.conn.amqp_out or self.conn.closed:
            return False
        self.confirmed(tag, True, True)
        return True

    def confirmed(self, tag: int, multiple: bool, ack: bool) -> None:
        if multiple:
            # In ascending order as inserted (confirm_seq only grows): the
            # run up to `tag` is a prefix, not a scan of all outstanding.
            seqs = []
            for seq in self.confirms:
                if seq > tag:
                    break
                seqs.append(seq)
        else:
            seqs = [tag]
        for seq in seqs:
            got = self.confirms.pop(seq, None)
            if got is None:
                continue
            waiting, retain = got
            if ack and retain is not None:
                kept = self.conn.ask(retain)
                if waiting is not None:  # acked once the retained message is on disk too
                    kept.add_done_callback(functools.partial(self._retained, *waiting))
                continue
            if waiting is None:
                continue
            kind, packet_id = waiting
            if not ack:  # the broker could not take it: the client sends it again
                self.qos2_publishing.discard(packet_id)
                if self.conn.level == P.MQTT_5:
                    self.conn.send(P.encode_ack(self.conn.level, kind, packet_id, 0x80))
                    continue
                self.conn.disconnect(0x80)
                return
            self._acked(kind, packet_id)

    def _acked(self, kind: int, packet_id: int) -> None:
        if kind == P.PUBACK:
            self.conn.send(_PUBACK_HEAD + packet_id.to_bytes(2, "big"))
        elif kind == P.PUBREC:
            self._pubrec(packet_id)
        else:
            self.conn.send(P.encode_ack(self.conn.level, kind, packet_id))

    def _retained(self, kind: int, packet_id: int, kept: asyncio.Future[ipc.Ok]) -> None:
        """A retained publish's ack, once the scheduler wrote it. If it could
        not (or a new scheduler lost the request), the message itself was
        confirmed: acked all the same, the loss said in the log."""
        if self.conn.closed:
            return
        if kept.cancelled() or kept.exception() is not None:
            log.error("mqtt client %s: retained message not kept", self.conn.client_id)
        self._acked(kind, packet_id)
