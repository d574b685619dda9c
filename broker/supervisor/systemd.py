"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1\\nSTATUS=...") to systemd; False if not under
    a notify-type unit or the socket is gone. Never raises."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float:
    """Seconds between WATCHDOG=1 pets (half of WatchdogSec=), 0 if the
    unit has no watchdog (or it is meant for another process)."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 2e6


LISTEN_FDS_START = 3


def activated_sockets() -> list[socket.socket]:
    """Listening sockets systemd passed (socket activation: LISTEN_FDS for
    this pid), [] if none. Connections that arrive while the broker
    restarts wait in their backlog, which systemd keeps."""
    count = os.environ.get("LISTEN_FDS", "")
    if not count.isdigit() or os.environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    sockets = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)):
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(True)
        sockets.append(sock)
    for name in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for the children
    return sockets
