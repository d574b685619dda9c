"""A TCP proxy that can fail as networks do, for the cluster's fault tests
(issue 38): put in front of a node's cluster port (its advertised
replication address), it passes bytes both ways until told to `hang()`.

A hang is a partition, or a NAT or load balancer that forgot the flow: no
byte moves on any connection, open or new, and nobody gets a FIN or a
reset. After `heal()` new connections pass again, while every connection
from before stays dead for good, as the forgotten flow would.

The other faults end with `heal()` too:

- `delay(seconds)`: each chunk waits that long before it is passed on (a
  slow or congested link);
- `cut(direction)`: one direction stops ("forward": towards the target,
  "back": from it) while the other flows, as when packets are lost one way:
  nothing is lost, TCP would resend it, so the stalled bytes move again
  after the heal;
- `reset()`: every open connection is reset (RST) at once, as by a NAT or
  firewall that restarted; new ones pass.

Threads with blocking sockets, in the test process: no event loop to share
with the code under test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from tests.broker_process import free_port


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._generation = 0  # a connection passes bytes only in its own generation
        self._hung = False
        self._delay = 0.0
        self._cut: set[str] = set()  # directions stopped ("forward", "back")
        self._moved = threading.Condition(self._lock)  # a cut healed
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.connections = 0  # accepted, for the tests' own checks

    def start(self) -> FaultProxy:
        self._spawn(self._accept)
        return self

    def hang(self) -> None:
        """From now on no byte moves, on any connection."""
        with self._lock:
            self._hung = True

    def heal(self) -> None:
        """New connections pass again; after a hang the ones from before never
        do, after a cut they move on."""
        with self._lock:
            if self._hung:
                self._generation += 1
            self._hung = False
            self._delay = 0.0
            self._cut.clear()
            self._moved.notify_all()

    def delay(self, seconds: float) -> None:
        with self._lock:
            self._delay = seconds

    def cut(self, direction: str) -> None:
        assert direction in ("forward", "back")
        with self._lock:
            self._cut.add(direction)

    def reset(self) -> None:
        """Reset every open connection (RST, not FIN)."""
        with self._lock:
            self._generation += 1
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RD)  # wakes its pump's recv (a close alone does not)
            s.close()  # linger 0: an RST

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            self._moved.notify_all()  # cut pumps end too
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(10)

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        t.start()
        self._threads.append(t)

    def _passes(self, generation: int) -> bool:
        with self._lock:
            return not self._hung and generation == self._generation

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with self._lock:
                generation = -1 if self._hung else self._generation  # during a hang: dead
                self._sockets.append(client)
            if generation < 0:
                continue  # accepted by the kernel, never answered: a blackhole
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.append(upstream)
            self._spawn(self._pump, client, upstream, generation, "forward")
            self._spawn(self._pump, upstream, client, generation, "back")

    def _pump(
        self, src: socket.socket, dst: socket.socket, generation: int, direction: str
    ) -> None:
        def moving() -> bool:
            return direction not in self._cut or self._stopped.is_set()

        while True:
            with self._lock:  # a cut direction reads nothing until the heal
                self._moved.wait_for(moving)
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with self._lock:
                delay = self._delay
            if delay:
                time.sleep(delay)  # the link's latency, not a synchronisation
            with self._lock:  # read before the cut: held until the heal
                self._moved.wait_for(moving)
            if not self._passes(generation):
                # Hung, or a flow from before a heal: what was read is lost,
                # and nothing more is read (the sender's window fills up).
                self._stopped.wait()
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return
