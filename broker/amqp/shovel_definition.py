"""A shovel's definition: the value of a `shovel` runtime parameter,
checked as RabbitMQ 3.10's rabbit_shovel_parameters.erl checks it (the same
keys, defaults and refusal texts), and read into a `ShovelSpec`.

Pure: no IO. The scheduler checks a value before it journals it
(broker/scheduler/parameters.py); the shovel process reads the spec of
each parameter it finds (broker/shovel/runner.py). Here, beside the other
rules of definitions, so the scheduler need not import the shovels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shoal.broker.amqp.properties import BASIC_PROPERTIES, NUMERIC_PROPERTIES

COMPONENT = "shovel"
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp10", "amqp091")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5  # s, as RabbitMQ's ?DEFAULT_RECONNECT_DELAY
# What dest-publish-properties may set: every basic property but the headers.
PUBLISH_PROPERTIES = tuple(p for p in BASIC_PROPERTIES if p != "headers")


class ShovelError(ValueError):
    """A value RabbitMQ would refuse: its reasons, in RabbitMQ's words."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("\n".join(reasons))
        self.reasons = reasons


@dataclass(frozen=True)
class ShovelSpec:
    """What a shovel does (AMQP 0-9-1 at both ends)."""

    src_uris: tuple[str, ...]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    dest_uris: tuple[str, ...]
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None
    ack_mode: str
    prefetch_count: int
    delete_after: str | int  # "never", "queue-length" or a count
    add_forward_headers: bool
    add_timestamp_header: bool
    publish_properties: dict[str, Any]
    src_queue_args: dict[str, Any]
    src_consumer_args: dict[str, Any]
    dest_queue_args: dict[str, Any]
    reconnect_delay: float


def erl(term: Any) -> str:
    """A JSON value as Erlang's ~p prints the term it decodes to."""
    if isinstance(term, bool):
        return "true" if term else "false"
    if isinstance(term, str):
        return '<<"' + term.replace('"', '\\"') + '">>'
    if isinstance(term, list):
        return "[" + ",".join(erl(t) for t in term) + "]"
    if isinstance(term, dict):
        return "[" + ",".join("{" + erl(k) + "," + erl(v) + "}" for k, v in term.items()) + "]"
    if term is None:
        return "null"
    return repr(term)


Check = Callable[[str, Any], "str | None"]


def _number(name: str, term: Any) -> str | None:
    if isinstance(term, int | float) and not isinstance(term, bool):
        return None
    return f"{name} should be a number, actually was {erl(term)}"


def _binary(name: str, term: Any) -> str | None:
    return None if isinstance(term, str) else f"{name} should be binary, actually was {erl(term)}"


def _boolean(name: str, term: Any) -> str | None:
    if isinstance(term, bool):
        return None
    return f"{name} should be boolean, actually was {erl(term)}"


def _queue_name(name: str, term: Any) -> str | None:
    if not isinstance(term, str):
        return f"{name} should be binary, actually was {erl(term)}"
    size = len(term.encode())
    if size > 255:
        return f"{name} should be less than 255 bytes, actually was {size}"
    return None


def _enum(options: tuple[str, ...]) -> Check:
    def check(name: str, term: Any) -> str | None:
        if not isinstance(term, str):
            return f"{name} should be binary, actually was {erl(term)}"
        if term not in options:
            return f"{name} should be one of {erl(list(options))}, actually was {erl(term)}"
        return None

    return check


def _delete_after(name: str, term: Any) -> str | None:
    if term in ("never", "queue-length"):
        return None
    if isinstance(term, int) and not isinstance(term, bool) and term >= 0:
        return None
    return (
        f'{name} should be a number greater than or equal to 0, "never" or "queue-length", '
        f"actually was {erl(term)}"
    )


def _uri(name: str, term: Any) -> str | None:
    uris = [term] if isinstance(term, str) else term
    if not isinstance(uris, list):
        return f"{name} should be list, actually was {erl(term)}"
    if not uris:  # (RabbitMQ takes [] and its shovel then fails to start)
        return f"{name} should be a non-empty list of URIs"
    for uri in uris:
        if not isinstance(uri, str):
            return f"{name} should be binary, actually was {erl(uri)}"
        reason = uri_problem(uri)
        if reason:
            return f'"{uri}" not a valid URI: {{{reason},"{uri}"}}'
    return None


def _table(name: str, term: Any) -> str | None:
    return None if isinstance(term, dict) else f"{name} not a list {erl(term)}"


def _properties(name: str, term: Any) -> str | None:
    if not isinstance(term, dict):
        return f"{name} not a list {erl(term)}"
    checks = {p: _number if p in NUMERIC_PROPERTIES else _binary for p in PUBLISH_PROPERTIES}
    return next(iter(_proplist(name, {k: (c, False) for k, c in checks.items()}, term)), None)


def uri_problem(uri: str) -> str:
    """Why an AMQP URI cannot be used, as amqp_uri:parse says it ("": it can)."""
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return "{unable_to_parse_uri,bad_port}"
    if not parts.scheme:
        return "{unable_to_parse_uri,no_scheme}"
    if parts.scheme not in ("amqp", "amqps"):
        return '{unexpected_uri_scheme,"' + parts.scheme + '"}'
    if parts.port is not None and not parts.hostname:
        return "port_requires_host"
    if "/" in parts.path[1:]:
        return '{invalid_vhost,"' + parts.path[1:] + '"}'
    return ""


