"""A client id that connects again on another IO worker closes its older
connection there (MQTT-3.1.4-2): the scheduler keeps each client id's
newest connection and tells the worker that holds an older one
(broker/scheduler/mqtt_clients.py), also after it was killed and started
again, from the workers' HELLOs."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port, wait_for
from tests.integration.test_ctl import rows
from tests.mqtt_raw import RawClient, worker_of

WAIT_S = 10


def _held(broker: Broker, client: RawClient) -> int:
    """The pid of the worker that holds `client`'s socket, once handed over."""
    found: list[int] = []

    def handed() -> bool:
        try:
            found.append(worker_of(broker, client))
        except AssertionError:
            return False
        return True

    wait_for(handed, WAIT_S, "the acceptor's hand-off")
    return found[-1]


def _socket_on(broker: Broker, port: int, worker: int, raws: list[RawClient]) -> RawClient:
    """A client socket (no CONNECT yet) that worker `worker` (a pid) holds."""
    for _ in range(8):
        client = RawClient(port, P.MQTT_5)
        raws.append(client)
        if _held(broker, client) == worker:
            return client
    raise AssertionError("the acceptor never chose that worker")


def _two_workers(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> tuple[Broker, int, RawClient, int, int]:
    """A broker of two workers, client "phone" connected on one of them (its
    pid first, the other's second)."""
    port = free_port()
    broker = broker_factory(2, ("--mqtt-port", str(port)))
    first = RawClient(port, P.MQTT_5)
    raws.append(first)
    assert first.connect("phone")[1] == 0
    here = _held(broker, first)
    (there,) = [pid for pid in broker.pids("io-worker").values() if pid != here]
    return broker, port, first, here, there


def _taken_over(first: RawClient) -> bool:
    """5.0: DISCONNECT 0x8E (session taken over), then the socket's end."""
    return first.closed_by_broker() and any(
        kind == P.DISCONNECT and body[:1] == b"\x8e" for kind, _flags, body in first.got
    )


def test_a_client_id_connecting_on_another_worker_closes_the_older_connection(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    broker, port, first, _here, there = _two_workers(broker_factory, raws)
    other = RawClient(port, P.MQTT_5)  # another client id: nothing is taken over
    raws.append(other)
    assert other.connect("tablet")[1] == 0
    second = _socket_on(broker, port, there, raws)
    assert second.connect("phone")[1] == 0
    assert _taken_over(first)
    assert second.subscribe("inbox/phone", 1) == b"\x01"
    assert other.subscribe("inbox/tablet", 1) == b"\x01"  # (still connected)


def test_after_the_scheduler_is_killed_a_client_id_on_another_worker_still_takes_over(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    """The new scheduler knows the older connection from its worker's HELLO."""
    broker, port, first, _here, there = _two_workers(broker_factory, raws)
    filler = _socket_on(broker, port, there, raws)
    assert filler.connect("tablet")[1] == 0
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0) not in (None, old), WAIT_S, "a new scheduler")
    # Both workers answered the new scheduler's listing: their HELLOs came
    # first (each link's RESYNC was sent before it served a listing).
    wait_for(lambda: len(rows(broker, "list_connections", "name")) == 2, WAIT_S, "both listed")
    second = _socket_on(broker, port, there, raws)
    assert second.connect("phone")[1] == 0
    assert _taken_over(first)
    assert second.subscribe("inbox/phone", 1) == b"\x01"
