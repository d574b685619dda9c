"""The fuzzing harness's short run (issue 16, item 8; the 1M-frame run is
bench/fuzz.py): mutated and random frames from many connections, before
and after a login, while a bystander publishes and consumes with confirms.
No broker process dies or is replaced, the bystander is not disturbed and
loses nothing, nothing is logged as an internal error, and a new client
works afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from shoal.perf.fuzz import Bystander, fuzz
from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect

FRAMES = 60_000


def fault_of(log: str) -> str:
    """The broker log around its first traceback or internal error: what a
    failure must show (the log's end is the fuzzing's noise)."""
    at = min((i for i in (log.find("Traceback"), log.find("internal error")) if i >= 0), default=0)
    return log[max(0, at - 1500) : at + 4000]


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
    assert "Traceback" not in log and "internal error" not in log, fault_of(log)
    ch = connect(broker).channel()
    ch.queue_declare("after-fuzz")
    ch.confirm_delivery()
    ch.basic_publish("", "after-fuzz", b"still fine")
    assert ch.basic_get("after-fuzz", auto_ack=True)[2] == b"still fine"


MQTT_PACKETS = 30_000


@pytest.mark.parametrize("websocket", [False, True], ids=["tcp", "websocket"])
def test_fuzzed_mqtt_packets_hurt_no_one(
    broker_factory: Callable[..., Broker], websocket: bool
) -> None:
    """The same for the MQTT listeners (issue 41: malformed packets get the
    right disconnect and never touch other clients): 3.1.1 and 5.0 packets,
    valid and mutated, CONNECT refusals, takeovers, wills, clients that
    vanish mid-packet; over WebSocket, in frames cut at random, with bad
    upgrades and bad frames among them. An MQTT bystander (paho-mqtt, QoS 1)
    and an AMQP one keep working and lose nothing."""
    from shoal.perf import mqtt_fuzz

    port, ws_port = free_port(), free_port()
    broker = broker_factory(args=("--mqtt-port", str(port), "--mqtt-ws-port", str(ws_port)))
    before = pids(broker)
    mqtt_bystander = mqtt_fuzz.Bystander("127.0.0.1", port)
    amqp_bystander = Bystander("127.0.0.1", broker.port)
    for b in (mqtt_bystander, amqp_bystander):
        b.start()
    try:
        target = ws_port if websocket else port
        stats = asyncio.run(
            mqtt_fuzz.fuzz("127.0.0.1", target, MQTT_PACKETS, 16, seed=11, websocket=websocket)
        )
    finally:
        for b in (mqtt_bystander, amqp_bystander):
            b.stop.set()
            b.join(60)
    assert stats.frames >= MQTT_PACKETS and stats.connections > 100, stats  # (packets)
    assert stats.closed_by_broker > 50, stats  # the broker did refuse what was wrong
    for b in (mqtt_bystander, amqp_bystander):
        assert b.verdict() == "", b.verdict()
        assert b.sent > 0
    assert pids(broker) == before, "a broker process died or was replaced"
    log = broker.log()
    assert "Traceback" not in log and "internal error" not in log, fault_of(log)
    after = mqtt_fuzz.Bystander("127.0.0.1", port)  # a new client is served
    after.start()
    wait_for(lambda: after.sent >= 3 or bool(after.failure), 20, "a new MQTT client's messages")
    after.stop.set()
    after.join(30)
    assert after.verdict() == "", after.verdict()
