"""The command line of ``shoal perf`` and ``python -m shoal.perf``."""

from __future__ import annotations

import argparse
import json
import secrets
import sys

from shoal.perf.config import PerfConfig
from shoal.perf.connection import AmqpUri
from shoal.perf.report import format_human
from shoal.perf.runner import run_perf

# --- command line -----------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shoal perf", description="AMQP 0-9-1 throughput and latency test."
    )
    p.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/", help="broker URI")
    p.add_argument("--producers", type=_non_negative_int, default=1, help="producer processes")
    p.add_argument("--consumers", type=_non_negative_int, default=1, help="consumer processes")
    p.add_argument(
        "--size", type=_non_negative_int, default=64, help="body bytes (>= 8 for latency)"
    )
    p.add_argument(
        "--confirm", type=_non_negative_int, default=0, help="publisher-confirm window, 0 = off"
    )
    p.add_argument(
        "--prefetch", type=_non_negative_int, default=500, help="basic.qos prefetch count"
    )
    p.add_argument(
        "--multi-ack",
        type=_non_negative_int,
        default=100,
        help="ack every N deliveries (multiple=true if N > 1)",
    )
    p.add_argument("--no-ack", action="store_true", help="consume in no-ack (auto-ack) mode")
    p.add_argument("--duration", type=_positive_float, default=10.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds run before measuring")
    p.add_argument(
        "--queue",
        default=None,
        help="queue name (default perf-<random>, deleted at the end; a named queue is kept)",
    )
    p.add_argument("--persistent", action="store_true", help="delivery_mode 2 and a durable queue")
    p.add_argument(
        "--fanout",
        type=_non_negative_int,
        default=0,
        help="publish to a fanout exchange bound to N queues; consumers are spread "
        "over them (0 = publish straight to one queue)",
    )
    p.add_argument(
        "--stream", action="store_true", help="a stream queue (durable, x-queue-type stream)"
    )
    p.add_argument(
        "--quorum",
        action="store_true",
        help="a quorum queue (durable, x-queue-type quorum: replicated on a RabbitMQ cluster)",
    )
    p.add_argument(
        "--stream-offset",
        default="next",
        help="consumers' x-stream-offset: first, last, next, an offset, or spread:N "
        "(consumer i of C starts at i * N // C)",
    )
    p.add_argument(
        "--dedup",
        choices=("off", "header", "queue"),
        default="off",
        help="header: each message carries a unique x-deduplication-header; queue: "
        "the same, to a queue declared with x-message-deduplication",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--rate", type=_non_negative_int, default=0, help="per-producer msg/s cap, 0 = unlimited"
    )
    return p


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> PerfConfig:
    multi_ack = args.multi_ack
    if not args.no_ack:
        if multi_ack == 0:
            parser.error("--multi-ack must be >= 1 (use --no-ack for auto-ack)")
        if args.prefetch and multi_ack > args.prefetch:
            # Acking only every N deliveries with fewer than N in flight would stall.
            parser.error("--multi-ack must not exceed --prefetch")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        AmqpUri.parse(args.uri)
    except ValueError as exc:
        parser.error(str(exc))
    generated = args.queue is None
    return PerfConfig(
        uri=args.uri,
        producers=args.producers,
        consumers=args.consumers,
        size=args.size,
        confirm=args.confirm,
        prefetch=args.prefetch,
        multi_ack=multi_ack,
        no_ack=args.no_ack,
        duration=args.duration,
        warmup=args.warmup,
        queue=f"perf-{secrets.token_hex(6)}" if generated else args.queue,
        queue_generated=generated,
        persistent=args.persistent,
        rate=args.rate,
        fanout=args.fanout,
        stream=args.stream,
        quorum=args.quorum,
        stream_offset=args.stream_offset,
        dedup=args.dedup,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = config_from_args(args, parser)
    if cfg.producers + cfg.consumers == 0:
        parser.error("nothing to run: --producers and --consumers are both 0")
    try:
        report = run_perf(cfg)
    except KeyboardInterrupt:
        print("shoal perf: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_human(report))
    if report.get("fatal") or report.get("errors"):
        return 1
    return 0
