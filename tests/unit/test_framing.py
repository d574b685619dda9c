"""The sans-IO frame reader and the hand-written codecs, checked against pamqp."""

from __future__ import annotations

import random
import struct

import pytest
from pamqp import body as pamqp_body
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from shoal.workers import framing as F

STREAM = b"".join(
    [
        pamqp_frame.marshal(C.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), 1),
        pamqp_frame.marshal(pamqp_header.ContentHeader(body_size=5), 1),
        pamqp_frame.marshal(pamqp_body.ContentBody(b"hello"), 1),
        F.HEARTBEAT_FRAME,
        pamqp_frame.marshal(C.Basic.Ack(delivery_tag=7, multiple=True), 2),
    ]
)


def chunkings(data: bytes) -> list[list[bytes]]:
    rng = random.Random(1)
    whole = [[data]]
    per_byte = [[data[i : i + 1] for i in range(len(data))]]
    randoms = []
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 5))
        randoms.append([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)])
    return whole + per_byte + randoms


def expanded(items: list[tuple[object, ...]]) -> list[tuple[int, int, bytes]]:
    """The reader's items as plain frames (a whole publish as its three)."""
    out = []
    for item in items:
        parts = F.publish_frames(item) if item[0] == F.PUBLISH_WHOLE else [item]
        out += [(t, ch, bytes(p)) for t, ch, p in parts]  # type: ignore[misc]
    return out


@pytest.mark.parametrize("chunks", chunkings(STREAM))
def test_reader_yields_the_same_frames_at_every_chunking(chunks: list[bytes]) -> None:
    reader = F.FrameReader(131072)
    frames = [frame for c in chunks for frame in expanded(reader.feed(c))]
    assert [(t, ch) for t, ch, _ in frames] == [(1, 1), (2, 1), (3, 1), (8, 0), (1, 2)]
    assert F.decode_publish(memoryview(frames[0][2])) == (b"ex", b"rk", True, False)
    assert F.decode_content_header(memoryview(frames[1][2])) == (60, 5)
    assert frames[2][2] == b"hello"
    assert F.method_index(memoryview(frames[4][2])) == F.ACK
    assert F.decode_ack(memoryview(frames[4][2])) == (7, 1)
    assert reader.pending == b""


def test_a_publish_in_one_read_is_one_item_decoded() -> None:
    items = F.FrameReader(131072).feed(STREAM)
    assert [item[0] for item in items] == [F.PUBLISH_WHOLE, 8, 1]
    _, channel, _view, start, exchange, routing_key, bits, header, body = items[0]
    assert (channel, start, exchange, routing_key, bits) == (1, 0, b"ex", b"rk", 1)
    assert F.decode_content_header(memoryview(header)) == (60, 5)
    assert bytes(body) == b"hello"


@pytest.mark.parametrize(
    "header",
    [
        pamqp_header.ContentHeader(body_size=5, properties=C.Basic.Properties(user_id="guest")),
        pamqp_header.ContentHeader(body_size=4),  # not the body's size
    ],
)
def test_a_publish_the_general_path_must_see_stays_three_frames(
    header: pamqp_header.ContentHeader,
) -> None:
    """A user-id (checked against the login) or a body of another size than
    the header says: the three frames, for the general path's checks."""
    data = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
        + pamqp_frame.marshal(header, 1)
        + pamqp_frame.marshal(pamqp_body.ContentBody(b"hello"), 1)
    )
    assert [item[0] for item in F.FrameReader(131072).feed(data)] == [1, 2, 3]


def test_malformed_properties_stay_three_frames() -> None:
    good = pamqp_frame.marshal(pamqp_header.ContentHeader(body_size=5), 1)
    bad = good[:7] + good[7:-1] + b"\x00" + good[-1:]  # a byte after the last property
    bad = bad[:3] + struct.pack(">I", len(bad) - 8) + bad[7:]
    data = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
        + bad
        + pamqp_frame.marshal(pamqp_body.ContentBody(b"hello"), 1)
    )
    assert [item[0] for item in F.FrameReader(131072).feed(data)] == [1, 2, 3]


def test_frame_larger_than_frame_max_is_a_frame_error() -> None:
    reader = F.FrameReader(4096)
    with pytest.raises(F.FrameError) as exc:
        reader.feed(struct.pack(">BHI", 3, 1, 5000))
    assert exc.value.reply_code == 501
    assert "frame_too_large" in exc.value.reply_text


def test_wrong_frame_end_is_a_frame_error() -> None:
    frame = pamqp_frame.marshal(C.Basic.Qos(prefetch_count=1), 1)
    with pytest.raises(F.FrameError) as exc:
        F.FrameReader(131072).feed(frame[:-1] + b"\x00")
    assert "invalid_frame_end_marker" in exc.value.reply_text


def test_unknown_frame_type_is_a_frame_error() -> None:
    with pytest.raises(F.FrameError):
        F.FrameReader(131072).feed(struct.pack(">BHI", 9, 0, 0) + b"\xce")


def test_truncated_publish_is_a_syntax_error() -> None:
    payload = memoryview(b"\x00\x3c\x00\x28\x00\x00\x09ex")
    with pytest.raises(F.FrameError) as exc:
        F.decode_publish(payload)
    assert exc.value.reply_code == 502


def test_unknown_method_is_not_implemented() -> None:
    with pytest.raises(F.FrameError) as exc:
        F.decode_method(memoryview(b"\x00\x99\x00\x01"))
    assert exc.value.reply_code == 540


def test_deliver_and_content_round_trip_through_pamqp() -> None:
    header = pamqp_frame.marshal(pamqp_header.ContentHeader(body_size=10, properties=None), 1)[7:-1]
    frames = [F.encode_deliver(3, F.shortstr(b"ctag"), 99, True, b"ex", b"rk")]
    frames += F.encode_content(3, header, b"0123456789", frame_max=4096 + 8)
    data = b"".join(frames)
    decoded = []
    while data:
        n, channel, frame = pamqp_frame.unmarshal(data)
        decoded.append((channel, frame))
        data = data[n:]
    deliver = decoded[0][1]
    assert isinstance(deliver, C.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag", 99, True)
    assert (deliver.exchange, deliver.routing_key) == ("ex", "rk")
    assert decoded[1][1].body_size == 10
    assert decoded[2][1].value == b"0123456789"
    assert {ch for ch, _ in decoded} == {3}


def test_large_body_is_split_at_frame_max() -> None:
    frames = F.encode_content(
        1, b"\x00\x3c\x00\x00" + struct.pack(">Q", 10000) + b"\x00\x00", b"b" * 10000, 4096
    )
    bodies = [frames[i] for i in range(4, len(frames), 3)]
    assert [len(b) for b in bodies] == [4088, 4088, 1824]


def test_confirm_ack_round_trip() -> None:
    _n, channel, frame = pamqp_frame.unmarshal(F.encode_ack(5, 123, True))
    assert channel == 5 and frame.delivery_tag == 123 and frame.multiple
