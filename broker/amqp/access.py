"""Users, passwords and permissions, without IO (issue 16, items 1-3):
RabbitMQ's internal authentication and authorisation backend.

Passwords are kept as RabbitMQ keeps them, so that definitions exported
from RabbitMQ import unchanged: base64(salt + hash(salt + password)) with a
4-byte random salt, by `rabbit_password_hashing_sha256` (the default),
`_sha512` or `_md5`. A user's permissions in a virtual host are three
regular expressions, configure / write / read, searched (not anchored) in a
resource's name; an empty one grants nothing. The default exchange is
called `amq.default` when checked. Topic permissions restrict the routing
keys published to, and bound from, a topic exchange; without any for an
exchange, all keys are allowed (RabbitMQ's rule). Which method needs which
permission is RabbitMQ's access-control table, applied by the IO worker
(workers/connection_access.py)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
from collections.abc import Callable
from functools import lru_cache

from shoal.broker.amqp import errors

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
_HASHES: dict[str, Callable[[bytes], bytes]] = {
    SHA256: lambda data: hashlib.sha256(data).digest(),
    SHA512: lambda data: hashlib.sha512(data).digest(),
    MD5: lambda data: hashlib.md5(data).digest(),
}
SALT_SIZE = 4

TAGS = ("administrator", "monitoring", "management", "policymaker", "impersonator")
CONFIGURE, WRITE, READ = "configure", "write", "read"
DEFAULT_EXCHANGE_NAME = "amq.default"


class AccessError(ValueError):
    """A user, vhost or permission request that cannot be carried out
    (`shoal ctl` prints it, as rabbitmqctl prints its errors, and exits
    with rabbitmqctl's code for it: 70 by default, 67 no such user, 65 or
    69 no such vhost)."""

    def __init__(self, text: str, code: int = 70) -> None:
        super().__init__(text)
        self.code = code


def hash_password(password: str, algorithm: str = SHA256, salt: bytes | None = None) -> str:
    """RabbitMQ's password_hash for `password`."""
    digest = _HASHES.get(algorithm)
    if digest is None:
        raise AccessError(f"unknown hashing algorithm {algorithm!r}")
    salt = secrets.token_bytes(SALT_SIZE) if salt is None else salt
    return base64.b64encode(salt + digest(salt + password.encode())).decode()


def password_matches(password_hash: str, algorithm: str, password: str) -> bool:
    """Whether `password` is the one `password_hash` was made from. A user
    without a hash (created without a password) logs in by certificate only."""
    digest = _HASHES.get(algorithm or SHA256)
    if digest is None or not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    salt = raw[:SALT_SIZE]
    return len(raw) > SALT_SIZE and hash_password(password, algorithm or SHA256, salt) == (
        password_hash
    )


def check_tags(tags: list[str]) -> list[str]:
    """Tags as RabbitMQ keeps them: any names, without blanks or repeats
    (only those in TAGS mean something to the management API)."""
    seen: list[str] = []
    for tag in tags:
        tag = tag.strip()
        if tag and tag not in seen:
            seen.append(tag)
    return seen


def check_pattern(pattern: str) -> str:
    """A permission's regular expression, refused if it does not compile."""
    try:
        _compiled(pattern)
    except re.error as exc:
        raise AccessError(f"invalid regular expression {pattern!r}: {exc}") from None
    return pattern


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def permits(pattern: str, name: str) -> bool:
    """RabbitMQ's match of a permission: the pattern is searched in the
    name, an empty one taken as ^$ (it grants nothing but an empty name:
    a topic permission's empty routing key)."""
    return _compiled(pattern or "^$").search(name) is not None


def resource_name(kind: str, name: str) -> str:
    """The name a permission is checked against: the default exchange is
    `amq.default`."""
    return DEFAULT_EXCHANGE_NAME if kind == "exchange" and not name else name


def refused(kind: str, name: str, vhost: str, user: str) -> errors.ChannelError:
    """The 403 for a resource `user` may not use that way (RabbitMQ 3.10
    does not say which permission is missing)."""
    return errors.ChannelError(
        errors.ACCESS_REFUSED,
        f"access to {kind} '{resource_name(kind, name)}' in vhost '{vhost}' "
        f"refused for user '{user}'",
    )


def expand_topic_pattern(pattern: str, user: str, vhost: str, client_id: str = "") -> str:
    """A topic permission's variables: {username}, {vhost}, {client_id}."""
    return (
        pattern.replace("{username}", user)
        .replace("{vhost}", vhost)
        .replace("{client_id}", client_id)
    )


def topic_refused(routing_key: str, exchange: str, vhost: str, user: str) -> errors.ChannelError:
    return errors.ChannelError(
        errors.ACCESS_REFUSED,
        f"access to topic '{routing_key}' in exchange '{exchange}' in vhost "
        f"'{vhost}' refused for user '{user}'",
    )


def check_user_id(claimed: bytes | None, user: str, tags: list[str]) -> None:
    """RabbitMQ's validated user-id: a message may say it comes from the
    user who published it only, unless that user is an `impersonator`."""
    if claimed is None or claimed == user.encode() or "impersonator" in tags:
        return
    raise errors.ChannelError(
        errors.PRECONDITION_FAILED,
        f"user_id property set to '{claimed.decode(errors='replace')}' but authenticated user "
        f"was '{user}'",
        60,
        40,
    )


def login_refused(mechanism: str) -> errors.ConnectionError_:
    return errors.ConnectionError_(
        errors.ACCESS_REFUSED,
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile.",
    )


@lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    """Whether a peer address is the machine itself (RabbitMQ's
    loopback_users may log in only from such an address). Kept per address:
    parsing it was 3 % of an MQTT connect's CPU in a storm."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host in ("", "localhost")  # a Unix socket has no address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
