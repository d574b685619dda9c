"""Queue and binding x-arguments: their checks, with RabbitMQ 3.10's error
texts (client test suites match on them), as pure functions (no IO).

The scheduler calls them on queue.declare and queue.bind; what a checked
argument becomes in the shared-memory queue record is the scheduler's
business (broker/scheduler/queue_lifecycle.py).
"""

from __future__ import annotations

from typing import Any

from shoal.broker.amqp import errors
from shoal.broker.amqp.routing import X_MATCH_MODES


def max_priority(name: bytes, vhost: str, arguments: dict[str, Any]) -> int:
    """x-max-priority, checked as RabbitMQ 3.10 does (an integer 0..255:
    check_non_neg_int_arg, then {max_value_exceeded,N}; measured on 3.10.8)."""
    value = non_negative(name, vhost, arguments, "x-max-priority")
    if value is None:
        return 0
    if value > 255:
        where = f"invalid arg 'x-max-priority' for queue '{name.decode()}' in vhost '{vhost}'"
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"{where}: {{max_value_exceeded,{value}}}"
        )
    return value


def non_negative(name: bytes, vhost: str, arguments: dict[str, Any], key: str) -> int | None:
    """An integer argument >= 0 (None if absent), refused as RabbitMQ 3.10's
    check_non_neg_int_arg refuses it (measured on 3.10.8: a value of another
    type is "expected integer, got T", not {unacceptable_type,T})."""
    value = arguments.get(key)
    if value is None:
        return None
    where = f"invalid arg '{key}' for queue '{name.decode()}' in vhost '{vhost}'"
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: {not_integer(value)}")
    if value < 0:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"{where}: {{value_negative,{value}}}"
        )
    return value


def expires(name: bytes, vhost: str, arguments: dict[str, Any]) -> int | None:
    """x-expires in ms (None: none): a positive integer, as RabbitMQ 3.10's
    check_expires_arg wants it."""
    value = non_negative(name, vhost, arguments, "x-expires")
    where = f"invalid arg 'x-expires' for queue '{name.decode()}' in vhost '{vhost}'"
    if value == 0:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: {{value_zero,0}}")
    if value is not None and value > MAX_EXPIRY:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"{where}: {{value_too_large,{value}}}"
        )
    return value


# The largest TTL, expiration or x-expires RabbitMQ 3.10 accepts (ten years
# in ms; measured: one more is {value_too_large,N}).
MAX_EXPIRY = 315_360_000_000


def integer_type(value: int) -> str:
    """The AMQP type pika and pamqp encode an integer as, as RabbitMQ names
    it in some errors: a 32-bit 'I' (signedint), else 'l' (long)."""
    return "signedint" if -(1 << 31) <= value < 1 << 31 else "long"


# The x-overflow values RabbitMQ 3.10 accepts.
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")


def length_limits(
    name: bytes, vhost: str, arguments: dict[str, Any]
) -> tuple[int | None, int | None, str]:
    """x-max-length, x-max-length-bytes (None: no limit) and x-overflow
    (checked even when there is no limit, as RabbitMQ does)."""
    max_length = non_negative(name, vhost, arguments, "x-max-length")
    max_bytes = non_negative(name, vhost, arguments, "x-max-length-bytes")
    overflow = arguments.get("x-overflow", "drop-head")
    where = f"invalid arg 'x-overflow' for queue '{name.decode()}' in vhost '{vhost}'"
    if isinstance(overflow, bytes):
        overflow = overflow.decode(errors="replace")
    if not isinstance(overflow, str):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"{where}: {{unacceptable_type,{field_type(overflow)}}}"
        )
    if overflow not in OVERFLOW_MODES:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: invalid_overflow")
    return max_length, max_bytes, overflow


# The x-queue-mode and x-queue-version values RabbitMQ 3.10 accepts (a
# queue here has one way of keeping its messages: both are only checked).
QUEUE_MODES = ("default", "lazy")
QUEUE_VERSIONS = (1, 2)


def mode_and_version(name: bytes, vhost: str, arguments: dict[str, Any]) -> None:
    """x-queue-mode and x-queue-version, refused in RabbitMQ 3.10's words
    where it refuses them (measured)."""
    where = f"for queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    mode = arguments.get("x-queue-mode")
    if mode is not None and not isinstance(mode, str):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-queue-mode' {where}: {{unacceptable_type,{field_type(mode)}}}",
        )
    if mode is not None and mode not in QUEUE_MODES:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-queue-mode' {where}: \"unsupported queue mode '{mode}'\"",
        )
    version = arguments.get("x-queue-version")
    if version is None or (version in QUEUE_VERSIONS and not isinstance(version, bool)):
        return
    if isinstance(version, bool) or not isinstance(version, int):
        problem = not_integer(version)
    elif version < 0:
        problem = f"{{value_negative,{version}}}"
    else:
        problem = f"\"unsupported queue version '{version}'\""
    raise errors.ChannelError(
        errors.PRECONDITION_FAILED, f"invalid arg 'x-queue-version' {where}: {problem}"
    )


