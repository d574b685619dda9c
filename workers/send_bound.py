"""A bound on what the kernel holds of a connection's output not yet sent."""

from __future__ import annotations

import socket
from typing import Any

# What the kernel may hold of the output not yet sent of a connection with a
# no-ack consumer (TCP_NOTSENT_LOWAT). Linux grows a busy socket's send buffer
# to tcp_wmem's maximum (4 MiB by default), and nothing else bounds a no-ack
# consumer's deliveries: those it has not read would wait there, gone from the
# queue (another consumer cannot take them, they are lost with its connection)
# and counted nowhere. With the bound they wait in the queue; what is in flight
# on the wire is not limited (a long, fast path keeps its window). Consumers
# with acks are bounded by their prefetch instead, and keep the kernel's
# buffers whole: the bound cost 1 -> 1 with 4 KiB messages 8 % (more partial
# writes). lavinmqperf 4 -> 4 no-ack: consume / publish 0.93-0.96 -> 0.96-0.99.
NOTSENT_LOWAT = 1 << 17
# Linux's option (and macOS's); where the platform has none, nothing is bounded.
_OPTION: int | None = getattr(socket, "TCP_NOTSENT_LOWAT", None)


def bound_unsent(transport: Any) -> None:
    """A no-ack consumer starts on the connection of `transport`: from now on
    the kernel holds at most NOTSENT_LOWAT of its output not yet sent (again
    for each such consumer: one system call, harmless)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or _OPTION is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _OPTION, NOTSENT_LOWAT)
    except OSError:
        pass  # not TCP (a Unix socket, a test's socket pair): nothing to bound
