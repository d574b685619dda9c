"""How long a new connection's handshake takes while many publishers fan out.

The Java client's Bug19219Test shape: queues bound to amq.fanout, one
connection consuming all of them without acks (a thread reads and discards),
N publishers writing publishes to amq.fanout as fast as their sockets take
them (raw frames, one thread each). After WARM_S of that load, pika opens
HANDSHAKES connections one after another (connection and channel open) and
the seconds each took are printed, with the bytes the consumer read. The
broker is any AMQP 0-9-1 broker on 127.0.0.1 (Shoal or RabbitMQ):

    python bench/fanout_handshakes.py --port 5672 --queues 1500 --publishers 40

A benchmark, not a test: run it against each broker in the same session.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import pika
from pamqp import commands as C
from pamqp import frame as F
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

WARM_S = 3.0  # load before the first handshake is timed
HANDSHAKES = 8


def raw_open(port: int) -> socket.socket:
    """A logged-in connection with channel 1 open (guest/guest)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"AMQP\x00\x00\x09\x01")
    s.recv(65536)  # connection.start
    s.sendall(
        F.marshal(
            C.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
            ),
            0,
        )
    )
    s.recv(65536)  # connection.tune
    s.sendall(F.marshal(C.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0))
    s.sendall(F.marshal(C.Connection.Open(), 0))
    s.recv(65536)
    s.sendall(F.marshal(C.Channel.Open(), 1))
    s.recv(65536)
    return s


def publish_until(port: int, stop: threading.Event) -> None:
    s = raw_open(port)
    one = (
        F.marshal(C.Basic.Publish(exchange="amq.fanout", routing_key=""), 1)
        + F.marshal(ContentHeader(0, 8, C.Basic.Properties()), 1)
        + F.marshal(ContentBody(b"12345678"), 1)
    )
    chunk = one * 100
    while not stop.is_set():
        try:
            s.sendall(chunk)
        except OSError:
            break
    s.close()


def drain(s: socket.socket, got: list[int]) -> None:
    while True:
        try:
            data = s.recv(1 << 20)
        except OSError:
            return
        if not data:
            return
        got[0] += len(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--queues", type=int, default=1500)
    ap.add_argument("--publishers", type=int, default=40)
    args = ap.parse_args()
    url = f"amqp://guest:guest@127.0.0.1:{args.port}/"
    setup = pika.BlockingConnection(pika.URLParameters(url))
    ch = setup.channel()
    names = [f"fanout-hs-{i}" for i in range(args.queues)]
    for name in names:
        ch.queue_declare(name)
        ch.queue_bind(name, "amq.fanout")
    consumer = raw_open(args.port)
    consumer.sendall(b"".join(F.marshal(C.Basic.Consume(queue=n, no_ack=True), 1) for n in names))
    got = [0]
    threading.Thread(target=drain, args=(consumer, got), daemon=True).start()
    stop = threading.Event()
    for _ in range(args.publishers):
        threading.Thread(target=publish_until, args=(args.port, stop), daemon=True).start()
    time.sleep(WARM_S)  # the load builds (a measurement's warm-up, not a synchronisation)
    started = time.perf_counter()
    times = []
    for _ in range(HANDSHAKES):
        t0 = time.perf_counter()
        conn = pika.BlockingConnection(pika.URLParameters(url + "?socket_timeout=60"))
        conn.channel()
        times.append(time.perf_counter() - t0)
        conn.close()
    stop.set()
    elapsed = time.perf_counter() - started + WARM_S
    print(
        f"handshakes (s): median {statistics.median(times):.2f} max {max(times):.2f} "
        f"all {[round(t, 2) for t in times]}; consumer read {got[0] / elapsed / 1e6:.1f} MB/s",
        flush=True,
    )
    consumer.close()
    t0 = time.perf_counter()
    left = sum(ch.queue_declare(name, passive=True).method.message_count for name in names)
    deletes = []
    for name in names:
        t1 = time.perf_counter()
        ch.queue_delete(name)
        deletes.append(time.perf_counter() - t1)
    print(
        f"{left} messages left in the queues, deleted in {time.perf_counter() - t0:.1f} s "
        f"(a delete: median {statistics.median(deletes) * 1000:.0f} ms, "
        f"max {max(deletes) * 1000:.0f} ms)"
    )
    setup.close()


if __name__ == "__main__":
    main()
