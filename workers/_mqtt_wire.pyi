from collections.abc import Callable

from typing_extensions import Buffer

def deliveries(
    buffer: Buffer,
    at: int,
    plans: dict[bytes, tuple[bytes, int, bool] | None],
    unacked: dict[int, int],
    next_id: int,
    level5: bool,
    /,
) -> tuple[int, int, bytes | None, bytes | None]:
    """A run of planned deliveries of the inner AMQP connection at `at` as
    PUBLISH packets: (where Python goes on, the next packet id, the packets
    or None, the key of an unplanned delivery at the new `at` or None)."""

def publishes(
    data: Buffer,
    at: int,
    topics: dict[bytes, tuple[bytes, bytes]],
    props0: bytes | None,
    props1: bytes | None,
    level5: bool,
    max_packet: int,
    frame_max: int,
    /,
) -> tuple[int, bytes | None, list[int]]:
    """A run of a device's plain PUBLISHes at `at` as the inner AMQP
    connection's frames: (where Python goes on, the frames or None, each
    publish's packet id, 0 for QoS 0)."""

def pubacks(
    data: Buffer,
    at: int,
    unacked: dict[int, int],
    nothing: int,
    /,
) -> tuple[int, list[int]]:
    """A subscriber's read's leading run of PUBACKs with success (short form)
    at `at`: (where Python goes on, the delivery tags of their ids popped from
    `unacked`, those equal to `nothing` left out)."""

class DeliveryFlush:
    """An MQTT subscriber's inner connection's scheduled flush: where only
    planned deliveries are to write (and the bridge reads nothing else),
    Connection.flush, the bridge's read and Outbound.run in one call, the
    PUBLISHes written to `conn`'s transport; else `fallback()`. An
    Exception raised by either is given to `failed`."""

    def __init__(
        self,
        conn: object,
        amqp: object,
        fallback: Callable[[], None],
        failed: Callable[[Exception], None],
        /,
    ) -> None: ...
    def __call__(self) -> None: ...
