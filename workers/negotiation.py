"""The connection handshake's rules, without IO: what the server says of
itself in connection.start, the client's credentials, and the limits a
client may tune to (RabbitMQ's reply texts). workers/connection.py drives
the handshake and calls these."""

from __future__ import annotations

import logging
import os
import struct
import sys
from collections.abc import Collection, Mapping
from typing import Any

from pamqp import commands as C
from pamqp import decode as pamqp_decode

from shoal.broker import VERSION, node_name
from shoal.broker.amqp import access, errors
from shoal.broker.amqp.definitions import Definitions, PermissionSet, UserSet
from shoal.broker.amqp.definitions_json import RABBIT_VERSION

log = logging.getLogger("shoal.connection")


def server_properties(worker: int) -> dict[str, Any]:
    """connection.start's server-properties table."""
    return {
        "product": "Shoal",
        # The RabbitMQ version Shoal answers as, which clients compare (aioamqp's
        # tests take 0.1.0 for a RabbitMQ before 3.3.5, whose deletes of missing
        # objects were 404s), as the management API's rabbitmq_version; Shoal's
        # own is shoal_version.
        "version": RABBIT_VERSION,
        "platform": f"Python {sys.version.split()[0]}",
        "copyright": "Shoal authors",
        "information": "Licensed under the Apache License 2.0",
        "cluster_name": node_name.node_name(),
        "capabilities": {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "exchange_exchange_bindings": True,
            "connection.blocked": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "consumer_priorities": True,
            "direct_reply_to": True,
        },
        # Which IO worker serves this connection: visible to any client. As
        # strings: RabbitMQ sends only long strings, booleans and tables here,
        # and codecs written against AMQP 0-8 know no short-short-int ('b'),
        # the type pamqp picks for a small integer.
        "shoal_version": VERSION,
        "shoal_worker": str(worker),
        "shoal_worker_pid": str(os.getpid()),
    }


def login(
    method: C.Connection.StartOk,
    users: Mapping[str, UserSet],
    peer_host: str,
    loopback_users: Collection[str],
    certificate_user: str = "",
    enabled: Collection[str] = ("PLAIN", "AMQPLAIN"),
) -> str:
    """The user connection.start-ok's credentials log in as, or RabbitMQ's
    403 "Login was refused ...": an unknown user, a wrong password, or one
    of `loopback_users` from another machine (the same text, measured). EXTERNAL: the user named
    by the client's verified TLS certificate (`certificate_user`), whose
    password is not asked for. A mechanism not offered (of `enabled`) or a
    malformed response: errors.SilentClose, as RabbitMQ (no frame, a close
    3 s later)."""
    mechanism = method.mechanism
    if mechanism not in mechanisms(certificate_user, enabled).split():
        # RabbitMQ's command_invalid: EXTERNAL is one it knows, offered only
        # over TLS with a client certificate.
        known = "invalid" if mechanism in ("EXTERNAL", "PLAIN", "AMQPLAIN") else "unknown"
        raise errors.SilentClose(
            errors.COMMAND_INVALID, f"{known} authentication mechanism '{mechanism}'"
        )
    if mechanism == "EXTERNAL":
        if certificate_user not in users:
            log.warning("EXTERNAL login refused: user '%s' - unknown", certificate_user)
            raise access.login_refused(mechanism)
        got_user = certificate_user
    else:
        credentials = _credentials(mechanism, method.response)
        if credentials is None:  # RabbitMQ's syntax_error
            raise errors.SilentClose(
                errors.SYNTAX_ERROR, f"{mechanism} response {method.response!r} invalid"
            )
        got_user, got_password = credentials
        record = users.get(got_user)
        if record is None or not access.password_matches(
            record.password_hash, record.hashing_algorithm, got_password
        ):
            why = "invalid credentials" if record is not None else "unknown user"
            log.warning("%s login refused: user '%s' - %s", mechanism, got_user, why)
            raise access.login_refused(mechanism)
    if got_user in loopback_users and not access.is_loopback(peer_host):
        log.warning("user '%s' can only connect via localhost (from %s)", got_user, peer_host)
        raise access.login_refused(mechanism)  # RabbitMQ 3.10 says no more
    return got_user


def mechanisms(certificate_user: str, enabled: Collection[str] = ("PLAIN", "AMQPLAIN")) -> str:
    """connection.start's mechanisms: those `enabled` (--auth-mechanisms),
    EXTERNAL among them only over TLS with a client certificate. Offered by
    default it broke clients that take it first (py-amqp, so Celery and
    Kombu, over mutual TLS with a password: 403 for a CN that is no user),
    where RabbitMQ offers it only with its plugin enabled and listed."""
    return " ".join(m for m in enabled if m != "EXTERNAL" or certificate_user)


