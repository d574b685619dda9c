"""workers/_wire.c's message path against the Python it replaces: scan()
splits what framing.split() splits (a whole publish as one item that
expands back to the same three frames) and raises the same errors, at any
chunking and on mutated input; deliver_frames() builds what
encode_deliver() + encode_content() build; write_record() writes what
shm/arena.py write_message() writes."""

from __future__ import annotations

import random
import struct

import pytest
from pamqp import body as pamqp_body
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from shoal.shm import layout
from shoal.shm._atomic import Atomic
from shoal.shm.arena import read_message
from shoal.workers import framing as F
from shoal.workers._wire import deliver_frames

FRAME_MAX = 4096


def random_frames(rng: random.Random, count: int) -> bytes:
    """Publishes (whole, of several body frames, with odd properties),
    acks, heartbeats and bodies on a few channels."""
    out = []
    for _ in range(count):
        channel = rng.choice((1, 1, 2, 7))
        kind = rng.random()
        if kind < 0.6:
            size = rng.choice((0, 1, 64, 600, FRAME_MAX - 8, FRAME_MAX, 3 * FRAME_MAX))
            props = rng.choice(
                (
                    C.Basic.Properties(),
                    C.Basic.Properties(delivery_mode=2, headers={"a": 1, "b": [1, "x"]}),
                    C.Basic.Properties(user_id="guest"),
                    C.Basic.Properties(reply_to="r", expiration="100", priority=3),
                )
            )
            out.append(
                pamqp_frame.marshal(
                    C.Basic.Publish(
                        exchange=rng.choice(("", "amq.direct", "x" * 127)),
                        routing_key=rng.choice(("q", "", "k" * 250)),
                        mandatory=rng.random() < 0.3,
                    ),
                    channel,
                )
            )
            out.append(pamqp_frame.marshal(pamqp_header.ContentHeader(0, size, props), channel))
            body = bytes(rng.getrandbits(8) for _ in range(min(size, 50))) * (size // 50 + 1)
            for off in range(0, size, FRAME_MAX - 8):
                chunk = body[off : min(size, off + FRAME_MAX - 8)]
                out.append(pamqp_frame.marshal(pamqp_body.ContentBody(chunk), channel))
        elif kind < 0.8:
            out.append(pamqp_frame.marshal(C.Basic.Ack(delivery_tag=rng.randrange(99)), channel))
        else:
            out.append(F.HEARTBEAT_FRAME)
    return b"".join(out)


def reference(data: bytes) -> tuple[list[tuple[int, int, bytes]], str | None]:
    """The frames of `data` by the Python splitter alone, and the error text
    it stops with (None: it did not)."""
    frames: list[tuple[int, int, memoryview]] = []
    try:
        F.split(data, memoryview(data), 0, FRAME_MAX, frames)
    except F.FrameError as exc:
        return [(t, c, bytes(p)) for t, c, p in frames], exc.reply_text
    return [(t, c, bytes(p)) for t, c, p in frames], None


def expanded(items: list[tuple[object, ...]]) -> list[tuple[int, int, bytes]]:
    out = []
    for item in items:
        if item[0] == F.PUBLISH_WHOLE:
            parts = F.publish_frames(item)
            method, head, body = (bytes(p) for _t, _c, p in parts)
            # The decoded fields are those of the frames.
            assert F.decode_publish(memoryview(method))[:3] == (
                item[4],
                item[5],
                bool(item[6] & 1),  # type: ignore[operator]
            )
            assert item[7] == head and bytes(item[8]) == body  # type: ignore[arg-type]
            out += [(t, c, bytes(p)) for t, c, p in parts]
        else:
            t, c, p = item
            out.append((t, c, bytes(p)))  # type: ignore[arg-type]
    return out


def fed(data: bytes, cuts: list[int]) -> tuple[list[tuple[int, int, bytes]], str | None]:
    reader = F.FrameReader(FRAME_MAX)
    frames: list[tuple[int, int, bytes]] = []
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        try:
            frames += expanded(reader.feed(data[a:b]))
        except F.FrameError as exc:
            return frames, exc.reply_text
    return frames, None


@pytest.mark.parametrize("seed", range(40))
def test_scan_splits_as_the_python_splitter_does(seed: int) -> None:
    rng = random.Random(seed)
    data = random_frames(rng, 60)
    if seed % 2:  # mutated: a few bytes flipped, maybe a frame end or a size
        mutable = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            mutable[rng.randrange(len(mutable))] = rng.getrandbits(8)
        data = bytes(mutable)
    want, want_error = reference(data)
    cuts = sorted(rng.sample(range(1, len(data)), rng.randrange(0, 12)))
    got, got_error = fed(data, cuts)
    assert got_error == want_error
    # A read that raised lost its frames (as before the C scan): a prefix.
    assert got == want[: len(got)]
    if want_error is None:
        assert got == want


def test_a_whole_publish_is_one_item_only_when_all_three_frames_are_in() -> None:
    one = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
        + pamqp_frame.marshal(pamqp_header.ContentHeader(0, 3, C.Basic.Properties()), 1)
        + pamqp_frame.marshal(pamqp_body.ContentBody(b"abc"), 1)
    )
    reader = F.FrameReader(FRAME_MAX)
    # A read that ends inside a publish whose body fits one frame leaves the
    # whole publish for the next read (it then comes whole).
    for cut in (5, len(one) - 12, len(one) - 1):
        assert reader.feed(one[:cut]) == [] and reader.pending == one[:cut]
        assert [item[0] for item in reader.feed(one[cut:] + one)] == [F.PUBLISH_WHOLE] * 2
        assert reader.pending == b""
    # A body of several frames does not wait: its frames come one by one.
    big = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
        + pamqp_frame.marshal(pamqp_header.ContentHeader(0, FRAME_MAX, C.Basic.Properties()), 1)
        + pamqp_frame.marshal(pamqp_body.ContentBody(b"a" * (FRAME_MAX - 8)), 1)
    )
    assert [item[0] for item in reader.feed(big)] == [1, 2, 3]
    # Nor does a header the general path refuses (another class): its error
    # must not wait for a body that may never come.
    bad = pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1) + bytes(
        pamqp_frame.marshal(pamqp_header.ContentHeader(0, 10, C.Basic.Properties()), 1)
    ).replace(b"\x00\x3c\x00\x00", b"\x00\x32\x00\x00", 1)
    assert [item[0] for item in F.FrameReader(FRAME_MAX).feed(bad)] == [1, 2]


