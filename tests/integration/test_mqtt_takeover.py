"""A client that connects again while its older connection is still there
(a takeover, MQTT-3.1.4-2): the newer connection reads the session only once
the older one wrote what it had and let go (workers/mqtt_session.py
open_owned), on the same worker or another."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port, wait_for
from tests.mqtt_raw import RawClient
from tests.mqtt_raw import worker_counts as _counts
from tests.mqtt_raw import worker_of as _worker_of

WAIT_S = 10
PERSISTENT_5 = {"session_expiry_interval": 3600}


def _client(raws: list[RawClient], port: int, level: int) -> RawClient:
    client = RawClient(port, level)
    raws.append(client)
    return client


def _balanced(broker: Broker, fillers: list[pika.BlockingConnection]) -> None:
    """Two workers' counts made (c, c) or (c + 1, c) with idle AMQP
    connections: the acceptor hands a connection to the worker with the
    fewest (the lower index at a tie), so the next two go to different ones."""
    while True:
        c0, c1 = _counts(broker)
        if c1 <= c0 <= c1 + 1:
            return
        fillers.append(pika.BlockingConnection(pika.URLParameters(broker.url)))
        counted = lambda total=c0 + c1 + 1: sum(_counts(broker)) == total  # noqa: E731
        wait_for(counted, WAIT_S, "the filler counted")


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_takeover_while_a_qos2_ids_write_is_under_way_publishes_the_resend_once(
    broker_factory: Callable[..., Broker],
    raws: list[RawClient],
    tmp_path: Path,
    level: int,
    workers: int,
) -> None:
    """A device's QoS 2 PUBLISH is in its queue, and the session write that
    holds its packet id still under way (a slow disk: 0.3 s a sync, so no
    PUBREC yet), when the device connects again and sends it once more
    (DUP). The older connection, taken over, writes its ids and lets go
    before the newer one reads them: the resend gets its PUBREC and is not
    published again. (Before, the newer connection read the file at once
    and the message was in the queue twice.) With two workers the newer
    connection lands on the other one (the acceptor's fewest connections:
    the AMQP consumer's worker)."""
    port = free_port()
    faults = tmp_path / "disk-faults"
    faults.write_text("slow 0.3")  # every sync 0.3 s (store/disk.py)
    broker = broker_factory(
        workers, ("--mqtt-port", str(port)), env={"SHOAL_DISK_FAULTS": str(faults)}
    )
    props = PERSISTENT_5 if level == P.MQTT_5 else {}
    name, client_id = f"takeover-{level}", f"device-{level}"
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare(name)
    ch.queue_bind(name, "amq.topic", f"takeover.{level}.#")

    def queued() -> int:
        return int(ch.queue_declare(name, passive=True).method.message_count)

    fillers: list[pika.BlockingConnection] = []
    if workers == 2:
        _balanced(broker, fillers)
    older = _client(raws, port, level)
    older.connect(client_id, props, clean=False)
    older.sock.sendall(P.encode_publish(level, f"takeover/{level}/x", b"once", 2, packet_id=7))
    wait_for(lambda: queued() == 1, WAIT_S, "the QoS 2 message in its queue")

    newer = _client(raws, port, level)
    assert newer.connect(client_id, props, clean=False)[:2] == (True, 0)
    assert older.closed_by_broker()
    (takeover,) = [line for line in broker.log().splitlines() if "taken over" in line]
    older_pid = int(takeover.split()[2])  # (the log line's process id)
    assert (_worker_of(broker, newer) != older_pid) == (workers == 2)
    newer.sock.sendall(
        P.encode_publish(level, f"takeover/{level}/x", b"once", 2, packet_id=7, dup=True)
    )
    assert newer.read(P.PUBREC)[2][:2] == (7).to_bytes(2, "big")
    newer.ack(P.PUBREL, 7)
    newer.read(P.PUBCOMP)
    assert queued() == 1, "the resend was published again"
    for c in [conn, *fillers]:
        c.close()
