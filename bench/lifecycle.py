"""Message TTL and delayed delivery at scale (issue 15's benchmarks).

1. **TTL**: 1,000,000 messages (64 B) published to a queue with
   x-message-ttl 10 s and no consumer. When is it empty, against the last
   publish + 10 s, and what is left of shared memory (Shoal's arenas)?
2. **Expiry rate**: 1,000,000 messages to a queue without a TTL, each with
   an `expiration` that makes them all due at the same moment: messages
   expired per second once due (the expirer's own speed).
3. **A queue filled faster than its TTL**: `shoal perf` producers (4, no
   confirms) publish for --fill-seconds into a queue that a policy gives a
   10 s TTL, so it holds ~1M at once: empty on time after the last publish
   + 10 s? (pika alone publishes 1M in ~25 s: longer than the TTL.)
4. **Delayed messages** (Shoal only: RabbitMQ 3.10's Debian package has no
   delayed message exchange plugin): 10,000 messages with random x-delay up
   to 60 s through an x-delayed-message exchange; how late each one arrives
   at a consumer, against its due time.

Brokers side by side in one run (RabbitMQ as a private node: needs the
Debian package), each fresh. Prints a markdown report.

    python bench/lifecycle.py [--messages 1000000] [--delayed 10000] [--no-rabbitmq]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import machine_info, perf_command, run_perf, shoal_revision
from persistent import Rabbit, Shoal

BODY = b"x" * 64
BATCH = 10_000


def _channel(uri: str) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    return conn, conn.channel()


def count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def publish(ch: Any, queue: str, messages: int, due: float | None = None) -> tuple[float, float]:
    """Publish `messages` to `queue`; with `due` (a time.time()), each with
    an expiration that ends at `due`. Returns (first, last) publish times."""
    first = time.time()
    props = None
    for i in range(messages):
        if due is not None and i % BATCH == 0:
            left = max(0, int((due - time.time()) * 1000))
            props = pika.BasicProperties(expiration=str(left))
        ch.basic_publish("", queue, BODY, props)
    return first, time.time()


def wait_empty(ch: Any, queue: str, timeout: float) -> float | None:
    """When `queue` was first seen empty (polled every 50 ms), or None."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if count(ch, queue) == 0:
            return time.time()
        time.sleep(0.05)
    return None


def arena_used(shoal: Shoal) -> int:
    from shoal.broker.operate.status import snapshot
    from shoal.shm.segment import Segment

    snap = snapshot(Segment.attach(str(Path(shoal.runtime) / "shoal.shm")))
    return sum(p.get("arena_used_bytes") or 0 for p in snap["processes"])


def ttl_run(uri: str, messages: int) -> dict[str, Any]:
    conn, ch = _channel(uri)
    ch.queue_declare("ttl-10s", arguments={"x-message-ttl": 10_000})
    first, last = publish(ch, "ttl-10s", messages)
    peak = count(ch, "ttl-10s")
    empty = wait_empty(ch, "ttl-10s", 300)
    conn.close()
    return {
        "publish_s": last - first,
        "peak": peak,
        "lag_s": None if empty is None else empty - (last + 10),
    }


def ttl_full_run(uri: str, set_policy: Any, seconds: float) -> dict[str, Any]:
    """A queue filled faster than its TTL: `shoal perf` producers (4, no
    confirms, 64 B) publish for `seconds` into a queue that a policy gives a
    10 s TTL (perf declares it without arguments). How many it held at
    once, and when it is empty against the last publish + 10 s."""
    set_policy("ttl-full", "^ttl-full$", {"message-ttl": 10_000})
    args = ("--producers", "4", "--consumers", "0", "--size", "64", "--queue", "ttl-full")
    run_perf(perf_command(uri, args, seconds, 0), seconds + 120)
    last = time.time()
    conn, ch = _channel(uri)
    held = count(ch, "ttl-full")
    empty = wait_empty(ch, "ttl-full", 300)
    conn.close()
    return {"held": held, "lag_s": None if empty is None else empty - (last + 10)}


def shoal_policy(shoal: Shoal) -> Any:
    def set_policy(name: str, pattern: str, definition: dict[str, Any]) -> None:
        subprocess.run(
            [
                *(sys.executable, "-m", "shoal.broker", "policy", "--runtime-dir", shoal.runtime),
                *("set", name, pattern, json.dumps(definition), "--apply-to", "queues"),
            ],
            check=True,
            capture_output=True,
        )

    return set_policy


def rabbit_policy(rabbit: Rabbit) -> Any:
    def set_policy(name: str, pattern: str, definition: dict[str, Any]) -> None:
        subprocess.run(
            [
                *rabbit.ctl,
                "set_policy",
                name,
                pattern,
                json.dumps(definition),
                "--apply-to",
                "queues",
            ],
            env=rabbit.env,
            check=True,
            capture_output=True,
        )

    return set_policy


def rate_run(uri: str, messages: int, publish_s: float) -> dict[str, Any]:
    conn, ch = _channel(uri)
    ch.queue_declare("due-together")
    due = time.time() + publish_s * 1.5 + 5
    publish(ch, "due-together", messages, due)
    held = count(ch, "due-together")
    wait = due - time.time()
    if wait > 0:
        time.sleep(wait)
    empty = wait_empty(ch, "due-together", 300)
    conn.close()
    took = None if empty is None else max(empty - due, 1e-3)
    return {"held": held, "took_s": took, "rate": None if took is None else held / took}


