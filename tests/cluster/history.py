"""A history of confirmed publishes and acked deliveries against a cluster
whose nodes die, and its checker (issue 29's crash test).

A publisher and a consumer, each a pika client on a thread of its own,
connect to any node that answers (a follower proxies to the leader) and
reconnect when their connection dies. The publisher numbers its messages
and records one as confirmed only when `basic_publish` returned (pika's
BlockingChannel raises on a nack, a return or a lost connection). The
consumer records every delivery with its redelivered flag, then acks it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pika

from tests.broker_process import wait_for
from tests.cluster.nodes import ClusterNode, in_sync

QUEUE = "history"


@dataclass
class History:
    confirmed: set[int] = field(default_factory=set)
    attempted: int = 0
    deliveries: list[tuple[int, bool]] = field(default_factory=list)  # (n, redelivered)
    reconnects: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def problems(self) -> list[str]:
        """What breaks the promise: a confirmed message never delivered, a
        second delivery of one not flagged redelivered, or a delivery of a
        message never published (as Jepsen's queue checkers look)."""
        out = []
        seen: set[int] = set()
        for n, redelivered in self.deliveries:
            if n in seen and not redelivered:
                out.append(f"message {n} delivered again without the redelivered flag")
            if not 1 <= n <= self.attempted:
                out.append(f"message {n} delivered but never published")
            seen.add(n)
        lost = sorted(self.confirmed - seen)
        if lost:
            out.append(f"{len(lost)} confirmed messages lost, first {lost[:10]}")
        return out


def _connect(urls: Callable[[], list[str]]) -> pika.BlockingConnection:
    last: Exception | None = None
    for url in urls():
        try:
            return pika.BlockingConnection(
                pika.URLParameters(url + "?socket_timeout=3&blocked_connection_timeout=10")
            )
        except Exception as exc:  # any node may be down
            last = exc
    raise ConnectionError(f"no node answered: {last}")


class Clients:
    def __init__(self, urls: Callable[[], list[str]], history: History) -> None:
        self.urls = urls
        self.history = history
        self.stop_publishing = threading.Event()
        self.stop_consuming = threading.Event()
        self.threads = [
            threading.Thread(target=self._publish, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def start(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def _publish(self) -> None:
        h = self.history
        n = 0
        while not self.stop_publishing.is_set():
            try:
                conn = _connect(self.urls)
            except ConnectionError:
                time.sleep(0.1)  # every node down: poll again (bounded by the test)
                continue
            try:
                ch = conn.channel()
                ch.queue_declare(QUEUE, durable=True)
                ch.confirm_delivery()
                while not self.stop_publishing.is_set():
                    n += 1
                    with h.lock:
                        h.attempted = n
                    ch.basic_publish(
                        "",
                        QUEUE,
                        b"%d" % n,
                        pika.BasicProperties(delivery_mode=2),
                        mandatory=True,
                    )
                    with h.lock:
                        h.confirmed.add(n)
                conn.close()
            except Exception:  # the node died under us: reconnect
                h.reconnects["publisher"] += 1
                with contextlib.suppress(Exception):
                    conn.close()

    def _consume(self) -> None:
        h = self.history
        while not self.stop_consuming.is_set():
            try:
                conn = _connect(self.urls)
            except ConnectionError:
                time.sleep(0.1)
                continue
            try:
                ch = conn.channel()
                ch.queue_declare(QUEUE, durable=True)
                ch.basic_qos(prefetch_count=100)
                for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.2):
                    if self.stop_consuming.is_set():
                        break
                    if method is None:
                        continue
                    with h.lock:
                        h.deliveries.append((int(body), bool(method.redelivered)))
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except Exception:  # likewise
                h.reconnects["consumer"] += 1

    def delivered(self) -> set[int]:
        with self.history.lock:
            return {n for n, _ in self.history.deliveries}

    def stop_publisher(self) -> None:
        """No publish after this returns (none in flight that could still be
        confirmed behind the checker's back)."""
        self.stop_publishing.set()
        self.threads[0].join(60)
        assert not self.threads[0].is_alive(), "the publisher did not stop"

    def stop(self) -> None:
        self.stop_publishing.set()
        self.stop_consuming.set()
        for t in self.threads:
            t.join(30)


def urls(nodes: list[ClusterNode]) -> list[str]:
    return [n.url for n in nodes if n.alive()]


def run_history(
    nodes: list[ClusterNode],
    rounds: int,
    act: object,
    out: list[History] | None = None,
    clients_through: list[ClusterNode] | None = None,
) -> History:
    """Run the clients against `nodes` while `act(nodes)` happens `rounds`
    times (each once 3 nodes are in sync and 50 more messages confirmed);
    then every confirmed message must be delivered. `nodes` may change
    inside `act` (a node added or removed): the clients follow it, unless
    `clients_through` names the nodes they may connect to."""
    history = History()
    if out is not None:
        out.append(history)  # for an act that watches the history
    clients = Clients(lambda: urls(clients_through or nodes), history).start()
    try:
        for i in range(rounds):
            in_sync(nodes, 3, 60)
            before = len(history.confirmed)
            wait_for(
                lambda b=before: len(history.confirmed) > b + 50,  # type: ignore[misc]
                60,
                f"confirms before failure {i + 1}",
                interval=0.05,
            )
            act(nodes)  # type: ignore[operator]
        in_sync(nodes, 3, 60)
        last = max(history.confirmed)
        wait_for(
            lambda: len(history.confirmed) > 0 and max(history.confirmed) > last + 50,
            60,
            "confirms after the last failure",
            interval=0.05,
        )
        clients.stop_publisher()
        wait_for(
            lambda: history.confirmed <= clients.delivered(),
            60,
            "every confirmed message delivered",
            interval=0.1,
        )
    finally:
        clients.stop()
    return history
