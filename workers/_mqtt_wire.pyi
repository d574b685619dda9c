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
