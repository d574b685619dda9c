"""What the management API asks of the broker: the scheduler's control
socket (the same JSON requests as `shoal ctl`), the definitions journal
(users, for logins), and AMQP itself for what a client does (declare,
delete, purge, bind, publish, get): those go over a connection made as
the API's user with that user's password, so RabbitMQ's access control
applies to them exactly as to any client (workers/connection_access.py). pika's
blocking client, in a thread per request: a management call is rare, and
it is the client that reports an unroutable mandatory publish without
adding properties to the message."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions

from shoal.broker.amqp.definitions import Definitions, Op
from shoal.broker.config import Config
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.introspect import socket_path
from shoal.shm import memory
from shoal.shm.catalog import CatalogFollower
from shoal.shm.segment import Segment

CONTROL_TIMEOUT = 30.0
AMQP_TIMEOUT = 10.0
T = TypeVar("T")


class ControlError(Exception):
    """The scheduler refused a request: its text and rabbitmqctl's code."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


class AmqpError(Exception):
    """An AMQP error the internal connection got (code and reply text)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class Backend:
    def __init__(self, config: Config, seg: Segment) -> None:
        self.config = config
        self.seg = seg
        self.runtime_dir = config.runtime_path()
        self.journal = CatalogFollower(seg, Op, Definitions)

    def alarms(self) -> str:
        """The resource alarms in force, as RabbitMQ's health check names
        them ("" when none)."""
        bits = memory.broker_alarms(self.seg)
        raised = [
            n
            for bit, n in ((memory.ALARM_MEMORY, "memory"), (memory.ALARM_DISK, "disk"))
            if bits & bit
        ]
        return f"resource alarm(s) in effect: {', '.join(raised)}" if raised else ""

    def current(self) -> Definitions:
        """The definitions as the journal has them now (users, vhosts,
        permissions): replayed since the last call."""
        return self.journal.current()

    async def control(self, request: C.Op | dict[str, Any]) -> dict[str, Any]:
        """One request to the scheduler's control socket: typed (control.py),
        or as its JSON object ({"op": ..., ...})."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(socket_path(self.runtime_dir), limit=256 << 20),
            CONTROL_TIMEOUT,
        )
        try:
            writer.write(C.encode(request))
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), CONTROL_TIMEOUT)
        finally:
            writer.close()
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ControlError(str(answer["error"]), int(answer.get("code", 70)))
        return answer

    async def rows(self, op: str, **fields: Any) -> list[dict[str, Any]]:
        """A listing's rows: `op` names its request, `fields` its fields."""
        answer = await self.control(C.BY_NAME[op](**fields))
        rows: list[dict[str, Any]] = answer.get("rows", answer.get("policies", []))
        return rows

    async def amqp(self, user: str, password: str, vhost: str, work: Callable[[Any], T]) -> T:
        """`work(channel)` on a channel of a connection made as `user` to
        `vhost` (the plain listener, loopback), in a thread: pika's
        blocking client, whose mandatory publishes under confirms say
        whether a message was routed without changing it."""
        if not self.config.plain_listener:
            raise AmqpError(503, "the management API needs the plain AMQP listener")
        if len(vhost.encode()) > 255:  # (an AMQP short string: no vhost is so named)
            raise AmqpError(404, f"vhost '{vhost[:32]}...' not found")
        return await asyncio.to_thread(self._amqp, user, password, vhost, work)

    def _amqp(self, user: str, password: str, vhost: str, work: Callable[[Any], T]) -> T:
        params = pika.ConnectionParameters(
            "127.0.0.1",
            self.config.port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
            socket_timeout=AMQP_TIMEOUT,
            blocked_connection_timeout=AMQP_TIMEOUT,
        )
        try:
            connection = pika.BlockingConnection(params)
        except pika.exceptions.ProbableAuthenticationError as exc:
            raise AmqpError(401, str(exc)) from None
        except pika.exceptions.ConnectionClosedByBroker as exc:
            raise AmqpError(exc.reply_code, exc.reply_text) from None
        except pika.exceptions.AMQPError as exc:
            raise AmqpError(503, f"cannot connect to the broker: {exc!r}") from None
        try:
            return work(connection.channel())
        except pika.exceptions.ShortStringTooLong as exc:  # (a name no queue or exchange has)
            raise ValueError(f"name too long: {len(exc.args[0])} bytes (255 at most)") from None
        except (
            pika.exceptions.ChannelClosedByBroker,
            pika.exceptions.ConnectionClosedByBroker,
        ) as exc:
            if exc.reply_code == 503:  # COMMAND_INVALID: the request's fault (400, as RabbitMQ)
                raise ValueError(exc.reply_text) from None
            raise AmqpError(exc.reply_code, exc.reply_text) from None
        finally:
            if connection.is_open:
                connection.close()

    async def get(
        self,
        user: str,
        password: str,
        vhost: str,
        queue: str,
        count: int,
        requeue: bool,
        encoding: str,
        truncate: int | None,
    ) -> list[dict[str, Any]]:
        """/api/queues/V/Q/get: up to `count` messages, requeued or not."""

        def work(channel: Any) -> list[dict[str, Any]]:
            got: list[dict[str, Any]] = []
            last = 0
            for _ in range(count):
                method, props, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                last = method.delivery_tag
                got.append(_message(method, props, body, encoding, truncate))
            if last:
                if requeue:
                    channel.basic_nack(last, multiple=True, requeue=True)
                else:
                    channel.basic_ack(last, multiple=True)
            return got

        return await self.amqp(user, password, vhost, work)

    async def publish(
        self,
        user: str,
        password: str,
        vhost: str,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any],
    ) -> bool:
        """/api/exchanges/V/X/publish: whether the message was routed
        (mandatory and confirmed: a basic.return says it was not)."""

        def work(channel: Any) -> bool:
            channel.confirm_delivery()
            try:
                channel.basic_publish(
                    "" if exchange == "amq.default" else exchange,
                    routing_key,
                    body,
                    pika.BasicProperties(**properties),
                    mandatory=True,
                )
            except pika.exceptions.UnroutableError:
                return False
            return True

        return await self.amqp(user, password, vhost, work)


def _message(
    method: Any, props: Any, body: bytes, encoding: str, truncate: int | None
) -> dict[str, Any]:
    """A message as the management API's /get shows it."""
    payload_bytes = len(body)
    if truncate is not None:
        body = body[:truncate]
    payload, payload_encoding = base64.b64encode(body).decode(), "base64"
    if encoding != "base64":
        try:
            payload, payload_encoding = body.decode(), "string"
        except UnicodeDecodeError:
            pass
    properties = {
        name: getattr(props, attribute)
        for name, attribute in PROPERTY_NAMES.items()
        if getattr(props, attribute, None) is not None
    }
    return {
        "payload_bytes": payload_bytes,
        "redelivered": method.redelivered,
        "exchange": method.exchange,
        "routing_key": method.routing_key,
        "message_count": method.message_count,
        "properties": properties,
        "payload": payload,
        "payload_encoding": payload_encoding,
    }


# The management API's property names, and pika's.
PROPERTY_NAMES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "type",
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}
