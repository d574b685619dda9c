"""kill -9 of each kind of child: the supervisor replaces it, and clients of
the other processes carry on."""

from __future__ import annotations

import os
import signal
import time

import pika
import psutil

from tests.broker_process import Broker, wait_for


def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def worker_of(conn: pika.BlockingConnection) -> int:
    return int(conn._impl.server_properties["shoal_worker"])


def drain(conn: pika.BlockingConnection, box: list, n: int, timeout: float = 10) -> None:
    wait_for(lambda: conn.process_data_events(0.05) or len(box) >= n, timeout, f"{n} deliveries")


def test_kill_worker_redelivers_its_unacked_and_spares_other_workers(broker: Broker) -> None:
    victim = connect(broker)
    bystander = connect(broker)
    assert worker_of(victim) != worker_of(bystander)
    vch = victim.channel()
    vch.queue_declare("work")
    for i in range(30):
        vch.basic_publish("", "work", str(i).encode())
    vch.basic_qos(prefetch_count=10)
    held: list[tuple] = []
    vch.basic_consume("work", lambda c, m, p, b: held.append((m, b)))
    drain(victim, held, 10)
    assert [b for _m, b in held] == [str(i).encode() for i in range(10)]

    # The bystander on the other worker consumes a queue of its own throughout.
    bch = bystander.channel()
    bch.queue_declare("steady")
    steady: list[bytes] = []
    bch.basic_consume("steady", lambda c, m, p, b: (steady.append(b), c.basic_ack(m.delivery_tag)))
    bch.basic_publish("", "steady", b"before")
    drain(bystander, steady, 1)

    index = worker_of(victim)
    old_pid = broker.pids("io-worker")[index]
    os.kill(old_pid, signal.SIGKILL)

    def victim_dropped() -> bool:
        try:
            victim.process_data_events(0.05)
        except pika.exceptions.AMQPConnectionError:
            return True
        return False

    wait_for(victim_dropped, 10, "the victim's connection to drop")
    wait_for(
        lambda: broker.pids("io-worker").get(index, old_pid) != old_pid, 10, "a replacement worker"
    )

    # The bystander saw nothing: same connection, same consumer, still served.
    bch.basic_publish("", "steady", b"after")
    drain(bystander, steady, 2)
    assert steady == [b"before", b"after"]

    # The victim's 10 unacked messages are back, in order, flagged redelivered.
    got: list[tuple[bytes, bool]] = []
    bch.basic_consume(
        "work", lambda c, m, p, b: (got.append((b, m.redelivered)), c.basic_ack(m.delivery_tag))
    )
    drain(bystander, got, 30)
    assert got[:10] == [(str(i).encode(), True) for i in range(10)]
    assert got[10:] == [(str(i).encode(), False) for i in range(10, 30)]
    bystander.close()


def test_kill_scheduler_consumers_keep_receiving(broker: Broker) -> None:
    conn = connect(broker)
    pub = connect(broker)
    ch = conn.channel()
    ch.queue_declare("s")
    ch.basic_qos(prefetch_count=5)
    got: list[bytes] = []
    ch.basic_consume("s", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    pch = pub.channel()
    for i in range(20):
        pch.basic_publish("", "s", b"a%d" % i)
    drain(conn, got, 20)
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    # Publish while the scheduler is dead and while it restarts.
    for i in range(50):
        pch.basic_publish("", "s", b"b%d" % i)
    drain(conn, got, 70, timeout=15)
    assert got == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(50)]
    new = wait_for(
        lambda: broker.pids("scheduler").get(0, old) != old and broker.pids("scheduler")[0],
        10,
        "new scheduler",
    )
    assert new != old
    # The rebuilt scheduler still knows the queue and its consumer.
    declared = pch.queue_declare("s", passive=True).method
    assert declared.consumer_count == 1 and declared.message_count == 0
    for i in range(10):
        pch.basic_publish("", "s", b"c%d" % i)
    drain(conn, got, 80)
    conn.close()
    pub.close()


def test_exclusive_queues_known_again_after_the_scheduler_s_restart(broker: Broker) -> None:
    """A restarted scheduler finds each exclusive queue's owner again: a
    close after the restart deletes that connection's queues and no other's."""
    leaving, staying, looker = connect(broker), connect(broker), connect(broker)
    leaving.channel().queue_declare("leaving.1", exclusive=True)
    leaving.channel().queue_declare("leaving.2", exclusive=True)
    staying.channel().queue_declare("staying", exclusive=True)
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(
        lambda: broker.pids("scheduler").get(0, old) != old and broker.pids("scheduler")[0],
        10,
        "new scheduler",
    )

    def gone(name: str) -> bool:
        """404 once it is gone; another's exclusive queue is 405 RESOURCE_LOCKED."""
        try:
            looker.channel().queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code in (404, 405)
            return exc.reply_code == 404
        raise AssertionError(f"{name}: declared passively from another connection")

    assert not gone("staying")  # (answered by the new scheduler)
    leaving.close()

    wait_for(lambda: gone("leaving.1") and gone("leaving.2"), 10, "the closed one's queues gone")
    assert not gone("staying")
    staying.close()
    wait_for(lambda: gone("staying"), 10, "the other's queue gone at its close")
    looker.close()


def test_kill_acceptor_is_replaced_and_connections_survive(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("acc")
    ch.confirm_delivery()  # the publish below is in the queue before basic_get looks
    old = broker.pids("acceptor")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("acceptor").get(0, old) != old, 10, "new acceptor")
    ch.basic_publish("", "acc", b"x")
    fresh = connect(broker)
    assert fresh.channel().basic_get("acc", auto_ack=True)[2] == b"x"
    fresh.close()
    conn.close()


def test_worker_crashing_at_boot_backs_off(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2, env={"SHOAL_FAULT_WORKER_BOOT": "1"}, wait=False)
    started = time.monotonic()
    supervisor = psutil.Process(broker.proc.pid)
    wait_for(
        lambda: os.path.exists(broker.runtime_dir) and broker.pids("io-worker").get(0),
        15,
        "worker 0",
    )
    # Clients are served by the healthy worker meanwhile.
    conn = connect(broker)
    assert worker_of(conn) == 0
    conn.close()
    # Back-off doubles from 0.25 s: the 6th failed boot cannot come before
    # 0 + 0.25 + 0.5 + 1 + 2 = 3.75 s. A spinning supervisor would get there at once.
    wait_for(
        lambda: broker.log().count("RuntimeError: injected boot failure") >= 6,
        20,
        "six failed boots",
    )
    assert time.monotonic() - started >= 3.5, "the supervisor restarts a crashing worker too often"
    assert sum(supervisor.cpu_times()[:2]) < 1.0, "the supervisor spins"


def test_a_killed_supervisor_takes_its_children(broker: Broker) -> None:
    """kill -9 of the supervisor: its children go too (none would be
    restarted, and the data directory's lock went with the supervisor, so a
    new broker could open the directory beside them). Its segment stays until
    the next start removes it, as after a power cut."""
    assert broker.proc is not None
    children = psutil.Process(broker.proc.pid).children()
    assert len(children) >= 4  # the scheduler, two workers, the acceptor
    os.kill(broker.proc.pid, signal.SIGKILL)
    broker.proc.wait(10)
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"children outlived their supervisor: {alive}"
    broker.start()  # the next start on its directories works, and cleans up
