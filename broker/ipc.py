"""Control messages between IO workers and the scheduler.

Each IO worker slot has one SOCK_SEQPACKET socketpair, created by the
supervisor before any fork and kept open by it. The scheduler inherits every
scheduler end, worker N inherits its worker end. Because the supervisor holds
both ends, a restart of either side reuses the same channel: nothing has to
reconnect, and SEQPACKET keeps each message whole, so a process killed in the
middle of a send never leaves half a message for its replacement.

Messages are msgpack arrays whose first item is a `Msg` code. Everything sent
during one event-loop iteration leaves as one datagram (an array of messages),
so a burst of acks or notifications costs one system call, not one each.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import msgspec


class Msg(IntEnum):
    # worker -> scheduler
    HELLO = 1  # worker, incarnation, [[cid, qid, priority, acquiring, exclusive, interested]...]
    DECLARE = 2  # req, vhost, name, passive, durable, exclusive, auto_delete, owner, conn, args
    CONSUME = 3  # req, cid, qid, priority, acquiring, exclusive, interested
    CANCEL = 4  # cid
    INTEREST = 5  # cid, interested
    DONE = 6  # cid, changes seen before the scan that found nothing; -1: yielded
    CONN_CLOSED = 7  # req, conn_id: its exclusive queues go; the reply lets close-ok out
    DELETE = 8  # req, vhost, name, if_unused, if_empty, conn_id
    PURGE = 9  # req, vhost, name, conn_id
    WORKER_GONE = 10  # written by the supervisor into a dead worker's end
    EXCHANGE_DECLARE = 11  # req, vhost, name, type, passive, durable, auto_delete, internal, args
    EXCHANGE_DELETE = 12  # req, vhost, name, if_unused
    BIND = 13  # req, vhost, source, kind ("q"/"e"), dest, routing_key, args, conn_id
    UNBIND = 14  # req, vhost, source, kind, dest, routing_key, args, conn_id
    LEVEL = 15  # req, qid, priority: the slot for that level of a priority queue
    CONSUMERS = 16  # req, [Consumer.inspect() ...]: a worker's answer to INSPECT
    # scheduler -> worker
    REPLY = 20  # req, ok, payload (a list on success, [code, text] on failure)
    NOTIFY = 21  # cid
    CONSUMER_GONE = 22  # cid: its queue was deleted
    RESYNC = 23  # a (new) scheduler asks for HELLO
    INSPECT = 24  # req: the scheduler asks for the worker's consumers (shoal status)
    UNBLOCK = 25  # qid: the queue fell to its resume size; release its publishers


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode

MAX_MESSAGE = 1 << 20  # a HELLO lists every consumer of a worker


def encode(*items: Any) -> bytes:
    """One message as a datagram of its own (for the supervisor, which has no loop)."""
    return _encode([items])


class Link:
    """One end of a SEQPACKET socketpair, driven by an asyncio loop."""

    __slots__ = ("_batch", "_inbox", "_loop", "_on_message", "_out", "_writing", "sock")

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        on_message: Callable[[list[Any]], None],
    ) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._loop = loop
        self._on_message = on_message
        self._out: deque[bytes] = deque()
        self._batch: list[tuple[Any, ...]] = []
        self._inbox = bytearray(MAX_MESSAGE)
        self._writing = False
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, *items: Any) -> None:
        if not self._batch:
            self._loop.call_soon(self.flush)
        self._batch.append(items)

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        # Keep each datagram well under the socket buffer.
        for start in range(0, len(batch), 512):
            data = _encode(batch[start : start + 512])
            if self._out:
                self._out.append(data)
                continue
            try:
                self.sock.send(data)
            except BlockingIOError:
                self._out.append(data)
                self._start_writing()

    def _start_writing(self) -> None:
        if not self._writing:
            self._writing = True
            self._loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        while self._out:
            try:
                self.sock.send(self._out[0])
            except BlockingIOError:
                return
            self._out.popleft()
        self._writing = False
        self._loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        for _ in range(256):  # bounded, so one busy link cannot starve the loop
            try:
                n = self.sock.recv_into(self._inbox)
            except BlockingIOError:
                return
            if not n:
                return
            for message in _decode(memoryview(self._inbox)[:n]):
                self._on_message(message)

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
        self.sock.close()


def socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.set_inheritable(True)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return a, b
