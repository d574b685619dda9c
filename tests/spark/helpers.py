"""pika helpers for the connector's tests, and the runner of the Spark jobs
in jobs.py (not a test module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pika

from shoal.spark.options import Options
from shoal.spark.publish import Publisher

STREAM = {"x-queue-type": "stream"}


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def publish(url: str, queue: str, n: int, start: int = 0, stream: bool = True) -> None:
    """Messages m<i> (message_id id-<i>, headers i and tag) for i in
    [start, start + n), with confirms, pipelined (the connector's publisher);
    declares the queue first (a stream unless stream=False)."""
    conn = connect(url)
    conn.channel().queue_declare(queue, durable=True, arguments=STREAM if stream else None)
    conn.close()
    rows = (
        {"body": f"m{i}".encode(), "message_id": f"id-{i}", "headers": {"i": i, "tag": b"t"}}
        for i in range(start, start + n)
    )
    Publisher(Options.parse({"uri": url, "routingKey": queue})).publish_all(rows, "test")


def count(url: str, queue: str) -> int:
    conn = connect(url)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def drain(url: str, queue: str, timeout: float = 10.0) -> list[tuple[bytes, Any, bool]]:
    """Consume (and ack) everything in a classic queue: (body, properties,
    redelivered) in order."""
    conn = connect(url)
    ch = conn.channel()
    got: list[tuple[bytes, Any, bool]] = []
    n = int(ch.queue_declare(queue, passive=True).method.message_count)
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((body, props, method.redelivered))
        ch.basic_ack(method.delivery_tag)
        if len(got) >= n:
            break
    conn.close()
    return got


def browse_all(url: str, queue: str) -> list[tuple[bytes, bool]]:
    """(body, redelivered) of every ready message, without taking any."""
    conn = connect(url)
    ch = conn.channel()
    seen: list[tuple[bytes, bool]] = []
    done: list[bool] = []
    ch.add_on_cancel_callback(lambda _f: done.append(True))
    ch.basic_consume(
        queue,
        lambda _c, m, _p, b: seen.append((b, m.redelivered)),
        auto_ack=True,
        arguments={"x-filter-no-consume": True, "x-filter-auto-close": True},
    )
    while not done:
        conn.process_data_events(time_limit=0.05)
    conn.close()
    return seen


JOBS = Path(__file__).with_name("jobs.py")


def run_job(cwd: Path, *args: str, pythonpath: str | None = None) -> dict[str, Any]:
    """Run a job of jobs.py, a Spark driver of its own, in `cwd` (its Python
    workers: this interpreter); return the job's result line."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath  # Spark's workers get it too
    env.pop("PYSPARK_DRIVER_PYTHON", None)  # Spark would look data sources up with it
    proc = subprocess.run(
        [sys.executable, str(JOBS), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("result: ")]
    assert lines, out[-6000:]
    return dict(json.loads(lines[-1].removeprefix("result: ")))
