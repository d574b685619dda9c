"""A no-ack consumer that reads slower than the broker delivers: what it has
not read yet waits in its queue, where other consumers can take it, not in
the kernel's buffers (workers/connection.py NOTSENT_LOWAT). Without the
bound, Linux lets the broker's send buffer of that one connection grow to
`tcp_wmem`'s maximum (4 MiB by default): a backlog that is gone from the
queue, lost if the consumer goes, and counted neither as ready nor as
consumed. pika over real sockets."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.broker_process import Broker
from tests.clients import connect

BODY = b"x" * 1024
COUNT = 20_000  # 20 MiB: several times what a connection's buffers may hold
# What may be delivered and not yet read at once: the connection's write
# buffer (1 MiB high mark, plus the last run written over it), the kernel's
# unsent bound (128 KiB) and what the client's receive buffer holds. The
# broker's autotuned send buffer alone would be up to 4 MiB.
IN_FLIGHT_MAX = 3 << 20
READ_PAUSE_S = 0.001  # the slow consumer's time per message: at most 1,000 a second


def test_a_slow_no_ack_consumer_leaves_what_it_has_not_read_in_the_queue(
    broker: Broker,
) -> None:
    queue = "slow-reader"
    reader = connect(broker)
    channel = reader.channel()
    channel.queue_declare(queue)
    consumed = [0]

    def on_message(*_: Any) -> None:
        consumed[0] += 1
        time.sleep(READ_PAUSE_S)  # a slow client, not a wait for the broker

    channel.basic_consume(queue, on_message, auto_ack=True)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            reader.process_data_events(time_limit=0.05)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    publisher = connect(broker)
    try:
        out = publisher.channel()
        for _ in range(COUNT):
            out.basic_publish("", queue, BODY)
        # The declare-ok follows the publishes on the channel: all are in.
        ready = out.queue_declare(queue, passive=True).method.message_count
        read_by_then = consumed[0]  # read after: in flight is at least this
        in_flight = COUNT - ready - read_by_then
        assert read_by_then < COUNT // 2, "the consumer was not slower than the broker"
        assert in_flight * (len(BODY) + 60) <= IN_FLIGHT_MAX, (
            f"{in_flight} messages delivered and not read: {ready} ready, {read_by_then} read"
        )
    finally:
        stop.set()
        thread.join(timeout=10)
        reader.close()
        publisher.close()