def connection_limited(vhost: str, user: str, definitions: Definitions) -> bool:
    """Whether a max-connections limit applies to a connection opening."""
    record = definitions.users.get(user)
    return "max-connections" in definitions.vhost_limits.get(vhost, {}) or (
        record is not None and "max-connections" in record.limits
    )


def check_vhost_access(
    vhost: str,
    user: str,
    vhost_ids: Mapping[str, int],
    permissions: Mapping[tuple[str, str], PermissionSet],
) -> int:
    """connection.open's virtual host: its id, or RabbitMQ's 530."""
    vhost_id = vhost_ids.get(vhost)
    if vhost_id is None:
        raise errors.ConnectionError_(errors.NOT_ALLOWED, f"vhost {vhost} not found", 10, 40)
    if (vhost, user) not in permissions:
        raise errors.ConnectionError_(
            errors.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'", 10, 40
        )
    return vhost_id


def check_channel_max(open_now: int, channel_max: int) -> None:
    """Before a channel.open: RabbitMQ limits how many channels are open
    (not their numbers) to the negotiated channel_max."""
    if channel_max and open_now >= channel_max:
        raise errors.ConnectionError_(
            errors.NOT_ALLOWED,
            f"number of channels opened ({open_now}) has reached the "
            f"negotiated channel_max ({channel_max})",
        )


def check_tune_ok(method: C.Connection.TuneOk, frame_max: int, channel_max: int) -> None:
    """The client's connection.tune-ok within what we offered, or what
    RabbitMQ 3.10 answers (measured): no frame, the socket closed 3 s later
    (rabbit_reader's handshake error). A 0, "no limit", is over a limit the
    server has (rabbit_reader's validate_negotiated_integer_value)."""
    for name, value, low, high in (
        ("frame_max", method.frame_max, 4096, frame_max),  # (framing.FRAME_MIN_SIZE)
        ("channel_max", method.channel_max, 0, channel_max),
    ):
        if value and value < low:
            raise errors.SilentClose(
                errors.NOT_ALLOWED,
                f"negotiated {name} = {value} is lower than the minimum allowed value ({low})",
            )
        if high and (value == 0 or value > high):
            raise errors.SilentClose(
                errors.NOT_ALLOWED,
                f"negotiated {name} = {value} is higher than the maximum allowed value ({high})",
            )


# Clients that answer a server's channel.flow with channel.flow-ok and hold
# their publishes until it is re-opened (RabbitMQ's Java and .NET clients), or
# answer and carry on (py-amqp: kombu, Celery). Others must not get it: pika
# only logs it, aiormq would take it for the reply to its next request, and
# the Erlang client (shovels, Elixir) silently discards what is published by
# cast meanwhile. No capability announces it, so the client's product /
# platform properties decide.
CHANNEL_FLOW_PLATFORMS = frozenset({"Java", ".NET", ".NET Core"})
CHANNEL_FLOW_PRODUCTS = frozenset({"py-amqp"})


def obeys_channel_flow(props: dict[str, Any]) -> bool:
    def text(key: str) -> str:
        value = props.get(key)
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")

    return text("platform") in CHANNEL_FLOW_PLATFORMS or text("product") in CHANNEL_FLOW_PRODUCTS


def _credentials(mechanism: str, response: Any) -> tuple[str, str] | None:
    """(user, password) of a PLAIN or AMQPLAIN response; None where it is
    malformed: PLAIN without its two NULs (an empty response, as clients
    send for an empty password), AMQPLAIN without LOGIN and PASSWORD."""
    # pamqp decodes the response as UTF-8: encode it back the same way.
    raw = (
        response.encode(errors="surrogateescape")
        if isinstance(response, str)
        else bytes(response or b"")
    )
    if mechanism == "PLAIN":
        parts = raw.split(b"\0")
        if len(parts) != 3:
            return None
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    try:
        _n, table = pamqp_decode.field_table(struct.pack(">I", len(raw)) + raw)
    except Exception:
        return None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if not isinstance(login, str | bytes) or not isinstance(password, str | bytes):
        return None
    as_str = lambda v: v.decode(errors="replace") if isinstance(v, bytes) else v  # noqa: E731
    return as_str(login), as_str(password)
