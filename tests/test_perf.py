"""Unit tests of the load generator's hand-written wire code; no broker is started."""

from __future__ import annotations

import json
import math
import random
import socket

import pytest
from pamqp import body, commands, frame, header

from shoal.perf.cli import build_parser, config_from_args, main
from shoal.perf.connection import AmqpUri
from shoal.perf.consumer import DeliveryParser
from shoal.perf.producer import ConfirmTracker
from shoal.perf.report import format_human, summarize
from shoal.perf.stats import Histogram, bucket_bounds, bucket_index, latency_summary_ms
from shoal.perf.wire import (
    FRAME_METHOD,
    TIMESTAMP_BYTES,
    FrameParser,
    ProtocolError,
    build_publish_template,
    encode_ack,
    parse_confirm,
    parse_deliver_tag,
)

QUEUE = "perf-0123456789ab"


def _unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    frames: list[tuple[int, object]] = []
    while data:
        consumed, channel, value = frame.unmarshal(data)
        frames.append((channel, value))
        data = data[consumed:]
    return frames


def _delivery(tag: int, body_value: bytes, consumer_tag: str = "amq.ctag-xyz") -> bytes:
    method = commands.Basic.Deliver(
        consumer_tag=consumer_tag, delivery_tag=tag, exchange="", routing_key=QUEUE
    )
    content = header.ContentHeader(
        body_size=len(body_value), properties=commands.Basic.Properties()
    )
    parts = [frame.marshal(method, 1), frame.marshal(content, 1)]
    if body_value:
        parts.append(frame.marshal(body.ContentBody(body_value), 1))
    return b"".join(parts)


# --- publish frames ---------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("size", [0, 5, 8, 64, 4096])
def test_publish_template_decodes_with_pamqp(size: int, persistent: bool) -> None:
    template = build_publish_template(QUEUE, size, persistent=persistent)
    stamp = 0x0102030405060708
    frames = _unmarshal_all(template.message(stamp))

    channel, method = frames[0]
    assert channel == 1
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key) == ("", QUEUE)
    assert not method.mandatory and not method.immediate
    _, content = frames[1]
    assert isinstance(content, header.ContentHeader)
    assert content.body_size == size
    assert content.properties.delivery_mode == (2 if persistent else None)
    payload = b"".join(v.value for _, v in frames[2:] if isinstance(v, body.ContentBody))
    assert len(payload) == size
    if size >= TIMESTAMP_BYTES:
        assert payload[:8] == stamp.to_bytes(8, "big")
    assert len(frames) == 2 + (1 if size else 0)


def test_publish_template_splits_body_at_frame_max() -> None:
    template = build_publish_template(QUEUE, 10_000, frame_max=4096)
    frames = _unmarshal_all(template.message(42))
    bodies = [v.value for _, v in frames if isinstance(v, body.ContentBody)]
    assert [len(b) for b in bodies] == [4088, 4088, 1824]
    assert int.from_bytes(bodies[0][:8], "big") == 42


def test_publish_batch_is_repeated_messages() -> None:
    template = build_publish_template(QUEUE, 64)
    frames = _unmarshal_all(template.batch(7, 3))
    assert [type(v) for _, v in frames] == [
        commands.Basic.Publish,
        header.ContentHeader,
        body.ContentBody,
    ] * 3


@pytest.mark.parametrize("multiple", [False, True])
def test_encode_ack_decodes_with_pamqp(multiple: bool) -> None:
    ((channel, value),) = _unmarshal_all(encode_ack(2**40 + 3, multiple))
    assert channel == 1
    assert isinstance(value, commands.Basic.Ack)
    assert value.delivery_tag == 2**40 + 3
    assert value.multiple is multiple


# --- hand parsing of incoming methods ---------------------------------------------


