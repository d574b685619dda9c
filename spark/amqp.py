"""Connections and the AMQP calls every part of the connector shares, with
pika's exceptions turned into ShoalSparkError messages a Spark user can act
on: the URI without its password, the queue and vhost that do not exist.

Nothing here is called from an `__init__`: readers and writers connect
lazily, in the process that reads or writes (pitfall 11 of the research
notes: data source objects are built in planner processes and pickled).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import pika
import pika.exceptions

from shoal.spark.errors import ShoalSparkError

# A no-acquire, auto-closing browser whose selector matches nothing: on a
# classic queue it takes nothing, sees nothing and is accepted; on a stream
# the same basic.consume without basic.qos is refused (406 "consumer prefetch
# count is not set"). That refusal is how a queue's type is told without
# touching its messages.
_PROBE_ARGUMENTS = {
    "x-filter-no-consume": True,
    "x-filter-auto-close": True,
    "x-filter-jms-selector": "1 = 0",
    "x-stream-offset": "first",
}


def redact(uri: str) -> str:
    """`uri` with its password replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return "<invalid uri>"
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def vhost_of(uri: str) -> str:
    try:
        path = urllib.parse.urlsplit(uri).path
    except ValueError:
        return "/"
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def connect(uri: str, heartbeat: int | None = None) -> pika.BlockingConnection:
    """A blocking pika connection, or a ShoalSparkError saying why not."""
    try:
        params = pika.URLParameters(uri)
    except Exception as exc:
        raise ShoalSparkError(f"invalid uri {redact(uri)}: {exc}") from None
    if heartbeat is not None:
        params.heartbeat = heartbeat
    params.client_properties = {"connection_name": "shoal.spark"}
    where = redact(uri)
    try:
        return pika.BlockingConnection(params)
    except (
        pika.exceptions.ProbableAuthenticationError,
        pika.exceptions.AuthenticationError,
    ) as exc:
        raise ShoalSparkError(
            f"login refused by {where} for user {params.credentials.username!r}: {exc}"
        ) from None
    except pika.exceptions.ProbableAccessDeniedError as exc:
        raise ShoalSparkError(
            f"access to vhost {params.virtual_host!r} refused by {where}: {exc}"
        ) from None
    except pika.exceptions.AMQPConnectionError as exc:
        text = repr(exc)
        if "ConnectionRefused" in text:
            raise ShoalSparkError(
                f"cannot connect to {where}: connection refused (is the broker running?)"
            ) from None
        raise ShoalSparkError(f"cannot connect to {where}: {text}") from None
    except OSError as exc:
        raise ShoalSparkError(f"cannot connect to {where}: {exc}") from None


def not_found(exc: Exception, kind: str, name: str, uri: str) -> ShoalSparkError | None:
    """The clear error for a 404 channel close, else None."""
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == 404:
        return ShoalSparkError(f"{kind} '{name}' does not exist in vhost '{vhost_of(uri)}'")
    return None


def broker_error(exc: Exception, what: str, uri: str) -> ShoalSparkError:
    """Any other pika failure, with what was being done."""
    return ShoalSparkError(f"{what} failed on {redact(uri)}: {exc!r}")


def message_count(conn: pika.BlockingConnection, queue: str, uri: str) -> int:
    """Passive declare: the queue's ready count (a stream's next - first)."""
    try:
        ok = conn.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        raise not_found(exc, "queue", queue, uri) or broker_error(
            exc, "queue.declare", uri
        ) from None
    return int(ok.method.message_count)


def is_stream(conn: pika.BlockingConnection, queue: str, uri: str) -> bool:
    """Whether `queue` is a stream queue, without taking or marking any of its
    messages (see _PROBE_ARGUMENTS); a missing queue raises the 404 error."""
    message_count(conn, queue, uri)  # 404 first, with its own message
    ch = conn.channel()
    try:
        ch.basic_consume(queue, _ignore, arguments=_PROBE_ARGUMENTS)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406 and "prefetch count" in exc.reply_text:
            return True
        raise not_found(exc, "queue", queue, uri) or broker_error(
            exc, "probing the type of queue " + repr(queue), uri
        ) from None
    try:
        ch.close()
    except pika.exceptions.AMQPError:
        pass
    return False


def _ignore(*_args: Any) -> None:
    return None


def close_quietly(conn: Any) -> None:
    if conn is None:
        return
    try:
        if conn.is_open:
            conn.close()
    except Exception:
        pass
