"""The connector's options, parsed once from Spark's case-insensitive string
map into a frozen, picklable dataclass (spark/README.md lists them).

Spark lower-cases option keys; every value is a string. Nothing here opens a
socket: the objects built from these options are constructed in several
processes (the driver's runners and planners, the executors) and pickled.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.spark.errors import ShoalSparkError

DEFAULT_URI = "amqp://guest:guest@localhost:5672/"
QUEUE_TYPES = ("auto", "stream", "classic")


def _get(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """`name` in any case (Spark hands the keys lower-cased; tests pass them
    as written)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return str(value)
    return default


def _int(options: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ShoalSparkError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ShoalSparkError(f"option {name} must be at least {minimum}, not {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ShoalSparkError(f"option {name} must be true or false, not {raw!r}")


def parse_offsets(raw: str | None, queues: tuple[str, ...], name: str) -> dict[str, Any]:
    """startingOffsets / endingOffsets: "earliest", "latest", or a JSON object
    {"queue": offset} where an offset is an integer, "earliest" or "latest"
    (Kafka's -2 and -1 are accepted too). A queue missing from the object
    gets `earliest` for a start and `latest` for an end."""
    default = "earliest" if name == "startingOffsets" else "latest"
    if raw is None or raw.strip() == "":
        return dict.fromkeys(queues, default)
    text = raw.strip()
    if text in ("earliest", "latest"):
        return dict.fromkeys(queues, text)
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        raise ShoalSparkError(
            f'option {name} must be "earliest", "latest" or a JSON object '
            f'{{"queue": offset}}, not {raw!r}'
        ) from None
    if not isinstance(given, dict):
        raise ShoalSparkError(f"option {name} must be a JSON object, not {raw!r}")
    unknown = sorted(set(given) - set(queues))
    if unknown:
        raise ShoalSparkError(f"option {name} names queues not in option queue: {unknown}")
    out: dict[str, Any] = {}
    for queue in queues:
        value = given.get(queue, default)
        if value == -2:
            value = "earliest"
        elif value == -1:
            value = "latest"
        if value not in ("earliest", "latest") and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise ShoalSparkError(
                f"option {name}: offset for queue {queue!r} must be a non-negative integer, "
                f'"earliest" or "latest", not {value!r}'
            )
        out[queue] = value
    return out


@dataclass(frozen=True)
class Options:
    uri: str = DEFAULT_URI
    queues: tuple[str, ...] = ()
    queue_type: str = "auto"
    starting_offsets: dict[str, Any] = field(default_factory=dict)
    ending_offsets: dict[str, Any] = field(default_factory=dict)
    max_messages_per_trigger: int | None = None
    messages_per_partition: int = 100_000
    prefetch: int = 1000
    fail_on_data_loss: bool = True
    read_timeout: float = 60.0
    poll_timeout: float = 1.0
    spool_location: str | None = None
    dedupe_window: int = 100_000
    exchange: str = ""
    routing_key: str | None = None
    delivery_mode: int = 2
    confirm_timeout: float = 60.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        queues = tuple(
            q.strip() for q in (_get(options, "queue") or "").split(",") if q.strip() != ""
        )
        if len(set(queues)) != len(queues):
            raise ShoalSparkError(f"option queue names a queue twice: {','.join(queues)}")
        queue_type = (_get(options, "queueType") or "auto").strip().lower()
        if queue_type not in QUEUE_TYPES:
            raise ShoalSparkError(
                f"option queueType must be one of {', '.join(QUEUE_TYPES)}, not {queue_type!r}"
            )
        limit = _get(options, "maxMessagesPerTrigger")
        spool = _get(options, "spoolLocation")
        if not spool:
            checkpoint = _get(options, "checkpointLocation")
            spool = os.path.join(checkpoint, "shoal-spool") if checkpoint else None
        delivery_mode = _int(options, "deliveryMode", 2)
        if delivery_mode not in (1, 2):
            raise ShoalSparkError(f"option deliveryMode must be 1 or 2, not {delivery_mode}")
        return cls(
            uri=_get(options, "uri") or DEFAULT_URI,
            queues=queues,
            queue_type=queue_type,
            starting_offsets=parse_offsets(
                _get(options, "startingOffsets"), queues, "startingOffsets"
            ),
            ending_offsets=parse_offsets(_get(options, "endingOffsets"), queues, "endingOffsets"),
            max_messages_per_trigger=None
            if limit in (None, "")
            else _int(options, "maxMessagesPerTrigger", 0),
            messages_per_partition=_int(options, "messagesPerPartition", 100_000),
            prefetch=min(_int(options, "prefetch", 1000), 65535),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            read_timeout=float(_int(options, "readTimeoutSeconds", 60)),
            poll_timeout=_int(options, "pollTimeoutMs", 1000) / 1000,
            spool_location=spool,
            dedupe_window=_int(options, "dedupeWindow", 100_000, minimum=0),
            exchange=_get(options, "exchange") or "",
            routing_key=_get(options, "routingKey"),
            delivery_mode=delivery_mode,
            confirm_timeout=float(_int(options, "confirmTimeoutSeconds", 60)),
        )

    def require_queues(self) -> tuple[str, ...]:
        if not self.queues:
            raise ShoalSparkError('option "queue" is required (one name or a comma-separated list)')
        return self.queues
