"""Exchanges and bindings of every virtual host, as a replayable state.

The scheduler changes definitions by operations; each is applied to its own
`Definitions` and journaled in shared memory (shm/catalog.py); IO workers
replay the same operations into theirs and route publishes through it. An
operation is a msgspec Struct, encoded as a msgpack array led by its letter
(its tag), then its fields in order:

    v  VHostAdded         vhost, id: queue records carry the id (shm/layout.py Q_VHOST)
    x  ExchangeDeclared   vhost, name, exchange_type, durable, auto_delete, internal, arguments
    X  ExchangeDeleted    vhost, name: and its bindings, both ways
    b  Bound              vhost, source, kind ("q" or "e"), dest, routing_key, arguments
    u  Unbound            the same fields
    q  QueueArgumentsSet  vhost, queue, arguments: a queue's x-arguments
    Q  QueueGone          vhost, queue: its bindings and arguments go
    p  PolicySet          vhost, name, pattern, apply_to, priority, definition
    P  PolicyCleared      vhost, name
    V  VHostDeleted       vhost: with everything in it (the scheduler removes its queues first)
    l  VHostLimitsSet     vhost, limits: max-connections, max-queues (absent: none)
    r  TracingSet         vhost, on: the firehose (workers/firehose.py); never on disk,
                          as in RabbitMQ a restart turns it off
    w  UserSet            user, password_hash, hashing_algorithm, tags, limits (the whole user)
    W  UserDeleted        user: and their permissions
    a  PermissionSet      vhost, user, configure, write, read (broker/amqp/access.py)
    A  PermissionCleared  vhost, user
    t  TopicPermissionSet vhost, user, exchange, write, read
    T  TopicPermissionCleared  vhost, user, exchange ("": all of the user's in the vhost)

Users and permissions are journaled as the rest, so that every IO worker
checks a login and each method against what is current: a permission
revoked applies to connections already open.

The journal lives only in the shared-memory segment, which a broker creates
afresh when it starts: no other version's records are ever read back.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from typing import Any, TypeVar, Union

import msgspec

from shoal.broker.amqp import policy_rules
from shoal.broker.amqp.routing import Router

DEFAULT_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
# The firehose's exchange (RabbitMQ's rabbit_trace): internal, so only the
# broker publishes to it.
TRACE_EXCHANGE = "amq.rabbitmq.trace"


class Operation(msgspec.Struct, array_like=True, gc=False):
    """Base of every journal record: each belongs to one virtual host.
    gc=False: a record holds strings and an arguments dict, never itself."""

    vhost: str


class VHostAdded(Operation, tag="v"):
    id: int


class ExchangeDeclared(Operation, tag="x"):
    name: str
    exchange_type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


class ExchangeDeleted(Operation, tag="X"):
    name: str


class _Binding(Operation):
    source: str
    kind: str  # "q": dest is a queue, "e": an exchange
    dest: str
    routing_key: str
    arguments: dict[str, Any]


class Bound(_Binding, tag="b"):
    pass


class Unbound(_Binding, tag="u"):
    pass


class QueueArgumentsSet(Operation, tag="q"):
    queue: str
    arguments: dict[str, Any]


class QueueGone(Operation, tag="Q"):
    queue: str


class PolicySet(Operation, tag="p"):
    """An operator's policy (broker/amqp/policy_rules.py), set or replaced."""

    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]


class PolicyCleared(Operation, tag="P"):
    name: str


class VHostDeleted(Operation, tag="V"):
    pass


class ParameterSet(Operation, tag="m"):
    """A runtime parameter of a vhost (RabbitMQ's `set_parameter`): a
    shovel's, the one component Shoal runs (broker/shovel/)."""

    component: str
    name: str
    value: dict[str, Any]


class ParameterCleared(Operation, tag="M"):
    component: str
    name: str


class VHostLimitsSet(Operation, tag="l"):
    limits: dict[str, int]


class TracingSet(Operation, tag="r"):
    on: bool


class UserOperation(msgspec.Struct, array_like=True, gc=False):
    """Base of the records of a user, who belongs to no virtual host."""

    user: str


class UserSet(UserOperation, tag="w"):
    password_hash: str
    hashing_algorithm: str
    tags: list[str]
    limits: dict[str, int]  # max-connections, max-channels (absent: none)


class UserDeleted(UserOperation, tag="W"):
    pass


class PermissionSet(Operation, tag="a"):
    user: str
    configure: str
    write: str
    read: str


class PermissionCleared(Operation, tag="A"):
    user: str


class TopicPermissionSet(Operation, tag="t"):
    user: str
    exchange: str
    write: str
    read: str


