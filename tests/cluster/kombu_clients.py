"""kombu clients for tests/cluster/test_kombu.py, in a module of their own:
it is imported inside the test, so that without kombu (it comes with the
celery extra) `make test` still collects, and `--cluster` fails rather
than skips."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import kombu
from kombu.mixins import ConsumerMixin

QUEUE = kombu.Queue("kombu-history", routing_key="kombu-history", durable=True)


def connection(urls: list[str]) -> kombu.Connection:
    """One kombu connection given every node, as an application is."""
    return kombu.Connection(
        ";".join(urls),
        failover_strategy="round-robin",
        transport_options={"confirm_publish": True},
        connect_timeout=3,
    )


class Producer:
    """Publishes 1, 2, 3, ... persistent, each confirmed before the next;
    kombu's `Connection.ensure` reconnects and sends again on a lost
    connection (`retried`: the numbers it sent more than once)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.confirmed: set[int] = set()
        self.retried: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        with connection(self.urls) as conn:
            producer = conn.Producer(serializer="json")
            n = 0

            def again(exc: Exception, interval: float) -> None:
                self.retried.add(n)

            send = conn.ensure(
                producer,
                producer.publish,
                errback=again,
                max_retries=100,
                interval_start=0.1,
                interval_step=0.1,
                interval_max=0.5,
            )
            while not self.stop.is_set():
                n += 1
                send(n, routing_key=QUEUE.routing_key, declare=[QUEUE], delivery_mode=2)
                self.confirmed.add(n)  # publish returned: the broker confirmed it


class Consumer(ConsumerMixin):  # type: ignore[misc]
    """kombu's consumer loop, which reconnects by itself; acks each one."""

    def __init__(self, urls: list[str]) -> None:
        self.connection = connection(urls)
        self.deliveries: list[tuple[int, bool]] = []  # (n, redelivered)
        self.reconnects = 0
        self.lock = threading.Lock()

    def get_consumers(self, consumer: Callable[..., Any], channel: Any) -> list[Any]:
        return [
            consumer(
                queues=[QUEUE], callbacks=[self.on_message], accept=["json"], prefetch_count=100
            )
        ]

    def on_message(self, body: int, message: Any) -> None:
        with self.lock:
            self.deliveries.append((body, bool(message.delivery_info["redelivered"])))
        message.ack()

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        self.reconnects += 1

    def delivered(self) -> set[int]:
        with self.lock:
            return {n for n, _ in self.deliveries}
