"""Differences from RabbitMQ that other clients' test suites found,
each shown with a real client over a real socket: pika and py-amqp, and raw
frames where the behaviour is in the frame order or the TCP close itself."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading

import amqp
import pika
import psutil
import pytest
from pamqp import body as pamqp_body
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from tests.broker_process import Broker, wait_for
from tests.clients import connect
from tests.integration.test_malformed import handshake


class Wire:
    """A raw client's frames in order (several may come in one read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, channel: int, *frames: object) -> None:
        self.sock.sendall(b"".join(pamqp_frame.marshal(f, channel) for f in frames))  # type: ignore[arg-type]

    def read(self) -> object:
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0] + 8
                if len(self.buf) >= size:
                    _n, _channel, frame = pamqp_frame.unmarshal(self.buf[:size])
                    self.buf = self.buf[size:]
                    return frame
            chunk = self.sock.recv(65536)
            assert chunk, "the broker closed the connection"
            self.buf += chunk

    def expect(self, cls: type) -> object:
        frame = self.read()
        assert isinstance(frame, cls), f"expected {cls.__name__}, got {frame!r}"
        return frame


# --------------------------------------------- 1. server properties (AMQP 0-8)


def strict_08_table(data: bytes) -> dict[str, object]:
    """A field table decoded as codecs written against AMQP 0-8 decode it:
    long strings, long ints, decimals, timestamps and nested tables, plus
    booleans. Any other type (pamqp's short-short-int 'b', say) is an error."""
    out: dict[str, object] = {}
    i = 0
    while i < len(data):
        n = data[i]
        key = data[i + 1 : i + 1 + n].decode()
        i += 1 + n
        kind = chr(data[i])
        i += 1
        if kind in "SF":
            (size,) = struct.unpack_from(">I", data, i)
            raw = data[i + 4 : i + 4 + size]
            out[key] = raw.decode() if kind == "S" else strict_08_table(raw)
            i += 4 + size
        elif kind == "I":
            (out[key],) = struct.unpack_from(">i", data, i)
            i += 4
        elif kind == "D":
            out[key] = struct.unpack_from(">Bi", data, i)
            i += 5
        elif kind == "T":
            (out[key],) = struct.unpack_from(">Q", data, i)
            i += 8
        elif kind == "t":
            out[key] = bool(data[i])
            i += 1
        else:
            raise ValueError(f"field {key!r}: type {kind!r} is not in AMQP 0-8")
    return out


def test_connection_start_decodes_with_amqp_08_field_types(broker: Broker) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while len(data) < 7 or len(data) < 8 + struct.unpack_from(">I", data, 3)[0]:
            chunk = s.recv(65536)
            assert chunk, "the broker closed before connection.start"
            data += chunk
    ftype, channel, size = struct.unpack_from(">BHI", data)
    assert (ftype, channel, data[7 + size]) == (1, 0, 0xCE)
    assert struct.unpack_from(">HH", data, 7) == (10, 10)  # connection.start
    (table_size,) = struct.unpack_from(">I", data, 13)
    props = strict_08_table(data[17 : 17 + table_size])
    assert props["product"] == "Shoal"
    assert props["capabilities"]["publisher_confirms"] is True  # type: ignore[index]
    # Which worker serves the connection is still there, as text.
    assert props["shoal_worker"] in ("0", "1")
    assert int(str(props["shoal_worker_pid"])) in {p.pid for p in broker.family()}
    # The mechanisms and locales follow as long strings.
    rest = data[17 + table_size :]
    (n,) = struct.unpack_from(">I", rest)
    assert rest[4 : 4 + n] == b"PLAIN AMQPLAIN"


# ------------------------------------- 2. queue.delete-ok before basic.cancel


def py_amqp(broker: Broker) -> amqp.Connection:
    conn = amqp.Connection(host=f"127.0.0.1:{broker.port}", userid="guest", password="guest")
    conn.connect()
    return conn


def test_py_amqp_deletes_a_queue_its_own_consumers_use(broker: Broker) -> None:
    """py-amqp waits for delete-ok; a basic.cancel before it would raise
    ConsumerCancelled inside queue_delete (kombu, Celery)."""
    conn = py_amqp(broker)
    try:
        ch, other = conn.channel(), conn.channel()
        ch.queue_declare("busy")
        tags = {ch.basic_consume("busy", callback=lambda m: None)}
        tags.add(other.basic_consume("busy", callback=lambda m: None))
        assert ch.queue_delete("busy") == 0  # delete-ok, with its message count
        cancelled = set()
        for _ in range(2):  # then a basic.cancel for each consumer
            with pytest.raises(amqp.exceptions.ConsumerCancelled) as exc:
                conn.drain_events(timeout=5)
            cancelled.add(exc.value.reply_text)
        assert cancelled == tags
        # Both channels are fine.
        for c in (ch, other):
            assert c.queue_declare("after", auto_delete=False).queue == "after"
    finally:
        conn.close()