class TopicPermissionCleared(Operation, tag="T"):
    user: str
    exchange: str  # "": every exchange


# One journal record (shm/catalog.py decodes into this). A Union, not `A | B`:
# mypy takes it as a type alias.
Op = Union[  # noqa: UP007
    VHostAdded,
    ExchangeDeclared,
    ExchangeDeleted,
    Bound,
    Unbound,
    QueueArgumentsSet,
    QueueGone,
    PolicySet,
    PolicyCleared,
    VHostDeleted,
    VHostLimitsSet,
    UserSet,
    UserDeleted,
    PermissionSet,
    PermissionCleared,
    TopicPermissionSet,
    TopicPermissionCleared,
    ParameterSet,
    ParameterCleared,
    TracingSet,
]
ACCESS_OPS = (
    VHostLimitsSet,
    UserSet,
    UserDeleted,
    PermissionSet,
    PermissionCleared,
    TopicPermissionSet,
    TopicPermissionCleared,
)


def server_named_queue() -> bytes:
    """A name for a queue declared without one (RabbitMQ's form)."""
    return server_generated(b"amq.gen")


def server_generated(prefix: bytes) -> bytes:
    """RabbitMQ's generated names (rabbit_guid:binary): the prefix, '-', 16
    random bytes in URL-safe base64 (amq.gen-..., amq.ctag-...)."""
    return prefix + b"-" + base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=")


def default_exchange_ops(vhost: str) -> list[Op]:
    """The amq.* exchanges every virtual host starts with (durable)."""
    return [
        *(
            ExchangeDeclared(vhost, name, type_, True, False, False, {})
            for name, type_ in DEFAULT_EXCHANGES
        ),
        ExchangeDeclared(vhost, TRACE_EXCHANGE, "topic", True, False, True, {}),
    ]


def missing_default_exchanges(definitions: Definitions) -> list[Op]:
    """The amq.* exchanges a vhost kept by an older version lacks (the
    firehose's came later)."""
    return [
        op
        for vhost, router in definitions.vhosts.items()
        if vhost in definitions.vhost_ids
        for op in default_exchange_ops(vhost)
        if isinstance(op, ExchangeDeclared) and op.name not in router.exchanges
    ]


def new_vhost_ops(vhost: str, vhost_id: int) -> list[Op]:
    """A virtual host: its id, then its amq.* exchanges."""
    return [VHostAdded(vhost, vhost_id), *default_exchange_ops(vhost)]


def inverse(op: Op) -> Op:
    """The operation that undoes a growing change (declare, bind, queue
    arguments); only those can fail to fit in the journal."""
    if isinstance(op, ExchangeDeclared):
        return ExchangeDeleted(op.vhost, op.name)
    if isinstance(op, Bound):
        return Unbound(*msgspec.structs.astuple(op))
    if isinstance(op, Unbound):
        return Bound(*msgspec.structs.astuple(op))
    if isinstance(op, QueueArgumentsSet):
        return QueueGone(op.vhost, op.queue)
    if isinstance(op, PolicySet):
        return PolicyCleared(op.vhost, op.name)
    if isinstance(op, ParameterSet):
        return ParameterCleared(op.vhost, op.component, op.name)
    raise ValueError(f"no inverse for {op!r}")


