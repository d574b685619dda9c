"""Durable definitions outlive the broker, stopped or killed, and transient
ones do not, as in RabbitMQ: durable exchanges, durable queues that are not
exclusive (with their arguments), bindings between durable entities."""

from __future__ import annotations

import os
import signal
from typing import Any

import pika
import pytest

from shoal.broker.scheduler import durable
from shoal.store import definitions_log as definitions_log
from shoal.store import records
from tests.broker_process import Broker, wait_for
from tests.clients import connect


def exists(conn: pika.BlockingConnection, kind: str, name: str) -> bool:
    try:
        ch = conn.channel()
        if kind == "queue":
            ch.queue_declare(name, passive=True)
        else:
            ch.exchange_declare(name, passive=True)
        ch.close()
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False


def ready(conn: pika.BlockingConnection, queue: str) -> int:
    return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def declare_everything(ch: Any) -> None:
    ch.exchange_declare("d.topic", "topic", durable=True, arguments={"alternate-exchange": "d.ae"})
    ch.exchange_declare("d.ae", "fanout", durable=True)
    ch.exchange_declare("d.inner", "direct", durable=True, auto_delete=True)
    ch.exchange_declare("t.direct", "direct", durable=False)
    ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 10, "x-max-priority": 5})
    ch.queue_declare("d.ae-q", durable=True)
    ch.queue_declare("d.auto", durable=True, auto_delete=True)
    ch.queue_declare("t.q", durable=False)
    ch.queue_declare("d.excl", durable=True, exclusive=True)
    ch.queue_bind("d.q", "d.topic", "a.#")
    ch.queue_bind("d.ae-q", "d.ae")
    ch.exchange_bind("d.inner", "d.topic", "via.#")  # destination, source
    ch.queue_bind("d.q", "d.inner", "via.inner")
    ch.queue_bind("t.q", "d.topic", "a.#")  # to a transient queue: not kept
    ch.queue_bind("d.q", "t.direct", "k")  # from a transient exchange: not kept
    ch.queue_bind("d.q", "amq.direct", "amqk")  # from a default exchange: kept
    # Durable and auto-delete, bound only to a transient queue: RabbitMQ 3.10
    # keeps it after a restart, with no bindings (checked against it).
    ch.exchange_declare("d.src", "fanout", durable=True, auto_delete=True)
    ch.queue_bind("t.q", "d.src")


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_durable_definitions_outlive_the_broker_and_transient_ones_do_not(
    broker: Broker, crash: bool
) -> None:
    conn = connect(broker)
    declare_everything(conn.channel())
    # No pause: the -ok replies mean the changes are on disk.
    broker.restart(crash=crash)
    conn = connect(broker)
    for name in ("d.topic", "d.ae", "d.inner", "d.src", "amq.direct", "amq.topic"):
        assert exists(conn, "exchange", name), name
    assert not exists(conn, "exchange", "t.direct")
    for name in ("d.q", "d.ae-q", "d.auto"):
        assert exists(conn, "queue", name), name
    for name in ("t.q", "d.excl"):
        assert not exists(conn, "queue", name), name

    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("d.topic", "a.b", b"direct binding")
    ch.basic_publish("d.topic", "via.inner", b"through the exchange binding")
    ch.basic_publish("d.topic", "nothing.matches", b"to the alternate exchange")
    ch.basic_publish("amq.direct", "amqk", b"through amq.direct")
    assert ready(conn, "d.q") == 3
    assert ready(conn, "d.ae-q") == 1
    # The queue's arguments came back: a different x-max-length is refused,
    # the same declaration is accepted, and the limit holds.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().queue_declare("d.q", durable=True, arguments={"x-max-length": 11})
    assert refused.value.reply_code == 406
    assert "x-max-length" in refused.value.reply_text
    ch = conn.channel()
    ch.queue_declare("d.q", durable=True, arguments={"x-max-length": 10, "x-max-priority": 5})
    ch.confirm_delivery()
    for i in range(12):
        ch.basic_publish("", "d.q", str(i).encode())
    assert ready(conn, "d.q") == 10
    # The alternate exchange argument: inequivalent if changed.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().exchange_declare("d.topic", "topic", durable=True)
    assert refused.value.reply_code == 406
    conn.close()


