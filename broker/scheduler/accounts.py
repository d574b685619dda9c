"""Users, virtual hosts and permissions in the scheduler (issue 16, items
1-3; the rules are broker/amqp/access.py): `shoal ctl`'s requests through
the control socket (introspect.py, control.py), journaled with the
definitions so that every IO worker checks logins and methods against what
is current, and kept in the durable definitions.

Deleting a virtual host removes its queues (and their messages), then its
exchanges, bindings, policies, limits and permissions, and closes its
connections; deleting a user closes theirs (RabbitMQ does both)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from shoal.broker import ipc
from shoal.broker.amqp import access
from shoal.broker.amqp import definitions as D
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.state import QueueState, SchedulerState

log = logging.getLogger("shoal.scheduler")

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


class Accounts:
    """Users, vhosts, their limits and permissions: one handler per
    control request (scheduler.py's table points at them)."""

    def __init__(
        self, state: SchedulerState, journal: Journal, remove_queue: Callable[[QueueState], None]
    ) -> None:
        self.state = state
        self._journal = journal.journal
        self._remove_queue = remove_queue
        self.last_vhost_id = -1  # the highest vhost id given since this start

    # ------------------------------------------------------------- users
    def add_user(self, r: C.AddUser) -> C.Ok:
        user = r.user
        if not user:
            raise access.AccessError("a user name cannot be empty")
        if user in self.state.definitions.users:
            raise access.AccessError(f'User "{user}" already exists')
        password_hash = r.password_hash if r.password_hash is not msgspec.UNSET else None
        if password_hash is None:
            password_hash = access.hash_password(r.password) if r.password else ""
        algorithm = r.hashing_algorithm or access.SHA256
        tags = access.check_tags(names(r.tags))
        self._journal(D.UserSet(user, password_hash, algorithm, tags, {}))
        log.info("user %r added", user)
        return C.OK

    def _user(self, user: str, quoted: bool = True) -> D.UserSet:
        record = self.state.definitions.users.get(user)
        if record is None:  # rabbitmqctl quotes the name in some texts only
            raise access.AccessError(
                f'User "{user}" does not exist' if quoted else f"User {user} does not exist", 67
            )
        return record

    def delete_user(self, r: C.DeleteUser) -> C.Ok:
        record = self._user(r.user)
        self._journal(D.UserDeleted(record.user))
        log.info("user %r deleted", record.user)
        self._disconnect(user=record.user, text=f"user '{record.user}' is deleted")
        return C.OK

    def change_password(self, r: C.ChangePassword) -> C.Ok:
        record = self._user(r.user)
        new_hash = access.hash_password(r.password) if r.password else ""
        self._journal(D.UserSet(record.user, new_hash, access.SHA256, record.tags, record.limits))
        return C.OK

    def clear_password(self, r: C.ClearPassword) -> C.Ok:
        record = self._user(r.user)
        self._journal(
            D.UserSet(record.user, "", record.hashing_algorithm, record.tags, record.limits)
        )
        return C.OK

    def authenticate_user(self, r: C.AuthenticateUser) -> C.Authenticated:
        record = self._user(r.user)
        if not access.password_matches(record.password_hash, record.hashing_algorithm, r.password):
            raise access.AccessError(
                f'Error: failed to authenticate user "{record.user}"\n'
                f"user '{record.user}' - invalid credentials",
                65,
            )
        return C.Authenticated(tags=record.tags)

    def set_user_tags(self, r: C.SetUserTags) -> C.Ok:
        record = self._user(r.user)
        tags = access.check_tags(names(r.tags))
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, tags, record.limits
            )
        )
        return C.OK

    def set_user_limits(self, r: C.SetUserLimits) -> C.Ok:
        record = self._user(r.user)
        limits = checked_limits(record.limits, r.limits or {}, USER_LIMITS)
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, record.tags, limits
            )
        )
        return C.OK

    def clear_user_limits(self, r: C.ClearUserLimits) -> C.Ok:
        record = self._user(r.user)
        name = r.limit
        kept = {} if name in ("", "all") else record.limits
        limits = {k: v for k, v in kept.items() if k != name}
        self._journal(
            D.UserSet(
                record.user, record.password_hash, record.hashing_algorithm, record.tags, limits
            )
        )
        return C.OK

    def list_users(self, r: C.ListUsers) -> C.Rows:
        return C.Rows(
            [
                {
                    "user": u.user,
                    "tags": u.tags,
                    "password_hash": u.password_hash,
                    "hashing_algorithm": u.hashing_algorithm,
                    "limits": u.limits,
                }
                for u in self.state.definitions.users.values()
            ]
        )

    # ------------------------------------------------------------ vhosts
    def vhost(self, r: C.InVhost) -> str:
        """The request's vhost (the default one if it names none), which
        must exist."""
        vhost = r.in_vhost(self.state.vhost)
        if vhost not in self.state.definitions.vhost_ids:
            raise access.AccessError(f"Virtual host {vhost} does not exist", 69)
        return vhost

    def add_vhost(self, r: C.AddVhost) -> C.Ok:
        vhost = r.vhost
        if not vhost:
            raise access.AccessError("a virtual host name cannot be empty")
        if vhost in self.state.definitions.vhost_ids:
            return C.OK  # as rabbitmqctl 3.10: adding an existing vhost succeeds
        self.add(vhost)
        log.info("vhost %r added", vhost)
        return C.OK

    def add(self, vhost: str) -> None:
        """A new vhost, with its amq.* exchanges."""
        for op in D.new_vhost_ops(vhost, self._next_vhost_id()):
            self._journal(op)

    def _next_vhost_id(self) -> int:
        """Never one a vhost deleted since this start had: a connection
        still closing may hold it (queue lookups are by vhost id)."""
        ids = self.state.definitions.vhost_ids.values()
        self.last_vhost_id = max(max(ids, default=-1), self.last_vhost_id) + 1
        return self.last_vhost_id

    def delete_vhost(self, r: C.DeleteVhost) -> C.Ok:
        vhost = r.vhost
        state = self.state
        if vhost not in state.definitions.vhost_ids:
            raise access.AccessError(f"Virtual host '{vhost}' does not exist", 65)
        for q in list(state.queues.values()):
            if q.vhost == vhost:
                self._remove_queue(q)
        for key in [key for key in state.unrestored if key[0] == vhost]:
            del state.unrestored[key]  # not restored (--max-queues): gone with it
        self._journal(D.VHostDeleted(vhost))
        log.info("vhost %r deleted", vhost)
        self._disconnect(vhost=vhost, text=f"vhost '{vhost}' is down")
        return C.OK

    def list_vhosts(self, r: C.ListVhosts) -> C.Rows:
        definitions = self.state.definitions
        return C.Rows(
            [
                {
                    "name": vhost,
                    "limits": definitions.vhost_limits.get(vhost, {}),
                    "tracing": vhost in definitions.tracing,
                }
                for vhost in definitions.vhost_ids
            ]
        )

    def trace(self, r: C.TraceOn | C.TraceOff) -> C.Ok:
        """The firehose on or off (workers/firehose.py). rabbitmqctl takes a
        vhost that does not exist too: so does this, changing nothing."""
        vhost, on = r.in_vhost(self.state.vhost), isinstance(r, C.TraceOn)
        definitions = self.state.definitions
        if vhost in definitions.vhost_ids and (vhost in definitions.tracing) != on:
            self._journal(D.TracingSet(vhost, on))
            log.info("tracing %s for vhost %r", "enabled" if on else "disabled", vhost)
        return C.OK

    def set_vhost_limits(self, r: C.SetVhostLimits) -> C.Ok:
        vhost = self.vhost(r)
        current = self.state.definitions.vhost_limits.get(vhost, {})
        limits = checked_limits(current, r.limits or {}, VHOST_LIMITS)
        self._journal(D.VHostLimitsSet(vhost, limits))
        return C.OK

    def clear_vhost_limits(self, r: C.ClearVhostLimits) -> C.Ok:
        vhost = self.vhost(r)
        self._journal(D.VHostLimitsSet(vhost, {}))
        return C.OK

    # ------------------------------------------------------- permissions
    def set_permissions(self, r: C.SetPermissions) -> C.Ok:
        vhost, user = self.vhost(r), self._user(r.user, quoted=False).user
        patterns = [access.check_pattern(p) for p in (r.configure, r.write, r.read)]
        self._journal(D.PermissionSet(vhost, user, *patterns))
        return C.OK

    def clear_permissions(self, r: C.ClearPermissions) -> C.Ok:
        vhost, user = self.vhost(r), self._user(r.user, quoted=False).user
        self._journal(D.PermissionCleared(vhost, user))
        return C.OK

    def list_permissions(self, r: C.ListPermissions) -> C.Rows:
        """Of a user (given one), else of a vhost."""
        return C.Rows(self._rows(r, r.user, self.state.definitions.permissions.values()))

    def _rows(
        self, r: C.InVhost, user: str, records: Iterable[D.Operation]
    ) -> list[dict[str, Any]]:
        vhost = None if user else self.vhost(r)
        return [
            msgspec.structs.asdict(p)
            for p in records
            if p.vhost == vhost or getattr(p, "user", None) == user
        ]

    def set_topic_permissions(self, r: C.SetTopicPermissions) -> C.Ok:
        vhost, user = self.vhost(r), self._user(r.user, quoted=False).user
        if not r.exchange:
            raise access.AccessError("a topic permission names an exchange")
        write, read = (access.check_pattern(p) for p in (r.write, r.read))
        self._journal(D.TopicPermissionSet(vhost, user, r.exchange, write, read))
        return C.OK

    def clear_topic_permissions(self, r: C.ClearTopicPermissions) -> C.Ok:
        vhost, user = self.vhost(r), self._user(r.user, quoted=False).user
        self._journal(D.TopicPermissionCleared(vhost, user, r.exchange))
        return C.OK

    def list_topic_permissions(self, r: C.ListTopicPermissions) -> C.Rows:
        named = self.state.definitions.topic_permissions.values()
        return C.Rows(self._rows(r, r.user, (p for rules in named for p in rules.values())))

    def _disconnect(self, text: str, vhost: str = "", user: str = "") -> None:
        """Close the matching connections on every worker (320)."""
        self.state.send_all(ipc.Disconnect(vhost, user, 0, text))


def names(value: list[str] | str | None) -> list[str]:
    """A list of names as a request gives it: a list, or one string of
    names separated by commas or spaces."""
    if isinstance(value, str):
        return value.replace(",", " ").split()
    return value or []


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
