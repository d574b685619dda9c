"""The one hook of replication in the broker's processes: after a durable
write is synced here, its file is mirrored to the in-sync followers before
the caller goes on (and so before any client is told it is safe).

In a cluster (issue 29) the node's agent (broker/cluster/node.py) starts the
broker with SHOAL_REPLICA_SOCKET naming its replication socket. Every sync
point in store/ (`sync.sync_now`, `RecordFile.sync`, `records.sync_directory`)
then ends with `mirror(path)`: one request on that unix socket, answered
once the leader's shipper (broker/cluster/shipper.py) has sent what changed
in `path` to every follower and every in-sync follower has written and
synced it. The shipper decides what changed by looking at the file (its
inode and size against what each follower has), so a caller says only which
file; appends, truncations, renames into place and removals (a directory's
path) are all the same request.

Standalone (no socket named) `link` is None and a sync pays one test.

A refused or failed request means this node may no longer confirm anything
(its lease is lost, or its agent is gone): the process ends as after a
failed fdatasync (`sync.durability_lost`), so no confirm follows.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading

ENV = "SHOAL_REPLICA_SOCKET"
OK = b"\x01"
FENCED = b"\x00"
TAIL = b"t"  # a request's first byte: what changed is at the file's end (or its name)
WHOLE = b"w"  # the file was changed in place: send it whole
SHIP = b"s"  # send what was appended soon; no answer (ReplicaLink.ship)
_LENGTH = struct.Struct("<I")


class ReplicaRefused(OSError):
    """The agent refused (fenced) or could not be reached."""


class ReplicaLink:
    """This process's requests to its node's agent: one connection per
    thread (a GroupSync thread per file, the event loop's), opened on first
    use and again after a fork."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _socket(self) -> socket.socket:
        local = self._local
        sock: socket.socket | None = getattr(local, "sock", None)
        if sock is None or local.pid != os.getpid():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(address(self.path))
            local.sock, local.pid = sock, os.getpid()
        return sock

    def mirror(self, path: str, whole: bool = False) -> None:
        """Return once `path` (a file, or a directory whose entries changed)
        is the same on every in-sync follower, durably. `whole`: the file
        was changed in place (a mapped deduplication cache), not appended
        to, so it is sent whole."""
        try:
            sock = self._socket()
            data = (WHOLE if whole else TAIL) + os.fsencode(path)
            sock.sendall(_LENGTH.pack(len(data)) + data)
            answer = sock.recv(1)
        except OSError as exc:
            self._local.sock = None
            raise ReplicaRefused(errno.EIO, f"replication socket {self.path}: {exc}") from exc
        if answer != OK:
            self._local.sock = None
            raise ReplicaRefused(errno.EIO, f"{path}: not confirmed by the cluster's in-sync set")

    def ship(self, path: str) -> None:
        """Have what was appended to `path` sent to the followers with the
        next batch, without waiting and without a sync: acks, which a
        standalone broker does not sync either, so that after a failover
        the messages acked before it do not come back. Best effort: a
        failure here shows at the next `mirror`."""
        data = SHIP + os.fsencode(path)
        try:
            self._socket().sendall(_LENGTH.pack(len(data)) + data)
        except OSError:
            self._local.sock = None


def address(name: str) -> str:
    """A socket name as the environment carries it: "@name" is Linux's
    abstract namespace (no file to leave behind when a node is killed)."""
    return "\0" + name[1:] if name.startswith("@") else name


link: ReplicaLink | None = None


def install_from_env() -> None:
    """Set `link` if this broker runs under a cluster node's agent."""
    global link
    path = os.environ.get(ENV, "")
    link = ReplicaLink(path) if path else None


def mirror_fd(fd: int) -> None:
    """mirror() of the file open on `fd` (called after its fdatasync)."""
    assert link is not None
    link.mirror(os.readlink(f"/proc/self/fd/{fd}"))


install_from_env()