def test_deletions_and_unbinds_are_durable_too(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    declare_everything(ch)
    ch.queue_unbind("d.q", "d.topic", "a.#")
    ch.queue_delete("d.ae-q")
    ch.exchange_unbind("d.inner", "d.topic", "via.#")  # d.inner is auto-delete...
    ch.queue_unbind("d.q", "d.inner", "via.inner")  # ...and goes with its last binding
    conn.close()
    broker.restart(crash=True)
    conn = connect(broker)
    assert not exists(conn, "queue", "d.ae-q")
    assert not exists(conn, "exchange", "d.inner")
    assert exists(conn, "exchange", "d.ae")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(
        "d.topic", "a.b", b"unbound: goes to the alternate exchange, whose queue is gone"
    )
    assert ready(conn, "d.q") == 0
    # A queue declared again after its deletion is a new, empty queue with
    # the new arguments: the old record does not come back.
    ch.queue_declare("d.ae-q", durable=True, arguments={"x-max-length": 3})
    conn.close()
    broker.restart(crash=True)
    conn = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        conn.channel().queue_declare("d.ae-q", durable=True)
    assert refused.value.reply_code == 406
    conn.close()


def test_a_torn_definitions_log_is_cut_at_its_last_whole_record(broker: Broker) -> None:
    conn = connect(broker)
    conn.channel().queue_declare("kept", durable=True)
    conn.close()
    broker.crash()
    path = os.path.join(broker.data_dir, definitions_log.FILENAME)
    with open(path, "ab") as f:  # half a record: a power cut in mid-write
        f.write(b"\x40\x00\x00\x00\x12\x34\x56\x78partial")
    broker.start()
    wait_for(lambda: "skipped 15 bytes" in broker.log(), 10, "the skipped tail in the log")
    conn = connect(broker)
    assert exists(conn, "queue", "kept")
    conn.close()


def test_a_scheduler_killed_mid_change_leaves_the_log_right(broker: Broker) -> None:
    """A restarted scheduler writes what the queue table holds to the log:
    what one killed between the two would have missed is there after the
    next start."""
    conn = connect(broker)
    conn.channel().queue_declare("before", durable=True)
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 15, "a new scheduler")
    conn.channel().queue_declare("after", durable=True)
    conn.close()
    broker.restart(crash=True)
    conn = connect(broker)
    assert exists(conn, "queue", "before")
    assert exists(conn, "queue", "after")
    conn.close()