def test_frames_on_another_channel_in_between_stay_frames() -> None:
    data = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
        + pamqp_frame.marshal(pamqp_header.ContentHeader(0, 3, C.Basic.Properties()), 2)
        + pamqp_frame.marshal(pamqp_body.ContentBody(b"abc"), 1)
    )
    assert [item[0] for item in F.FrameReader(FRAME_MAX).feed(data)] == [1, 2, 3]


def python_deliver(
    channel: int, tag: bytes, delivery_tag: int, redelivered: bool, message: tuple[bytes, ...]
) -> bytes:
    exchange, routing_key, props, body = message
    method = F.encode_deliver(
        channel, bytes((len(tag),)) + tag, delivery_tag, redelivered, exchange, routing_key
    )
    return method + b"".join(F.encode_content(channel, props, body, FRAME_MAX))


@pytest.mark.parametrize("seed", range(20))
def test_deliver_frames_and_write_record_match_the_python_codecs(seed: int) -> None:
    rng = random.Random(seed)
    exchange = b"x" * rng.randrange(256)
    routing_key = bytes(rng.getrandbits(8) for _ in range(rng.randrange(256)))
    props = pamqp_header.ContentHeader(
        0, 0, C.Basic.Properties(message_id="m" * rng.randrange(100))
    ).marshal()
    body = bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 1, 100, 5000, 20000))))
    timed = rng.random() < 0.5
    times = (rng.randrange(1 << 40), rng.randrange(1 << 40)) if timed else None
    # The record as the Python writer writes it, and as the C one does.
    size = layout.MSG_PREFIX.size + len(exchange) + len(routing_key) + len(props) + len(body)
    size += layout.MSG_TIME.size if timed else 0
    block = 64
    python_buf = bytearray(block + layout.BLOCK_HEADER + size + 64)
    c_buf = bytearray(len(python_buf))
    record = block + layout.BLOCK_HEADER
    layout.MSG_PREFIX.pack_into(
        python_buf,
        record,
        len(exchange),
        len(routing_key),
        layout.MSG_TIMED if timed else 0,
        len(props),
        len(body),
    )
    at = record + layout.MSG_PREFIX.size
    for part in (exchange, routing_key, props, body):
        python_buf[at : at + len(part)] = part
        at += len(part)
    if times is not None:
        layout.MSG_TIME.pack_into(python_buf, at, *times)
    published, expires = times if times is not None else (-1, 0)
    # shm/_record.h's writer, as the fast publish path calls it (Atomic)
    written = Atomic(c_buf).write_record(
        block, exchange, routing_key, props, body, published, expires
    )
    assert written == size and c_buf == python_buf
    assert Atomic(c_buf).timed(block) == timed
    # A body that comes in frames: the head first, then each part in place.
    framed = bytearray(len(python_buf))
    atomic = Atomic(framed)
    atomic.write_record(block, exchange, routing_key, props, bytes(len(body)), published, expires)
    for at in range(0, len(body), 4096):
        atomic.write_body(block, at, body[at : at + 4096])
    assert framed == python_buf

    class Seg:
        buf = memoryview(c_buf)

    assert read_message(Seg, block) == (exchange, routing_key, props, body)  # type: ignore[arg-type]
    tag = b"ctag-" + bytes(rng.randrange(33, 127) for _ in range(rng.randrange(200)))
    delivery_tag, redelivered = rng.randrange(1 << 63), rng.random() < 0.5
    frames, body_len = deliver_frames(
        Atomic(c_buf), block, 3, bytes((len(tag),)) + tag, delivery_tag, redelivered, FRAME_MAX
    )
    assert body_len == len(body)
    assert frames == python_deliver(
        3, tag, delivery_tag, redelivered, (exchange, routing_key, props, body)
    )


