"""Fairness between a queue's consumers, as pika clients see it.

Four identical consumers, prefetch 10, wait on a queue; a burst of 20 messages
arrives at once. RabbitMQ deals it round-robin, 5 each. Shoal used to hand the
first notified consumer all it could take (its 10 of credit), then the second
the other 10, and the last two nothing: how much a consumer got hung on how
much happened to be ready at its turn, which under CPU contention spread four
identical consumers' shares of a long run from 16 % to 33 %
(bench/fairness.py, docs/benchmarks.md). Now a turn takes the consumer's share
of what is ready, so each gets part of the burst.

One IO worker, and the burst published in one transaction: the commit appends
all 20 in one step of the worker's loop, before any consumer of that loop can
pull, so what each consumer gets does not depend on timing. Every wait is
bounded; nothing sleeps.
"""

from __future__ import annotations

import time
from typing import Any

import pika

from tests.broker_process import Broker

CONSUMERS = 4
PREFETCH = 10
BURST = 20


def test_a_burst_is_dealt_among_the_waiting_consumers(broker_factory: Any) -> None:
    broker: Broker = broker_factory(workers=1)
    params = pika.URLParameters(broker.url)
    setup = pika.BlockingConnection(params)
    setup.channel().queue_declare("fair")
    conns = [pika.BlockingConnection(params) for _ in range(CONSUMERS)]
    got: list[list[int]] = [[] for _ in range(CONSUMERS)]
    channels = []
    for i, conn in enumerate(conns):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=PREFETCH)
        ch.basic_consume(
            "fair", lambda c, m, p, b, i=i: got[i].append(m.delivery_tag), auto_ack=False
        )
        channels.append(ch)  # consume-ok: registered and waiting

    publisher = setup.channel()
    publisher.tx_select()
    for n in range(BURST):
        publisher.basic_publish("", "fair", str(n).encode())
    publisher.tx_commit()

    deadline = time.monotonic() + 30
    while sum(map(len, got)) < BURST:
        assert time.monotonic() < deadline, f"only {[len(g) for g in got]} of {BURST} arrived"
        for conn in conns:
            conn.process_data_events(time_limit=0)
        setup.process_data_events(time_limit=0.01)
    counts = [len(g) for g in got]
    assert min(counts) >= 1, f"a waiting consumer got none of the burst: {counts}"
    assert max(counts) < PREFETCH, f"a consumer's turn was bounded by its credit only: {counts}"

    for ch, tags in zip(channels, got, strict=True):
        ch.basic_ack(tags[-1], multiple=True)
    for conn in [*conns, setup]:
        conn.close()
