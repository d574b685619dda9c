"""A device's plain PUBLISHes in C (workers/_mqtt_wire.c `publishes`,
Inbound.publish_run): a run of them in one read becomes exactly the frames
Python's path gives the inner AMQP connection (amqp_frames.with_content),
and anything else stops the run where it is, untouched, for the packet
loop (and its errors) to take."""

from __future__ import annotations

import pytest

from shoal.broker.mqtt import amqp_frames as F
from shoal.broker.mqtt import packets as P
from shoal.workers._mqtt_wire import publishes

FRAME_MAX = 131072
MAX_PACKET = 1 << 20
TOPIC = "devices/7/temp"
METHOD = F.publish_method(1, b"amq.topic", b"devices.7.temp")
TOPICS = {TOPIC.encode(): (b"devices.7.temp", METHOD)}
PROPS0 = b"\x10\x00\x01"  # any property bytes: copied as they are
PROPS1 = b"\x90\x00\x00\x00\x00\x00\x02"


def run(data: bytes, level: int = P.MQTT_311, **kw: object) -> tuple[int, bytes | None, list[int]]:
    args = {"props0": PROPS0, "props1": PROPS1, "max_packet": MAX_PACKET, "frame_max": FRAME_MAX}
    args.update(kw)
    return publishes(
        data,
        0,
        args.get("topics", TOPICS),
        args["props0"],
        args["props1"],
        level == P.MQTT_5,
        args["max_packet"],
        args["frame_max"],
    )


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_run_is_the_frames_pythons_path_feeds(level: int) -> None:
    # Payloads around the remaining length's one-, two- and three-byte forms.
    sizes = [0, 1, 100, 110, 111, 200, 16_360, 16_400, 20_000]
    packets, expected, ids = [], [], []
    for i, size in enumerate(sizes):
        payload = bytes([i % 251]) * size
        qos = i % 2
        packet_id = 300 + i if qos else None
        packets.append(P.encode_publish(level, TOPIC, payload, qos, packet_id=packet_id))
        expected.append(F.with_content(METHOD, 1, PROPS1 if qos else PROPS0, payload, FRAME_MAX))
        ids.append(packet_id or 0)
    data = b"".join(packets)
    assert run(data, level) == (len(data), b"".join(expected), ids)


def test_a_resent_qos1_publish_is_taken_alike() -> None:
    dup = bytearray(P.encode_publish(P.MQTT_311, TOPIC, b"x", 1, packet_id=9))
    dup[0] |= 0x08
    at, frames, ids = run(bytes(dup))
    assert (at, ids) == (len(dup), [9])
    assert frames == F.with_content(METHOD, 1, PROPS1, b"x", FRAME_MAX)


def stopper(level: int, name: str) -> bytes:
    """A packet the run must leave to the loop."""
    if name == "retained":
        return P.encode_publish(level, TOPIC, b"r", 0, retain=True)
    if name == "qos2":
        return P.encode_publish(level, TOPIC, b"q", 2, packet_id=5)
    if name == "unknown topic":
        return P.encode_publish(level, "devices/8/temp", b"u")
    if name == "id 0":
        return b"\x32" + bytes([2 + len(TOPIC) + 2 + 1]) + P.string(TOPIC) + b"\x00\x00z"
    if name == "a frame's worth":
        return P.encode_publish(level, TOPIC, b"b" * (FRAME_MAX - 7))
    if name == "another packet":
        return P.encode_pingresp()
    return P.encode_publish(level, TOPIC, b"p", 1, packet_id=6, properties={"content_type": "t"})


STOPPERS = ["retained", "qos2", "unknown topic", "id 0", "a frame's worth", "another packet"]


@pytest.mark.parametrize(
    ("level", "name"),
    [(level, name) for level in (P.MQTT_311, P.MQTT_5) for name in STOPPERS]
    + [(P.MQTT_5, "5.0 properties")],
)
def test_the_run_stops_untouched_at_anything_else(level: int, name: str) -> None:
    first = P.encode_publish(level, TOPIC, b"one", 1, packet_id=1)
    after = stopper(level, name)
    at, frames, ids = run(first + after + first, level)
    assert (at, ids) == (len(first), [1])
    assert frames == F.with_content(METHOD, 1, PROPS1, b"one", FRAME_MAX)
    assert run(after + first, level) == (0, None, [])


