"""Queue declare/delete/purge semantics and the server-sent basic.cancel."""

from __future__ import annotations

import pika
import psutil
import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame

from shoal.broker.amqp import names  # noqa: F401  (pamqp's name grammar widened, as the broker's)
from tests.broker_process import Broker, queue_gone, wait_for
from tests.integration.test_malformed import expect, handshake


def connect(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def test_deleting_a_queue_cancels_its_consumers(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("doomed")
    cancelled: list[str] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume("doomed", lambda *a: None)
    other = connect(broker)
    assert other.channel().queue_delete("doomed").method.message_count == 0
    wait_for(lambda: conn.process_data_events(0.05) or cancelled, 5, "server-sent basic.cancel")
    assert cancelled == [tag]
    conn.close()
    other.close()


def test_delete_if_unused_and_if_empty(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("busy")
    ch.basic_publish("", "busy", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_delete("busy", if_empty=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - queue 'busy' in vhost '/' not empty"
    ch = conn.channel()
    ch.basic_consume("busy", lambda *a: None)
    ch2 = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch2.queue_delete("busy", if_unused=True)
    assert exc.value.reply_text == "PRECONDITION_FAILED - queue 'busy' in vhost '/' in use"
    conn.close()


def test_purge_counts_and_keeps_unacked(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("p")
    for i in range(5):
        ch.basic_publish("", "p", str(i).encode())
    held, _props, _body = ch.basic_get("p")
    assert ch.queue_purge("p").method.message_count == 4
    ch.basic_reject(held.delivery_tag, requeue=True)
    assert ch.queue_declare("p", passive=True).method.message_count == 1
    conn.close()


def test_redeclare_with_other_properties_is_refused(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("eq", durable=False)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("eq", durable=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'eq' in vhost '/': "
        "received 'true' but current is 'false'"
    )
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_declare("amq.mine")
    assert exc.value.reply_code == 403
    conn.close()


def test_auto_delete_queue_goes_with_its_last_consumer(broker: Broker) -> None:
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("ad", auto_delete=True)
    tag = ch.basic_consume("ad", lambda *a: None)
    ch.basic_cancel(tag)
    probe = conn.channel()

    wait_for(lambda: queue_gone(conn, "ad"), 5, "auto-delete")
    probe.close()
    conn.close()


def test_delete_if_empty_counts_ready_messages_only(broker: Broker) -> None:
    """As RabbitMQ: a delivered, unacknowledged message does not make the
    queue 'not empty' (aio-pika deletes with if_empty by default)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare("in-flight")
    ch.basic_publish("", "in-flight", b"x")
    method, _props, _body = ch.basic_get("in-flight")
    assert method is not None
    assert ch.queue_delete("in-flight", if_empty=True).method.message_count == 0
    conn.close()


def test_names_are_any_utf8_and_lose_cr_lf_as_in_rabbitmq(broker: Broker) -> None:
    """Names outside pamqp's grammar (non-ASCII letters, punctuation) come back
    wherever a name does (declare-ok, get-ok, return): they closed the
    connection with 541 before. CR and LF are stripped from declares,
    deletes and bindings, as rabbit_channel's strip_cr_lf does (the Java
    client's QueueLifecycle and ExchangeDeclare tests)."""
    conn = connect(broker)
    ch = conn.channel()
    queue, exchange = "café jobs!$*", "événements!"
    assert ch.queue_declare(queue).method.queue == queue
    ch.exchange_declare(exchange + "\n", "direct")
    ch.exchange_declare(exchange, passive=True)  # the stripped name is the exchange's
    ch.queue_bind(queue, exchange + "\r\n", "k")
    ch.basic_publish(exchange, "k", b"hi")
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert method is not None and (method.exchange, body) == (exchange, b"hi")
    returned: list[str] = []
    ch.add_on_return_callback(lambda _ch, m, _p, _b: returned.append(m.exchange))
    ch.basic_publish(exchange, "nowhere", b"x", mandatory=True)
    wait_for(lambda: conn.process_data_events(0.05) or returned, 5, "basic.return")
    assert returned == [exchange]
    ch.exchange_delete(exchange + "\r")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_declare(exchange, passive=True)
    assert exc.value.reply_code == 404
    conn.close()
    # (pika waits for a declare-ok that names the queue as asked: a raw client)
    s = handshake(broker.port)
    s.sendall(pamqp_frame.marshal(C.Queue.Declare(queue="orders\r\n"), 1))
    assert expect(s, C.Queue.DeclareOk).queue == "orders"  # type: ignore[attr-defined]
    s.sendall(pamqp_frame.marshal(C.Queue.Delete(queue="orders\n"), 1))
    expect(s, C.Queue.DeleteOk)
    s.sendall(pamqp_frame.marshal(C.Queue.Declare(queue="orders", passive=True), 1))
    assert expect(s, C.Channel.Close).reply_code == 404  # type: ignore[attr-defined]
    s.close()


def _segment_resident_kib(pid: int) -> int:
    """KiB of the shared segment (shoal.shm) mapped into process `pid`."""
    kib, inside = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            if line[:1] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith("shoal.shm")
            elif inside and line.startswith("Rss:"):
                kib += int(line.split()[1])
    return kib


def test_a_large_queue_limit_costs_the_slots_used_not_the_limit(broker_factory: type) -> None:
    """--max-queues 262,144: past 4,096 queues, and the segment's queue table
    (1 KiB a slot) touched only as far as the slots used (H_QUEUES_USED):
    every process used to read every slot at its start (256 MiB here)."""
    broker = broker_factory(args=("--max-queues", "262144"))
    conn = connect(broker)
    try:
        ch = conn.channel()
        names = [ch.queue_declare("", exclusive=True).method.queue for _ in range(4100)]
        ch.basic_publish("", names[-1], b"the last queue's")
        wait_for(
            lambda: ch.basic_get(names[-1], auto_ack=True)[2] == b"the last queue's",
            5,
            "the message back from the 4,100th queue",
        )
        assert broker.proc is not None
        processes = psutil.Process(broker.proc.pid).children(recursive=True)
        scheduler = next(p for p in processes if "scheduler" in " ".join(p.cmdline()))
        assert _segment_resident_kib(scheduler.pid) < 32 * 1024  # (4,100 slots: ~4 MiB)
    finally:
        conn.close()