def _proplist(
    where: str, checks: dict[str, tuple[Check, bool]], value: dict[str, Any]
) -> list[str]:
    """rabbit_parameter_validation:proplist: each key's check, a missing
    mandatory key, and the keys no check knows."""
    reasons: list[str] = []
    for key, (check, mandatory) in checks.items():
        if key in value:
            reason = check(key, value[key])
            if reason:
                reasons.append(reason)
        elif mandatory:
            reasons.append(f'Key "{key}" not found in {where}')
    reasons.reverse()  # RabbitMQ folds the checks into a list, last first
    unknown = [k for k in value if k not in checks]
    if unknown:
        listed = ",".join("{" + erl(k) + "," + erl(value[k]) + "}" for k in unknown)
        reasons.insert(0, f"Unrecognised terms [{listed}] in {where}")
    return reasons


_SHOVEL_KEYS: dict[str, tuple[Check, bool]] = {
    "reconnect-delay": (_number, False),
    "ack-mode": (_enum(ACK_MODES), False),
    "src-protocol": (_enum(PROTOCOLS), False),
    "dest-protocol": (_enum(PROTOCOLS), False),
}
_SRC_KEYS: dict[str, tuple[Check, bool]] = {
    "src-uri": (_uri, True),
    "src-exchange": (_binary, False),
    "src-exchange-key": (_binary, False),
    "src-queue": (_binary, False),
    "src-queue-args": (_table, False),
    "src-consumer-args": (_table, False),
    "prefetch-count": (_number, False),
    "src-prefetch-count": (_number, False),
    "delete-after": (_delete_after, False),
    "src-delete-after": (_delete_after, False),
}
_DEST_KEYS: dict[str, tuple[Check, bool]] = {
    "dest-uri": (_uri, True),
    "dest-exchange": (_binary, False),
    "dest-exchange-key": (_binary, False),
    "dest-queue": (_queue_name, False),
    "dest-queue-args": (_table, False),
    "add-forward-headers": (_boolean, False),
    "add-timestamp-header": (_boolean, False),
    "dest-add-forward-headers": (_boolean, False),
    "dest-add-timestamp-header": (_boolean, False),
    "publish-properties": (_properties, False),
    "dest-publish-properties": (_properties, False),
}


def check(name: str, value: Any) -> list[str]:
    """Every reason RabbitMQ 3.10 would refuse `value` as shovel `name`'s
    definition ([]: none), in its order and words."""
    if not isinstance(value, dict):
        return [f"{name} not a list {erl(value)}"]
    reasons: list[str] = []
    src_protocol = value.get("src-protocol", "amqp091")
    dest_protocol = value.get("dest-protocol", "amqp091")
    if "amqp10" in (src_protocol, dest_protocol):
        # Shoal speaks AMQP 0-9-1 only; RabbitMQ's own amqp10 keys are not taken.
        return [
            "protocol amqp10 is not supported by Shoal's shovels: use amqp091 "
            "(src-protocol, dest-protocol)"
        ]
    has_x, has_q = "src-exchange" in value, "src-queue" in value
    if not has_x and not has_q:
        reasons.append("Must specify 'src-exchange' or 'src-queue'")
    elif has_x and has_q:
        reasons.append("Cannot specify 'src-exchange' and 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    if isinstance(delete_after, int) and value.get("ack-mode") == "no-ack":
        reasons.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        reasons.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    reasons += _proplist(name, {**_SHOVEL_KEYS, **_SRC_KEYS, **_DEST_KEYS}, value)
    return reasons


def parse(name: str, value: Any) -> ShovelSpec:
    """The spec of a definition `check` passes (ShovelError otherwise)."""
    reasons = check(name, value)
    if reasons:
        raise ShovelError(reasons)

    def uris(key: str) -> tuple[str, ...]:
        given = value[key]
        return (given,) if isinstance(given, str) else tuple(given)

    def first(*keys: str, default: Any = None) -> Any:
        return next((value[k] for k in keys if k in value), default)

    delete_after = first("src-delete-after", "delete-after", default="never")
    return ShovelSpec(
        src_uris=uris("src-uri"),
        src_queue=value.get("src-queue"),
        src_exchange=value.get("src-exchange"),
        src_exchange_key=value.get("src-exchange-key", ""),
        dest_uris=uris("dest-uri"),
        dest_queue=value.get("dest-queue"),
        dest_exchange=value.get("dest-exchange"),
        dest_exchange_key=value.get("dest-exchange-key"),
        ack_mode=value.get("ack-mode", "on-confirm"),
        prefetch_count=int(first("src-prefetch-count", "prefetch-count", default=DEFAULT_PREFETCH)),
        delete_after=delete_after,
        add_forward_headers=bool(
            first("dest-add-forward-headers", "add-forward-headers", default=False)
        ),
        add_timestamp_header=bool(
            first("dest-add-timestamp-header", "add-timestamp-header", default=False)
        ),
        publish_properties=dict(first("dest-publish-properties", "publish-properties", default={})),
        src_queue_args=dict(value.get("src-queue-args", {})),
        src_consumer_args=dict(value.get("src-consumer-args", {})),
        dest_queue_args=dict(value.get("dest-queue-args", {})),
        reconnect_delay=float(value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)),
    )
