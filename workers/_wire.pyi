from typing import Any

from typing_extensions import Buffer

MSG_PREFIX_SIZE: int
MSG_TIMED: int
MSG_TIME_SIZE: int

def properties_ok(header: Buffer, /) -> bool: ...
def dedup_key(header: Buffer, /) -> bytes | bool | None: ...
def scan(view: memoryview, frame_max: int, /) -> tuple[list[Any], int, bool]: ...
def deliver_frames(
    buf: Buffer,
    record: int,
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    frame_max: int,
    /,
) -> tuple[bytes, int]: ...
def write_record(
    buf: Buffer,
    record: int,
    exchange: Buffer,
    routing_key: Buffer,
    properties: Buffer,
    body: Buffer,
    published: int,
    expires: int,
    /,
) -> int: ...
