"""pika helpers shared by the integration tests (not a test module)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest

from tests.broker_process import ROOT, Broker


def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def worker_of(conn: pika.BlockingConnection) -> int:
    """The IO worker a connection landed on (server property shoal_worker)."""
    return int(conn._impl.server_properties["shoal_worker"])


def connections_on_both_workers(
    broker: Broker,
) -> tuple[pika.BlockingConnection, pika.BlockingConnection]:
    """Two connections on different IO workers (the acceptor balances by load,
    so a few tries are enough; bounded)."""
    first = connect(broker)
    spare = []
    for _ in range(8):
        other = connect(broker)
        if worker_of(other) != worker_of(first):
            for c in spare:
                c.close()
            return first, other
        spare.append(other)
    raise AssertionError("every connection landed on the same worker")


def pump(
    conns: list[pika.BlockingConnection], done: Callable[[], bool], timeout: float, what: str
) -> None:
    """Run the connections' I/O until `done()`; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        for c in conns:
            c.process_data_events(time_limit=0.02)


def pump_until_drained_and_unblocked(
    conns: list[pika.BlockingConnection], got: list[Any], n: int, events: list[str]
) -> None:
    """Until `got` has `n` deliveries and the producer's `events` has its
    connection.unblocked. The broker writes that before it releases the held
    publishes, but pump may read the watcher's last delivery before the
    producer's socket: waiting for the deliveries alone can miss it."""
    pump(
        conns,
        lambda: len(got) >= n and "unblocked" in events,
        20,
        f"all {n} messages and connection.unblocked",
    )


def assert_declare_refused(
    broker: Broker, queue: str, arguments: dict[str, Any], text: str
) -> None:
    """queue.declare with `arguments` is refused: 406 PRECONDITION_FAILED,
    the reply text containing `text`."""
    conn = connect(broker)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_declare(queue, arguments=arguments)
        assert exc.value.reply_code == 406
        assert text in exc.value.reply_text
    finally:
        conn.close()


def declare_refused(broker: Broker, queue: str, text: str, **kwargs: Any) -> None:
    """queue.declare(queue, **kwargs) closes the channel with 406 and
    `text` (after "PRECONDITION_FAILED - ")."""
    conn = connect(broker)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_declare(queue, **kwargs)
        assert (exc.value.reply_code, exc.value.reply_text) == (
            406,
            f"PRECONDITION_FAILED - {text}",
        )
    finally:
        conn.close()


def shoal(broker: Broker, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`shoal COMMAND --runtime-dir <the broker's> ARGS...` (status, policy), run."""
    return subprocess.run(
        [sys.executable, "-m", "shoal.broker", command, "--runtime-dir", broker.runtime_dir, *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
