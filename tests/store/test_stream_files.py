"""A stream's segment files without a broker (store/stream_segments.py): chunks,
offsets across segments, a torn tail cut off at open, retention, cursors
from each kind of start; and the x-stream-offset header a stored message
gets (broker/amqp/stream_arguments.py), decoded by pamqp as a client would."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from pamqp import commands as C
from pamqp import header as pamqp_header

from shoal.broker.amqp import errors
from shoal.broker.amqp import stream_arguments as amqp_streams
from shoal.store import stream_segments as files


def write(log: files.StreamLog, start: int, count: int, body: bytes = b"b") -> None:
    records = [
        files.encode_record(b"", b"rk", b"h", body + str(i).encode())
        for i in range(start, start + count)
    ]
    log.append(records, origin=1, last_seq=start + count - 1)


def read_all(directory: str, offset: int, durable_next: int) -> list[int]:
    cursor = files.StreamCursor(directory)
    cursor.seek(offset, durable_next)
    got: list[int] = []
    while chunk := cursor.read_chunk(durable_next):
        got += [m[0] for m in chunk]
    cursor.close()
    return got


def test_offsets_run_across_segments_and_a_cursor_starts_anywhere(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=300, max_bytes=0, max_age_ms=0)
    for i in range(0, 100, 5):
        write(log, i, 5)
    assert log.next == 100 and len(log.segments) > 3
    assert read_all(d, 0, 100) == list(range(100))
    assert read_all(d, 37, 100) == list(range(37, 100))
    assert read_all(d, 37, 60) == list(range(37, 60))  # never past the durable end
    assert read_all(d, 150, 100) == []  # past the end: waits
    log.close()


def test_syncs_are_group_commits_that_follow_a_segment_roll(tmp_path: Path) -> None:
    """`sync` calls back once what was appended before it is durable (on
    the store's sync thread); a roll to a new segment lets the syncs of the
    old one finish first, then syncs the new one."""
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=300, max_bytes=0, max_age_ms=0)
    called = threading.Semaphore(0)
    try:
        for start in range(0, 60, 6):  # several segments
            write(log, start, 6, b"x" * 20)
            log.sync(called.release)
        for _ in range(10):
            assert called.acquire(timeout=5)
        assert len(log.segments) > 2
    finally:
        log.close()
    assert read_all(d, 0, 60) == list(range(60))


def test_a_torn_or_corrupt_tail_is_cut_off_at_open(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=1 << 20, max_bytes=0, max_age_ms=0)
    write(log, 0, 10)
    write(log, 10, 10)
    size = log.position
    log.close()
    path = os.path.join(d, files.segment_name(0))
    with open(path, "r+b") as f:  # a torn second chunk
        f.truncate(size - 7)
    log = files.StreamLog(d, segment_bytes=1 << 20, max_bytes=0, max_age_ms=0)
    assert log.next == 10 and log.last_seq == 9
    write(log, 10, 5)
    log.close()
    with open(path, "r+b") as f:  # a flipped byte in the last chunk's records
        f.seek(-3, os.SEEK_END)
        f.write(b"\xff")
    log = files.StreamLog(d, segment_bytes=1 << 20, max_bytes=0, max_age_ms=0)
    assert log.next == 10
    assert read_all(d, 0, log.next) == list(range(10))
    log.close()


def test_retention_by_size_keeps_the_segment_being_written(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=200, max_bytes=500, max_age_ms=0)
    for i in range(0, 200, 4):
        write(log, i, 4, b"x" * 20)
        log.apply_retention()
    assert log.total_bytes <= 500 + 200 and log.first > 0
    assert files.list_segments(d)[0] == log.first
    assert read_all(d, 0, log.next)[0] == log.first  # below the first: the first
    log = files.StreamLog(d, segment_bytes=200, max_bytes=1, max_age_ms=0)
    log.apply_retention()
    assert len(log.segments) == 1 and read_all(d, 0, log.next)[-1] == 199
    log.close()


def test_seek_by_time(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=1 << 20, max_bytes=0, max_age_ms=0)
    write(log, 0, 3)
    cursor = files.StreamCursor(d)
    cursor.seek_time(0, log.next)
    assert [m[0] for m in cursor.read_chunk(log.next)] == [0, 1, 2]
    cursor.seek_time(1 << 62, log.next)  # in the future: what comes next
    assert cursor.read_chunk(log.next) == []
    write(log, 3, 2)
    assert [m[0] for m in cursor.read_chunk(log.next)] == [3, 4]
    cursor.close()
    log.close()


def _content_header(properties: dict) -> bytes:
    frame = pamqp_header.ContentHeader(0, 5, C.Basic.Properties(**properties))
    return frame.marshal()


@pytest.mark.parametrize(
    "properties",
    [
        {},
        {"content_type": "text/plain", "content_encoding": "gzip"},
        {"headers": {"a": 1, "b": "two"}, "content_type": "x", "delivery_mode": 2},
        {"app_id": "me", "message_id": "id-1"},
    ],
)
def test_the_offset_header_joins_the_properties(properties: dict) -> None:
    raw = _content_header(properties)
    out = amqp_streams.with_offset(raw, 1 << 40)
    decoded = pamqp_header.ContentHeader()
    decoded.unmarshal(out)
    got = decoded.properties
    assert got.headers["x-stream-offset"] == 1 << 40
    for key, value in properties.items():
        if key == "headers":
            assert {k: got.headers[k] for k in value} == value
        else:
            assert getattr(got, key) == value
    assert decoded.body_size == 5


def test_start_specs() -> None:
    spec = amqp_streams.start_spec
    assert spec({}, 0, b"q", "/") == amqp_streams.StartSpec("next")
    assert spec({"x-stream-offset": "first"}, 0, b"q", "/").kind == "first"
    assert spec({"x-stream-offset": b"last"}, 0, b"q", "/").kind == "last"
    assert spec({"x-stream-offset": 7}, 0, b"q", "/") == amqp_streams.StartSpec("offset", 7)
    assert spec({"x-stream-offset": -1}, 0, b"q", "/").kind == "first"
    assert spec({"x-stream-offset": "1h"}, 10_000_000, b"q", "/") == amqp_streams.StartSpec(
        "timestamp", 10_000_000 - 3_600_000
    )
    for bad in ("0s", "foo", True, 1.5):
        with pytest.raises(errors.ChannelError):
            spec({"x-stream-offset": bad}, 0, b"q", "/")


def test_a_record_keeps_its_filter_value(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    log = files.StreamLog(d, segment_bytes=1 << 20, max_bytes=0, max_age_ms=0)
    log.append(
        [
            files.encode_record(b"x", b"rk", b"hdr", b"body", b"emea"),
            files.encode_record(b"", b"", b"h", b""),
        ],
        origin=1,
        last_seq=1,
    )
    cursor = files.StreamCursor(d)
    cursor.seek(0, log.next)
    (o1, x1, rk1, h1, b1, f1), (o2, _x, _rk, _h, b2, f2) = cursor.read_chunk(log.next)
    assert (o1, x1, rk1, h1, bytes(b1), f1) == (0, b"x", b"rk", b"hdr", b"body", b"emea")
    assert (o2, bytes(b2), f2) == (1, b"", b"")
    cursor.close()
    log.close()


def test_the_filter_value_is_found_in_the_headers() -> None:
    for headers, want in (
        ({"x-stream-filter-value": "apac", "other": 1}, b"apac"),
        ({"other": "x-stream-filter-value"}, b""),
        ({}, b""),
    ):
        raw = _content_header({"headers": headers, "content_type": "t"})
        assert amqp_streams.filter_value(raw) == want
    spec = amqp_streams.filter_spec({"x-stream-filter": ["a", "b"]}, b"q", "/")
    assert spec is not None and spec.accepts(b"a") and not spec.accepts(b"c")
    assert not spec.accepts(b"")
    spec = amqp_streams.filter_spec(
        {"x-stream-filter": "a", "x-stream-match-unfiltered": True}, b"q", "/"
    )
    assert spec is not None and spec.accepts(b"") and not spec.accepts(b"b")
    assert amqp_streams.filter_spec({}, b"q", "/") is None
    with pytest.raises(errors.ChannelError):
        amqp_streams.filter_spec({"x-stream-filter": 5}, b"q", "/")
