"""After many messages have flowed through, shared memory returns to its
baseline: arena accounting to zero, and the tmpfs pages back to the OS."""

from __future__ import annotations

import pika

from shoal.shm import layout as L
from tests.broker_process import Broker, wait_for

BODY = 64 * 1024
COUNT = 400  # 25 MiB of bodies in flight at the peak


def test_shared_memory_returns_to_baseline(broker: Broker) -> None:
    seg = broker.segment()
    baseline = seg.allocated_bytes()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("burst")
    body = b"z" * BODY
    for _ in range(COUNT):
        ch.basic_publish("", "burst", body)
    assert ch.queue_declare("burst", passive=True).method.message_count == COUNT
    peak = seg.allocated_bytes()
    assert peak - baseline >= COUNT * BODY, "bodies should live in the segment"
    for got, (method, _props, payload) in enumerate(ch.consume("burst", inactivity_timeout=10), 1):
        assert method is not None and payload == body
        ch.basic_ack(method.delivery_tag)
        if got == COUNT:
            break
    ch.cancel()
    used = [seg.atomic.load(seg.layout.arena(i) + L.A_USED) for i in range(broker.workers)]
    wait_for(
        lambda: not any(seg.atomic.load(seg.layout.arena(i) + L.A_USED) for i in range(2)),
        5,
        "arenas empty",
    )
    # What may remain: the queue's record, the touched pages of its log (16
    # bytes per message), the wake bitmap: well under 64 KiB, against a peak
    # of 25 MiB.
    wait_for(
        lambda: seg.allocated_bytes() <= baseline + 64 * 1024,
        10,
        f"segment back to baseline (arena bytes used {used})",
    )
    conn.close()
