"""Users, virtual hosts and permissions in the scheduler (issue 16, items
1-3; the rules are broker/amqp/access.py): `shoal ctl`'s requests through
the control socket (introspect.py), journaled with the definitions so that
every IO worker checks logins and methods against what is current, and
kept in the durable definitions.

Deleting a virtual host removes its queues (and their messages), then its
exchanges, bindings, policies, limits and permissions, and closes its
connections; deleting a user closes theirs (RabbitMQ does both)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgspec

from shoal.broker import ipc
from shoal.broker.amqp import access, errors
from shoal.broker.amqp import definitions as D
from shoal.broker.scheduler.policies import Policies

log = logging.getLogger("shoal.scheduler")

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


class Access(Policies):
    # The control requests answered by a method of that name (those of the
    # layers above are added there).
    CONTROL_REQUESTS: frozenset[str] = frozenset()

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A user, vhost or permission request ({"op": ..., ...}), else
        the policies' (policies.py)."""
        op = str(request.get("op"))
        if op not in self.CONTROL_REQUESTS:
            return super().control(request)
        try:
            answer = getattr(self, op)(ControlRequest(request))
        except (access.AccessError, errors.AMQPError, TypeError, ValueError) as exc:
            text = getattr(exc, "reply_text", None) or str(exc)
            return {"error": text, "code": getattr(exc, "code", 70)}
        return answer if answer is not None else {"ok": True}

    # ------------------------------------------------------------- users
    def add_user(self, r: ControlRequest) -> None:
        user = r.text("user")
        if not user:
            raise access.AccessError("a user name cannot be empty")
        if user in self.definitions.users:
            raise access.AccessError(f'User "{user}" already exists')
        password = r.text("password")
        password_hash = r.text("password_hash") if "password_hash" in r.fields else None
        if password_hash is None:
            password_hash = access.hash_password(password) if password else ""
        algorithm = r.text("hashing_algorithm") or access.SHA256
        tags = access.check_tags(r.list("tags"))
        self._journal(D.UserSet(user, password_hash, algorithm, tags, {}))
        log.info("user %r added", user)

    def _user(self, r: ControlRequest, quoted: bool = True) -> D.UserSet:
        user = r.text("user")
        record = self.definitions.users.get(user)
        if record is None:  # rabbitmqctl quotes the name in some texts only
            raise access.AccessError(
                f'User "{user}" does not exist' if quoted else f"User {user} does not exist", 67
            )
        return record

    def delete_user(self, r: ControlRequest) -> None:
        record = self._user(r)
        self._journal(D.UserDeleted(record.user))
        log.info("user %r deleted", record.user)
        self._disconnect(user=record.user, text=f"user '{record.user}' is deleted")

    def change_password(self, r: ControlRequest) -> None:
        record = self._user(r)
        password = r.text("password")
        new_hash = access.hash_password(password) if password else ""
        self._journal(D.UserSet(record.user, new_hash, access.SHA256, record.tags, record.limits))

    def clear_password(self, r: ControlRequest) -> None:
        record = self._user(r)
        self._journal(
            D.UserSet(record.user, "", record.hashing_algorithm, record.tags, record.limits)
        )

    def authenticate_user(self, r: ControlRequest) -> dict[str, Any]:
        record = self._user(r)
        if not access.password_matches(
            record.password_hash, record.hashing_algorithm, r.text("password")
        ):
            raise access.AccessError(
                f'Error: failed to authenticate user "{record.user}"\n'
                f"user '{record.user}' - invalid credentials",
                65,
            )
        return {"ok": True, "tags": record.tags}

    def set_user_tags(self, r: ControlRequest) -> None:
        record = self._user(r)
        tags = access.check_tags(r.list("tags"))
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, tags, record.limits
            )
        )

    def set_user_limits(self, r: ControlRequest) -> None:
        record = self._user(r)
        limits = checked_limits(record.limits, r.dict("limits"), USER_LIMITS)
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, record.tags, limits
            )
        )

    def clear_user_limits(self, r: ControlRequest) -> None:
        record = self._user(r)
        name = r.text("limit")
        kept = {} if name in ("", "all") else record.limits
        limits = {k: v for k, v in kept.items() if k != name}
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, record.tags, limits
            )
        )

    def list_users(self, r: ControlRequest) -> dict[str, Any]:
        return {
            "rows": [
                {
                    "user": u.user,
                    "tags": u.tags,
                    "password_hash": u.password_hash,
                    "hashing_algorithm": u.hashing_algorithm,
                    "limits": u.limits,
                }
                for u in self.definitions.users.values()
            ]
        }

    # ------------------------------------------------------------ vhosts
    def _vhost(self, r: ControlRequest) -> str:
        vhost = r.text("vhost", self.vhost)
        if vhost not in self.definitions.vhost_ids:
            raise access.AccessError(f"Virtual host {vhost} does not exist", 69)
        return vhost

    def add_vhost(self, r: ControlRequest) -> None:
        vhost = r.text("vhost")
        if not vhost:
            raise access.AccessError("a virtual host name cannot be empty")
        if vhost in self.definitions.vhost_ids:
            return  # as rabbitmqctl 3.10: adding an existing vhost succeeds
        for op in D.new_vhost_ops(vhost, self._next_vhost_id()):
            self._journal(op)
        log.info("vhost %r added", vhost)

    def _next_vhost_id(self) -> int:
        """Never one a vhost deleted since this start had: a connection
        still closing may hold it (queue lookups are by vhost id)."""
        ids = self.definitions.vhost_ids.values()
        self.last_vhost_id = max(max(ids, default=-1), getattr(self, "last_vhost_id", -1)) + 1
        return self.last_vhost_id

    def delete_vhost(self, r: ControlRequest) -> None:
        vhost = r.text("vhost")
        if vhost not in self.definitions.vhost_ids:
            raise access.AccessError(f"Virtual host '{vhost}' does not exist", 65)
        for q in list(self.queues.values()):
            if q.vhost == vhost:
                self._remove_queue(q)
        for key in [key for key in self.unrestored if key[0] == vhost]:
            del self.unrestored[key]  # not restored (--max-queues): gone with it
        self._journal(D.VHostDeleted(vhost))
        log.info("vhost %r deleted", vhost)
        self._disconnect(vhost=vhost, text=f"vhost '{vhost}' is down")

    def list_vhosts(self, r: ControlRequest) -> dict[str, Any]:
        limits = self.definitions.vhost_limits
        return {
            "rows": [
                {"name": vhost, "limits": limits.get(vhost, {})}
                for vhost in self.definitions.vhost_ids
            ]
        }

    def set_vhost_limits(self, r: ControlRequest) -> None:
        vhost = self._vhost(r)
        current = self.definitions.vhost_limits.get(vhost, {})
        limits = checked_limits(current, r.dict("limits"), VHOST_LIMITS)
        self._journal(D.VHostLimitsSet(vhost, limits))

    def clear_vhost_limits(self, r: ControlRequest) -> None:
        vhost = self._vhost(r)
        self._journal(D.VHostLimitsSet(vhost, {}))

    # ------------------------------------------------------- permissions
    def set_permissions(self, r: ControlRequest) -> None:
        vhost, user = self._vhost(r), self._user(r, quoted=False).user
        patterns = [access.check_pattern(r.text(k)) for k in ("configure", "write", "read")]
        self._journal(D.PermissionSet(vhost, user, *patterns))

    def clear_permissions(self, r: ControlRequest) -> None:
        vhost, user = self._vhost(r), self._user(r, quoted=False).user
        self._journal(D.PermissionCleared(vhost, user))

    def list_permissions(self, r: ControlRequest) -> dict[str, Any]:
        """Of a user (given one), else of a vhost."""
        return {"rows": self._rows(r, self.definitions.permissions.values())}

    def _rows(self, r: ControlRequest, records: Iterable[D.Operation]) -> list[dict[str, Any]]:
        user = r.text("user")
        vhost = None if user else self._vhost(r)
        return [
            msgspec.structs.asdict(p)
            for p in records
            if p.vhost == vhost or getattr(p, "user", None) == user
        ]

    def set_topic_permissions(self, r: ControlRequest) -> None:
        vhost, user = self._vhost(r), self._user(r, quoted=False).user
        exchange = r.text("exchange")
        if not exchange:
            raise access.AccessError("a topic permission names an exchange")
        write, read = (access.check_pattern(r.text(k)) for k in ("write", "read"))
        self._journal(D.TopicPermissionSet(vhost, user, exchange, write, read))

    def clear_topic_permissions(self, r: ControlRequest) -> None:
        vhost, user = self._vhost(r), self._user(r, quoted=False).user
        self._journal(D.TopicPermissionCleared(vhost, user, r.text("exchange")))

    def list_topic_permissions(self, r: ControlRequest) -> dict[str, Any]:
        named = self.definitions.topic_permissions.values()
        return {"rows": self._rows(r, (p for rules in named for p in rules.values()))}

    # ------------------------------------------------------- connections
    def _connection_opened(self, worker: int, m: ipc.ConnOpen) -> list[Any]:
        if m.vhost not in self.definitions.vhost_ids:  # deleted since the worker looked
            raise errors.ConnectionError_(errors.NOT_ALLOWED, f"vhost {m.vhost} not found", 10, 40)
        if m.check:
            self._check_connection_limits(m.vhost, m.user)
        self.client_connections[m.conn_id] = (m.vhost, m.user)
        return []

    def _check_connection_limits(self, vhost: str, user: str) -> None:
        """RabbitMQ's 530s for a connection over the vhost's or the user's
        max-connections."""
        opened = self.client_connections.values()
        limit = self.definitions.vhost_limits.get(vhost, {}).get("max-connections")
        if limit is not None and sum(1 for v, _u in opened if v == vhost) >= limit:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED,
                f"access to vhost '{vhost}' refused for user '{user}': connection limit "
                f"({limit}) is reached",
                10,
                40,
            )
        record = self.definitions.users.get(user)
        limit = record.limits.get("max-connections") if record is not None else None
        if limit is not None and sum(1 for _v, u in opened if u == user) >= limit:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED,
                f"connection refused for user '{user}': user connection limit ({limit}) is reached",
                10,
                40,
            )

    def _connection_closed(self, conn_id: int) -> None:
        super()._connection_closed(conn_id)
        self.client_connections.pop(conn_id, None)

    def _known_connections(self, worker: int, connections: list[tuple[int, str, str]]) -> None:
        """A worker's HELLO (or its death, with none): its connections now.
        Its channel counts start again from its next report."""
        for conn_id in [c for c in self.client_connections if c >> 40 == worker]:
            del self.client_connections[conn_id]
        for conn_id, vhost, user in connections:
            self.client_connections[conn_id] = (vhost, user)
        self._channel_counts(worker, {u: 0 for u, by in self.user_channels.items() if worker in by})

    def _channel_counts(self, worker: int, counts: dict[str, int]) -> None:
        """A worker's channels per user (ipc.ChannelCounts): the totals that
        changed go to every worker, which check users' max-channels limits
        against them (eventually consistent, as RabbitMQ's tracking is)."""
        changed: dict[str, int] = {}
        for user, count in counts.items():
            by_worker = self.user_channels.get(user, {})
            if by_worker.get(worker, 0) == count:
                continue
            self.user_channels[user] = by_worker
            if count:
                by_worker[worker] = count
            else:
                by_worker.pop(worker, None)
            changed[user] = sum(by_worker.values())
            if not by_worker:
                del self.user_channels[user]
        if changed:
            for link in self.links.values():
                link.send(ipc.ChannelTotals(changed))

    def _channel_totals(self) -> dict[str, int]:
        """Every user's channels over all workers (a HELLO's snapshot)."""
        return {user: sum(by.values()) for user, by in self.user_channels.items()}

    def _disconnect(self, text: str, vhost: str = "", user: str = "") -> None:
        """Close the matching connections on every worker (320)."""
        for link in self.links.values():
            link.send(ipc.Disconnect(vhost, user, 0, text))


