"""TCP settings of the replication connections (issue 38)."""

from __future__ import annotations

import socket


def keep_alive(sock: socket.socket | None) -> None:
    """TCP keepalive on a replication socket, probing after 5 s of silence
    and giving up after three unanswered probes a second apart: a peer
    gone without a FIN (a partition, a NAT that forgot the flow) is noticed
    in about 8 s even by a side that only writes, such as a leader whose
    follower's acks stopped."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has all three
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