def test_the_log_stays_small_under_churn(broker: Broker) -> None:
    """Appended changes are folded into a snapshot once they outgrow it."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("stays", durable=True)
    big = {"x-note": "n" * 2000}
    for i in range(700):  # ~1.4 MB of records: more than the compaction threshold
        ch.queue_declare(f"churn-{i % 10}", durable=True, arguments=big)
        ch.queue_delete(f"churn-{i % 10}")
    conn.close()
    size = os.path.getsize(os.path.join(broker.data_dir, definitions_log.FILENAME))
    assert size < definitions_log.MIN_COMPACTION_BYTES + 10_000
    broker.restart(crash=True)
    conn = connect(broker)
    assert exists(conn, "queue", "stays")
    assert not exists(conn, "queue", "churn-3")
    conn.close()


def logged_uids(broker: Broker) -> dict[str, int]:
    _log, restored = durable.open_log(broker.data_dir)
    _log.close()
    return {name: record.uid for (_vhost, name), record in restored.queues.items()}


def test_a_durable_queue_keeps_its_uid_and_a_new_one_gets_another(broker: Broker) -> None:
    """The uid names the queue's messages on disk: it survives restarts of
    the broker and of the scheduler; a queue deleted and declared again is
    another queue."""
    conn = connect(broker)
    conn.channel().queue_declare("u", durable=True)
    conn.close()
    broker.restart(crash=True)
    assert broker.stop() == 0
    uid = logged_uids(broker)["u"]
    assert uid > 0
    broker.start()
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 15, "a new scheduler")
    conn = connect(broker)
    conn.channel().queue_declare("other", durable=True)  # the new scheduler is up
    broker.stop()
    assert logged_uids(broker)["u"] == uid
    broker.start()
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_delete("u")
    ch.queue_declare("u", durable=True)
    conn.close()
    broker.stop()
    assert logged_uids(broker)["u"] != uid


def test_a_log_it_cannot_read_stops_the_broker_with_one_clear_line(
    broker_factory: Any,
) -> None:
    """Starting without the definitions it promised would be worse: the
    broker exits 1 and says which file, and leaves the file as it was."""
    broker: Broker = broker_factory(workers=1)
    assert broker.stop() == 0
    path = os.path.join(broker.data_dir, definitions_log.FILENAME)
    with open(path, "wb") as f:
        f.write(b"SHOALD\x09\x00")  # a format version from the future
    broker.start(wait=False)
    assert broker.proc is not None and broker.proc.wait(20) == 1
    assert f"{path}: not a SHOALD file of format version 1" in broker.log()
    with open(path, "rb") as f:
        assert f.read() == b"SHOALD\x09\x00"


def test_a_queue_a_lowered_limit_leaves_out_is_kept_for_a_later_start(broker: Broker) -> None:
    names = [f"k{i}" for i in range(65)]  # one more than --max-queues 64 allows
    conn = connect(broker)
    ch = conn.channel()
    for name in names:
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, "amq.direct", name)
    # Its persistent messages wait on disk too (the message store's recovery
    # keeps the message files of a queue that is not declared at this start).
    ch.confirm_delivery()
    for name in ("k0", "k64"):
        ch.basic_publish("", name, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    assert broker.stop() == 0
    normal = broker.args
    broker.args = (*normal, "--max-queues", "64")
    broker.start()
    wait_for(lambda: "durable queue 'k64' in vhost '/' not restored" in broker.log(), 10, "the log")
    conn = connect(broker)
    assert exists(conn, "queue", "k63") and not exists(conn, "queue", "k64")
    ch = conn.channel()
    method, _props, body = ch.basic_get("k0")  # its segment now counts k64's message only
    assert body == b"kept"
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("k0")[0] is None  # a round trip: the ack is counted down by now
    # What `shoal status` shows live is k64's message, which keeps the
    # segment from the owner's sweep.
    assert broker.status()["store"]["live_entries"] == 1
    conn.close()
    assert broker.stop() == 0
    broker.args = normal
    broker.start()
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", "k64", b"bound again")
    assert ready(conn, "k64") == 2 and ready(conn, "k0") == 0
    assert ch.basic_get("k64", auto_ack=True)[2] == b"kept"
    conn.close()


def test_each_start_has_the_next_epoch_and_queues_show_their_uid(broker: Broker) -> None:
    def uids() -> dict[str, int]:
        return {q["name"]: q["uid"] for q in broker.status()["queues"]}

    first = broker.status()["epoch"]
    assert first >= 1
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("lasting", durable=True)
    ch.queue_declare("passing", durable=False)
    ch.queue_declare("mine", durable=True, exclusive=True)
    shown = uids()
    assert shown["lasting"] > 0 and shown["passing"] == 0 and shown["mine"] == 0
    broker.restart(crash=True)
    assert broker.status()["epoch"] == first + 1
    assert uids() == {"lasting": shown["lasting"]}
    # A restarted scheduler writes the same uid into the queue table.
    old = broker.pids("scheduler")[0]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: broker.pids("scheduler").get(0, old) != old, 15, "a new scheduler")
    conn = connect(broker)
    conn.channel().queue_declare("lasting", durable=True)  # the new scheduler answers
    conn.close()
    assert uids() == {"lasting": shown["lasting"]} == logged_uids_now(broker)
    broker.restart()
    assert broker.status()["epoch"] == first + 2


def logged_uids_now(broker: Broker) -> dict[str, int]:
    """The log's uids while the broker runs (the scheduler appends to it;
    reading it is safe: records are whole once written)."""
    with open(os.path.join(broker.data_dir, definitions_log.FILENAME), "rb") as f:
        data = f.read()
    payloads, _end, _reason = records.decode_all(data, records.HEADER_SIZE)
    restored = durable.Restored()
    for payload in payloads:
        restored.apply(durable._decode(payload))
    return {name: record.uid for (_vhost, name), record in restored.queues.items()}


def test_definitions_a_smaller_journal_cannot_hold_stop_the_broker_clearly(
    broker: Broker,
) -> None:
    """A restart with a --catalog-mb too small for the durable definitions
    exits 1 saying so (not a scheduler failing in a loop), and leaves them
    for a start with enough."""
    conn = connect(broker)
    ch = conn.channel()
    for i in range(3000):  # about 600 kB of journal: more than half of 1 MiB
        ch.exchange_declare(f"wide-{i:05d}-" + "x" * 150, "fanout", durable=True)
    conn.close()
    assert broker.stop() == 0
    normal = broker.args
    broker.args = (*normal, "--catalog-mb", "1")
    broker.start(wait=False)
    assert broker.proc is not None and broker.proc.wait(20) == 1
    assert "the durable definitions need" in broker.log()
    assert "raise --catalog-mb" in broker.log()
    broker.args = normal
    broker.start()
    conn = connect(broker)
    assert exists(conn, "exchange", "wide-02999-" + "x" * 150)
    conn.close()


def test_a_damaged_epoch_file_stops_the_broker_with_one_clear_line(broker: Broker) -> None:
    assert broker.stop() == 0
    path = os.path.join(broker.data_dir, "epoch")
    with open(path, "w") as f:
        f.write("not a number\n")
    broker.start(wait=False)
    assert broker.proc is not None and broker.proc.wait(20) == 1
    assert f"{path}: not an epoch number" in broker.log()