class Definitions:
    __slots__ = (
        "parameters",
        "permissions",
        "policies",
        "queue_arguments",
        "topic_permissions",
        "tracing",
        "users",
        "vhost_ids",
        "vhost_limits",
        "vhosts",
    )

    def __init__(self) -> None:
        self.vhosts: dict[str, Router] = {}
        self.vhost_ids: dict[str, int] = {}
        # (vhost, queue) -> x-arguments, for queues declared with any
        self.queue_arguments: dict[tuple[str, str], dict[str, Any]] = {}
        # vhost -> policy name -> policy (broker/amqp/policy_rules.py's form)
        self.policies: dict[str, dict[str, dict[str, Any]]] = {}
        # vhost -> (component, name) -> value: runtime parameters (shovels)
        self.parameters: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self.vhost_limits: dict[str, dict[str, int]] = {}
        self.tracing: set[str] = set()  # vhosts with the firehose on
        self.users: dict[str, UserSet] = {}
        self.permissions: dict[tuple[str, str], PermissionSet] = {}  # (vhost, user)
        # (vhost, user) -> exchange -> its topic permission
        self.topic_permissions: dict[tuple[str, str], dict[str, TopicPermissionSet]] = {}

    def policy_for(self, vhost: str, queue: str) -> dict[str, Any] | None:
        """The policy that applies to a queue (None: none)."""
        return policy_rules.applying(list(self.policies.get(vhost, {}).values()), queue)

    def effective_arguments(self, vhost: str, queue: str) -> dict[str, Any]:
        """A queue's x-arguments with its policy applied: what its rules
        follow (its own arguments alone decide redeclare equivalence)."""
        own = self.queue_arguments.get((vhost, queue), {})
        return policy_rules.effective(own, self.policy_for(vhost, queue))

    def router(self, vhost: str) -> Router:
        router = self.vhosts.get(vhost)
        if router is None:
            router = self.vhosts[vhost] = Router()
        return router

    def apply(self, op: Op) -> None:
        handler = _APPLY.get(type(op))
        if handler is None:
            raise ValueError(f"unknown definitions operation {op!r}")
        # Every operation of a vhost makes it known, even one that changes nothing.
        handler(self, self.router(op.vhost) if isinstance(op, Operation) else _NO_ROUTER, op)

    def _vhost_added(self, router: Router, op: VHostAdded) -> None:
        self.vhost_ids[op.vhost] = op.id

    def _exchange_declared(self, router: Router, op: ExchangeDeclared) -> None:
        alternate = op.arguments.get("alternate-exchange")
        router.declare(
            op.name,
            op.exchange_type,
            alternate if isinstance(alternate, str) and alternate else None,
            op.durable,
            op.auto_delete,
            op.internal,
            op.arguments,
        )
        policies = self.policies.get(op.vhost)
        if policies:  # (one exchange: a replay of many declares stays linear)
            found = policy_rules.alternate_exchanges(list(policies.values()), [op.name])
            router.policy_alternates.pop(op.name, None)
            router.policy_alternates.update(found)

    def _exchange_deleted(self, router: Router, op: ExchangeDeleted) -> None:
        router.delete(op.name)
        router.policy_alternates.pop(op.name, None)

    def _exchange_policies(self, vhost: str, router: Router) -> None:
        """What the policies now say of the vhost's exchanges: their alternate exchanges."""
        router.policy_alternates = policy_rules.alternate_exchanges(
            list(self.policies.get(vhost, {}).values()), list(router.exchanges)
        )

    def _bound(self, router: Router, op: Bound) -> None:
        router.bind(op.source, (op.kind, op.dest), op.routing_key, op.arguments)

    def _unbound(self, router: Router, op: Unbound) -> None:
        router.unbind(op.source, (op.kind, op.dest), op.routing_key, op.arguments)

    def _queue_arguments_set(self, router: Router, op: QueueArgumentsSet) -> None:
        self.queue_arguments[(op.vhost, op.queue)] = op.arguments

    def _queue_gone(self, router: Router, op: QueueGone) -> None:
        router.drop_dest(("q", op.queue))
        self.queue_arguments.pop((op.vhost, op.queue), None)

    def _policy_set(self, router: Router, op: PolicySet) -> None:
        self.policies.setdefault(op.vhost, {})[op.name] = {
            "name": op.name,
            "pattern": op.pattern,
            "apply-to": op.apply_to,
            "priority": op.priority,
            "definition": op.definition,
        }
        self._exchange_policies(op.vhost, router)

    def _policy_cleared(self, router: Router, op: PolicyCleared) -> None:
        self.policies.get(op.vhost, {}).pop(op.name, None)
        self._exchange_policies(op.vhost, router)

    def _parameter_set(self, router: Router, op: ParameterSet) -> None:
        self.parameters.setdefault(op.vhost, {})[(op.component, op.name)] = op.value

    def _parameter_cleared(self, router: Router, op: ParameterCleared) -> None:
        self.parameters.get(op.vhost, {}).pop((op.component, op.name), None)

    def _vhost_deleted(self, router: Router, op: VHostDeleted) -> None:
        vhost = op.vhost
        self.vhosts.pop(vhost, None)
        self.vhost_ids.pop(vhost, None)
        self.policies.pop(vhost, None)
        self.parameters.pop(vhost, None)
        self.vhost_limits.pop(vhost, None)
        self.tracing.discard(vhost)
        for table in (self.queue_arguments, self.permissions, self.topic_permissions):
            for key in [key for key in table if key[0] == vhost]:
                del table[key]

    def _vhost_limits_set(self, router: Router, op: VHostLimitsSet) -> None:
        self.vhost_limits[op.vhost] = op.limits

    def _tracing_set(self, router: Router, op: TracingSet) -> None:
        if op.on:
            self.tracing.add(op.vhost)
        else:
            self.tracing.discard(op.vhost)

    def _user_set(self, router: Router, op: UserSet) -> None:
        self.users[op.user] = op

    def _user_deleted(self, router: Router, op: UserDeleted) -> None:
        self.users.pop(op.user, None)
        for table in (self.permissions, self.topic_permissions):
            for key in [key for key in table if key[1] == op.user]:
                del table[key]

    def _permission_set(self, router: Router, op: PermissionSet) -> None:
        self.permissions[(op.vhost, op.user)] = op

    def _permission_cleared(self, router: Router, op: PermissionCleared) -> None:
        self.permissions.pop((op.vhost, op.user), None)

    def _topic_permission_set(self, router: Router, op: TopicPermissionSet) -> None:
        self.topic_permissions.setdefault((op.vhost, op.user), {})[op.exchange] = op

    def _topic_permission_cleared(self, router: Router, op: TopicPermissionCleared) -> None:
        key = (op.vhost, op.user)
        named = self.topic_permissions.get(key, {})
        if op.exchange:
            named.pop(op.exchange, None)
        else:
            named.clear()
        if not named:
            self.topic_permissions.pop(key, None)

    def access_snapshot(
        self,
    ) -> list[UserSet | VHostLimitsSet | PermissionSet | TopicPermissionSet]:
        """Users, vhost limits and permissions as operations (after the
        vhosts: a permission names one)."""
        ops: list[UserSet | VHostLimitsSet | PermissionSet | TopicPermissionSet]
        ops = list(self.users.values())
        ops += [VHostLimitsSet(vhost, limits) for vhost, limits in self.vhost_limits.items()]
        ops += self.permissions.values()
        for named in self.topic_permissions.values():
            ops += named.values()
        return ops

    def snapshot(self) -> list[Op]:
        """Operations that rebuild this state from nothing (for compaction)."""
        ops: list[Op] = [VHostAdded(vhost, vhost_id) for vhost, vhost_id in self.vhost_ids.items()]
        for vhost, router in self.vhosts.items():
            for x in router.exchanges.values():
                ops.append(
                    ExchangeDeclared(
                        vhost, x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments
                    )
                )
            for x in router.exchanges.values():
                for (dest, rk, _f), args in x.bindings.items():
                    ops.append(Bound(vhost, x.name, dest[0], dest[1], rk, args))
        for (vhost, queue), args in self.queue_arguments.items():
            ops.append(QueueArgumentsSet(vhost, queue, args))
        for vhost, named in self.policies.items():
            for p in named.values():
                fields = (p["name"], p["pattern"], p["apply-to"], p["priority"], p["definition"])
                ops.append(PolicySet(vhost, *fields))
        for vhost, parameters in self.parameters.items():
            for (component, name), value in parameters.items():
                ops.append(ParameterSet(vhost, component, name, value))
        ops += self.access_snapshot()
        ops += [TracingSet(vhost, True) for vhost in self.tracing]
        return ops


