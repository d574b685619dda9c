"""An MQTT client's planned deliveries in C (workers/_mqtt_wire.c,
Outbound.run): the inner AMQP connection's frames become exactly the PUBLISH
packets Python's path writes, and anything the plan does not decide stops
the run where it is, untouched."""

from __future__ import annotations

import pytest
from pamqp import body, frame, header
from pamqp import commands as C

from shoal.broker.mqtt import packets as P
from shoal.workers._mqtt_wire import deliveries

QUEUE = "mqtt-subscription-sub-1qos1"
PROPS = C.Basic.Properties(delivery_mode=2, headers={"x-mqtt-publish-qos": 1})


def delivery(
    tag: int,
    payload: bytes,
    routing_key: str = "sensors.1.temp",
    redelivered: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """basic.deliver, its content header and its body as the inner
    connection writes them (the body in frames of at most frame_max)."""
    frames = [
        frame.marshal(C.Basic.Deliver(QUEUE, tag, redelivered, "amq.topic", routing_key), 1),
        frame.marshal(header.ContentHeader(0, len(payload), PROPS), 1),
    ]
    step = frame_max - 8
    frames += [
        frame.marshal(body.ContentBody(payload[at : at + step]), 1)
        for at in range(0, len(payload), step)
    ]
    return b"".join(frames)


def planned(buffer: bytes, plan: tuple[bytes, int, bool] | None) -> dict:
    """The plans with the first delivery's key taught (what deliver() does
    after `deliveries` reported it missing)."""
    at, next_id, packets, miss = deliveries(bytearray(buffer), 0, {}, {}, 1, False)
    assert (at, next_id, packets) == (0, 1, None) and miss is not None
    return {miss: plan}


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("retain", [False, True])
def test_a_planned_run_is_what_pythons_path_writes(level: int, qos: int, retain: bool) -> None:
    # Bodies around the remaining length's one-, two- and three-byte forms.
    sizes = [0, 1, 100, 104, 200, 16_400, 20_000]
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    buffer = bytearray(b"".join(delivery(10 + i, p) for i, p in enumerate(payloads)))
    plans = planned(buffer, (b"sensors/1/temp", qos, retain))
    unacked = {2: 999}  # an id still out: skipped
    at, next_id, packets, miss = deliveries(buffer, 0, plans, unacked, 1, level == P.MQTT_5)
    assert at == len(buffer) and miss is None
    ids = [1, 3, 4, 5, 6, 7, 8] if qos else [None] * len(sizes)
    expected = b"".join(
        P.encode_publish(level, "sensors/1/temp", p, qos, retain, False, packet_id, {})
        for p, packet_id in zip(payloads, ids, strict=True)
    )
    assert packets == expected
    if qos:
        assert unacked == {2: 999, **{i: 10 + n for n, i in enumerate(ids)}}
        assert next_id == 9
    else:
        assert unacked == {2: 999} and next_id == 1


def test_packet_ids_wrap_past_65535_and_skip_those_in_use() -> None:
    buffer = bytearray(delivery(1, b"a") + delivery(2, b"b") + delivery(3, b"c"))
    plans = planned(buffer, (b"t", 1, False))
    unacked = {1: 50}
    at, next_id, packets, _miss = deliveries(buffer, 0, plans, unacked, 65535, False)
    assert at == len(buffer)
    assert unacked == {1: 50, 65535: 1, 2: 2, 3: 3} and next_id == 4
    assert packets == b"".join(
        P.encode_publish(P.MQTT_311, "t", p, 1, False, False, i, {})
        for p, i in ((b"a", 65535), (b"b", 2), (b"c", 3))
    )


def test_no_free_packet_id_leaves_the_delivery_to_python() -> None:
    buffer = bytearray(delivery(1, b"a"))
    plans = planned(buffer, (b"t", 1, False))
    unacked = {i: i for i in range(1, 65536)}
    assert deliveries(buffer, 0, plans, unacked, 1, False)[0] == 0
    assert len(unacked) == 65535


def test_the_run_stops_at_whatever_its_plans_do_not_decide() -> None:
    plain = delivery(1, b"one")
    plans = planned(plain, (b"sensors/1/temp", 0, False))
    one = P.encode_publish(P.MQTT_311, "sensors/1/temp", b"one", 0, False, False, None, {})
    confirm = frame.marshal(C.Basic.Ack(7, False), 1)
    stops = {
        "another frame": confirm,
        "a redelivery": delivery(2, b"one", redelivered=True),
        "another routing key": delivery(3, b"one", routing_key="sensors.2.temp"),
        "a body in two frames": delivery(4, b"x" * 300, frame_max=200),
        "a frame without its end octet": delivery(5, b"one")[:-1],
        "a delivery not all here": delivery(6, b"one")[:-1],
    }
    for name, then in stops.items():
        buffer = bytearray(plain + then + (b"" if name.endswith("here") else plain))
        at, _next_id, packets, miss = deliveries(buffer, 0, plans, {}, 1, False)
        assert (at, packets) == (len(plain), one), name
        assert (miss is not None) == (name == "another routing key"), name
    # A delivery planned as None (Python's alone): not taken, and no miss.
    buffer = bytearray(plain)
    assert deliveries(buffer, 0, planned(plain, None), {}, 1, False) == (0, 1, None, None)
    # From an offset, and with nothing there.
    buffer = bytearray(confirm + plain)
    assert deliveries(buffer, len(confirm), plans, {}, 1, False)[:3] == (len(buffer), 1, one)
    assert deliveries(buffer, len(buffer), plans, {}, 1, False) == (len(buffer), 1, None, None)


def test_a_run_is_cut_at_about_256_kib_and_a_body_over_64_kib_is_pythons() -> None:
    payloads = [bytes([i]) * 60_000 for i in range(10)]
    buffer = bytearray(b"".join(delivery(i + 1, p) for i, p in enumerate(payloads)))
    plans = planned(buffer, (b"big", 0, False))
    got = b""
    at = 0
    for _call in range(2):  # five of them fill the first run past 256 KiB
        at, _next_id, packets, _miss = deliveries(buffer, at, plans, {}, 1, False)
        assert packets is not None
        got += packets
    assert at == len(buffer)
    assert got == b"".join(
        P.encode_publish(P.MQTT_311, "big", p, 0, False, False, None, {}) for p in payloads
    )
    big = bytearray(delivery(1, b"x" * (64 * 1024 + 1)))
    assert deliveries(big, 0, plans, {}, 1, False) == (0, 1, None, None)  # (planned alike)


def test_bad_arguments_are_refused_not_read() -> None:
    buffer = bytearray(delivery(1, b"a"))
    with pytest.raises(IndexError):
        deliveries(buffer, len(buffer) + 1, {}, {}, 1, False)
    with pytest.raises(ValueError):
        deliveries(buffer, 0, {}, {}, 0, False)
    with pytest.raises(TypeError):
        deliveries(buffer, 0, [], {}, 1, False)  # type: ignore[arg-type]
