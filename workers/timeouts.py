"""Consumer timeouts (issue 15, item 6): a consumer that holds a delivery
unacknowledged longer than its timeout is cancelled (a server basic.cancel)
and its unacknowledged messages are requeued; its channel and the channel's
other consumers carry on. (RabbitMQ 3.x closes the whole channel with 406;
a client that did not announce consumer_cancel_notify gets that instead, as
it would never learn of the cancel.)

The timeout: the consumer's `x-consumer-timeout` argument, else its
queue's, else the broker's `--consumer-timeout` (ms; 30 min as RabbitMQ's;
0: none). Nothing is done per delivery: once a second the worker marks each
channel's next delivery tag with the time, so a tag's delivery time is known
to within a second (from the marks around it), and looks at each channel's
oldest unacknowledged deliveries until one is younger than the shortest
timeout there. A consumer is cancelled at most a second late, never early.
Acks of the requeued tags that come later are ignored, not errors.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from typing import Any, Protocol

from shoal.broker.amqp import errors
from shoal.workers.unmade import UNMADE

log = logging.getLogger("shoal.worker")

# (delivery tag, monotonic time): tags at or above it were delivered after it.
Marks = deque[tuple[int, float]]


class TimedChannel(Protocol):
    """What the check uses of a channel (workers/delivery.py)."""

    next_tag: int
    unacked: dict[int, Any]
    delivery_marks: Marks
    timed_out_tags: set[int]
    consumers: dict[bytes, Any]

    def time_out(self, consumer: Any, tags: list[int]) -> None: ...


def consumer_timeout_ms(
    consumer_args: dict[str, Any], queue_args: dict[str, Any], default_ms: int
) -> int:
    """A consumer's timeout in ms (0: none); a bad value is refused."""
    for args in (consumer_args, queue_args):
        value = args.get("x-consumer-timeout")
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg 'x-consumer-timeout' for consumer: {value!r}",
                60,
                20,
            )
        return value
    return default_ms


def mark(channel: TimedChannel, now: float) -> None:
    """Once a second: tags from channel.next_tag on are delivered after `now`.
    Marks at or below the oldest unacknowledged delivery are dropped; with
    none unacknowledged, none is kept (a later delivery's tag is at or above
    any mark made now: only the first mark above a tag dates it). So a
    channel that holds no delivery costs the once-a-second walk nothing
    (`needs_marks`)."""
    marks = channel.delivery_marks
    if not channel.unacked:
        marks.clear()
        return
    oldest = next(iter(channel.unacked))  # only the first mark above a delivery dates it
    while marks and marks[0][0] <= oldest:
        marks.popleft()
    if not marks or marks[-1][0] != channel.next_tag:
        if marks is UNMADE:
            marks = channel.delivery_marks = deque()
        marks.append((channel.next_tag, now))


def needs_marks(channel: TimedChannel) -> bool:
    """Whether mark and check have anything to do for `channel`."""
    return bool(channel.unacked or channel.delivery_marks)


def delivered_before(tags: list[int], marks: Marks, tag: int) -> float | None:
    """A time the delivery of `tag` came before: that of the first mark
    above it (None: none yet, it is younger than the last mark). `tags`:
    the marks' tags, in order."""
    i = bisect.bisect_right(tags, tag)
    return marks[i][1] if i < len(marks) else None


def check(channel: TimedChannel, now: float) -> None:
    """Cancel the consumers whose oldest delivery is older than their
    timeout."""
    if not channel.unacked or not channel.delivery_marks:
        return
    timeouts = [c.timeout_ms for c in channel.consumers.values() if c.timeout_ms]
    if not timeouts:
        return
    shortest = min(timeouts) / 1000
    expired: dict[Any, list[int]] = {}
    marks = channel.delivery_marks
    tags = [t for t, _ in marks]
    for tag, entry in channel.unacked.items():
        consumer = entry[0]
        before = delivered_before(tags, marks, tag)
        if before is None or now - before < shortest:
            break  # this one and every later one are younger than any timeout
        if consumer is None or not consumer.timeout_ms or consumer.cancelled:
            continue  # basic.get, or a consumer with no (or a longer) timeout
        if now - before >= consumer.timeout_ms / 1000:
            expired.setdefault(consumer, [])
    for consumer in expired:
        tags = [t for t, e in channel.unacked.items() if e[0] is consumer]
        channel.time_out(consumer, tags)


PRUNE_TICKS = 8  # ticks between the drops of books with nothing and no consumer


class TimedBooks:
    """The delivery books the once-a-second marks and checks visit, and the
    pinned heads' look (workers/pinned_heads.py): those that gained a
    consumer or a basic.get delivery (the only ways into `unacked`), kept
    until they hold nothing and have no consumer. Visiting
    every channel of every connection instead cost an idle worker with
    10,000 MQTT clients most of its idle CPU (workers/census.py)."""

    __slots__ = ("books", "ticks")

    def __init__(self) -> None:
        self.books: set[TimedChannel] = set()
        self.ticks = 0

    def add(self, book: TimedChannel) -> None:
        self.books.add(book)

    def tick(self, now: float) -> None:
        # needs_marks inlined and the idle books passed over in one
        # comprehension: 10,000 MQTT subscribers are 10,000 books, nearly
        # all holding nothing, walked once a second.
        books = self.books
        busy = [b for b in books if b.unacked or b.delivery_marks]
        self.ticks += 1
        if self.ticks % PRUNE_TICKS == 0:
            # Those that hold nothing and have no consumer go (a consume or a
            # get adds a book again); one walk more every PRUNE_TICKS.
            books.difference_update([b for b in books if not (b.consumers or b.unacked)])
        for book in busy:
            try:
                mark(book, now)
                check(book, now)
            except Exception:
                log.exception("consumer timeout check failed")