_O = TypeVar("_O", bound=Operation | UserOperation)
_Apply = Callable[[Definitions, Router, Any], None]


def _on(cls: type[_O], handler: Callable[[Definitions, Router, _O], None]) -> tuple[type, _Apply]:
    """A table entry, checked by mypy: the handler takes that operation."""
    return cls, handler


_NO_ROUTER = Router()  # what a user's records are given: they route nothing

# How Definitions.apply applies each operation, by its class.
_APPLY: dict[type, _Apply] = dict(
    (
        _on(VHostAdded, Definitions._vhost_added),
        _on(ExchangeDeclared, Definitions._exchange_declared),
        _on(ExchangeDeleted, Definitions._exchange_deleted),
        _on(Bound, Definitions._bound),
        _on(Unbound, Definitions._unbound),
        _on(QueueArgumentsSet, Definitions._queue_arguments_set),
        _on(QueueGone, Definitions._queue_gone),
        _on(PolicySet, Definitions._policy_set),
        _on(PolicyCleared, Definitions._policy_cleared),
        _on(VHostDeleted, Definitions._vhost_deleted),
        _on(VHostLimitsSet, Definitions._vhost_limits_set),
        _on(TracingSet, Definitions._tracing_set),
        _on(UserSet, Definitions._user_set),
        _on(UserDeleted, Definitions._user_deleted),
        _on(PermissionSet, Definitions._permission_set),
        _on(PermissionCleared, Definitions._permission_cleared),
        _on(TopicPermissionSet, Definitions._topic_permission_set),
        _on(TopicPermissionCleared, Definitions._topic_permission_cleared),
        _on(ParameterSet, Definitions._parameter_set),
        _on(ParameterCleared, Definitions._parameter_cleared),
    )
)
