"""One process's SETTLE records (store/messages.py): which durable entries of
persistent messages it deleted, written to its ack file of each message file.

Buffered: `settle` is called on the hot path (an ack), `flush` once per
event-loop iteration writes every buffered record with one write per ack
file. No sync: an ack that did not reach the disk before a power cut only
brings its message back flagged redelivered (docs/durability.md), and so
does one whose write failed (logged, not fatal). On a cluster's leader each
write is also shipped to the followers without waiting (replica.ship), so
that a failover brings back only the messages acked in its last moments. `sync` makes them durable
for tx.commit, under the rule of every durable write (store/sync.py): a
failed sync, or a failed write since the last sync, ends the process rather
than let a commit-ok confirm acks that may not be on disk.

The message file a message's tag names, and the count of its live entries, live
in shared memory (shm/message_files.py); this module sees that table through a
Protocol, so that it needs nothing from shm/.
"""

from __future__ import annotations

import logging
from typing import Protocol

from shoal.store import replica
from shoal.store.messages import AckWriter, message_file_name
from shoal.store.sync import durability_lost, sync_now

log = logging.getLogger("shoal.store")

# (message file slot, check, record offset) as shm.arena.read_tag gives it
Tag = tuple[int, int, int]


class MessageFiles(Protocol):
    """shm/message_files.py MessageFileTable, as far as settling needs it."""

    def name(self, slot: int, check: int) -> tuple[int, int, int] | None:
        """(epoch, writer, counter) of the message file a tag names (None: gone)."""
        ...

    def add(self, slot: int, count: int) -> None: ...


class SettleWriter:
    __slots__ = ("_files", "_lost", "_unsynced", "directory", "message_files", "pending", "writer")

    def __init__(self, directory: str, writer: int, message_files: MessageFiles) -> None:
        """`writer`: this process's number in ack file names."""
        self.directory = directory
        self.writer = writer
        self.message_files = message_files
        self._files: dict[tuple[int, int], tuple[str, AckWriter]] = {}
        self._unsynced: set[tuple[int, int]] = set()
        self._lost: OSError | None = None  # a write failed since the last `sync`
        self.pending: list[tuple[Tag, int]] = []

    def settle(self, tag: Tag, uid: int) -> None:
        self.pending.append((tag, uid))

    def flush(self) -> None:
        """Write what is buffered, then count the message files down (after the
        write: a message file must not be deleted before its acks are written,
        or they would make an ack file of no message file)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        by_file: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for (slot, check, offset), uid in pending:
            by_file.setdefault((slot, check), []).append((offset, uid))
        for key, settled in by_file.items():
            name = self.name_of(*key)
            if name is None:
                # Cannot be while its entries were live (they keep the slot):
                # counting down would hit whatever message file holds the slot now.
                log.error(
                    "acks of %d entries name no live message file (slot %d)", len(settled), key[0]
                )
                continue
            # uid 0: its queue was deleted (definitions.log says so already).
            records = [s for s in settled if s[1]]
            try:
                if records:
                    file = self._file(key, name)
                    file.settle(records)
                    self._unsynced.add(key)
                    if replica.link is not None:  # a cluster's leader: followers get them too
                        replica.link.ship(file.file.path)
            except OSError as exc:
                # Not fatal: without the record the message comes back,
                # flagged redelivered, after a crash.
                log.error("cannot record %d acks in message file %s: %s", len(records), name, exc)
                self._lost = exc
            self.message_files.add(key[0], -len(settled))

    def _file(self, key: tuple[int, int], name: str) -> AckWriter:
        """This process's ack file of message file `name` (a cached one of an
        earlier message file in the same slot is closed first)."""
        cached = self._files.get(key)
        if cached is not None and cached[0] == name:
            return cached[1]
        if cached is not None:
            cached[1].file.close()
        file = AckWriter(self.directory, name, self.writer)
        self._files[key] = (name, file)
        return file

    def name_of(self, slot: int, check: int) -> str | None:
        """The file name of the message file a tag names (None: it is gone)."""
        name = self.message_files.name(slot, check)
        return None if name is None else message_file_name(*name)

    def sync(self) -> None:
        """fdatasync every ack file written since the last sync (blocking,
        on the caller's thread: only tx.commit asks, and only when its
        transaction settled something). A failure ends the process."""
        if self._lost is not None:
            durability_lost(f"acks of writer {self.writer} could not be written", self._lost)
        keys, self._unsynced = self._unsynced, set()
        for key in keys:
            cached = self._files.get(key)
            if cached is not None:
                sync_now(cached[1].file.fd, f"ack file of message file {cached[0]}")

    def sweep(self) -> None:
        """Close the ack files of message files that were deleted (an open
        descriptor would keep their disk space)."""
        for key in [k for k, (name, _) in self._files.items() if self.name_of(*k) != name]:
            self._files.pop(key)[1].file.close()
            self._unsynced.discard(key)

    def close(self) -> None:
        """A clean stop: the acks are written and synced, because the
        clean-stop record (store/clean_stop.py) will say that the messages
        they settled were not delivered; on a cluster's leader the sync
        also brings them to the followers before leadership moves."""
        self.flush()
        self.sync()
        for _name, file in self._files.values():
            file.file.close()
        self._files.clear()
