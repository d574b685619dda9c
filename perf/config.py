"""One run's options, its shared schedule and the limits on each phase."""

from __future__ import annotations

from dataclasses import dataclass

# Phase limits.  Together they keep ``main`` under duration + warmup + 30 s even when
# the broker is unreachable or a child hangs.
CONNECT_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 8.0
RESULT_GRACE_S = 5.0
CLOSE_TIMEOUT_S = 1.0
JOIN_TIMEOUT_S = 2.0


# --- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class PerfConfig:
    uri: str
    producers: int
    consumers: int
    size: int
    confirm: int
    prefetch: int
    multi_ack: int
    no_ack: bool
    duration: float
    warmup: float
    queue: str
    queue_generated: bool
    persistent: bool
    rate: int
    fanout: int = 0  # > 0: publish to a fanout exchange bound to this many queues
    stream: bool = False  # declare a stream queue (x-queue-type stream)
    quorum: bool = False  # declare a quorum queue (x-queue-type quorum: RabbitMQ's replicated one)
    # Consumers' x-stream-offset: "first", "last", "next", an offset, or
    # "spread:N" (consumer i of C starts at offset i * N // C).
    stream_offset: str = "next"
    # Message deduplication (issue 26): "off"; "header": every message
    # carries a unique x-deduplication-header, to a plain queue; "queue":
    # the same, to a queue declared with x-message-deduplication.
    dedup: str = "off"

    def stream_offset_for(self, index: int) -> int | str:
        value = self.stream_offset
        if value.startswith("spread:"):
            return index * int(value[7:]) // max(1, self.consumers)
        return int(value) if value.isdigit() else value

    def exchange(self) -> str:
        return f"{self.queue}-fanout" if self.fanout else ""

    def queues(self) -> list[str]:
        if self.fanout:
            return [f"{self.queue}-{i}" for i in range(self.fanout)]
        return [self.queue]

    def queue_for(self, index: int) -> str:
        """The queue consumer `index` reads (spread over the fan-out's queues)."""
        queues = self.queues()
        return queues[index % len(queues)]


@dataclass(frozen=True)
class Window:
    """The shared schedule, in monotonic nanoseconds."""

    start_ns: int
    warm_ns: int
    end_ns: int

    @classmethod
    def from_start(cls, start_s: float, warmup: float, duration: float) -> Window:
        start_ns = int(start_s * 1e9)
        warm_ns = start_ns + int(warmup * 1e9)
        return cls(start_ns, warm_ns, warm_ns + int(duration * 1e9))
