"""Does a queue with a 1M-message backlog slow a quiet queue on the same worker?

A queue's backlog must cost other queues nothing (bounded work); as a
benchmark, not a timed test: the round-trip latency of single messages
through a quiet queue (publish, then wait for its delivery; one at a time,
5 ms apart) is measured three times:

  1. unloaded: nothing else in the broker;
  2. idle backlog: another queue holds 1,000,000 messages;
  3. draining backlog: a consumer (another process) drains that queue at full
     speed while the pings run.

Shoal runs with one IO worker, so every connection shares the worker the
backlog is served by. The same script measures RabbitMQ from the same run.

    python bench/quiet_queue.py --start-shoal [--rabbit-uri amqp://guest:guest@127.0.0.1:5672/]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shoal.broker.cli import local_command  # noqa: E402
from tests.broker_process import free_port, wait_for  # noqa: E402

BACKLOG = 1_000_000
PINGS = 400
PING_GAP = 0.005


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1e3, 3),
        "max_ms": round(ordered[-1] * 1e3, 3),
    }


def ping(uri: str, n: int) -> list[float]:
    """Round trips through the quiet queue, one message at a time."""
    pub = pika.BlockingConnection(pika.URLParameters(uri))
    sub = pika.BlockingConnection(pika.URLParameters(uri))
    pch, sch = pub.channel(), sub.channel()
    pch.queue_declare("quiet", auto_delete=False)
    got: list[float] = []
    sch.basic_consume("quiet", lambda c, m, p, b: got.append(time.perf_counter()), auto_ack=True)
    samples = []
    for _ in range(n):
        before = len(got)
        sent = time.perf_counter()
        pch.basic_publish("", "quiet", b"ping")
        deadline = sent + 10
        while len(got) == before:
            if time.perf_counter() > deadline:
                raise SystemExit("a ping was not delivered within 10 s")
            sub.process_data_events(time_limit=0.001)
        samples.append(got[-1] - sent)
        time.sleep(PING_GAP)  # pacing: one quiet message at a time, not a sync
    pub.close()
    sub.close()
    return samples


def fill(uri: str, n: int) -> float:
    """Publish n 64 B messages to 'busy' as fast as the socket takes them
    (pre-encoded frames written past pika), then wait until the queue holds
    them all; returns seconds."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.queue_declare("busy")
    ch.queue_purge("busy")
    number = ch.channel_number
    header = ContentHeader(body_size=64, properties=C.Basic.Properties())
    one = b"".join(
        [
            pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="busy"), number),
            pamqp_frame.marshal(header, number),
            pamqp_frame.marshal(ContentBody(b"x" * 64), number),
        ]
    )
    sock = conn._impl._transport._sock  # bulk path: pika's per-message overhead dominates
    start = time.perf_counter()
    batch = one * 1000
    sock.setblocking(True)
    for _ in range(n // 1000):
        sock.sendall(batch)
    sock.setblocking(False)
    deadline = time.monotonic() + 600
    counter = pika.BlockingConnection(pika.URLParameters(uri))
    cch = counter.channel()
    while cch.queue_declare("busy", passive=True).method.message_count < n:
        if time.monotonic() > deadline:
            raise SystemExit("the backlog did not fill in 10 min")
        time.sleep(0.2)
    elapsed = time.perf_counter() - start
    counter.close()
    conn.close()
    return elapsed


def drain(uri: str, ready: Any) -> None:
    """Another process: consume 'busy' at full speed (prefetch 500, acks
    with multiple=true every 100)."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    count = 0

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        nonlocal count
        count += 1
        if count % 100 == 0:
            c.basic_ack(m.delivery_tag, multiple=True)

    ch.basic_consume("busy", on_message)
    ready.set()
    ch.start_consuming()


def measure(uri: str) -> dict[str, Any]:
    ping(uri, 50)  # warm up
    result: dict[str, Any] = {"unloaded": percentiles(ping(uri, PINGS))}
    result["fill_s"] = round(fill(uri, BACKLOG), 1)
    result["idle_backlog"] = percentiles(ping(uri, PINGS))
    ready = multiprocessing.Event()
    drainer = multiprocessing.Process(target=drain, args=(uri, ready), daemon=True)
    drainer.start()
    ready.wait(30)
    time.sleep(1)  # let the drain reach full speed before measuring
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    left_before = conn.channel().queue_declare("busy", passive=True).method.message_count
    started = time.perf_counter()
    result["draining_backlog"] = percentiles(ping(uri, PINGS))
    took = time.perf_counter() - started
    left_after = conn.channel().queue_declare("busy", passive=True).method.message_count
    result["drain_msg_per_s"] = round((left_before - left_after) / took)
    result["backlog_left_after"] = left_after
    conn.channel().queue_delete("busy")
    conn.close()
    drainer.kill()
    drainer.join()
    for phase in ("idle_backlog", "draining_backlog"):
        result[f"{phase}_p50_ratio"] = round(
            result[phase]["p50_ms"] / result["unloaded"]["p50_ms"], 2
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start-shoal", action="store_true")
    parser.add_argument("--shoal-uri")
    parser.add_argument("--rabbit-uri")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_before": os.getloadavg(),
    }
    proc = None
    shoal_uri = args.shoal_uri
    runtime = tempfile.mkdtemp(prefix="shoal-quiet-")
    if args.start_shoal:
        port = free_port()
        cmd = local_command(
            port,
            1,
            runtime,
            "--queue-capacity",
            str(1 << 21),
            "--max-queues",
            "64",
            "--arena-mb",
            "512",
        )
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shoal_uri = f"amqp://guest:guest@127.0.0.1:{port}/"

        def up() -> bool:
            try:
                pika.BlockingConnection(pika.URLParameters(shoal_uri)).close()
                return True
            except pika.exceptions.AMQPError:
                return False

        wait_for(up, 30, "Shoal")
    try:
        if shoal_uri:
            results["shoal"] = measure(shoal_uri)
        if args.rabbit_uri:
            results["rabbitmq"] = measure(args.rabbit_uri)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
