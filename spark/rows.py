"""The row every read produces (one per AMQP message), its Spark schema, and
its JSON form in the classic-queue spool. Pure Python: no pyspark import.

Columns, in order (spark/README.md, "Schema"): the body, where the message
was published (routing key, exchange), the basic properties, the headers as
strings, when the connector read it, its stream offset (null for classic
queues), the redelivered flag and the queue it came from.
"""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

PROPERTY_COLUMNS = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)
_INT_PROPERTIES = {"delivery_mode", "priority"}
COLUMNS = (
    "body",
    "routing_key",
    "exchange",
    *PROPERTY_COLUMNS,
    "headers",
    "read_time",
    "offset",
    "redelivered",
    "queue",
)
_TYPES = {
    "body": "BINARY",
    "delivery_mode": "INT",
    "priority": "INT",
    "timestamp": "TIMESTAMP",
    "headers": "MAP<STRING, STRING>",
    "read_time": "TIMESTAMP",
    "offset": "BIGINT",
    "redelivered": "BOOLEAN",
}
# Backquoted: offset, timestamp and type are SQL keywords.
SCHEMA_DDL = ", ".join(f"`{name}` {_TYPES.get(name, 'STRING')}" for name in COLUMNS)
INDEX = {name: i for i, name in enumerate(COLUMNS)}
_UTC = datetime.UTC
SHOAL_ID = "x-shoal-id"  # docs/streams.md: the consume argument and the header
_STREAM_OFFSET = "x-stream-offset"


def header_text(value: Any) -> str:
    """A header value as a string: bytes decoded as UTF-8 (invalid bytes
    escaped), tables and arrays as JSON, timestamps in ISO 8601."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=header_text, sort_keys=True)
    return str(value)


def _timestamp(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=_UTC)
    return datetime.datetime.fromtimestamp(int(value), tz=_UTC)


def message_row(
    queue: str,
    method: Any,
    properties: Any,
    body: bytes,
    read_time: datetime.datetime,
    offset: int | None,
) -> tuple[Any, ...]:
    """One row from a pika delivery (method: Basic.Deliver)."""
    headers = properties.headers or {}
    return (
        bytes(body),
        method.routing_key,
        method.exchange,
        properties.content_type,
        properties.content_encoding,
        properties.delivery_mode,
        properties.priority,
        properties.correlation_id,
        properties.reply_to,
        properties.expiration,
        properties.message_id,
        _timestamp(properties.timestamp),
        properties.type,
        properties.user_id,
        properties.app_id,
        {str(k): header_text(v) for k, v in headers.items() if k != _STREAM_OFFSET},
        read_time,
        offset,
        bool(method.redelivered),
        queue,
    )


def dedupe_id(row: tuple[Any, ...]) -> str | None:
    """The id by which classic-queue mode recognises a message it has already
    handed to Spark when the broker delivers it again (after a connection
    loss): the broker-stamped `x-shoal-id` header (the queue entry, the same
    on every redelivery while the broker runs; the consumer asks for it),
    else the message_id property. None: the message cannot be recognised, so
    a redelivery of it becomes a duplicate row."""
    headers = row[INDEX["headers"]] or {}
    stamped = headers.get(SHOAL_ID)
    if stamped:
        return str(stamped)
    value = row[INDEX["message_id"]]
    return None if value is None or value == "" else str(value)


def now() -> datetime.datetime:
    return datetime.datetime.now(_UTC)


def _micros(value: datetime.datetime | None) -> int | None:
    if value is None:
        return None
    delta = value - datetime.datetime(1970, 1, 1, tzinfo=_UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(value: int | None) -> datetime.datetime | None:
    if value is None:
        return None
    return datetime.datetime(1970, 1, 1, tzinfo=_UTC) + datetime.timedelta(microseconds=value)


def to_json(row: tuple[Any, ...]) -> str:
    """One spool line: exact (bytes in base64, timestamps in microseconds)."""
    out = list(row)
    out[INDEX["body"]] = base64.b64encode(row[INDEX["body"]]).decode("ascii")
    out[INDEX["timestamp"]] = _micros(row[INDEX["timestamp"]])
    out[INDEX["read_time"]] = _micros(row[INDEX["read_time"]])
    return json.dumps(out, separators=(",", ":"))


def from_json(line: str) -> tuple[Any, ...]:
    out = json.loads(line)
    if len(out) != len(COLUMNS):
        raise ValueError(f"spool line has {len(out)} fields, not {len(COLUMNS)}")
    out[INDEX["body"]] = base64.b64decode(out[INDEX["body"]])
    out[INDEX["timestamp"]] = _from_micros(out[INDEX["timestamp"]])
    out[INDEX["read_time"]] = _from_micros(out[INDEX["read_time"]])
    return tuple(out)
