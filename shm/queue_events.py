"""What a queue tells the process above it (SharedQueues's `events`).

shm/ sits below the workers and the scheduler, so a transition that must
reach them (a durable entry deleted: the message store records it; a message
a length limit dropped: dead-lettering takes it) raises an event on the
object its SharedQueues was made with, rather than calling up or through a
callback assigned after construction.
"""

from __future__ import annotations

from typing import Protocol


class QueueEvents(Protocol):
    """What a queue tells the process above it, named in one place. Each is
    raised by a SharedQueues transition (or shm/timed_entries.py) and handled
    by the owner of the rule it touches: in an IO worker
    workers/events.py WorkerEvents, in the scheduler its SchedulerEvents."""

    # Whether `settled` is to be raised (a message store is open): read
    # before an entry is deleted, to know whether to read its tag first.
    records_settles: bool

    def settled(self, tag: tuple[int, int, int], uid: int) -> None:
        """A durable entry of a tagged (persistent) message was deleted by
        this process: (message tag as shm.arena.read_tag gives it, queue
        uid; 0 when the queue itself is being deleted: nothing to record,
        only to count)."""

    def dropped(self, log: int, block: int) -> None:
        """A length limit dropped (drop-head) or refused (reject-publish-dlx)
        the message in `block` from log `log`: dead-letter it. Raised while
        the entry or the publisher still holds the block."""


class NoEvents:
    """A process above nothing: observers, and the tests' stores."""

    records_settles = False

    def settled(self, tag: tuple[int, int, int], uid: int) -> None:
        raise AssertionError("settled raised with records_settles False")

    def dropped(self, log: int, block: int) -> None:
        pass


NO_EVENTS = NoEvents()
