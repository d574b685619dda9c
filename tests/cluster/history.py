"""A history of confirmed publishes and acked deliveries against a cluster
whose nodes die, and its checker (issue 29's crash test).

Per queue, a publisher and a consumer, each a pika client on a thread of
its own, connect to any node that answers (a follower proxies to the
leader) and reconnect when their connection dies. The publisher numbers its
messages and records one as confirmed only when `basic_publish` returned
(pika's BlockingChannel raises on a nack, a return or a lost connection).
The consumer records every delivery with its redelivered flag, then acks
it. Queues of three kinds (KINDS): a classic durable queue, a quorum queue,
and a stream, whose consumer reads it from the first offset again at each
connection (a stream keeps what was read: there is no redelivered flag).
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
# kind -> (queue, its x-arguments)
KINDS: dict[str, tuple[str, dict[str, object]]] = {
    "classic": (QUEUE, {}),
    "quorum": ("history.quorum", {"x-queue-type": "quorum"}),
    "stream": ("history.stream", {"x-queue-type": "stream"}),
}


@dataclass
class History:
    kind: str = "classic"
    confirmed: set[int] = field(default_factory=set)
    attempted: int = 0
    deliveries: list[tuple[int, bool]] = field(default_factory=list)  # (n, redelivered)
    reconnects: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: list[int] = field(default_factory=list)  # stream: where each read began
    others: list[History] = field(default_factory=list)  # the other kinds' queues

    @property
    def queue(self) -> str:
        return KINDS[self.kind][0]

    def problems(self) -> list[str]:
        """What breaks the promise, in this queue and the others: a
        confirmed message never delivered, a delivery of a message never
        published, a second delivery of one not flagged redelivered, or
        (per-publisher order) a message delivered for the first time after
        one published later (as Jepsen's queue checkers look). A stream has
        no redelivered flag: each connection reads it again from the start,
        in publish order."""
        out = [f"{self.kind}: {p}" for p in self._problems()]
        for other in self.others:
            out += other.problems()
        return out

    def _problems(self) -> list[str]:
        out = []
        seen: set[int] = set()
        latest = 0  # the highest message delivered for the first time so far
        starts = set(self.sessions)
        for at, (n, redelivered) in enumerate(self.deliveries):
            if not 1 <= n <= self.attempted:
                out.append(f"message {n} delivered but never published")
            if self.kind == "stream":
                if at in starts:
                    latest = 0
                if n <= latest:
                    out.append(f"message {n} read after {latest}, published later")
                latest = n
            else:
                if n in seen and not redelivered:
                    out.append(f"message {n} delivered again without the redelivered flag")
                if not redelivered and n not in seen:
                    if n < latest:
                        out.append(f"message {n} delivered first after {latest}, published later")
                    latest = max(latest, n)
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
                queue, arguments = KINDS[h.kind]
                ch.queue_declare(queue, durable=True, arguments=arguments)
                ch.confirm_delivery()
                while not self.stop_publishing.is_set():
                    n += 1
                    with h.lock:
                        h.attempted = n
                    ch.basic_publish(
                        "",
                        queue,
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
                queue, arguments = KINDS[h.kind]
                ch.queue_declare(queue, durable=True, arguments=arguments)
                ch.basic_qos(prefetch_count=100)
                consume_args = {"x-stream-offset": "first"} if h.kind == "stream" else None
                with h.lock:
                    h.sessions.append(len(h.deliveries))
                for method, _props, body in ch.consume(
                    queue, inactivity_timeout=0.2, arguments=consume_args
                ):
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
    kinds: tuple[str, ...] = ("classic",),
) -> History:
    """Run the clients against `nodes` while `act(nodes)` happens `rounds`
    times (each once 3 nodes are in sync and 50 more messages confirmed);
    then every confirmed message must be delivered. `nodes` may change
    inside `act` (a node added or removed): the clients follow it, unless
    `clients_through` names the nodes they may connect to. One queue per
    kind (KINDS), each with its clients; the first kind's history is
    returned, the others in its `others` (its problems() covers them)."""
    history, *others = [History(kind) for kind in kinds]
    history.others = others
    if out is not None:
        out.append(history)  # for an act that watches the history
    every = [Clients(lambda: urls(clients_through or nodes), h).start() for h in (history, *others)]
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
        for c in every:
            c.stop_publisher()
        for c in every:
            wait_for(
                lambda c=c: c.history.confirmed <= c.delivered(),  # type: ignore[misc]
                60,
                f"every confirmed message of the {c.history.kind} queue delivered",
                interval=0.1,
            )
    finally:
        for c in every:
            c.stop()
    return history
