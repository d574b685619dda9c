"""The fuzzing benchmark (issue 16, item 8): perf/fuzz.py's mutated and
random frames, at least 1M of them, from many connections at once, against
a broker started here, while a bystander publishes and consumes with
confirms. Reported: frames and time, whether any broker process died or
was replaced (crashes), whether the bystander was disturbed or lost a
message, and the IO workers' memory before, at the end, and after the
fuzzers are gone (back to baseline). docs/benchmarks.md has the numbers.

    python bench/fuzz.py [--frames 1000000] [--connections 32] [--workers 2]
    python bench/fuzz.py --mqtt tcp|websocket [--frames 1000000]   # perf/mqtt_fuzz.py's packets

With --mqtt the frames are MQTT packets to the MQTT (or MQTT-over-WebSocket)
listener, and a paho-mqtt bystander at QoS 1 runs beside the AMQP one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import psutil
from compare import free_port
from persistent import Shoal

from shoal.broker.operate.status import snapshot
from shoal.perf import mqtt_fuzz
from shoal.perf.fuzz import Bystander, fuzz


def processes(broker: Shoal) -> dict[str, int]:
    """role/index -> pid, from the broker's process table."""
    broker.counters()  # attaches the segment
    assert broker._seg is not None
    return {
        f"{p['role']}/{p.get('index', 0)}": p["pid"]
        for p in snapshot(broker._seg)["processes"]
        if p["pid"]
    }


def worker_rss_mb(pids: dict[str, int]) -> float:
    """The IO workers' own memory: resident pages less the shared segment's
    (RSS counts the pages of the shared-memory segment a worker has touched,
    which grow as its arena's allocation cursor moves on and are the arena's
    to give back, not a leak): RssAnon, the Python heap and native memory."""
    total = 0
    for name, pid in pids.items():
        if name.startswith("io-worker"):
            info = psutil.Process(pid).memory_info()
            total += info.rss - info.shared
    return round(total / 2**20, 1)


def worker_segment_mb(pids: dict[str, int]) -> float:
    """The shared segment's pages the IO workers have resident (summed)."""
    total = sum(
        psutil.Process(pid).memory_info().shared
        for name, pid in pids.items()
        if name.startswith("io-worker")
    )
    return round(total / 2**20, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="runs of --frames in the same broker")
    p.add_argument("--mqtt", choices=("tcp", "websocket"), help="MQTT packets instead")
    ns = p.parse_args()
    mqtt_port, ws_port = free_port(), free_port()
    broker = Shoal(ns.workers, ["--mqtt-port", str(mqtt_port), "--mqtt-ws-port", str(ws_port)])
    broker.start()
    try:
        before = processes(broker)
        rss_before = worker_rss_mb(before)
        bystanders: list[Bystander | mqtt_fuzz.Bystander] = [Bystander("127.0.0.1", broker.port)]
        if ns.mqtt:
            bystanders.append(mqtt_fuzz.Bystander("127.0.0.1", mqtt_port))
        for bystander in bystanders:
            bystander.start()
        started = time.monotonic()
        rss_rounds = []
        for round_no in range(ns.rounds):
            seed = ns.seed + round_no
            if ns.mqtt:
                websocket = ns.mqtt == "websocket"
                target = ws_port if websocket else mqtt_port
                mqtt_stats = asyncio.run(
                    mqtt_fuzz.fuzz(
                        "127.0.0.1", target, ns.frames, ns.connections, seed, websocket=websocket
                    )
                )
                sent, connections = mqtt_stats.frames, mqtt_stats.connections
            else:
                stats = asyncio.run(fuzz("127.0.0.1", broker.port, ns.frames, ns.connections, seed))
                sent, connections = stats.frames, stats.connections
            rss_rounds.append(worker_rss_mb(before))
        elapsed = time.monotonic() - started
        rss_end = rss_rounds[-1]
        for bystander in bystanders:
            bystander.stop.set()
            bystander.join(60)
        verdicts = [b.verdict() for b in bystanders]
        time.sleep(2)  # the last connections' close handshakes and lingers
        after = processes(broker)
        report: dict[str, Any] = {
            "frames": sent * ns.rounds,
            "worker_rss_mb_after_each_round": rss_rounds,
            "connections": connections,
            "seconds": round(elapsed, 1),
            "frames_per_second": round(sent * ns.rounds / elapsed),
            "processes_replaced": sorted(k for k in before if after.get(k) != before[k]),
            "bystander_messages": [b.sent for b in bystanders],
            "bystanders": [v or "undisturbed, every message once, in order" for v in verdicts],
            "worker_rss_mb": {"before": rss_before, "end": rss_end, "after": worker_rss_mb(after)},
            "worker_segment_pages_mb": worker_segment_mb(after),
            "broker_log_errors": sum(
                1
                for line in (broker.base / "broker.log").read_text(errors="replace").splitlines()
                if " ERROR " in line or "Traceback" in line
            ),
        }
    finally:
        broker.stop()
    print(json.dumps(report, indent=2))
    return 1 if report["processes_replaced"] or any(verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
