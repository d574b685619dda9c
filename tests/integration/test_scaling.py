"""The IO worker count changed at runtime (issue 16, item 7): SIGTTIN adds a
worker that takes new connections, SIGTTOU retires the last one (its
connections closed with 320 as at a broker stop, the others untouched, the
messages it published still delivered, its paging files paged in first),
`shoal ctl set_worker_count`; stream writers and message expiry move to
their new owners without losing or repeating a message
(broker/supervisor/scaling.py, shm/ownership.py)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import connect, connections_on_both_workers, pump, shoal, worker_of
from tests.integration.test_streams import consume, declare, publish


def worker_count(broker: Broker) -> dict[str, Any]:
    done = shoal(broker, "ctl", "worker_count", "--formatter", "json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    return dict(row)


def settled_at(broker: Broker, n: int) -> bool:
    row = worker_count(broker)
    return bool(row["settled"]) and row["workers"] == n


def scale(broker: Broker, sig: int, n: int) -> None:
    assert broker.proc is not None
    os.kill(broker.proc.pid, sig)
    wait_for(lambda: settled_at(broker, n), 20, f"{n} IO workers")
    wait_for(lambda: len(broker.pids("io-worker")) == n, 10, f"{n} IO workers ready")


def publish_on_worker_1(
    broker: Broker, queue: str, n: int, prefix: str
) -> tuple[pika.BlockingConnection, pika.BlockingConnection]:
    """(a connection on worker 0, one on worker 1 that published `n`
    messages `prefix<i>` to `queue`, confirmed)."""
    stays, goes = connections_on_both_workers(broker)
    if worker_of(stays) != 0:
        stays, goes = goes, stays
    stays.channel().queue_declare(queue)
    ch = goes.channel()
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", queue, f"{prefix}{i}".encode())
    return stays, goes


def drain(conn: pika.BlockingConnection, queue: str, n: int) -> list[bytes]:
    ch = conn.channel()
    got: list[bytes] = []
    ch.basic_consume(queue, lambda c, m, p, body: got.append(body), auto_ack=True)
    pump([conn], lambda: len(got) >= n, 20, f"{n} messages from {queue}")
    return got


def test_sigttin_adds_a_worker_that_serves_new_connections(broker_factory: Any) -> None:
    broker = broker_factory(workers=1, args=("--max-workers", "3"))
    first = connect(broker)
    ch = first.channel()
    ch.queue_declare("grow")
    scale(broker, signal.SIGTTIN, 2)
    second = connect(broker)
    assert (worker_of(first), worker_of(second)) == (0, 1)  # the least loaded
    second.channel().basic_publish("", "grow", b"from worker 1")
    assert drain(first, "grow", 1) == [b"from worker 1"]  # the first connection still serves
    assert "adding IO worker 1" in broker.log()


def test_sigttou_retires_the_last_worker_and_keeps_the_others(broker_factory: Any) -> None:
    broker = broker_factory(workers=2, args=("--max-workers", "2"))
    stays, goes = publish_on_worker_1(broker, "kept", 100, "m")  # bodies in its arena
    scale(broker, signal.SIGTTOU, 1)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        pump([goes], lambda: False, 10, "the retired worker's connection to close")
    assert (closed.value.reply_code, closed.value.reply_text) == (
        320,
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
    )
    assert drain(stays, "kept", 100) == [f"m{i}".encode() for i in range(100)]
    assert worker_of(connect(broker)) == 0
    # Back to two through shoal ctl: the slot is served again.
    done = shoal(broker, "ctl", "set_worker_count", "2")
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "2 IO workers"), done.stderr
    wait_for(lambda: len(broker.pids("io-worker")) == 2, 10, "worker 1 back")
    assert worker_of(connect(broker)) == 1


def test_set_worker_count_refuses_what_the_slots_cannot_hold(broker_factory: Any) -> None:
    broker = broker_factory(workers=1, args=("--max-workers", "2"))
    for count in ("0", "3", "many"):
        done = shoal(broker, "ctl", "set_worker_count", count)
        assert done.returncode == 70
        assert "the worker count must be an integer from 1 to 2 (--max-workers)" in done.stderr
    assert worker_count(broker) == {
        "wanted": 1,
        "workers": 1,
        "max_workers": 2,
        "settled": True,
        "retiring": [],
    }


def test_a_retiring_worker_pages_its_paging_files_in_first(broker_factory: Any) -> None:
    # A queue log of 16 cells: most of what worker 1 publishes goes to its
    # paging file (workers/pager.py), which a stop would drop.
    broker = broker_factory(workers=2, args=("--queue-capacity", "16", "--max-workers", "2"))
    stays, goes = publish_on_worker_1(broker, "paged", 400, "p")
    paging = os.path.join(broker.data_dir, "paging")
    assert os.listdir(paging)
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGTTOU)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
        pump([goes], lambda: False, 10, "the retired worker's connection to close")
    # Its connections are gone and the queue's log is full: it waits.
    wait_for(lambda: "retiring: 1 paging files still to page in" in broker.log(), 10, "drain")
    assert worker_count(broker)["retiring"] == [1]
    # Consumed on worker 0 while worker 1 pages in as the log makes room.
    assert drain(stays, "paged", 400) == [f"p{i}".encode() for i in range(400)]
    wait_for(lambda: settled_at(broker, 1), 20, "worker 1 retired")
    assert not os.listdir(paging)
    assert "IO worker 1 retired" in broker.log()


def test_streams_and_expiry_move_to_their_new_owners(broker_factory: Any) -> None:
    broker = broker_factory(workers=1, args=("--max-workers", "3"))
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    names = ["sa", "sb", "sc"]  # consecutive queue ids: their writers spread over workers
    for name in names:
        declare(ch, name)
    ch.queue_declare("dead")
    ch.queue_declare(
        "ttl",
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
    )
    for step, (sig, n) in enumerate(
        [(None, 1), (signal.SIGTTIN, 2), (signal.SIGTTIN, 3), (signal.SIGTTOU, 2)]
    ):
        if sig is not None:
            scale(broker, sig, n)
        for name in names:
            publish(ch, name, 20, start=20 * step)  # confirmed: written by the stream's owner
        ch.basic_publish("", "ttl", f"t{step}".encode())
    for name in names:
        got = consume(conn, name, 80, offset="first")
        assert got == [(i, f"m{i}".encode()) for i in range(80)], name
    assert drain(conn, "dead", 4) == [b"t0", b"t1", b"t2", b"t3"]


@pytest.mark.slow  # its own CI step (.ci/run: slow): out of make test's 10 minutes
def test_a_worker_back_in_a_retired_slot_keeps_its_predecessors_messages(
    broker_factory: Any,
) -> None:
    """The slot's message files outlive a retirement: the worker
    added back in it writes its own next to them (its next incarnation)."""
    broker = broker_factory(workers=2, args=("--max-workers", "2"))
    stays, goes = connections_on_both_workers(broker)
    if worker_of(stays) != 0:
        stays, goes = goes, stays
    stays.channel().queue_declare("kept-on-disk", durable=True)

    def publish_persistent(conn: pika.BlockingConnection, prefix: str) -> None:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish(
                "", "kept-on-disk", f"{prefix}{i}".encode(), pika.BasicProperties(delivery_mode=2)
            )

    publish_persistent(goes, "old")
    scale(broker, signal.SIGTTOU, 1)
    done = shoal(broker, "ctl", "set_worker_count", "2")
    assert done.returncode == 0, done.stderr
    again = connect(broker)
    assert worker_of(again) == 1
    publish_persistent(again, "new")
    expected = [f"old{i}".encode() for i in range(10)] + [f"new{i}".encode() for i in range(10)]
    assert drain(stays, "kept-on-disk", 20) == expected
    assert len(broker.pids("io-worker")) == 2  # nobody died on the way
