"""The acceptor process: accepts TCP connections and hands each socket to the
least-loaded IO worker (SCM_RIGHTS over that worker's handoff socketpair),
with one byte saying which listener took it: PLAIN AMQP, TLS (the worker
runs the TLS handshake, workers/tls.py), MQTT (workers/mqtt_connection.py),
MQTT over TLS or MQTT over WebSocket (workers/mqtt_websocket.py).

The listening socket is created by the supervisor and inherited, so a
restarted acceptor loses no connection: the kernel's backlog holds them.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from typing import NoReturn

from setproctitle import setproctitle

from shoal.broker import ipc
from shoal.shm.processes import Header, ProcessSlot
from shoal.shm.segment import Segment


def pick_worker(seg: Segment, workers: int, tried: set[int]) -> int | None:
    """The ready worker with the fewest connections, not in `tried`."""
    best, best_load = None, None
    for i in range(workers):
        if i in tried:
            continue
        slot = ProcessSlot(seg, i)
        load = slot.connections() + (0 if slot.ready() else 1 << 32)
        if best_load is None or load < best_load:
            best, best_load = i, load
    return best


PLAIN, TLS, MQTT, MQTTS = ipc.HANDOFF_PLAIN, ipc.HANDOFF_TLS, ipc.HANDOFF_MQTT, ipc.HANDOFF_MQTTS
MQTT_WS = ipc.HANDOFF_MQTT_WS


def hand_off(
    seg: Segment, handoffs: list[socket.socket], conn: socket.socket, kind: bytes = PLAIN
) -> bool:
    tried: set[int] = set()
    # The workers taking connections: slots below H_WORKERS (the count
    # changes at runtime, broker/supervisor/scaling.py).
    workers = min(len(handoffs), Header(seg).workers())
    while True:
        worker = pick_worker(seg, workers, tried)
        if worker is None:
            return False
        try:
            socket.send_fds(handoffs[worker], [kind], [conn.fileno()], socket.MSG_DONTWAIT)
        except (BlockingIOError, OSError):
            tried.add(worker)  # its queue is full (hung or restarting): next one
            continue
        ProcessSlot(seg, worker).count_connections(1)
        return True


def run_acceptor(
    port: int,
    seg: Segment,
    listeners: list[tuple[socket.socket, bytes]],
    handoffs: list[socket.socket],
) -> NoReturn:
    setproctitle(f"shoal: acceptor (port {port})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    slot = ProcessSlot.acceptor(seg)
    slot.started(os.getpid())
    selector = selectors.DefaultSelector()
    for listener, kind in listeners:
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ, kind)
    # Connections wait in the listen backlog until the durable definitions
    # and the message store are loaded: a client must never find its durable
    # queue missing, or its persistent messages not yet there.
    header = Header(seg)
    while not header.loaded():
        time.sleep(0.005)
    slot.set_ready(True)
    while True:
        for key, _events in selector.select():
            listening: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                conn, _addr = listening.accept()
            except BlockingIOError:
                continue  # another accept took it
            except OSError:
                # EMFILE and friends: keep serving, but do not spin on them.
                time.sleep(0.01)
                continue
            with conn:
                if hand_off(seg, handoffs, conn, key.data):
                    slot.count_connections(1)