@pytest.mark.parametrize("consumer_tag", ["", "c", "amq.ctag-" + "x" * 40])
def test_parse_deliver_tag(consumer_tag: str) -> None:
    method = commands.Basic.Deliver(
        consumer_tag=consumer_tag, delivery_tag=987654321, exchange="ex", routing_key="rk"
    )
    raw = frame.marshal(method, 1)
    assert parse_deliver_tag(raw, 7) == 987654321


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (commands.Basic.Ack(delivery_tag=5, multiple=True), (5, True)),
        (commands.Basic.Ack(delivery_tag=6, multiple=False), (6, False)),
        (commands.Basic.Nack(delivery_tag=7, multiple=True, requeue=True), (7, True)),
        (commands.Basic.Nack(delivery_tag=8, multiple=False, requeue=True), (8, False)),
    ],
)
def test_parse_confirm(value: commands.Basic.Ack, expected: tuple[int, bool]) -> None:
    assert parse_confirm(frame.marshal(value, 1), 7) == expected


# --- frame splitting --------------------------------------------------------------


def _mixed_stream() -> tuple[bytes, list[tuple[int, int, bytes]]]:
    parts = [
        frame.marshal(commands.Basic.Deliver("t", 1, False, "", QUEUE), 1),
        frame.marshal(body.ContentBody(b"x" * 300), 1),
        b"\x08\x00\x00\x00\x00\x00\x00\xce",  # heartbeat: the smallest frame
        frame.marshal(commands.Connection.Blocked(reason="low memory"), 0),
        frame.marshal(body.ContentBody(b"y"), 7),
    ]
    expected = [(p[0], int.from_bytes(p[1:3], "big"), p[7:-1]) for p in parts]
    return b"".join(parts), expected