def test_delete_ok_comes_before_the_cancels_on_the_wire(broker: Broker) -> None:
    w = Wire(handshake(broker.port, {"consumer_cancel_notify": True}))
    w.send(2, C.Channel.Open())
    w.expect(C.Channel.OpenOk)
    w.send(1, C.Queue.Declare(queue="wire"))
    w.expect(C.Queue.DeclareOk)
    for number, tag in ((1, "own"), (2, "neighbour")):
        w.send(number, C.Basic.Consume(queue="wire", consumer_tag=tag))
        w.expect(C.Basic.ConsumeOk)
    w.send(1, C.Queue.Delete(queue="wire"))
    frames = [w.read() for _ in range(3)]
    w.sock.close()
    assert isinstance(frames[0], C.Queue.DeleteOk), frames
    assert {f.consumer_tag for f in frames[1:] if isinstance(f, C.Basic.Cancel)} == {
        "own",
        "neighbour",
    }


def test_a_queue_deleted_elsewhere_cancels_at_once(broker: Broker) -> None:
    """The held cancels concern the deleting connection only: a consumer on
    another connection is told as before."""
    consumer, deleter = connect(broker), py_amqp(broker)
    try:
        ch = consumer.channel()
        ch.queue_declare("elsewhere")
        cancelled: list[str] = []
        ch.basic_consume("elsewhere", lambda *a: None)
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        assert deleter.channel().queue_delete("elsewhere") == 0
        wait_for(lambda: consumer.process_data_events(0.05) or cancelled, 10, "basic.cancel")
    finally:
        consumer.close()
        deleter.close()


# ------------------------------------------ 3. crossing channel.close frames


def test_crossing_channel_close_keeps_the_connection(broker: Broker) -> None:
    """The client closes channel 1 just as the broker closes it (a publish to
    a missing exchange); it answers the broker's close with close-ok. That
    close-ok belongs to the handshake: channel 2 carries on."""
    w = Wire(handshake(broker.port))
    w.send(2, C.Channel.Open())
    w.expect(C.Channel.OpenOk)
    w.send(
        1,
        C.Basic.Publish(exchange="missing", routing_key="k"),
        pamqp_header.ContentHeader(body_size=1),
        pamqp_body.ContentBody(b"x"),
        C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    )
    server_close = w.expect(C.Channel.Close)
    assert server_close.reply_code == 404  # type: ignore[attr-defined]
    assert server_close.reply_text == "NOT_FOUND - no exchange 'missing' in vhost '/'"  # type: ignore[attr-defined]
    w.expect(C.Channel.CloseOk)  # the answer to ours
    w.send(1, C.Channel.CloseOk())  # ours to the broker's
    w.send(2, C.Exchange.Declare(exchange="alive", exchange_type="fanout"))
    w.expect(C.Exchange.DeclareOk)
    w.send(1, C.Channel.Open())  # channel 1 can be opened again
    w.expect(C.Channel.OpenOk)
    w.sock.close()


def test_pika_closes_a_channel_the_broker_is_closing(broker: Broker) -> None:
    conn = connect(broker)
    try:
        doomed, survivor = conn.channel(), conn.channel()
        doomed.basic_publish("missing", "k", b"x")
        try:
            doomed.close()
        except pika.exceptions.ChannelClosedByBroker:
            pass  # the broker's close may reach pika first: it says so
        survivor.exchange_declare("still-here", "fanout")
        survivor.queue_declare("still-here-too")
        assert conn.is_open
    finally:
        conn.close()


# --------------------------------------------------------- 4. clean TCP close


def test_close_ok_then_a_clean_tcp_close(broker: Broker) -> None:
    """Frames the client sends after its connection.close (a second close
    from another thread, heartbeats: here 4 MB of them, more than one read)
    are discarded, and the broker waits for the client to close its end: the
    client sees close-ok and a clean EOF, never a reset."""
    w = Wire(handshake(broker.port))
    s = w.sock
    close = pamqp_frame.marshal(
        C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0
    )
    heartbeat = pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)
    s.sendall(close + close + heartbeat * (4 << 20 >> 3))
    s.shutdown(socket.SHUT_WR)
    w.expect(C.Connection.CloseOk)
    rest = w.buf
    while chunk := s.recv(65536):
        rest += chunk
    assert rest == b"", "only one close-ok"
    s.close()


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_concurrent_closers_see_close_ok_before_the_end(broker: Broker) -> None:
    """Go's client closing one connection from 10 goroutines sends 10
    connection.close frames and each goroutine waits for a close-ok; one
    that met the broker's EOF first reported "501 EOF" (15 runs in 20). As
    RabbitMQ: one close-ok, then no FIN of the broker's until the client
    closes its end, then a clean EOF, never a reset. 200 rounds of 10
    threads sending their close at once."""
    close = pamqp_frame.marshal(
        C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0
    )
    for round_ in range(200):
        w = Wire(handshake(broker.port))
        s = w.sock
        closers = [threading.Thread(target=s.sendall, args=(close,)) for _ in range(10)]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(10)
        w.expect(C.Connection.CloseOk)
        assert w.buf == b""
        s.settimeout(0.02)
        with pytest.raises(TimeoutError):
            s.recv(65536)  # the broker's end stays open, and quiet, while ours is
        s.shutdown(socket.SHUT_WR)
        s.settimeout(10)
        assert s.recv(65536) == b"", f"round {round_}: only one close-ok, then EOF"
        s.close()


