"""An MQTT client's subscriptions as queues and bindings (issue 41):
SUBSCRIBE and UNSUBSCRIBE, and which subscriptions a delivery matched.

    a filter at QoS q    the session's queue mqtt-subscription-<id>qos<q>
                         (RabbitMQ's names; qos2 is Shoal's: RabbitMQ grants 1),
                         bound to amq.topic with the filter as binding key
    $share/group/filter  (5.0 4.8.2, also taken from 3.1.1 clients, as mosquitto
                         does) the group's queue mqtt-shared-<group>/<filter>,
                         shared by its members' consumers (one message to one
                         member); it lasts while a member is subscribed
                         (auto-delete), like a shared subscription of the spec

A session's subscriptions and their options (QoS, 5.0's subscription
identifier, no local, retain as published) are in its state
(workers/mqtt_session.py): a persistent session's outlive the connection, and
a returning client's queues are consumed again at once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp.x_arguments import MAX_EXPIRY
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.topics import matches, shared, valid_filter
from shoal.workers._wire import filter_topics
from shoal.workers.mqtt_client import MqttClient
from shoal.workers.mqtt_inner import Declares, refusal_code
from shoal.workers.mqtt_session import Subscribed

if TYPE_CHECKING:
    from shoal.shm.processes import Header
    from shoal.shm.queue_catalog import QueueCatalog
    from shoal.shm.subscribe_barrier import SubscribeBarrier
    from shoal.workers.routes import Routes

MAX_QUEUE_NAME = 255
# SUBACK failure codes: (3.1.1, 5.0)
INVALID_FILTER = (0x80, 0x8F)
NOT_AUTHORIZED = (0x80, 0x87)


class Subscriptions:
    __slots__ = (
        "barrier",
        "binding",
        "catalog",
        "conn",
        "consumed",
        "declares",
        "header",
        "held_topics",
        "narrowing",
        "no_local",
        "routes",
        "version",
    )

    def __init__(
        self,
        conn: MqttClient,
        catalog: QueueCatalog,
        routes: Routes,
        barrier: SubscribeBarrier,
        header: Header,
    ) -> None:
        self.conn = conn
        self.header = header  # H_RETAINED: whether a new subscription asks for retained ones
        self.barrier = barrier  # others' publishes read during a SUBSCRIBE wait for its binds
        self.binding = 0  # the barrier's token of the SUBSCRIBE under way (0: none)
        self.narrowing: int | None = None  # its filters' topic bits, for the read's end
        # Held for others' SUBSCRIBEs (hold_for_subscribes): the topic bits of
        # the reads held, which they wait for (None: not held for them).
        self.held_topics: int | None = None
        self.catalog = catalog  # which queues exist (a session's earlier ones)
        self.routes = routes
        self.consumed: dict[str, int] = {}  # queue -> the QoS it is consumed with
        self.declares = Declares(conn)  # (channel 2: a refused declare leaves channel 1)
        self.no_local = False  # any no-local subscription: this client's publishes say who
        # Bumped by every change to the filters or the queues consumed: what
        # was planned for deliveries before (workers/mqtt_outbound.py) is stale.
        self.version = 0

    @property
    def filters(self) -> dict[str, Subscribed]:
        return self.conn.session.state.subscriptions

    def queue_for(self, topic_filter: str, qos: int) -> str:
        """RabbitMQ's name for a session's queue; a shared subscription's
        group queue. A clean session's are its connection's own (their names
        end in its id): an older connection of the client id, being taken
        over, may still hold its exclusive queues when this one declares."""
        conn = self.conn
        group = shared(topic_filter)
        if group is not None:
            name = f"mqtt-shared-{group[0]}/{group[1]}"  # (a group name has no '/')
            if len(name.encode()) > MAX_QUEUE_NAME:
                name = "mqtt-shared-" + hashlib.sha256(topic_filter.encode()).hexdigest()
            return name
        name = f"mqtt-subscription-{conn.client_id}qos{qos}"
        return name if conn.persistent else f"{name}-{conn.conn_id:x}"

    def resume(self, then: Callable[[], None]) -> None:
        """A returning session's queues consumed again (what came while it
        was away is delivered), and its shared groups joined again."""
        self.no_local = any(sub.no_local for sub in self.filters.values())
        self.version += 1
        steps = list(self.filters.items())

        def next_step() -> None:
            if not steps:
                then()
                return
            topic_filter, sub = steps.pop(0)
            # Bound again: the queue may have gone (a group's, or one that
            # expired before the session's file did) and been declared anew.
            self._consume(
                sub.queue,
                sub.qos,
                lambda: self._unbind_legacy(topic_filter, sub.queue, next_step),
                bind=topic_filter,
            )

        next_step()

    def delete_session_queues(self, then: Callable[[], None]) -> None:
        """The persistent session's queues deleted, one after another; then
        `then`. A clean start's earlier session, a session that expired while
        its queues lived on, or one that ends with its connection (their
        x-expires are the first connection's: matching messages would
        collect in them until then)."""
        # Only those that exist: a device that always starts clean costs no
        # scheduler round trip here (its CONNACK waits for these).
        vhost_id = self.routes.vhost_id(self.conn.vhost)
        names = []
        for qos in (0, 1, 2):
            name = f"mqtt-subscription-{self.conn.client_id}qos{qos}"
            if vhost_id is not None and self.catalog.lookup(name.encode(), vhost_id) is not None:
                names.append(name)

        def next_delete(_reply: Any = None) -> None:
            if names and not self.conn.session.detached:  # (taken over: the newer one's)
                self.conn.call(C.Queue.Delete(queue=names.pop(0)), next_delete)
            else:
                then()

        next_delete()

    def send_retained(self, topic_filter: str, qos: int) -> None:
        """The retained messages `topic_filter` matches, for its new subscription:
        none to ask for while the scheduler keeps none (shm/layout.py H_RETAINED)."""
        if not self.header.retained():
            return
        conn = self.conn
        asked = conn.ask(ipc.RetainedFor(conn.vhost, topic_filter))
        subs = [conn.session.state.subscriptions[topic_filter]]

        def got(future: Any) -> None:
            if conn.closed or future.cancelled() or future.exception() is not None:
                return
            for message in future.result().messages:
                conn.outbound.send_retained(message, qos, subs)

        asked.add_done_callback(got)

    def matching(self, queue: str, topic: str) -> list[Subscribed]:
        """The subscriptions whose queue is `queue` and whose filter matches `topic`."""
        found = []
        for topic_filter, sub in self.filters.items():
            if sub.queue != queue:
                continue
            group = shared(topic_filter)
            if matches(group[1] if group is not None else topic_filter, topic):
                found.append(sub)
        return found

    # ------------------------------------------------------------ SUBSCRIBE
    def subscribe(self, packet: P.Subscribe) -> None:
        conn = self.conn
        level5 = conn.level == P.MQTT_5
        identifier = packet.properties.get("subscription_identifier", [0])[0]
        codes: list[int] = []
        retained: list[tuple[str, int]] = []  # (filter, QoS) to send retained messages for
        steps = list(packet.subscriptions)
        # MQTT-3.8.3-4, for the whole packet before any of its filters takes
        # effect (and while its read's handler can answer the error).
        if any(one.no_local and _is_shared(one.topic_filter) for one in steps):
            raise P.ProtocolError("no local on a shared subscription")
        self.begin()
        # (narrowed at the end of the read: a SUBSCRIBE behind it in the read is not held yet)
        self.narrowing = filters_topics(one.topic_filter for one in steps)

        def subscribed() -> None:
            conn.send(P.encode_suback(conn.level, packet.packet_id, codes))
            for topic_filter, qos in retained:
                self.send_retained(topic_filter, qos)
            conn.serve_held()

        def next_step() -> None:
            if not steps:
                # A SUBSCRIBE read behind this one and held until its SUBACK
                # keeps the barrier, begun before its read: others' publishes
                # read meanwhile wait for its bindings too (gmqtt's shared
                # subscription test lost all of a burst published between).
                if not self._subscribe_held():
                    self.bound()
                # The SUBACK once the session holds the subscriptions on disk
                # (a cluster's followers too): a failover or a restart after
                # it must not forget them (MQTT-3.8.4 lets a matching PUBLISH
                # come first).
                conn.session.save(subscribed)
                return
            one = steps.pop(0)
            try:
                group = shared(one.topic_filter)
            except ValueError:
                group, valid = None, False
            else:
                plain_filter = one.topic_filter if group is None else group[1]
                # (a binding key is an AMQP shortstr: 255 bytes at most)
                valid = valid_filter(plain_filter) and len(plain_filter.encode()) <= 255
            if not valid:
                codes.append(INVALID_FILTER[level5])
                next_step()
                return
            plain = one.topic_filter if group is None else group[1]
            if not conn.may_subscribe(M.mqtt_to_amqp(plain)):  # (RabbitMQ's topic permissions)
                codes.append(NOT_AUTHORIZED[level5])
                next_step()
                return
            queue = self.queue_for(one.topic_filter, one.qos)
            old = self.filters.get(one.topic_filter)
            sub = Subscribed(one.qos, queue, identifier, one.no_local, one.retain_as_published)

            def refused(close: Any) -> None:  # (a queue limit: MQTT-3.9.3's failure)
                codes.append(refusal_code(close, level5))
                next_step()

            def done() -> None:
                self.filters[one.topic_filter] = sub
                self.version += 1
                self.no_local = self.no_local or one.no_local
                codes.append(one.qos)
                # 5.0 retain handling: 0 always, 1 for a new subscription, 2 never;
                # never for a shared subscription (5.0 4.8.2).
                if group is None and (
                    one.retain_handling == 0 or (one.retain_handling == 1 and old is None)
                ):
                    retained.append((one.topic_filter, one.qos))
                next_step()

            if old is not None and old.queue != queue:  # a new QoS for the filter: moved
                # (a refused queue keeps the old subscription: its binding back)
                back = lambda c: self._bind(one.topic_filter, old.queue, lambda: refused(c))  # noqa: E731
                self._unbind(
                    one.topic_filter,
                    old.queue,
                    lambda _r: self._consume(queue, one.qos, done, back, bind=one.topic_filter),
                )
            elif group is not None and old is not None and old.qos != one.qos:
                # the group's queue, consumed anew with or without acks
                conn.call(
                    C.Basic.Cancel(consumer_tag=queue),
                    lambda _r: self._rejoin(queue, one.qos, done),
                )
            else:
                self._consume(queue, one.qos, done, refused, bind=one.topic_filter)

        next_step()

    def begin(self, starts: bool = True) -> None:
        """A SUBSCRIBE is read (`starts`; else a read that only starts like
        one): publishes others' reads take from now on wait for its
        bindings (shm/subscribe_barrier.py)."""
        if not starts:
            self.barrier.unclaimed()
        elif not self.binding:
            self.binding = self.barrier.begin()
        else:  # (one read behind another in this connection: not decoded yet)
            self.barrier.widen(self.binding)

    def narrowed(self) -> None:
        """The end of the read that decoded a SUBSCRIBE under way: others'
        publishes wait for it only where its filters may match their topics
        (shm/subscribe_barrier.py), unless a SUBSCRIBE read behind it waits
        in the connection (not decoded for the barrier: every topic still)."""
        topics, self.narrowing = self.narrowing, None
        if topics is not None and self.binding and not self._subscribe_held():
            self.barrier.narrow(self.binding, topics)

    def held_behind(self) -> None:
        """A SUBSCRIBE is held in the connection behind the one under way:
        the barrier holds every topic for it until it is served."""
        if self.binding:
            self.barrier.widen(self.binding)

    def _subscribe_held(self) -> bool:
        return any(isinstance(p, P.Subscribe) for p in self.conn.held)

    def bound(self) -> None:
        """The SUBSCRIBE's bindings are in place, or it ends with its
        connection: others' publishes go on."""
        if self.binding:
            self.barrier.end(self.binding)
            self.binding = 0

    def _rejoin(self, queue: str, qos: int, then: Callable[[], None]) -> None:
        self.consumed.pop(queue, None)
        self.version += 1
        self._consume(queue, qos, then)

    def _bind(self, topic_filter: str, queue: str, then: Callable[[], None]) -> None:
        self.conn.call(_bind_method(topic_filter, queue), lambda _r: then())

    def _unbind_legacy(self, topic_filter: str, queue: str, then: Callable[[], None]) -> None:
        """A filter with a `.` was bound, before 2d9b621, with the dot as a
        level (RabbitMQ 3.x's mapping): that binding is dropped when its
        session returns, or it would deliver what the filter does not match."""
        group = shared(topic_filter)
        plain = group[1] if group is not None else topic_filter
        legacy = M.legacy_amqp_key(plain)
        if legacy == M.mqtt_to_amqp(plain):
            then()
            return
        unbind = C.Queue.Unbind(queue=queue, exchange=M.EXCHANGE, routing_key=legacy)
        self.conn.call(unbind, lambda _r: then())

    def _unbind(self, topic_filter: str, queue: str, then: Callable[[Any], None]) -> None:
        key = M.mqtt_to_amqp(topic_filter)
        self.conn.call(C.Queue.Unbind(queue=queue, exchange=M.EXCHANGE, routing_key=key), then)

    def _consume(
        self,
        queue: str,
        qos: int,
        then: Callable[[], None],
        refused: Callable[[Any], None] | None = None,
        bind: str | None = None,
    ) -> None:
        """Queue `queue` declared and consumed (once per connection), and
        with `bind` (a topic filter) bound for it, then `then`; a declare or
        its bind refused (its Channel.Close) goes to `refused`, or without it
        (a returning session's queues) ends the connection. A new queue's
        bind follows its declare on channel 2 while channel 1 takes the
        consume: both in one round trip to the scheduler (channel 1 would
        hold the bind behind the consume's)."""
        conn = self.conn
        if queue in self.consumed or conn.closed:  # (closed: a will delay's wait)
            if bind is not None:
                self._bind(bind, queue, then)
            else:
                then()
            return
        self.consumed[queue] = qos
        self.version += 1
        if queue.startswith("mqtt-shared-"):  # every member declares it alike
            declare = C.Queue.Declare(queue=queue, auto_delete=True)
        elif conn.persistent:
            # 5.0: the session ends its expiry interval after its last
            # connection (the queue's x-expires, as RabbitMQ 3.13 does); as
            # its queues were first declared (their arguments cannot change).
            state = conn.session.state
            if state.queue_expires < 0:
                expiry = conn.session_expiry or 0
                never = expiry in (0, 0xFFFFFFFF)
                state.queue_expires = 0 if never else min(expiry * 1000, MAX_EXPIRY)
            arguments: Any = {"x-expires": state.queue_expires} if state.queue_expires else {}
            declare = C.Queue.Declare(queue=queue, durable=True, arguments=arguments)
        else:
            declare = C.Queue.Declare(queue=queue, exclusive=True, auto_delete=True)

        replies = [1 if bind is None else 2]  # the consume's, the bind's

        def answered(_reply: Any) -> None:
            replies[0] -= 1
            if not replies[0]:
                then()

        def declared(_reply: Any) -> None:
            conn.call(C.Basic.Consume(queue=queue, consumer_tag=queue, no_ack=qos == 0), answered)

        def not_done(close: Any) -> None:
            if refused is not None:
                refused(close)
            else:
                conn.disconnect(0x87 if close.reply_code == 403 else 0x80)

        def not_declared(close: Any) -> None:
            self.consumed.pop(queue, None)
            self.version += 1
            not_done(close)

        # (a bind refused after the consume went: the queue stays consumed, unbound)
        follow = None if bind is None else (_bind_method(bind, queue), answered, not_done)
        self.declares.declare(declare, declared, not_declared, follow)

    # ---------------------------------------------------------- UNSUBSCRIBE
    def unsubscribe(self, packet: P.Unsubscribe) -> None:
        conn = self.conn
        filters = list(packet.topic_filters)
        codes: list[int] = []

        def unsubscribed() -> None:
            conn.send(P.encode_unsuback(conn.level, packet.packet_id, codes))
            conn.serve_held()

        def next_step(_reply: Any = None) -> None:
            if not filters:
                conn.session.save(unsubscribed)  # (as the SUBACK: once on disk)
                return
            topic_filter = filters.pop(0)
            sub = self.filters.pop(topic_filter, None)
            self.version += 1
            if sub is None:
                codes.append(0x11)  # no subscription existed
                next_step()
                return
            codes.append(0)
            if sub.queue.startswith("mqtt-shared-"):  # this member leaves; the group stays
                self.consumed.pop(sub.queue, None)
                conn.call(C.Basic.Cancel(consumer_tag=sub.queue), next_step)
            else:
                self._unbind(topic_filter, sub.queue, next_step)

        next_step()