def capacity(name: bytes, vhost: str, arguments: dict[str, Any]) -> tuple[int, int]:
    """x-capacity and x-flow-resume-capacity (bytes, Qpid's arguments): the
    resume size defaults to 80 % of the capacity and may not exceed it."""
    size = non_negative(name, vhost, arguments, "x-capacity")
    resume = non_negative(name, vhost, arguments, "x-flow-resume-capacity")
    if not size:
        return 0, 0
    if resume is None:
        resume = size * 4 // 5
    if resume > size:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-flow-resume-capacity' for queue '{name.decode()}' in vhost "
            f"'{vhost}': {resume} is above x-capacity {size}",
        )
    return size, resume


def replicated_properties(
    name: bytes, vhost: str, durable: bool, exclusive: bool, auto_delete: bool
) -> None:
    """Quorum and stream queues are durable, not exclusive nor auto-delete:
    refused in RabbitMQ 3.10's order and words."""
    where = f"queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    for refused, prop in (
        (auto_delete, "auto-delete"),
        (exclusive, "exclusive-owner"),
        (not durable, "non-durable"),
    ):
        if refused:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"invalid property '{prop}' for {where}"
            )


def single_active(name: bytes, vhost: str, arguments: dict[str, Any]) -> bool:
    """x-single-active-consumer, a boolean as RabbitMQ 3.10 requires."""
    value = arguments.get("x-single-active-consumer", False)
    if not isinstance(value, bool):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-single-active-consumer' for queue '{name.decode()}' in vhost "
            f"'{vhost}': {{unacceptable_type,{field_type(value)}}}",
        )
    return value


def not_integer(value: Any) -> str:
    """RabbitMQ 3.10's check_int_arg's refusal of a value that is no integer."""
    return f'"expected integer, got {field_type(value)}"'


def field_type(value: Any) -> str:
    """The AMQP field type of a value, as RabbitMQ's errors name it."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes):
        return "binary"  # (a byte array, 'x': pamqp decodes a longstr as str)
    return type(value).__name__


# The queue arguments RabbitMQ 3.10 checks for equivalence on redeclare.
EQUIVALENT_QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-capacity",
    "x-flow-resume-capacity",
)


def check_equivalent(
    name: bytes, vhost: str, arguments: dict[str, Any], current: dict[str, Any]
) -> None:
    """RabbitMQ compares the arguments it knows on a redeclare; others
    (a client's own x-foo) may differ. Type classes count, as in its
    assert_args_equivalence: 10 is not 10.0 (nor true 1)."""
    for key in EQUIVALENT_QUEUE_ARGUMENTS:
        got, have = arguments.get(key), current.get(key)
        if (
            got != have
            or (type(got) is bool) != (type(have) is bool)
            or (type(got) is float) != (type(have) is float)
        ):
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"inequivalent arg '{key}' for queue '{name.decode()}' in vhost "
                f"'{vhost}': {argument_mismatch(got, have)}",
            )


def check_x_match(args: dict[str, Any]) -> None:
    """A headers exchange binding's x-match, refused with RabbitMQ's text."""
    mode = args.get("x-match", "all")
    if mode not in X_MATCH_MODES:
        text = mode.decode(errors="replace") if isinstance(mode, bytes) else mode
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f'Invalid x-match field value <<"{text}">>; expected all, any, '
            "all-with-x, or any-with-x",
        )


def typed(value: Any) -> str:
    """A field value as RabbitMQ's argument equivalence errors show it."""
    if value is None:
        return "none"
    kind = field_type(value)
    shown = value.decode(errors="replace") if isinstance(value, bytes) else value
    if isinstance(shown, bool):
        shown = str(shown).lower()
    return f"the value '{shown}' of type '{kind}'"


def argument_mismatch(got: Any, have: Any) -> str:
    """RabbitMQ's rabbit_misc:assert_args_equivalence wording: typed when
    one side is missing, plain values when both are there."""
    if got is None or have is None:
        return f"received {typed(got)} but current is {typed(have)}"
    return f"received {shown(got)} but current is {shown(have)}"


def shown(value: Any) -> str:
    """A value as RabbitMQ's equivalence errors show it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"'{str(value).lower()}'"
    return f"'{value}'"