class ControlRequest:
    """A control request's fields, typed as they are read."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def text(self, key: str, default: str = "") -> str:
        value = self.fields.get(key, default)
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a string")
        return value

    def list(self, key: str) -> list[str]:
        value = self.fields.get(key) or []
        if isinstance(value, str):
            value = value.replace(",", " ").split()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{key} must be a list of strings")
        return value

    def flag(self, key: str) -> bool:
        return self.fields.get(key) is True

    def dict(self, key: str) -> dict[str, Any]:
        value = self.fields.get(key) or {}
        if not isinstance(value, dict):
            raise TypeError(f"{key} must be a JSON object")
        return value


def checked_limits(
    current: dict[str, int], given: dict[str, Any], known: tuple[str, ...]
) -> dict[str, int]:
    """`current` limits with those `given`, as RabbitMQ takes them: known
    names, integers; a negative one removes the limit."""
    limits = dict(current)
    for name, value in given.items():
        if name not in known:
            raise access.AccessError(f"unknown limit {name!r} (known: {', '.join(known)})")
        if not isinstance(value, int) or isinstance(value, bool):
            raise access.AccessError(f"limit {name!r} must be an integer")
        limits[name] = value
    return {k: v for k, v in limits.items() if v >= 0}


Access.CONTROL_REQUESTS = frozenset(
    (
        "add_user",
        "delete_user",
        "change_password",
        "clear_password",
        "authenticate_user",
        "set_user_tags",
        "set_user_limits",
        "clear_user_limits",
        "list_users",
        "add_vhost",
        "delete_vhost",
        "list_vhosts",
        "set_vhost_limits",
        "clear_vhost_limits",
        "set_permissions",
        "clear_permissions",
        "list_permissions",
        "set_topic_permissions",
        "clear_topic_permissions",
        "list_topic_permissions",
    )
)
