"""kombu (Celery's client, over py-amqp) against a cluster: given every
node's address, a confirming producer that retries through
`Connection.ensure` and a `ConsumerMixin` consumer carry on by themselves
after the leader's SIGKILL (issue 29: pika, aio-pika's connect_robust and
kombu). Every confirmed message is delivered; a message comes twice only
flagged redelivered, or when kombu sent it twice (a publish retried after
its confirm was lost with the connection)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.broker_process import wait_for
from tests.cluster.nodes import ClusterNode, in_sync, kill_the_leader, leader_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_kombu_producer_and_consumer_carry_on_after_the_leaders_death(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    from tests.cluster.kombu_clients import Consumer, Producer  # needs kombu: fails without

    nodes = three_nodes()
    leader_of(nodes, 60)
    in_sync(nodes, 3, 60)
    urls = [n.url for n in nodes]
    producer, consumer = Producer(urls), Consumer(urls)
    threads = [
        threading.Thread(target=consumer.run, daemon=True),
        threading.Thread(target=producer.run, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(consumer.delivered()) > 100, 60, "kombu traffic", interval=0.05)
        kill_the_leader(nodes)
        after = len(producer.confirmed)
        wait_for(
            lambda: len(producer.confirmed) > after + 100,
            60,
            "confirms after the kill",
            interval=0.05,
        )
        producer.stop.set()
        threads[1].join(60)
        assert not threads[1].is_alive(), "the producer did not stop"
        wait_for(lambda: producer.confirmed <= consumer.delivered(), 60, "every confirmed message")
    finally:
        producer.stop.set()
        consumer.should_stop = True
        for t in threads:
            t.join(30)
    seen: set[int] = set()
    for n, redelivered in consumer.deliveries:
        assert n not in seen or redelivered or n in producer.retried, f"{n} twice, unflagged"
        seen.add(n)
    assert consumer.reconnects >= 1, "the consumer never lost its connection"
    print(
        f"kombu: {len(producer.confirmed)} confirmed, {len(consumer.deliveries)} deliveries, "
        f"{len(producer.retried)} publishes retried, consumer reconnects {consumer.reconnects}"
    )
