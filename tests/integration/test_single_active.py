"""x-single-active-consumer queues: only the consumer registered first
receives messages, even when it has no credit left; when it goes, the next
one in registration order takes over, and gets what the first left unacked.
pika over real sockets, consumers on both IO workers."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from tests.broker_process import Broker
from tests.clients import connect, pump

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