class _Recorder:
    """A frame handler that keeps copies of what it was given."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes]] = []

    def __call__(
        self, frame_type: int, channel: int, buf: bytes | bytearray, start: int, end: int
    ) -> None:
        self.frames.append((frame_type, channel, bytes(buf[start:end])))


def _recording_parser() -> tuple[FrameParser, list[tuple[int, int, bytes]]]:
    recorder = _Recorder()
    return FrameParser(recorder), recorder.frames


def test_frame_parser_handles_every_split_point() -> None:
    stream, expected = _mixed_stream()
    for cut in range(len(stream) + 1):
        parser, seen = _recording_parser()
        parser.feed(stream[:cut])
        parser.feed(stream[cut:])
        assert seen == expected, cut


def test_frame_parser_handles_one_byte_at_a_time() -> None:
    stream, expected = _mixed_stream()
    parser, seen = _recording_parser()
    for i in range(len(stream)):
        parser.feed(stream[i : i + 1])
    assert seen == expected


def test_frame_parser_rejects_bad_frame_end() -> None:
    raw = bytearray(frame.marshal(body.ContentBody(b"abc"), 1))
    raw[-1] = 0x00
    parser = FrameParser(lambda *_: None)
    with pytest.raises(ProtocolError):
        parser.feed(bytes(raw))


# --- the consumer's delivery parser -----------------------------------------------


def _delivery_stream() -> tuple[bytes, list[int], list[int]]:
    """Six deliveries: varied timestamps, an empty body, a short body and a body split
    over two frames, with a Basic.Cancel in the middle for the slow path."""
    stamps = [100, 100, 200, None, None, 300]
    bodies = [
        (100).to_bytes(8, "big") + b"a" * 56,
        (100).to_bytes(8, "big"),
        (200).to_bytes(8, "big") + b"b" * 10,
        b"",
        b"abc",
        (300).to_bytes(8, "big") + b"c" * 100,
    ]
    parts = [_delivery(tag, value) for tag, value in enumerate(bodies[:5], start=1)]
    parts.insert(3, frame.marshal(commands.Basic.Cancel(consumer_tag="x"), 1))
    # The last message's body arrives in two frames; only the first has the timestamp.
    method = commands.Basic.Deliver("amq.ctag-xyz", 6, False, "", QUEUE)
    content = header.ContentHeader(0, len(bodies[5]), commands.Basic.Properties())
    parts.append(frame.marshal(method, 1) + frame.marshal(content, 1))
    parts.append(frame.marshal(body.ContentBody(bodies[5][:20]), 1))
    parts.append(frame.marshal(body.ContentBody(bodies[5][20:]), 1))
    expected_stamps = [s for s in stamps if s is not None]
    return b"".join(parts), expected_stamps, [2, 4, 6]


def _expand(runs: list[tuple[int, int]]) -> list[int]:
    return [stamp for stamp, count in runs for _ in range(count)]


def test_delivery_parser_handles_every_split_point() -> None:
    stream, stamps, ack_tags = _delivery_stream()
    for cut in range(len(stream) + 1):
        recorder = _Recorder()
        parser = DeliveryParser(recorder, ack_every=2)
        parser.feed(stream[:cut])
        parser.feed(stream[cut:])
        assert parser.delivered == 6, cut
        assert _expand(parser.runs) == stamps, cut
        assert parser.ack_tags == ack_tags, cut
        assert [f[0] for f in recorder.frames] == [FRAME_METHOD], cut


def test_delivery_parser_one_byte_at_a_time() -> None:
    stream, stamps, _ = _delivery_stream()
    parser = DeliveryParser(lambda *_: None, ack_every=0)
    for i in range(len(stream)):
        parser.feed(stream[i : i + 1])
    assert parser.delivered == 6
    assert _expand(parser.runs) == stamps
    assert parser.ack_tags == []


def test_delivery_parser_collapses_a_batch_into_one_run() -> None:
    stamp = (5).to_bytes(8, "big")
    parser = DeliveryParser(lambda *_: None, ack_every=100)
    parser.feed(b"".join(_delivery(tag, stamp + b"z" * 56) for tag in range(1, 251)))
    assert parser.runs == [(5, 250)]
    assert parser.ack_tags == [100, 200]


# --- histogram --------------------------------------------------------------------


def test_bucket_bounds_cover_values_without_gaps() -> None:
    previous_high = 0
    for index in range(bucket_index(1 << 30) + 1):
        low, high = bucket_bounds(index)
        assert low == previous_high
        assert bucket_index(low) == index
        assert bucket_index(high - 1) == index
        # At most 1/64 relative width: the precision the percentiles promise.
        assert high - low <= max(1, low // 64)
        previous_high = high


def _nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_histogram_percentiles_match_exact_within_precision(seed: int) -> None:
    rng = random.Random(seed)
    values = [int(rng.lognormvariate(7, 1.5)) for _ in range(20_000)] + [0, 3, 10**7]
    hist = Histogram()
    for value in values:
        hist.record(value)
    for q in (0.1, 1, 25, 50, 90, 95, 99, 99.9, 100):
        exact = _nearest_rank(values, q)
        estimate = hist.percentile(q)
        assert estimate is not None
        assert abs(estimate - exact) <= exact / 64 + 1, (q, exact, estimate)
    assert hist.max_value == 10**7
    assert hist.total == len(values)


def test_histogram_small_values_are_exact() -> None:
    hist = Histogram()
    for value in range(1, 101):
        hist.record(value)
    assert hist.percentile(50) == 50
    assert hist.percentile(99) == 99
    assert hist.percentile(100) == 100
    assert Histogram().percentile(50) is None


def test_histogram_counts_merge_and_wire_round_trip() -> None:
    a, b = Histogram(), Histogram()
    a.record(10, count=90)
    b.record(1000, count=10)
    b.record(-5)  # clock skew cannot produce a negative latency bucket
    merged = Histogram.from_wire(a.to_wire())
    merged.merge(Histogram.from_wire(b.to_wire()))
    assert merged.total == 101
    assert merged.percentile(50) == 10
    assert merged.percentile(95) == pytest.approx(1000, rel=1 / 64)
    assert merged.max_value == 1000


def test_latency_summary_converts_microseconds_to_ms() -> None:
    hist = Histogram()
    hist.record(2000, count=100)
    summary = latency_summary_ms(hist)
    assert summary is not None
    assert summary["p50"] == pytest.approx(2.0, rel=1 / 64)
    assert summary["max"] == 2.0
    assert latency_summary_ms(Histogram()) is None


# --- publisher confirms -----------------------------------------------------------


def test_confirm_tracker_multiple_and_out_of_order_acks() -> None:
    tracker = ConfirmTracker()
    hist = Histogram()
    tracker.sent(5, send_ns=0)  # tags 1-5
    tracker.sent(5, send_ns=1_000_000)  # tags 6-10
    assert tracker.outstanding == 10
    assert tracker.settle(3, True, True, 2_000_000, hist) == 3
    assert tracker.settle(7, False, True, 2_000_000, hist) == 1  # out of order
    assert tracker.outstanding == 6
    assert tracker.settle(5, False, False, 2_000_000, hist) == 1  # nack
    assert tracker.settle(4, False, True, 3_000_000, hist) == 1
    assert tracker.low == 5
    assert tracker.settle(6, False, True, 3_000_000, hist) == 1  # 7 was already settled
    assert tracker.low == 7 and not tracker.singles
    assert tracker.settle(10, True, True, 4_000_000, hist) == 3
    assert tracker.outstanding == 0
    assert (tracker.acked, tracker.nacked) == (9, 1)
    assert hist.total == 10
    assert tracker.settle(10, True, True, 4_000_000, hist) == 0  # duplicate is harmless


def test_confirm_tracker_rejects_unknown_tag() -> None:
    tracker = ConfirmTracker()
    tracker.sent(2, send_ns=0)
    with pytest.raises(ProtocolError):
        tracker.settle(3, False, True, 0, None)


# --- command line -----------------------------------------------------------------


def test_uri_parsing() -> None:
    uri = AmqpUri.parse("amqp://u%40x:p%2Fw@example:5673/%2Fvh")
    assert uri == AmqpUri("example", 5673, "u@x", "p/w", "/vh")
    assert AmqpUri.parse("amqp://127.0.0.1").vhost == "/"
    assert AmqpUri.parse("amqp://127.0.0.1/").vhost == "/"
    with pytest.raises(ValueError):
        AmqpUri.parse("amqps://127.0.0.1/")


def test_config_rejects_a_multi_ack_that_would_stall() -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        config_from_args(parser.parse_args(["--prefetch", "10", "--multi-ack", "20"]), parser)
    cfg = config_from_args(parser.parse_args(["--no-ack", "--multi-ack", "0"]), parser)
    assert cfg.no_ack
    assert cfg.queue.startswith("perf-") and cfg.queue_generated


def test_summarize_and_format() -> None:
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["--duration", "2", "--confirm", "10"]), parser)
    latency = Histogram()
    latency.record(1500, count=4)
    results = [
        {"role": "producer", "published": 200, "acked": 180, "nacked": 0,
         "confirm_hist": latency.to_wire(), "cpu_s": 0.5, "wall_s": 2.0},
        {"role": "consumer", "consumed": 100, "latency_hist": latency.to_wire(),
         "cpu_s": 0.5, "wall_s": 2.0},
    ]  # fmt: skip
    report = summarize(cfg, results)
    assert report["published_rate"] == 100
    assert report["consumed_rate"] == 50
    assert report["client_cpu_percent"] == 50
    assert report["latency_ms"]["p50"] == pytest.approx(1.5, rel=1 / 64)
    text = format_human(report)
    assert text.startswith("shoal perf: 1 producer(s) -> 1 consumer(s), 64 B, confirm 10")
    assert "published 100 msg/s  consumed 50 msg/s  latency ms p50 1." in text


def test_unreachable_broker_fails_fast(capsys: pytest.CaptureFixture[str]) -> None:
    # A bound but not listening socket refuses connections: no broker, no waiting.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        uri = f"amqp://guest:guest@127.0.0.1:{port}/"
        assert main(["--uri", uri, "--duration", "1", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["fatal"]
    assert "setup failed: ConnectionRefusedError" in report["errors"][0]