def test_deliver_frames_refuses_a_record_past_the_buffer() -> None:
    buf = bytearray(80)
    header = layout.BLOCK_HEADER
    struct.pack_into("<BBHIQ", buf, header, 0, 0, 0, 0, 1000)  # a body past the buffer
    with pytest.raises(IndexError):
        deliver_frames(Atomic(buf), 0, 1, b"\x01t", 1, False, FRAME_MAX)
    with pytest.raises(IndexError):  # a record whose prefix is past the buffer
        deliver_frames(Atomic(buf), 70 - header, 1, b"\x01t", 1, False, FRAME_MAX)
    with pytest.raises(IndexError):
        deliver_frames(Atomic(buf), -1, 1, b"\x01t", 1, False, FRAME_MAX)
    with pytest.raises(TypeError):  # the segment's Atomic, not a bare buffer
        deliver_frames(buf, 0, 1, b"\x01t", 1, False, FRAME_MAX)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        Atomic(buf).write_record(24, b"", b"", b"", b"x" * 40, -1, 0)


def test_write_body_stays_inside_the_record_body() -> None:
    buf = bytearray(256)
    atomic = Atomic(buf)
    atomic.write_record(0, b"e", b"r", b"", b"....", -1, 0)
    atomic.write_body(0, 2, b"xy")
    assert bytes(buf[layout.BLOCK_HEADER + layout.MSG_PREFIX.size + 2 :][:4]) == b"..xy"
    for at, data in ((3, b"xy"), (-1, b"x"), (5, b"")):
        with pytest.raises(IndexError):
            atomic.write_body(0, at, data)
    with pytest.raises(IndexError):
        atomic.write_body(len(buf), 0, b"x")
