"""Policies (issue 15, item 9), without IO: an operator's settings for the
queues whose names match a pattern, as RabbitMQ's policies are, and how a
policy and a queue's own x-arguments combine.

A policy has a name, a virtual host, a pattern (a regular expression
searched in the queue's or exchange's name, as RabbitMQ does), what it
applies to (`queues`, `exchanges` or `all`), a priority, and a definition.
Of the policies matching a queue (an exchange) the one with the highest
priority applies (ties: the first name in order), and only that one. An
exchange takes one key, `alternate-exchange`; its own argument wins.

RabbitMQ's rule for a key both sides set (rabbit_classic_queue's and
rabbit_quorum_queue's policy lookups): the numeric limits (message-ttl,
expires, max-length, max-length-bytes, delivery-limit, and Shoal's capacity)
take the lower of the two; the others (dead-letter-exchange,
dead-letter-routing-key, overflow, dead-letter-strategy) keep the queue's
own argument.
"""

from __future__ import annotations

import re
from typing import Any

from shoal.broker.amqp.x_arguments import MAX_EXPIRY, OVERFLOW_MODES

# Policy key -> (the queue argument it stands for, lower wins?)
KEYS: dict[str, tuple[str, bool]] = {
    "message-ttl": ("x-message-ttl", True),
    "expires": ("x-expires", True),
    "max-length": ("x-max-length", True),
    "max-length-bytes": ("x-max-length-bytes", True),
    "delivery-limit": ("x-delivery-limit", True),
    "capacity": ("x-capacity", True),
    "flow-resume-capacity": ("x-flow-resume-capacity", True),
    "dead-letter-exchange": ("x-dead-letter-exchange", False),
    "dead-letter-routing-key": ("x-dead-letter-routing-key", False),
    "overflow": ("x-overflow", False),
    "dead-letter-strategy": ("x-dead-letter-strategy", False),
}
# Policy keys for exchanges (the exchange argument each stands for).
EXCHANGE_KEYS = {"alternate-exchange": "alternate-exchange"}
APPLY_TO = ("queues", "all", "exchanges")


class PolicyError(ValueError):
    """A policy that cannot be set: the message says why."""


def check(name: str, pattern: str, apply_to: str, definition: dict[str, Any]) -> None:
    """Refuse a policy RabbitMQ's set_policy would refuse (for these keys)."""
    if not name:
        raise PolicyError("a policy needs a name")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise PolicyError(f"invalid pattern {pattern!r}: {exc}") from None
    if apply_to not in APPLY_TO:
        raise PolicyError(f"apply-to '{apply_to}' is not one of {', '.join(APPLY_TO)}")
    if not definition:
        raise PolicyError("a policy's definition must set at least one key")
    for key, value in definition.items():
        if key not in KEYS and key not in EXCHANGE_KEYS:
            raise PolicyError(f"'{key}' is not a recognised policy key")
        _check_value(key, value)


def _check_value(key: str, value: Any) -> None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in ("dead-letter-exchange", "dead-letter-routing-key", "alternate-exchange"):
        if not isinstance(value, str):
            raise PolicyError(f"{key}: {value!r} is not a string")
    elif key == "overflow":
        if value not in OVERFLOW_MODES:
            raise PolicyError(f"overflow: {value!r} is not one of {', '.join(OVERFLOW_MODES)}")
    elif key == "dead-letter-strategy":
        if value not in ("at-most-once", "at-least-once"):
            raise PolicyError(f"dead-letter-strategy: {value!r} is not a strategy")
    elif key == "delivery-limit":
        if not is_int or value < -1:
            raise PolicyError(f"delivery-limit: {value!r} is not an integer >= -1")
    elif not is_int or value < (1 if key == "expires" else 0):
        least = 1 if key == "expires" else 0
        raise PolicyError(f"{key}: {value!r} is not an integer >= {least}")
    elif key in ("message-ttl", "expires") and value > MAX_EXPIRY:
        raise PolicyError(f"{key}: {value} is above {MAX_EXPIRY}")


def applying(
    policies: list[dict[str, Any]], name: str, to: str = "queues"
) -> dict[str, Any] | None:
    """The policy (as stored: name, pattern, apply-to, priority,
    definition) that applies to the queue (`to` "exchanges": the exchange)
    `name`, of one virtual host's."""
    best = None
    other = "exchanges" if to == "queues" else "queues"
    for policy in sorted(policies, key=lambda p: p["name"]):
        if policy["apply-to"] == other or not re.search(policy["pattern"], name):
            continue
        if best is None or policy["priority"] > best["priority"]:
            best = policy
    return best


def effective(arguments: dict[str, Any], policy: dict[str, Any] | None) -> dict[str, Any]:
    """A queue's arguments with `policy` applied, by RabbitMQ's rules."""
    if policy is None:
        return arguments
    merged = dict(arguments)
    for key, value in policy["definition"].items():
        if key not in KEYS:
            continue  # (an exchange's key, of a policy that applies to all)
        argument, lower_wins = KEYS[key]
        own = merged.get(argument)
        if own is None or (lower_wins and _comparable(own) and _comparable(value) and value < own):
            merged[argument] = value
    return merged


def _comparable(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def alternate_exchanges(policies: list[dict[str, Any]], exchanges: list[str]) -> dict[str, str]:
    """Exchange -> the alternate exchange its policy names (those whose
    policy names none are left out)."""
    found = {}
    for name in exchanges:
        policy = applying(policies, name, "exchanges") if policies else None
        alternate = policy["definition"].get("alternate-exchange") if policy else None
        if alternate:
            found[name] = alternate
    return found