def test_a_packet_not_whole_or_too_large_is_the_loops() -> None:
    whole = P.encode_publish(P.MQTT_311, TOPIC, b"x" * 300, 1, packet_id=2)
    for cut in (1, 2, 3, len(whole) - 1):
        assert run(whole[:cut]) == (0, None, [])
    assert run(whole, max_packet=len(whole) - 1) == (0, None, [])
    assert run(whole, max_packet=len(whole))[0] == len(whole)
    assert run(b"\x30\xff\xff\xff\xff\x7f") == (0, None, [])  # a 5-byte remaining length


def test_a_qos_whose_properties_are_not_known_stops_it() -> None:
    qos0 = P.encode_publish(P.MQTT_311, TOPIC, b"0")
    qos1 = P.encode_publish(P.MQTT_311, TOPIC, b"1", 1, packet_id=3)
    assert run(qos0 + qos1, props1=None)[::2] == (len(qos0), [0])
    assert run(qos1 + qos0, props0=None)[::2] == (len(qos1), [3])


def test_bad_arguments_are_refused() -> None:
    data = P.encode_publish(P.MQTT_311, TOPIC, b"x")
    with pytest.raises(TypeError):
        publishes(data, 0, [], PROPS0, PROPS1, False, MAX_PACKET, FRAME_MAX)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        publishes(data, 0, TOPICS, "p", PROPS1, False, MAX_PACKET, FRAME_MAX)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        publishes(data, len(data) + 1, TOPICS, PROPS0, PROPS1, False, MAX_PACKET, FRAME_MAX)
    with pytest.raises(TypeError):
        publishes(data, 0)  # type: ignore[call-arg]


def test_any_bytes_give_a_prefix_of_whole_publishes_or_nothing() -> None:
    """Untrusted input: random cuts and flips of a valid run never read past
    it, and what the run takes is always whole packets the loop would split."""
    import random

    rng = random.Random(41)
    good = b"".join(
        P.encode_publish(level, TOPIC, b"x" * size, qos, packet_id=7 if qos else None)
        for level, size, qos in ((P.MQTT_311, 3, 1), (P.MQTT_311, 130, 0), (P.MQTT_311, 0, 1))
    )
    for _ in range(3000):
        data = bytearray(good[: rng.randrange(len(good) + 1)])
        for _ in range(rng.randrange(4)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        at, frames, ids = run(bytes(data), max_packet=rng.choice((MAX_PACKET, 40)))
        assert 0 <= at <= len(data)
        assert (frames is None) == (at == 0) == (not ids)
        if at:
            assert len(P.PacketReader().feed(bytes(data[:at]))) == len(ids)


@pytest.mark.parametrize("known", [2, 4, 5, 9])
def test_each_topic_of_a_few_or_of_many_takes_its_own_frame(known: int) -> None:
    """A device's topics dict scanned while small, looked up past four:
    topics that share a prefix or a length take their own frames, and one
    not in the dict (a longer one, a prefix) stops the run there."""
    names = [f"devices/7/t{i}" for i in range(known - 1)] + ["devices/7/t"]
    topics = {}
    for name in names:
        key = name.replace("/", ".").encode()
        topics[name.encode()] = (key, F.publish_method(1, b"amq.topic", key))
    order = names[::-1] + names
    data = b"".join(P.encode_publish(P.MQTT_311, n, n.encode(), 0) for n in order)
    expected = b"".join(
        F.with_content(topics[n.encode()][1], 1, PROPS0, n.encode(), FRAME_MAX) for n in order
    )
    assert run(data, topics=topics) == (len(data), expected, [0] * len(order))
    for unknown in ("devices/7/t00", "devices/7/", "devices/7/tX"):
        stop = P.encode_publish(P.MQTT_311, unknown, b"u", 0)
        first = P.encode_publish(P.MQTT_311, names[0], b"f", 0)
        at, frames, ids = run(first + stop, topics=topics)
        assert at == len(first) and ids == [0]
        assert frames == F.with_content(topics[names[0].encode()][1], 1, PROPS0, b"f", FRAME_MAX)
