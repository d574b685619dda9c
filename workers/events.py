"""Every event a lower part of an IO worker raises to an upper one, named in
one place, with who raises it and who handles it.

    event         raised by                               handled by
    settled       shm/queues.py SharedQueues (an ack, a     workers/persist.py Persister.settle:
                  reject, a no-ack delivery, a purge),    the message store records the
                  shm/timed_entries.py (an expiry),       settle
                  workers/pager.py (a paged message
                  purged or gone)
    dropped       shm/queues.py SharedQueues.enqueue        workers/dead_letter.py
                  (a length limit dropped or refused a    DeadLetters.dropped_by_limit
                  message)
    paged_in      workers/pager.py (a paged-out message   workers/ingest.py Ingest.put_payload:
                  comes back)                             the one way into a queue
    before_write  workers/persist.py (a batch of records  workers/dedup_filter.py
                  is about to be written)                 Deduplicator.flush: its keys first

The parts below hold this object from their construction and call its
methods; nothing assigns a callback into another object. The handlers are
the worker's own parts, of which the message store, dead-lettering and the
ingest exist only once the worker has opened its store (`store_opened`,
`serve`): until then nothing is settled, dead-lettered or paged in.
"""

from __future__ import annotations

from typing import Protocol


class SettleHandler(Protocol):
    def settle(self, tag: tuple[int, int, int], uid: int) -> None: ...


class DropHandler(Protocol):
    def dropped_by_limit(self, log: int, block: int) -> None: ...


class PageInHandler(Protocol):
    def put_payload(self, qid: int, payload: memoryview, redelivered: bool) -> int | None: ...


class WriteHandler(Protocol):
    def flush(self) -> None: ...


class WorkerEvents:
    """An IO worker's events (the module docstring's table): shm.queues
    QueueEvents, and the pager's and the message store's."""

    __slots__ = ("_dead_letters", "_dedup", "_ingest", "_persist", "records_settles")

    def __init__(self) -> None:
        self._dedup: WriteHandler | None = None
        self._persist: SettleHandler | None = None
        self._dead_letters: DropHandler | None = None
        self._ingest: PageInHandler | None = None
        # Whether settles are recorded (QueueEvents.records_settles): once
        # the message store is open.
        self.records_settles = False

    def store_opened(self, persist: SettleHandler, dedup: WriteHandler) -> None:
        """The message store is open (WorkerContext.open_store): settles are
        recorded from now on, and deduplication keys written before records."""
        self._persist = persist
        self._dedup = dedup
        self.records_settles = True

    def serve(self, dead_letters: DropHandler, ingest: PageInHandler) -> None:
        """The worker's dead-lettering and ingest exist (workers/worker.py):
        dropped messages are dead-lettered and paged ones come back."""
        self._dead_letters = dead_letters
        self._ingest = ingest

    def settled(self, tag: tuple[int, int, int], uid: int) -> None:
        if self._persist is not None:
            self._persist.settle(tag, uid)

    def dropped(self, log: int, block: int) -> None:
        if self._dead_letters is not None:
            self._dead_letters.dropped_by_limit(log, block)

    def paged_in(self, qid: int, payload: memoryview, redelivered: bool) -> int | None:
        if self._ingest is None:
            return None  # not served yet: as if the arena were full, later
        return self._ingest.put_payload(qid, payload, redelivered)

    def before_write(self) -> None:
        if self._dedup is not None:
            self._dedup.flush()
