"""x-single-active-consumer queues: only the consumer registered first
receives messages, even when it has no credit left; when it goes, the next
one in registration order takes over, and gets what the first left unacked.
pika over real sockets, consumers on both IO workers."""

from __future__ import annotations

import os
import signal
from typing import Any

import pika
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump, worker_of

SAC = {"x-single-active-consumer": True}


def test_only_the_first_consumer_is_active_and_the_next_takes_over(broker: Broker) -> None:
    conns = [connect(broker) for _ in range(3)]
    assert len({int(c._impl.server_properties["shoal_worker"]) for c in conns}) == 2
    pub = connect(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    pch.queue_declare("sac", arguments=SAC)
    got: list[list[int]] = [[], [], []]
    tags: list[list[int]] = [[], [], []]
    channels = []
    for i, conn in enumerate(conns):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=5)

        def on_message(c: Any, m: Any, p: Any, body: bytes, i: int = i) -> None:
            got[i].append(int(body))
            tags[i].append(m.delivery_tag)
            if i:  # the first consumer acks by hand, below
                c.basic_ack(m.delivery_tag)

        ch.basic_consume("sac", on_message)
        channels.append(ch)
    for n in range(20):
        pch.basic_publish("", "sac", b"%d" % n)
    # The first holds 5 unacked (no credit): the others still get nothing.
    pump(conns, lambda: len(got[0]) >= 5, 10, "the active consumer's prefetch")
    for c in conns:
        c.process_data_events(time_limit=0.2)
    assert got == [[0, 1, 2, 3, 4], [], []]
    channels[0].basic_ack(tags[0][-1], multiple=True)
    pump(conns, lambda: len(got[0]) >= 10, 10, "the next five")
    assert got[1] == got[2] == []
    # The active consumer goes with 5 unacked: the second registered takes
    # over and gets those and the rest. (pika cancels the consumer before it
    # closes the channel, so the rest may come before the requeued five.)
    conns[0].close()
    pump(conns[1:], lambda: len(got[1]) >= 15, 10, "the take-over")
    conns[2].process_data_events(time_limit=0.2)
    assert sorted(got[1]) == list(range(5, 20))
    assert got[2] == []
    for c in (*conns[1:], pub):
        c.close()


def test_single_active_consumer_must_be_a_boolean(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("sac2", arguments={"x-single-active-consumer": "yes"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue 'sac2' "
        "in vhost '/': {unacceptable_type,longstr}"
    )
    conn.close()


@pytest.mark.parametrize("first_on", [0, 1])
def test_the_active_consumer_stays_active_across_a_scheduler_restart(
    broker: Broker, first_on: int
) -> None:
    """A restarted scheduler rebuilds its consumers from the workers' HELLOs,
    which come in any order: the consumer registered first (on either worker)
    must stay the single active one, and no other may get a message meanwhile."""
    first, second = connections_on_both_workers(broker)
    if worker_of(first) != first_on:
        first, second = second, first
    pub = connect(broker)
    pch = pub.channel()
    pch.queue_declare("sac-restart", arguments=SAC)
    got: list[list[bytes]] = [[], []]
    for i, conn in enumerate((first, second)):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(
            "sac-restart",
            lambda c, m, p, b, i=i: (got[i].append(b), c.basic_ack(m.delivery_tag)),
        )
    for n in range(10):
        pch.basic_publish("", "sac-restart", b"a%d" % n)
    pump([first, second], lambda: len(got[0]) == 10, 10, "the first ten")
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 15, "a new scheduler")
    for n in range(10):
        pch.basic_publish("", "sac-restart", b"b%d" % n)
    pump([first, second], lambda: len(got[0]) == 20, 15, "ten more after the restart")
    second.process_data_events(time_limit=0.3)
    assert got[1] == []
    assert got[0] == [b"a%d" % n for n in range(10)] + [b"b%d" % n for n in range(10)]
    for c in (first, second, pub):
        c.close()
