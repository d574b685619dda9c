"""The fuzzing harness's short run (issue 16, item 8; the 1M-frame run is
bench/fuzz.py): mutated and random frames from many connections, before
and after a login, while a bystander publishes and consumes with confirms.
No broker process dies or is replaced, the bystander is not disturbed and
loses nothing, nothing is logged as an internal error, and a new client
works afterwards."""

from __future__ import annotations

import asyncio

from shoal.perf.fuzz import Bystander, fuzz
from tests.broker_process import Broker
from tests.clients import connect

FRAMES = 60_000


def pids(broker: Broker) -> dict[tuple[str, int], int]:
    return {
        (p["role"], p.get("index", 0)): p["pid"] for p in broker.status()["processes"] if p["pid"]
    }


def test_fuzzed_frames_hurt_no_one(broker: Broker) -> None:
    before = pids(broker)
    bystander = Bystander("127.0.0.1", broker.port)
    bystander.start()
    try:
        stats = asyncio.run(fuzz("127.0.0.1", broker.port, FRAMES, 16, seed=7))
    finally:
        bystander.stop.set()
        bystander.join(60)
    assert stats.frames >= FRAMES and stats.connections > 100
    assert bystander.verdict() == "", bystander.verdict()
    assert bystander.sent > 0
    assert pids(broker) == before, "a broker process died or was replaced"
    log = broker.log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    ch = connect(broker).channel()
    ch.queue_declare("after-fuzz")
    ch.confirm_delivery()
    ch.basic_publish("", "after-fuzz", b"still fine")
    assert ch.basic_get("after-fuzz", auto_ack=True)[2] == b"still fine"
