"""The message store's message file table: which message files are live, and how
many durable queue entries still point into each (docs/durability.md).

Each IO worker owns MESSAGE_FILE_SLOTS slots: the message files it writes, and (worker
0) the message files a recovery loaded messages from. A persistent message's
block is tagged with its message file's global slot index (shm/arena.py
write_tag), so whoever deletes one of its durable entries (an ack on any
worker, a purge by the scheduler) can name the message file and count it down.

    SG_NAME    epoch << 32 | counter; 0 for a free slot     owner writes
    SG_WRITER  writer + 1, | SEALED_BIT once sealed         owner writes
    SG_LIVE    durable entries pointing into the message file    owner adds, anyone subtracts

Only the owner claims, seals and frees its slots; it frees one (and deletes
the files) once the slot is sealed and SG_LIVE is 0. A process killed
between deleting an entry and counting it down leaves the message file on disk
until the next start's recovery, never a loss. A restarted worker seals
the slots its predecessor left open and carries on counting them.
"""

from __future__ import annotations

from typing import NamedTuple

from shoal.shm import layout
from shoal.shm.segment import Segment


class MessageFileName(NamedTuple):
    epoch: int
    writer: int
    counter: int


def check_of(name: MessageFileName) -> int:
    """The 32 bits a message tag carries to say which message file it means: the
    counter mixed with the epoch, so that a slot reused by a message file of
    another start (whose counter may repeat) does not pass for the old one."""
    return (name.counter ^ name.epoch * 0x9E3779B1) & 0xFFFFFFFF


class MessageFileTable:
    __slots__ = ("a", "first", "layout", "slots")

    def __init__(self, seg: Segment, worker: int) -> None:
        """The table as IO worker `worker` sees it (its own slots are the ones
        it may claim); any worker index serves a process that only counts down."""
        self.a = seg.atomic
        self.layout = seg.layout
        self.first = worker * layout.MESSAGE_FILE_SLOTS
        self.slots = layout.MESSAGE_FILE_SLOTS  # this worker's: message files it may have at once

    def _at(self, slot: int) -> int:
        return self.layout.message_file_slot(slot)

    def claim(self, name: MessageFileName, live: int = 0, sealed: bool = False) -> int | None:
        """A free slot of ours for message file `name` (None: all are in use)."""
        a = self.a
        for slot in range(self.first, self.first + layout.MESSAGE_FILE_SLOTS):
            at = self._at(slot)
            if a.load(at + layout.SG_NAME) == 0:
                a.store(at + layout.SG_LIVE, live)
                a.store(
                    at + layout.SG_WRITER, name.writer + 1 | (layout.SEALED_BIT if sealed else 0)
                )
                a.store(at + layout.SG_NAME, name.epoch << 32 | name.counter)
                return slot
        return None

    def name(self, slot: int, check: int) -> MessageFileName | None:
        """The message file in `slot`, if it is still the one `check` (a message
        tag's, check_of) names, else None."""
        a = self.a
        at = self._at(slot)
        word = a.load(at + layout.SG_NAME)
        if word == 0:
            return None
        writer = (a.load(at + layout.SG_WRITER) & 0xFFFFFFFF) - 1
        name = MessageFileName(word >> 32, writer, word & 0xFFFFFFFF)
        return name if check_of(name) == check else None

    def add(self, slot: int, count: int) -> None:
        self.a.fetch_add(self._at(slot) + layout.SG_LIVE, count)

    def live_word(self, slot: int) -> int:
        """The offset of `slot`'s live-entry count, which a publish lane
        adds to in C as add() does (workers/_wire.c)."""
        return self._at(slot) + layout.SG_LIVE

    def seal(self, slot: int, check: int) -> None:
        """Seal our message file in `slot` (nothing if the slot holds another now)."""
        if self.name(slot, check) is None:
            return
        at = self._at(slot)
        self.a.store(at + layout.SG_WRITER, self.a.load(at + layout.SG_WRITER) | layout.SEALED_BIT)

    def live(self, slot: int) -> int:
        value = self.a.load(self._at(slot) + layout.SG_LIVE)
        return value - (1 << 64) if value >= 1 << 63 else value

    def owned(self) -> list[tuple[int, MessageFileName, bool]]:
        """Our claimed slots: (slot, name, sealed)."""
        a, found = self.a, []
        # (Every second, by each worker's sweep: one load per free slot.)
        at = self._at(self.first) - layout.MESSAGE_FILE_SLOT_SIZE
        for slot in range(self.first, self.first + layout.MESSAGE_FILE_SLOTS):
            at += layout.MESSAGE_FILE_SLOT_SIZE
            word = a.load(at + layout.SG_NAME)
            if word:
                writer = a.load(at + layout.SG_WRITER)
                name = MessageFileName(word >> 32, (writer & 0xFFFFFFFF) - 1, word & 0xFFFFFFFF)
                found.append((slot, name, bool(writer & layout.SEALED_BIT)))
        return found

    def all_claimed(self) -> list[int]:
        """Every claimed slot, of every worker (for `shoal status`)."""
        a, offsets = self.a, self.layout
        slots = range(offsets.limits.max_workers * layout.MESSAGE_FILE_SLOTS)
        return [slot for slot in slots if a.load(self._at(slot) + layout.SG_NAME)]

    def free(self, slot: int) -> None:
        at = self._at(slot)
        self.a.store(at + layout.SG_NAME, 0)
        self.a.store(at + layout.SG_WRITER, 0)
        self.a.store(at + layout.SG_LIVE, 0)
