"""Publishing rows to exchanges with publisher confirms (the DataFrame writer).
Pure Python: the Spark writers in datasource.py feed rows to Publisher.

Per Spark task: one connection, one channel in confirm mode, `mandatory` set
on every message. Publishing is pipelined (a window of unconfirmed messages,
not one round trip per row); publish_all returns once every message is
confirmed, and raises if one was nacked or returned unroutable, so the task
fails and Spark reports it. Every message gets a deterministic message_id
(the row's own message_id column when set, else `<prefix>:<row index>`), so a
consumer can drop the copies a retried task or a replayed batch publishes;
the same id is the message's x-deduplication-header, so a broker can too.
"""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pika
import pika.exceptions
import pika.spec

import shoal.spark.amqp as amqp
from shoal.spark.errors import ShoalSparkError
from shoal.spark.options import Options
from shoal.spark.rows import PROPERTY_COLUMNS, header_text

WINDOW = 5000  # unconfirmed messages in flight per task
DEDUP_HEADER = "x-deduplication-header"
_INT_PROPERTIES = ("delivery_mode", "priority")


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "backslashreplace")
    return str(value)


def _body(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ShoalSparkError(f"column body must be binary or string, not {type(value).__name__}")


def properties_of(row: Mapping[str, Any], message_id: str, delivery_mode: int) -> Any:
    """pika BasicProperties from a row's property columns (absent or null:
    not set), with `message_id` unless the row has its own, and that id as
    header x-deduplication-header unless the row's headers have one."""
    values: dict[str, Any] = {}
    for name in PROPERTY_COLUMNS:
        value = row.get(name)
        if value is None:
            continue
        if name in _INT_PROPERTIES:
            values[name] = int(value)
        elif name == "timestamp":
            if isinstance(value, datetime.datetime):
                if value.tzinfo is None:
                    value = value.replace(tzinfo=datetime.UTC)
                values[name] = int(value.timestamp())
            else:
                values[name] = int(value)
        else:
            values[name] = _text(value)
    values.setdefault("message_id", message_id)
    values.setdefault("delivery_mode", delivery_mode)
    headers = {str(k): header_text(v) for k, v in dict(row.get("headers") or {}).items()}
    # The message deduplication plugin's key (RabbitMQ's, LavinMQ's, Shoal's):
    # a queue or exchange declared with x-message-deduplication drops the
    # copies a retried task or a replayed batch publishes, and confirms them.
    headers.setdefault(DEDUP_HEADER, values["message_id"])
    values["headers"] = headers
    return pika.spec.BasicProperties(**values)


class Publisher:
    """Publishes rows (mappings of column name to value) for one task."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._conn: Any = None
        self._ch: Any = None
        self._unconfirmed: collections.OrderedDict[int, tuple[str, str]] = collections.OrderedDict()
        self._next_tag = 1
        self._nacked: list[tuple[str, str]] = []
        self._returned: list[tuple[str, str, int, str]] = []
        self._exchanges: set[str] = {""}
        self.published = 0

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a Publisher is made per task, not pickled")

    def _open(self) -> None:
        self._conn = amqp.connect(self.options.uri)
        ch = self._conn.channel()
        ch.add_on_return_callback(self._on_return)
        selected: list[bool] = []
        # The underlying (asynchronous) channel: pika's BlockingChannel would
        # wait for each confirm, one round trip per row.
        ch._impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: selected.append(True)
        )
        deadline = time.monotonic() + self.options.confirm_timeout
        while not selected:
            self._check(ch)
            if time.monotonic() > deadline:
                raise ShoalSparkError("no confirm.select-ok from the broker")
            self._conn.process_data_events(time_limit=0.01)
        self._ch = ch

    def _on_return(self, _ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
        self._returned.append(
            (method.exchange, method.routing_key, method.reply_code, method.reply_text)
        )

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        nack = isinstance(method, pika.spec.Basic.Nack)
        pending = self._unconfirmed
        if method.multiple:
            while pending:
                tag, where = pending.popitem(last=False)
                if tag > method.delivery_tag:
                    pending[tag] = where
                    pending.move_to_end(tag, last=False)
                    break
                if nack:
                    self._nacked.append(where)
        else:
            found = pending.pop(method.delivery_tag, None)
            if nack and found is not None:
                self._nacked.append(found)

    def _check(self, ch: Any) -> None:
        if ch.is_closed:
            reason = getattr(ch, "_closing_reason", None)
            if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                raise amqp.broker_error(reason, "publishing", self.options.uri)
            raise ShoalSparkError(f"the channel to {amqp.redact(self.options.uri)} was closed")

    def _exchange_exists(self, exchange: str) -> None:
        if exchange in self._exchanges:
            return
        probe = self._conn.channel()
        try:
            probe.exchange_declare(exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise amqp.not_found(exc, "exchange", exchange, self.options.uri) or amqp.broker_error(
                exc, f"checking exchange '{exchange}'", self.options.uri
            ) from None
        probe.close()
        self._exchanges.add(exchange)

    def _pump(self, seconds: float) -> None:
        try:
            self._conn.process_data_events(time_limit=seconds)
        except pika.exceptions.AMQPError as exc:
            raise amqp.broker_error(exc, "publishing", self.options.uri) from None
        self._check(self._ch)

    def publish_all(self, rows: Iterable[Mapping[str, Any]], id_prefix: str) -> int:
        """Publish every row and wait for every confirm; returns the count."""
        self._open()
        try:
            opts = self.options
            for index, row in enumerate(rows):
                exchange = row.get("exchange")
                exchange = opts.exchange if exchange is None else str(exchange)
                routing_key = row.get("routing_key")
                if routing_key is None:
                    routing_key = opts.routing_key
                if routing_key is None:
                    raise ShoalSparkError(
                        "no routing key: give option routingKey or a routing_key column "
                        f"(null in row {index} of this partition)"
                    )
                routing_key = str(routing_key)
                self._exchange_exists(exchange)
                props = properties_of(row, f"{id_prefix}:{index}", opts.delivery_mode)
                self._ch._impl.basic_publish(
                    exchange, routing_key, _body(row.get("body")), props, mandatory=True
                )
                self._unconfirmed[self._next_tag] = (exchange, routing_key)
                self._next_tag += 1
                self.published += 1
                if len(self._unconfirmed) >= WINDOW:
                    while len(self._unconfirmed) >= WINDOW // 2:
                        self._pump(0.01)
                elif index % 256 == 0:
                    self._pump(0)
            deadline = time.monotonic() + opts.confirm_timeout
            while self._unconfirmed:
                if time.monotonic() > deadline:
                    raise ShoalSparkError(
                        f"{len(self._unconfirmed)} messages not confirmed by "
                        f"{amqp.redact(opts.uri)} within {opts.confirm_timeout:.0f} s"
                    )
                self._pump(0.01)
            self._pump(0)  # a basic.return precedes its ack: dispatch it
            if self._returned:
                exchange, routing_key, code, text = self._returned[0]
                raise ShoalSparkError(
                    f"{len(self._returned)} of {self.published} messages were returned "
                    f"unroutable ({code} {text}): exchange '{exchange}' with routing key "
                    f"'{routing_key}' routes to no queue"
                )
            if self._nacked:
                exchange, routing_key = self._nacked[0]
                raise ShoalSparkError(
                    f"{len(self._nacked)} of {self.published} messages were nacked by the "
                    f"broker (first: exchange '{exchange}', routing key '{routing_key}')"
                )
            return self.published
        finally:
            amqp.close_quietly(self._conn)
