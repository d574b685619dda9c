"""Fairness between a queue's consumers, as pika clients see it.

Four identical consumers, prefetch 10, wait on a queue; a burst of 20 messages
arrives at once. RabbitMQ deals it round-robin, 5 each. Shoal used to hand the
first notified consumer all it could take (its 10 of credit), then the second
the other 10, and the last two nothing: how much a consumer got hung on how
much happened to be ready at its turn, which under CPU contention spread four
identical consumers' shares of a long run from 16 % to 33 %
(bench/fairness.py, docs/benchmarks.md). Then a turn took the consumer's share
of what was ready (5, 5, 5, 5, but each in a run of consecutive messages),
and pika threads still spread wider than against RabbitMQ. Now a consumer with
a small prefetch, one of several, takes one message a turn, as RabbitMQ deals
them: the burst goes to the four in turn, message by message.

One IO worker, and the burst published in one transaction: the commit appends
all 20 in one step of the worker's loop, before any consumer of that loop can
pull, so what each consumer gets does not depend on timing. Every wait is
bounded; nothing sleeps.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pika

from tests.broker_process import Broker

CONSUMERS = 4
PREFETCH = 10
BURST = 20


def test_a_burst_is_dealt_one_message_to_each_waiting_consumer_in_turn(
    broker_factory: Any,
) -> None:
    broker: Broker = broker_factory(workers=1)
    params = pika.URLParameters(broker.url)
    setup = pika.BlockingConnection(params)
    setup.channel().queue_declare("fair")
    conns = [pika.BlockingConnection(params) for _ in range(CONSUMERS)]
    got: list[list[int]] = [[] for _ in range(CONSUMERS)]  # delivery tags
    bodies: list[list[int]] = [[] for _ in range(CONSUMERS)]  # publish order
    channels = []
    for i, conn in enumerate(conns):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=PREFETCH)

        def on_message(c: Any, m: Any, p: Any, body: bytes, i: int = i) -> None:
            got[i].append(m.delivery_tag)
            bodies[i].append(int(body))

        ch.basic_consume("fair", on_message, auto_ack=False)
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
    assert counts == [BURST // CONSUMERS] * CONSUMERS, f"not dealt evenly: {counts}"
    # One message to each in turn: consecutive messages go to different
    # consumers, and each consumer's are CONSUMERS apart in publish order.
    for mine in bodies:
        steps = {b - a for a, b in itertools.pairwise(mine)}
        assert steps == {CONSUMERS}, f"turns of several messages: {bodies}"

    for ch, tags in zip(channels, got, strict=True):
        ch.basic_ack(tags[-1], multiple=True)
    for conn in [*conns, setup]:
        conn.close()