def _consume_delayed(uri: str, expected: int, out: Any) -> None:
    conn, ch = _channel(uri)
    late: list[float] = []

    def on_message(chan: Any, method: Any, props: Any, body: bytes) -> None:
        late.append(time.time() - float(body))
        if len(late) >= expected:
            chan.stop_consuming()

    ch.basic_consume("delayed-out", on_message, auto_ack=True)
    out.send("consuming")  # the publisher starts now: no message is due before we listen
    ch.start_consuming()
    out.send(late)
    conn.close()


def delayed_run(uri: str, messages: int, max_delay_ms: int) -> dict[str, Any]:
    conn, ch = _channel(uri)
    ch.exchange_declare("delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_declare("delayed-out")
    ch.queue_bind("delayed-out", "delayed", "k")
    receiver, sender = multiprocessing.Pipe(duplex=False)
    consumer = multiprocessing.Process(target=_consume_delayed, args=(uri, messages, sender))
    consumer.start()
    if not receiver.poll(60) or receiver.recv() != "consuming":
        raise RuntimeError("the consumer did not start")
    rng = random.Random(15)
    for _ in range(messages):
        delay = rng.randint(0, max_delay_ms)
        props = pika.BasicProperties(headers={"x-delay": delay})
        ch.basic_publish("delayed", "k", str(time.time() + delay / 1000).encode(), props)
    conn.close()
    late = receiver.recv() if receiver.poll(max_delay_ms / 1000 + 120) else []
    consumer.join(10)
    if consumer.is_alive():
        consumer.kill()
    late.sort()
    return {
        "received": len(late),
        "p50_ms": statistics.median(late) * 1000 if late else None,
        "p99_ms": late[int(len(late) * 0.99) - 1] * 1000 if late else None,
        "max_ms": late[-1] * 1000 if late else None,
        "min_ms": late[0] * 1000 if late else None,
        "over_100ms": sum(1 for x in late if abs(x) > 0.1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--delayed", type=int, default=10_000)
    p.add_argument("--max-delay-ms", type=int, default=60_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument(
        "--fill-seconds", type=float, default=8.0, help="perf publishing into the 10 s TTL queue"
    )
    opts = p.parse_args(argv)
    rows = []
    brokers: list[tuple[str, Any]] = [("Shoal", Shoal(opts.workers, ()))]
    if not opts.no_rabbitmq:
        brokers.append(("RabbitMQ 3.10", Rabbit()))
    for name, broker in brokers:
        broker.start()
        try:
            baseline = arena_used(broker) if name == "Shoal" else None
            ttl = ttl_run(broker.uri, opts.messages)
            after = arena_used(broker) if name == "Shoal" else None
            rate = rate_run(broker.uri, opts.messages, ttl["publish_s"])
            policy = shoal_policy(broker) if name == "Shoal" else rabbit_policy(broker)
            full = ttl_full_run(broker.uri, policy, opts.fill_seconds)
            full_after = arena_used(broker) if name == "Shoal" else None
            rows.append((name, ttl, rate, baseline, after, full, full_after))
            print(f"{name}: {ttl} {rate} {full}", file=sys.stderr, flush=True)
        finally:
            broker.stop()
    shoal = Shoal(opts.workers, ())  # the delayed messages on a broker of their own
    shoal.start()
    try:
        delayed = delayed_run(shoal.uri, opts.delayed, opts.max_delay_ms)
    finally:
        shoal.stop()

    def s(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    print("\n".join(machine_info()))
    print(f"- Date: {time.strftime('%Y-%m-%d')}; Shoal {shoal_revision()}\n")
    print(
        "| broker | publish 1M (s) | queue empty, after last publish + 10 s (s) "
        "| arena bytes before / after | all due at once: held | expired in (s) | expired msg/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ttl, rate, baseline, after, _full, _full_after in rows:
        arenas = "-" if baseline is None else f"{baseline:,} / {after:,}"
        print(
            f"| {name} | {s(ttl['publish_s'], 1)} | {s(ttl['lag_s'])} | {arenas} "
            f"| {rate['held']:,} | {s(rate['took_s'])} | {s(rate['rate'], 0)} |"
        )
    print(f"\nFilled faster than its TTL ({opts.fill_seconds:g} s of `shoal perf`, 4 producers):\n")
    print("| broker | held at once | empty after last publish + 10 s (s) | arena bytes after |")
    print("|---|---:|---:|---:|")
    for name, _ttl, _rate, _baseline, _after, full, full_after in rows:
        arenas = "-" if full_after is None else f"{full_after:,}"
        print(f"| {name} | {full['held']:,} | {s(full['lag_s'])} | {arenas} |")
    if delayed is not None:
        print(
            f"\nDelayed (Shoal): {delayed['received']:,} of {opts.delayed:,} received; "
            f"lateness p50 {s(delayed['p50_ms'], 1)} ms, p99 {s(delayed['p99_ms'], 1)} ms, "
            f"max {s(delayed['max_ms'], 1)} ms (min {s(delayed['min_ms'], 1)} ms); "
            f"{delayed['over_100ms']} more than 100 ms off"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