def test_close_ok_reaches_a_client_that_shut_its_end_before_it(broker: Broker) -> None:
    """close-ok waits for the scheduler (exclusive queues go first). With the
    scheduler stopped, the client's EOF surely arrives before it: the broker
    still owes, and sends, close-ok (after its bounded wait), then closes."""
    w = Wire(handshake(broker.port))
    s = w.sock
    scheduler = broker.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        w.send(0, C.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        s.shutdown(socket.SHUT_WR)
        s.settimeout(15)
        w.expect(C.Connection.CloseOk)
        assert s.recv(65536) == b""
    finally:
        os.kill(scheduler, signal.SIGCONT)
        s.close()


def test_broker_closes_its_end_once_the_client_has(broker: Broker) -> None:
    """Waiting for the client's end to close holds nothing longer than
    that: once pika has closed, so has the broker."""
    conn = connect(broker)
    conn.channel().queue_declare("x")
    conn.close()
    worker_conns = lambda: [  # noqa: E731
        c
        for p in broker.family()
        for c in p.net_connections("tcp")
        if c.laddr and c.laddr.port == broker.port and c.status == psutil.CONN_ESTABLISHED
    ]
    wait_for(lambda: not worker_conns(), 5, "the broker to close its end")


# ------------------------------------------- 5. runtime directory after kill -9


def test_clean_stop_after_a_kill_9_leaves_no_runtime_dir(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=1)
    family = broker.family()
    for p in family:
        p.kill()
    psutil.wait_procs(family, timeout=10)
    broker.proc.wait(5)
    assert os.path.exists(os.path.join(broker.runtime_dir, "shoal.shm"))
    broker._seg = None
    broker.start()  # the same port and runtime directory
    assert "removed the stale segment" in broker.log()
    conn = connect(broker)
    conn.channel().queue_declare("after-crash")
    conn.close()
    assert broker.stop(signal.SIGTERM) == 0
    broker.assert_clean()
    assert not os.path.exists(broker.runtime_dir), os.listdir(broker.runtime_dir)


def test_exclusive_queues_are_gone_when_close_ok_arrives(broker: Broker) -> None:
    """As in RabbitMQ: close-ok follows the deletion of the connection's
    exclusive queues, so the name is free at once on any worker, even while
    the client has not closed its socket yet."""
    other = connect(broker)
    try:
        for _ in range(5):
            owner = Wire(handshake(broker.port))  # least loaded: the other worker
            owner.send(1, C.Queue.Declare(queue="mine", exclusive=True))
            owner.expect(C.Queue.DeclareOk)
            owner.send(
                0, C.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
            )
            owner.expect(C.Connection.CloseOk)
            ch = other.channel()
            ch.queue_declare("mine", exclusive=True)  # not 405 RESOURCE_LOCKED
            ch.queue_delete("mine")
            ch.close()
            owner.sock.close()
    finally:
        other.close()


# ------------------------------- deliver before ack on the consuming channel


def test_own_consumer_gets_the_delivery_before_the_confirm(broker: Broker) -> None:
    """A channel in confirm mode consumes the queue it publishes to: as in
    RabbitMQ, whose queue hands the message to the consumer before it
    confirms it, basic.deliver reaches the client before basic.ack. A client
    that waits for the confirm and then for the delivery (aiormq's
    test_connection_close_stairway) would otherwise wait forever when the
    connection breaks between the two frames."""
    w = Wire(handshake(broker.port))
    w.send(1, C.Confirm.Select())
    w.expect(C.Confirm.SelectOk)
    w.send(1, C.Queue.Declare(queue="", exclusive=True))
    queue = w.expect(C.Queue.DeclareOk).queue  # type: ignore[attr-defined]
    w.send(1, C.Basic.Consume(queue=queue, consumer_tag="c", no_ack=True))
    w.expect(C.Basic.ConsumeOk)
    for tag in range(1, 51):
        w.send(
            1,
            C.Basic.Publish(exchange="", routing_key=queue),
            pamqp_header.ContentHeader(body_size=4),
            pamqp_body.ContentBody(b"test"),
        )
        deliver = w.read()
        assert isinstance(deliver, C.Basic.Deliver), f"publish {tag}: {deliver!r} came first"
        w.expect(pamqp_header.ContentHeader)
        w.expect(pamqp_body.ContentBody)
        ack = w.expect(C.Basic.Ack)
        assert ack.delivery_tag == tag  # type: ignore[attr-defined]
    w.sock.close()
