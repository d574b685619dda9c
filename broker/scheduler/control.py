"""The control socket's requests and replies, typed (`shoal ctl`, `shoal
policy`, the management API; served by introspect.py).

A request is one JSON object on one line, {"op": "<name>", ...fields}: each
op is a msgspec Struct here, and `Request` is their union tagged on "op",
so the wire stays the JSON it always was. Each field is typed as the
clients send it; fields a client adds that an op does not read (`shoal
ctl` sends "vhost" with every verb) are ignored. The scheduler dispatches
a decoded request through a table op type -> handler (scheduler.py), and each
handler returns one of the reply Structs below.

Errors keep their texts: a field of the wrong type is answered "<field>
must be a string" (a list of strings, a JSON object, a boolean, an
integer), an unknown op "unknown request '<op>'", a refusal with the
refusing error's text and rabbitmqctl's exit code ("code"; the policy ops,
whose answers never had one, answer without it).

This module imports nothing else of the scheduler: the clients (`shoal
ctl`, `shoal policy`, the management API's backend) build their requests
with it.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, Union

import msgspec
from msgspec import UNSET, UnsetType

from shoal.broker.amqp import access, errors

# ------------------------------------------------------------- requests


class Op(msgspec.Struct, tag_field="op", kw_only=True):
    """A control request. `CODED`: its refusals carry rabbitmqctl's exit
    code (all but the policy ops')."""

    CODED: ClassVar[bool] = True


class InVhost(Op, kw_only=True):
    """An op on one vhost: the broker's default one when none is given."""

    vhost: str | UnsetType = UNSET

    def in_vhost(self, default: str) -> str:
        return default if self.vhost is UNSET else self.vhost


class AddUser(Op, tag="add_user", kw_only=True):
    user: str = ""
    password: str = ""
    # Given (the management API's, a definitions file's): kept as it is.
    password_hash: str | UnsetType = UNSET
    hashing_algorithm: str = ""
    tags: list[str] | str | None = None  # a list, or "a,b" / "a b"


class DeleteUser(Op, tag="delete_user", kw_only=True):
    user: str = ""


class ChangePassword(Op, tag="change_password", kw_only=True):
    user: str = ""
    password: str = ""


class ClearPassword(Op, tag="clear_password", kw_only=True):
    user: str = ""


class AuthenticateUser(Op, tag="authenticate_user", kw_only=True):
    user: str = ""
    password: str = ""


class SetUserTags(Op, tag="set_user_tags", kw_only=True):
    user: str = ""
    tags: list[str] | str | None = None


class SetUserLimits(Op, tag="set_user_limits", kw_only=True):
    user: str = ""
    limits: dict[str, Any] | None = None  # checked by name and value (accounts.py)


class ClearUserLimits(Op, tag="clear_user_limits", kw_only=True):
    user: str = ""
    limit: str = ""  # one limit's name; "" or "all": every one


class ListUsers(Op, tag="list_users", kw_only=True):
    pass


class AddVhost(Op, tag="add_vhost", kw_only=True):
    vhost: str = ""  # no default: the one to add


class DeleteVhost(Op, tag="delete_vhost", kw_only=True):
    vhost: str = ""


class ListVhosts(Op, tag="list_vhosts", kw_only=True):
    pass


class SetVhostLimits(InVhost, tag="set_vhost_limits", kw_only=True):
    limits: dict[str, Any] | None = None


class ClearVhostLimits(InVhost, tag="clear_vhost_limits", kw_only=True):
    pass


class TraceOn(InVhost, tag="trace_on", kw_only=True):
    """The firehose on for a vhost (rabbitmqctl trace_on; workers/firehose.py)."""


class TraceOff(InVhost, tag="trace_off", kw_only=True):
    pass


class SetPermissions(InVhost, tag="set_permissions", kw_only=True):
    user: str = ""
    configure: str = ""
    write: str = ""
    read: str = ""


class ClearPermissions(InVhost, tag="clear_permissions", kw_only=True):
    user: str = ""


class ListPermissions(InVhost, tag="list_permissions", kw_only=True):
    user: str = ""  # a user's, in every vhost; else the vhost's


class SetTopicPermissions(InVhost, tag="set_topic_permissions", kw_only=True):
    user: str = ""
    exchange: str = ""
    write: str = ""
    read: str = ""


class ClearTopicPermissions(InVhost, tag="clear_topic_permissions", kw_only=True):
    user: str = ""
    exchange: str = ""  # "": on every exchange


class ListTopicPermissions(InVhost, tag="list_topic_permissions", kw_only=True):
    user: str = ""


class ListQueues(InVhost, tag="list_queues", kw_only=True):
    pass


class ListExchanges(InVhost, tag="list_exchanges", kw_only=True):
    pass


class ListBindings(InVhost, tag="list_bindings", kw_only=True):
    pass


class PurgeQueue(InVhost, tag="purge_queue", kw_only=True):
    queue: str = ""


class DeleteQueue(InVhost, tag="delete_queue", kw_only=True):
    queue: str = ""
    if_unused: bool = False
    if_empty: bool = False


class ExportDefinitions(Op, tag="export_definitions", kw_only=True):
    pass


class ImportDefinitions(Op, tag="import_definitions", kw_only=True):
    # RabbitMQ's definitions document, checked by definitions_json.parse
    # (in its words) rather than here.
    definitions: Any = None


class SetWorkerCount(Op, tag="set_worker_count", kw_only=True):
    # Any JSON value: the scheduler refuses what is not a count in its
    # own words, which name the ceiling (`shoal ctl` passes on what it got).
    count: Any = None


class WorkerCount(Op, tag="worker_count", kw_only=True):
    pass


class SetPolicy(InVhost, tag="set_policy", kw_only=True):
    CODED: ClassVar[bool] = False
    name: str = ""
    pattern: str = ""
    apply_to: str = "all"
    priority: int = 0
    definition: dict[str, Any] | None = None


class ClearPolicy(InVhost, tag="clear_policy", kw_only=True):
    CODED: ClassVar[bool] = False
    name: str = ""


class ListPolicies(InVhost, tag="list_policies", kw_only=True):
    CODED: ClassVar[bool] = False


class SetParameter(InVhost, tag="set_parameter", kw_only=True):
    """A runtime parameter (RabbitMQ's `set_parameter`): `value` is any
    JSON, checked by its component (a shovel's: broker/amqp/shovel_definition.py)."""

    component: str = ""
    name: str = ""
    value: Any = None


class ClearParameter(InVhost, tag="clear_parameter", kw_only=True):
    component: str = ""
    name: str = ""


class ListParameters(InVhost, tag="list_parameters", kw_only=True):
    component: str = ""  # "": every component's


# Answered from the workers' INSPECT answers (introspect.py).
class ListConnections(Op, tag="list_connections", kw_only=True):
    pass


class ListChannels(Op, tag="list_channels", kw_only=True):
    pass


class ListConsumers(Op, tag="list_consumers", kw_only=True):
    vhost: str | None = None  # None: every vhost's


class ExchangeStats(Op, tag="exchange_stats", kw_only=True):
    """Messages published into each exchange and routed out of it, summed
    over the workers: rows {vhost, name, publish_in, publish_out}."""


class CloseConnection(Op, tag="close_connection", kw_only=True):
    name: str = ""  # its name or its pid, as listed
    reason: str = ""


Request = Union[  # noqa: UP007 (a Union: msgspec decodes it by its tag)
    AddUser,
    DeleteUser,
    ChangePassword,
    ClearPassword,
    AuthenticateUser,
    SetUserTags,
    SetUserLimits,
    ClearUserLimits,
    ListUsers,
    AddVhost,
    DeleteVhost,
    ListVhosts,
    SetVhostLimits,
    ClearVhostLimits,
    TraceOn,
    TraceOff,
    SetPermissions,
    ClearPermissions,
    ListPermissions,
    SetTopicPermissions,
    ClearTopicPermissions,
    ListTopicPermissions,
    ListQueues,
    ListExchanges,
    ListBindings,
    PurgeQueue,
    DeleteQueue,
    ExportDefinitions,
    ImportDefinitions,
    SetWorkerCount,
    WorkerCount,
    SetPolicy,
    ClearPolicy,
    ListPolicies,
    SetParameter,
    ClearParameter,
    ListParameters,
    ListConnections,
    ListChannels,
    ListConsumers,
    ExchangeStats,
    CloseConnection,
]
REQUESTS: tuple[type[Op], ...] = typing.get_args(Request)
BY_NAME: dict[str, type[Op]] = {cls.__struct_config__.tag: cls for cls in REQUESTS}  # type: ignore[misc]
# Answered by the workers' round trip (introspect.py), not by the scheduler's table.
CONNECTION_REQUESTS = (ListConnections, ListChannels, ListConsumers, ExchangeStats, CloseConnection)

# --------------------------------------------------------------- replies


class Reply(msgspec.Struct, frozen=True):
    """A control answer; each is one JSON object."""


class Ok(Reply, frozen=True):
    ok: bool = True


OK = Ok()


class Rows(Reply, frozen=True):
    """A listing, in rabbitmqctl's column names."""

    rows: list[dict[str, Any]]


class PolicyRows(Reply, frozen=True):
    policies: list[dict[str, Any]]


class Counted(Reply, frozen=True, kw_only=True):
    """A purge or a delete: the ready messages it took."""

    ok: bool = True
    messages: int


class Authenticated(Reply, frozen=True, kw_only=True):
    ok: bool = True
    tags: list[str]


class Exported(Reply, frozen=True):
    definitions: dict[str, Any]


class Workers(Reply, frozen=True):
    """The worker count (set_worker_count, worker_count): its fields, and
    the same as the one row of a listing."""

    wanted: int
    workers: int
    max_workers: int
    settled: bool
    retiring: list[int]
    rows: list[dict[str, Any]]


class Failed(Reply, frozen=True, omit_defaults=True):
    """A refusal: its text, and rabbitmqctl's exit code (absent for the
    policy ops and an unknown op, as they always answered)."""

    error: str
    code: int | UnsetType = UNSET


# ---------------------------------------------------------- the socket

_decoder = msgspec.json.Decoder(Request)
_encoder = msgspec.json.Encoder()
_PATH = re.compile(r"at `\$\.([^`.\[]+)")
# What a field must be, by its type (the first that its type holds).
_SHOWN = (
    (list, "a list of strings"),
    (dict, "a JSON object"),
    (bool, "a boolean"),
    (int, "an integer"),
    (str, "a string"),
)
NOT_ONE_OBJECT = Failed("a request is one JSON object on one line")
# The errors a handler's refusal may raise: their text is the answer.
REFUSALS = (access.AccessError, errors.AMQPError, TypeError, ValueError)

_O = TypeVar("_O", bound=Op)
Handler = Callable[[Any], Reply]


def handler(op: type[_O], answer: Callable[[_O], Reply]) -> tuple[type[Op], Handler]:
    """A dispatch table's entry, checked by mypy: the handler takes that op."""
    return op, answer


def decode(line: bytes) -> Op | Failed:
    """A request line as its op, or the answer that refuses it."""
    try:
        request: Op = _decoder.decode(line)
        return request
    except msgspec.ValidationError as exc:
        return _invalid(line, str(exc))
    except msgspec.DecodeError:
        return NOT_ONE_OBJECT


def _invalid(line: bytes, why: str) -> Failed:
    """The answers of old for a request msgspec refuses: an unknown op by
    its name, a field by what it must be."""
    try:
        fields = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return NOT_ONE_OBJECT
    if not isinstance(fields, dict):
        return NOT_ONE_OBJECT
    op = fields.get("op")
    cls = BY_NAME.get(op) if isinstance(op, str) else None
    if cls is None:
        return Failed(f"unknown request {op!r}")
    path = _PATH.search(why)
    field = path.group(1) if path else ""
    text = f"{field} must be {_shown(cls, field)}" if field else why
    return Failed(text, 70) if cls.CODED else Failed(text)


def _shown(cls: type[Op], field: str) -> str:
    for info in msgspec.structs.fields(cls):
        if info.name == field:
            held = {typing.get_origin(t) or t for t in typing.get_args(info.type)}
            held.add(typing.get_origin(info.type) or info.type)
            return next((text for kind, text in _SHOWN if kind in held), "valid")
    return "valid"


def run(answer: Handler, request: Op) -> Reply:
    """A handler's reply, or its refusal's (what it raised, in its words)."""
    try:
        return answer(request)
    except REFUSALS as exc:
        text = getattr(exc, "reply_text", None) or str(exc)
        if not request.CODED:
            return Failed(text)
        return Failed(text, getattr(exc, "code", 70))


def encode(message: msgspec.Struct | dict[str, Any]) -> bytes:
    """One line: a request (a client's) or its answer."""
    return _encoder.encode(message) + b"\n"
