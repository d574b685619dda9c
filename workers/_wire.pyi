from collections.abc import Callable
from typing import Any

from typing_extensions import Buffer

from shoal.shm._atomic import Atomic

MSG_PREFIX_SIZE: int
MSG_TIMED: int
MSG_TIME_SIZE: int
RUN_FULL: int
RUN_EMPTY: int
RUN_ENTRY: int
PULL_IN_PYTHON: int
PULL_YIELD: int
PULL_WATCH_LOST: int
PULL_ENTRY: int

class Lane:
    """A connection's publish lane (workers/lane.py)."""

    def __init__(self, atomic: object, /) -> None: ...
    @property
    def n(self) -> int: ...
    @property
    def armed(self) -> bool: ...
    @property
    def configured(self) -> bool: ...
    @property
    def channel(self) -> int: ...
    @property
    def routes(self) -> int: ...
    @property
    def signed(self) -> bool: ...
    def sign(self, signature: bytes, /) -> None: ...
    def configure(
        self,
        channel: int,
        intent: int,
        max_body: int,
        arena_base: int,
        arena_end: int,
        hot_end: int,
        hot_live: int,
        arenas: int,
        arena_bytes: int,
        /,
    ) -> None: ...
    def add(
        self,
        exchange: bytes,
        routing_key: bytes,
        queue: int,
        ring: int,
        mask: int,
        qid: int,
        store_uid: int,
        /,
    ) -> bool: ...
    def arm(self, cursor: int, used: int, high: int, page_out_high: int, /) -> None: ...
    def store_window(
        self,
        slot: int,
        check: int,
        epoch: int,
        reserved: int,
        limit: int,
        header_size: int,
        live_word: int,
        /,
    ) -> None: ...
    def clear(self) -> None: ...
    def take(
        self,
    ) -> tuple[
        int,
        int,
        tuple[int, ...] | None,
        int,
        int,
        list[tuple[int, int, int, bytes]],
        tuple[int, int, int, bool] | None,
        bytes | None,
        int,
        int,
    ]: ...
    def mqtt_run(
        self,
        data: Buffer,
        exchange: bytes,
        topics: dict[bytes, tuple[bytes, bytes]],
        props0: bytes | None,
        props1: bytes | None,
        level5: bool,
        max_packet: int,
        /,
    ) -> tuple[int, int, bytes, bytes]: ...
    def mqtt_read(
        self,
        data: Buffer,
        exchange: bytes,
        topics: dict[bytes, tuple[bytes, bytes]],
        props0: bytes | None,
        props1: bytes | None,
        level5: bool,
        max_packet: int,
        long_read_waker: object | None,
        arena: object,
        publisher: object,
        waker: object,
        pacer: object,
        ctx: object,
        confirm_channels: set[Any],
        /,
    ) -> tuple[int, int, bytes, bytes]: ...

class DeviceRead:
    """A device's reads through its publish lane in C (workers/_lane_device.h)."""

    def __init__(self, *args: Any) -> None: ...
    def read(self, data: Buffer, long_read: bool, /) -> int | tuple[int, int, bytes, bytes]: ...
    def shut_gate(self) -> None: ...
    def fold(self) -> None: ...
    @property
    def gate_open(self) -> bool: ...

class AckRead:
    """A subscriber's reads of PUBACKs in one C call (workers/_ack_read.h)."""

    def __init__(self, *args: Any) -> None: ...
    def read(self, data: Buffer, long_read: bool, /) -> int: ...

class WatchedPull:
    """A watched queue's wake-up pull in one C call (workers/_watched_pull.h)."""

    def __init__(self, *args: Any) -> None: ...
    def pull(self, consumer: Any, /) -> tuple[int, int, int, int] | None: ...
    def pull_each(
        self,
        qids: list[int],
        watching: dict[int, Any],
        go_on: Callable[[Any, tuple[int, int, int, int]], None],
        /,
    ) -> None: ...
    def wake(
        self,
        efd: int,
        bitmap: int,
        words: int,
        ctx: Any,
        watching: dict[int, Any],
        go_on: Callable[[Any, tuple[int, int, int, int]], None],
        flush_failed: Callable[[BaseException], object],
        /,
    ) -> None: ...

class AckBatch:
    """A worker's devices' PUBACKs, written at the turn's end (workers/_ack_defer.h)."""

    def __init__(self, call_soon: Callable[..., Any], /) -> None: ...
    def flush(self) -> None: ...
    @property
    def held(self) -> int: ...
    @property
    def flushes(self) -> int: ...

class MqttFront:
    """An MQTT client's socket protocol: its reads in C first (workers/_mqtt_front.h)."""

    fast: DeviceRead | AckRead | None
    @property
    def acks_held(self) -> int: ...
    def batch_with(self, batch: AckBatch, transport: Any, /) -> None: ...
    def flush_acks(self) -> None: ...
    @property
    def last_fast_read(self) -> float: ...
    def __init__(
        self,
        conn: Any,
        rest: Callable[[Any, bytes], None],
        counted: Callable[[Any, tuple[int, int, bytes, bytes]], int],
        failed: Callable[[Any, BaseException], None],
        long_read: int,
        atomic: Any = None,
        subscribing: int = 0,
        subscribed_at: int = 0,
        /,
    ) -> None: ...
    def data_received(self, data: bytes, /) -> None: ...
    def connection_made(self, transport: Any, /) -> None: ...
    def connection_lost(self, exc: Exception | None, /) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...

def stat_places(
    routed: int, size_sum: int, size_buckets: int, received_confirm: int, confirmed: int, /
) -> None: ...
def properties_ok(header: Buffer, /) -> bool: ...
def read_topics(data: object, /) -> int: ...
def filter_topics(topic_filter: bytes, /) -> int: ...
def device_gate_audit(on: bool, /) -> None: ...
def slot_get(obj: object, name: str, /) -> Any: ...
def slot_set(obj: object, name: str, value: object, /) -> None: ...
def dedup_key(header: Buffer, /) -> bytes | bool | None: ...
def scan(
    view: memoryview, frame_max: int, lane: Lane | None = None, /
) -> tuple[list[Any], int, bool]: ...
def ack_run(
    shared: tuple[object, int, int, int, int, int, int, int, bool],
    qid: int,
    unacked: dict[int, Any],
    upto: int,
    uid: int,
    /,
) -> tuple[int, int, list[tuple[Any, int, int]], list[tuple[tuple[int, int, int], int]]]: ...
def deliver_run(
    shared: tuple[object, int, int, int, int, int, int, int, bool],
    pointer: int,
    limit: int,
    channel: int,
    consumer_tag: bytes,
    next_tag: int,
    frame_max: int,
    no_ack: bool,
    unacked: dict[int, Any] | None,
    consumer: object,
    qid: int,
    /,
) -> tuple[bytes | None, int, int, int, int, int, int, int, int]: ...
def deliver_frames(
    atomic: Atomic,
    block: int,
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    frame_max: int,
    /,
) -> tuple[bytes, int]: ...
