"""Listening sockets for every listener of the broker (AMQP, AMQPS, the
management API, the metrics endpoint), bound the way RabbitMQ binds them.

The default address is `::`, dual-stack: one IPv6 socket that takes IPv4
connections too (IPV6_V6ONLY off), so a client that resolves `localhost`
to `::1` first (Node.js 18 and later, on many systems) connects as well as
one that uses 127.0.0.1. On a machine without IPv6 it falls back to
0.0.0.0. `--bind` may be given more than once: each address gets its own
socket, and then an IPv6 one takes IPv6 only, so that `--bind 0.0.0.0
--bind ::` does not bind the IPv4 port twice.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from typing import Any

ANY = "::"  # the default: every address, IPv4 and IPv6
ANY_IPV4 = "0.0.0.0"


class PortInUse(OSError):
    """A listener's port is taken, said in one line with the flag that moves
    it: the MQTT listeners are on by default, and where mosquitto (or
    another broker) runs, 1883 is taken."""

    def __init__(self, binds: Sequence[str], port: int, name: str, flag: str) -> None:
        off = "" if flag == "--port" else ", 0 turns it off"
        super().__init__(
            errno.EADDRINUSE,
            f"cannot listen on {shown(binds)} port {port} ({name}): address already in use; "
            f"{flag} chooses another{off}",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def listen(
    binds: Sequence[str], port: int, name: str = "", flag: str = "", backlog: int = 1024
) -> list[socket.socket]:
    """One listening socket per address of `binds` on `port` (inheritable,
    so that the supervisor's children can accept on it). With the listener's
    `name` and `flag`, a port in use raises PortInUse."""
    dual = len(binds) == 1
    sockets: list[socket.socket] = []
    try:
        for address in binds:
            sockets.append(_one(address, port, dual, backlog))
    except BaseException as exc:
        for sock in sockets:
            sock.close()
        if name and isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            raise PortInUse(binds, port, name, flag) from None
        raise
    return sockets


def _one(address: str, port: int, dual: bool, backlog: int) -> socket.socket:
    if address == ANY and not has_ipv6():
        address = ANY_IPV4
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
        sock.bind((address, port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def has_ipv6() -> bool:
    """Whether this machine can open an IPv6 socket at all."""
    if not socket.has_ipv6:
        return False
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EINVAL):
            return False
        raise
    return True


def shown(binds: Sequence[str]) -> str:
    """The addresses as a log line names them."""
    return ", ".join(f"[{b}]" if ":" in b else b for b in binds)


def socket_address(name: Any) -> tuple[str, int]:
    """(host, port) of a socket address as RabbitMQ shows it (rabbit_misc
    ntoa): an IPv4 client of a dual-stack listener as IPv4, 127.0.0.1 rather
    than ::ffff:127.0.0.1. ("", 0): none (a Unix socket)."""
    if not isinstance(name, tuple) or len(name) < 2:
        return "", 0
    host = str(name[0])
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:") :]
    return host, int(name[1])
