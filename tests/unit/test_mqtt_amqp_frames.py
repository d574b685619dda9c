"""broker/mqtt/amqp_frames.py: the frames the MQTT bridge encodes and
decodes by hand are byte for byte what pamqp makes and reads."""

from __future__ import annotations

import pytest
from pamqp import body, frame, header
from pamqp import commands as C

from shoal.broker.mqtt import amqp_frames as F

PROPS = [
    C.Basic.Properties(),
    C.Basic.Properties(delivery_mode=2, headers={"x-mqtt-publish-qos": 1}),
    C.Basic.Properties(
        delivery_mode=1,
        headers={"x-mqtt-publish-qos": 0, "tenant": "north", "x-mqtt-retain": 1},
        content_type="text/plain",
        correlation_id="c-1",
        reply_to="replies/1",
        expiration="60000",
    ),
]


@pytest.mark.parametrize("props", PROPS)
@pytest.mark.parametrize("size", [0, 1, 100, 4096 - 8, 4096 - 7, 2 * 4096 + 17])
def test_publish_frames_are_pamqps(props: C.Basic.Properties, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frame_max = 4096
    expected = [
        frame.marshal(C.Basic.Publish(exchange="amq.topic", routing_key="sensors.é.t"), 1),
        frame.marshal(header.ContentHeader(0, len(payload), props), 1),
    ]
    step = frame_max - 8
    expected += [
        frame.marshal(body.ContentBody(payload[at : at + step]), 1)
        for at in range(0, len(payload), step)
    ]
    got = F.publish(
        1, b"amq.topic", "sensors.é.t".encode(), F.properties_bytes(props), payload, frame_max
    )
    assert got == b"".join(expected)


def test_deliver_ack_and_confirms_read_and_written_as_pamqp() -> None:
    method = C.Basic.Deliver("mqtt-subscription-déviceqos1", 2**40 + 3, True, "amq.topic", "a.b.c")
    raw = frame.marshal(method, 1)
    assert F.is_deliver(raw[7:-1])
    assert F.deliver(raw[7:-1]) == F.Delivered(
        "mqtt-subscription-déviceqos1", 2**40 + 3, True, "amq.topic", "a.b.c"
    )
    assert F.ack_method(77) == frame.marshal(C.Basic.Ack(77, False), 1)[7:-1]
    for confirm, acked in ((C.Basic.Ack(9, True), True), (C.Basic.Nack(4, False), False)):
        payload = frame.marshal(confirm, 1)[7:-1]
        assert not F.is_deliver(payload)
        assert F.confirm_of(payload) == (confirm.delivery_tag, confirm.multiple, acked)
    assert F.confirm_of(frame.marshal(C.Basic.QosOk(), 1)[7:-1]) is None


@pytest.mark.parametrize("props", PROPS)
def test_content_headers_decode_once_per_distinct_properties(props: C.Basic.Properties) -> None:
    cache = F.PropertiesCache()
    first = frame.marshal(header.ContentHeader(0, 123, props), 1)[7:-1]
    size, decoded = cache.header(first)
    assert size == 123
    for name in ("delivery_mode", "headers", "content_type", "correlation_id", "reply_to"):
        assert getattr(decoded, name) == getattr(props, name)
    again = frame.marshal(header.ContentHeader(0, 5, props), 1)[7:-1]
    assert cache.header(again) == (5, decoded)  # the same object: not decoded again
    assert cache.header(again)[1] is decoded


@pytest.mark.parametrize("size", [0, 1, 300])
def test_a_delivery_is_read_whole_only_when_its_three_frames_are_all_there(size: int) -> None:
    method = C.Basic.Deliver("ctag", 7, False, "amq.topic", "a.b")
    props = PROPS[1]
    payload = bytes(range(256)) * 2
    payload = payload[:size]
    frames = frame.marshal(method, 1) + frame.marshal(header.ContentHeader(0, size, props), 1)
    if size:
        frames += frame.marshal(body.ContentBody(payload), 1)
    after = frame.marshal(C.Basic.Ack(3, False), 1)  # (the next frame: not read here)
    buffer = bytearray(frames + after)
    method_end = len(frame.marshal(method, 1))
    got = F.whole_delivery(buffer, 0, method_end)
    assert got is not None
    got_method, got_header, got_body, next_at = got
    assert F.deliver(got_method) == F.Delivered("ctag", 7, False, "amq.topic", "a.b")
    assert F.PropertiesCache().header(got_header)[0] == size
    assert (got_body, next_at) == (payload, len(frames))
    for cut in range(method_end, len(frames)):  # any part of it missing: not whole
        assert F.whole_delivery(bytearray(frames[:cut]), 0, method_end) is None


def test_a_body_in_several_frames_is_not_read_whole() -> None:
    method = frame.marshal(C.Basic.Deliver("ctag", 7, False, "amq.topic", "a.b"), 1)
    frames = (
        method
        + frame.marshal(header.ContentHeader(0, 10, PROPS[0]), 1)
        + frame.marshal(body.ContentBody(b"01234"), 1)
        + frame.marshal(body.ContentBody(b"56789"), 1)
    )
    assert F.whole_delivery(bytearray(frames), 0, len(method)) is None
