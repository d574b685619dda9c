"""What a connection's user may do in its virtual host (issue 16, item 3):
RabbitMQ's access-control table, checked by the channel before a method
goes anywhere (broker/amqp/access.py has the rules and texts).

The permissions are read from the worker's replay of the definitions
journal (workers/routes.py), so a change applies to connections already
open from their next read of the socket (the connection looks at the
journal once per read: one atomic load). A decision is cached per
(permission, kind, name) until the definitions change: the publish path
pays one dict lookup."""

from __future__ import annotations

from shoal.broker.amqp import access, properties
from shoal.broker.amqp.access import CONFIGURE, READ, WRITE
from shoal.workers.routes import Routes

__all__ = ["CONFIGURE", "READ", "WRITE", "ConnectionAccess"]

CACHE_MAX = 1024


class ConnectionAccess:
    __slots__ = (
        "_decided",
        "_published",
        "_topics",
        "_version",
        "routes",
        "tracing",
        "user",
        "vhost",
    )

    def __init__(self, routes: Routes, user: str, vhost: str) -> None:
        self.routes = routes
        self.user = user
        self.vhost = vhost
        self._version = -1
        self._decided: dict[tuple[str, str, str], bool] = {}
        self._published: dict[bytes, bool] = {}  # exchange -> write granted
        self._topics = False  # the user has topic permissions in this vhost
        # The vhost's firehose is on (workers/firehose.py): read here, with the
        # journal, so that the paths that trace read one attribute.
        self.tracing = False
        self._fresh()  # current at once: the first read's publishes are checked too

    def refresh(self) -> None:
        """The definitions journal again (one atomic load when nothing
        changed): the connection calls it once per read of its socket, so
        the publish path need not (a change applies from the next read)."""
        self._fresh()

    def _fresh(self) -> None:
        routes = self.routes
        routes.sync()
        if routes.access_version != self._version:
            self._version = routes.access_version
            self._decided.clear()
            self._published.clear()
            definitions = routes.definitions
            topics = definitions.topic_permissions
            self._topics = bool(topics) and (self.vhost, self.user) in topics
            self.tracing = self.vhost in definitions.tracing

    def allowed(self, permission: str, kind: str, name: str) -> bool:
        self._fresh()
        key = (permission, kind, name)
        granted = self._decided.get(key)
        if granted is None:
            if len(self._decided) >= CACHE_MAX:
                self._decided.clear()
            granted = self._decided[key] = self._decide(permission, kind, name)
        return granted

    def check(self, permission: str, kind: str, name: str) -> None:
        """Raises the 403 if the user may not use the resource that way."""
        if not self.allowed(permission, kind, name):
            raise access.refused(kind, name, self.vhost, self.user)

    def may_publish(self, exchange: bytes, routing_key: bytes | None) -> bool:
        """The publish path's check: write on the exchange, and the topic
        permission of a topic exchange (routing key None: of every key)."""
        # No journal check here: the connection calls refresh() once per read.
        granted = self._published.get(exchange)
        if granted is None:
            if len(self._published) >= CACHE_MAX:
                self._published.clear()
            name = exchange.decode(errors="replace")
            granted = self._published[exchange] = self._decide(WRITE, "exchange", name)
        if not granted:
            return False
        if not self._topics:  # the common case: one dict lookup per publish
            return True
        if routing_key is None:  # (topic permissions decide per key)
            return False
        key = routing_key.decode(errors="replace")
        return self._topic_allows(WRITE, exchange.decode(errors="replace"), key)

    def check_publish(self, exchange: bytes, routing_key: bytes) -> None:
        if self.may_publish(exchange, routing_key):
            return
        name = exchange.decode(errors="replace")
        self.check(WRITE, "exchange", name)
        raise access.topic_refused(
            routing_key.decode(errors="replace"), name, self.vhost, self.user
        )

    def check_user_id(self, raw_header: bytes) -> None:
        """A publish's user-id property, if set, must name this user."""
        record = self.routes.definitions.users.get(self.user)
        access.check_user_id(
            properties.user_id(raw_header), self.user, record.tags if record else []
        )

    def may_bind_topic(self, exchange: str, routing_key: str) -> bool:
        """Whether the user may bind from topic exchange `exchange` with this
        key: read on it, and its topic permission (an MQTT SUBSCRIBE asks
        first, to answer with a SUBACK failure rather than a closed channel)."""
        self._fresh()
        return self.allowed(READ, "exchange", exchange) and self._topic_allows(
            READ, exchange, routing_key
        )

    def check_topic(self, permission: str, exchange: str, routing_key: str) -> None:
        """A binding from a topic exchange (read) is limited by the user's
        topic permissions too."""
        self._fresh()
        if not self._topic_allows(permission, exchange, routing_key):
            raise access.topic_refused(routing_key, exchange, self.vhost, self.user)

    def _decide(self, permission: str, kind: str, name: str) -> bool:
        granted = self.routes.definitions.permissions.get((self.vhost, self.user))
        if granted is None:
            return False
        pattern = getattr(granted, permission)
        return access.permits(pattern, access.resource_name(kind, name))

    def _topic_allows(self, permission: str, exchange: str, routing_key: str) -> bool:
        definitions = self.routes.definitions
        named = definitions.topic_permissions.get((self.vhost, self.user))
        rule = named.get(exchange) if named else None
        if rule is None:
            return True  # no topic permission for this exchange: any key
        router = definitions.vhosts.get(self.vhost)
        x = router.exchanges.get(exchange) if router is not None else None
        if x is None or x.type != "topic":
            return True  # only topic exchanges are checked
        pattern = access.expand_topic_pattern(getattr(rule, permission), self.user, self.vhost)
        return access.permits(pattern, routing_key)