def filters_topics(topic_filters: Iterable[str]) -> int:
    """The subscribe barrier's topic bits of a SUBSCRIBE's filters
    (workers/_barrier.h): a shared one's filter after $share/group/; one
    that is malformed (refused, never bound), none."""
    topics = 0
    for topic_filter in topic_filters:
        try:
            group = shared(topic_filter)
        except ValueError:
            continue
        plain = topic_filter if group is None else group[1]
        if plain and valid_filter(plain):
            topics |= filter_topics(plain.encode())
    return topics


def _bind_method(topic_filter: str, queue: str) -> C.Queue.Bind:
    """The queue.bind of `topic_filter` (its group's filter, if shared) to `queue`."""
    group = shared(topic_filter)
    key = M.mqtt_to_amqp(group[1] if group is not None else topic_filter)
    return C.Queue.Bind(queue=queue, exchange=M.EXCHANGE, routing_key=key)


def _is_shared(topic_filter: str) -> bool:
    """A shared subscription's filter ($share/group/...; a malformed one is
    not, and gets its own code)."""
    try:
        return shared(topic_filter) is not None
    except ValueError:
        return False


SUBSCRIBE_POLL_S = 0.001  # a read held by others' SUBSCRIBEs looks again this often


def hold_for_subscribes(conn: Any, since_ns: int, topics: int) -> None:
    """Another client's SUBSCRIBE, read before this read, is under way
    (shm/subscribe_barrier.py) and may match the read's `topics`: this
    read's packets and the next wait, as during a SUBSCRIBE of its own,
    until no SUBSCRIBE read before it that may match them or the next
    reads' topics (Subscriptions.held_topics) is under way."""
    conn.busy = True
    conn.subscriptions.held_topics = topics
    conn.ctx.loop.call_later(SUBSCRIBE_POLL_S, poll_subscribes, conn, since_ns)


def poll_subscribes(conn: Any, since_ns: int) -> None:
    if conn.closed:
        return
    topics = conn.subscriptions.held_topics
    if conn.ctx.subscribe_barrier.holds(since_ns, time.monotonic_ns(), topics):
        conn.ctx.loop.call_later(SUBSCRIBE_POLL_S, poll_subscribes, conn, since_ns)
    else:
        conn.subscriptions.held_topics = None
        conn.serve_held()
