"""An IO worker's side of the message store (docs/durability.md): the PUBLISH
records of its persistent messages, its SETTLE records, group commit, and
deleting the message files it owns once nothing points into them.

A persistent message routed to a durable queue reserves its record before
it is appended (`reserve`: the record's offset is known, the body block is
tagged with it and the message file counts its entries), so that whoever acks
one of its entries, on any worker, can name the record. Once the appends
are done the record is complete (`complete`); at the end of the loop
iteration `flush` writes the complete records, in order, with one write,
and asks the sync thread (store/sync.py) to make them durable. A channel's
confirms wait for that (workers/channel_state.py `confirmable`).

Records are written in reservation order: one whose appends wait for room
in a full queue holds back the records reserved after it (their confirms
wait with it). That ends with backlogs on disk (issue 13, item 6).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import NoReturn, Protocol

from shoal.shm import stats
from shoal.shm.arena import message_size, record_bytes, write_tag
from shoal.shm.message_files import MessageFileName, MessageFileTable, check_of
from shoal.shm.processes import Header
from shoal.shm.queues import APPENDED, OVER_CAPACITY, REMOVED, SharedQueues
from shoal.shm.segment import Segment
from shoal.store import messages, records
from shoal.store.messages import PENDING, UNAPPENDED, Entry, encode_amend, encode_publish
from shoal.store.records import encode as encode_record
from shoal.store.settles import SettleWriter
from shoal.store.sync import GroupSync, durability_lost
from shoal.workers.pending import Pending
from shoal.workers.ticker import on_grid

log = logging.getLogger("shoal.worker")

SWEEP_INTERVAL = 1.0  # how often the owner looks for message files to delete


class Confirming(Protocol):
    """A channel whose confirms wait for a sync."""

    def synced(self) -> bool:
        """Send what the sync allows; True if it still waits for a later one."""
        ...


class _MessageFile:
    __slots__ = ("check", "slot", "writer")

    def __init__(self, writer: messages.MessageFileWriter, slot: int, check: int) -> None:
        self.writer = writer
        self.slot = slot
        self.check = check


class _Record:
    __slots__ = ("count", "index", "message_file", "payload")

    def __init__(self, index: int, message_file: _MessageFile) -> None:
        self.index = index
        self.message_file = message_file
        # Framed (store/records.py encode); None until its appends are done.
        self.payload: bytes | None = None
        self.count = 1  # the records in it: a publish lane's run has many


class StoreEvents(Protocol):
    """What the message store raises (workers/events.py names every event)."""

    def before_write(self) -> None:
        """Records are about to be written: what must be on disk no later
        than them goes first (the keys of their deduplication caches)."""


class Persister:
    def __init__(
        self,
        seg: Segment,
        worker: int,
        incarnation: int,
        directory: str,
        loop: asyncio.AbstractEventLoop,
        counters: list[int],
        events: StoreEvents | None = None,
    ) -> None:
        self.seg = seg
        self.events = events
        self.counters = counters  # the worker's statistics (shm/stats.py)
        self._syncs_counted = 0
        self.loop = loop
        self.directory = directory
        self.worker = worker
        self.epoch = Header(seg).epoch()
        self.table = MessageFileTable(seg, worker)
        self.settles = SettleWriter(directory, worker, self.table)
        # Counters in message file names: unique per incarnation of this worker.
        self._counter = (incarnation & 0xFFF) << 20
        for slot, name, sealed in self.table.owned():
            if not sealed:  # a predecessor's open message file: it writes no more
                self.table.seal(slot, check_of(name))
        self.message_file: _MessageFile | None = None  # where records are reserved
        self.reserved = 0  # end of the last reservation in it
        # Where a publish lane's run may put PUBLISH records (workers/lane.py,
        # Lane.store_window) but for `reserved`: the open message file's slot
        # and check, the epoch, the size at which reserve() opens the next
        # file, the header's size, the file's live-entry count's offset;
        # None before the first file is opened. Attributes, not a call: the
        # lane reads them before each read's scan.
        self.window: tuple[int, int, int, int, int, int] | None = None
        self._synced_file: _MessageFile | None = None  # the file `sync` syncs
        self.sync: GroupSync | None = None
        self.records: deque[_Record] = deque()
        self.next_index = 0  # records [0, next_index) reserved
        self.written = 0  # records [0, written) written
        self.synced = 0  # records [0, synced) durable: their confirms may go
        # (upto, records written) of each write not yet synced: the records
        # counted as synced (a publish lane's run is one index, many records).
        self._written_counts: deque[tuple[int, int]] = deque()
        self.waiting: set[Confirming] = set()
        self._synced_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._flush_scheduled = False
        self._sweeper = loop.call_later(on_grid(loop, SWEEP_INTERVAL), self._sweep)

    # ------------------------------------------------------------ settles
    def settle(self, tag: tuple[int, int, int], uid: int) -> None:
        """The `settled` event (workers/events.py): this worker deleted a
        durable entry of a persistent message (an ack, a reject, a no-ack
        delivery, drop-head)."""
        self.settles.pending.append((tag, uid))
        self.schedule()

    def settle_many(self, settled: list[tuple[tuple[int, int, int], int]]) -> None:
        """settle() for each (tag, uid) of a multiple ack's run (workers/_wire.c
        ack_run)."""
        self.settles.pending += settled
        self.schedule()

    # ------------------------------------------------------------ publish
    def reserve(self, entries: int, message_len: int) -> tuple[int, int, int, int] | None:
        """Room for a PUBLISH record of `entries` durable queues: (record
        index, message file slot, check, offset), the last three for the tag.
        None if no message file slot is free (the caller waits and retries)."""
        size = messages.publish_size(entries, message_len)
        message_file = self.message_file
        if message_file is None or (
            self.reserved + size > messages.MESSAGE_FILE_BYTES
            and self.reserved > records.HEADER_SIZE
        ):
            message_file = self._open_file()
            if message_file is None:
                return None
        index, offset = self._add_record(message_file, size)
        self.table.add(message_file.slot, entries)
        return index, message_file.slot, message_file.check, offset

    def _add_record(self, message_file: _MessageFile, size: int) -> tuple[int, int]:
        offset = self.reserved
        self.reserved += size
        record = _Record(self.next_index, message_file)
        self.records.append(record)
        self.next_index += 1
        return record.index, offset

    def amend(self, slot: int, check: int, payload: bytes) -> int:
        """Write an AMEND record (store/messages.py) into the message file of the
        PUBLISH record it amends: the index of a record whose sync covers it,
        or -1 if it is durable already. Rare (a publish that waited for room
        in a full queue), so an older message file is reopened and synced here."""
        self.flush()  # nothing reserved is left behind: every record is complete
        message_file = self.message_file
        if message_file is not None and (message_file.slot, message_file.check) == (slot, check):
            index, _offset = self._add_record(message_file, len(payload) + records.RECORD_OVERHEAD)
            self.complete(index, payload)
            return index
        old = self._synced_file
        if old is not None and (old.slot, old.check) == (slot, check):
            file, close = old.writer.file, False  # rotated, not yet switched away from
        else:
            name = self.table.name(slot, check)
            assert name is not None  # the entries it amends keep it alive
            path = messages.message_file_path(self.directory, messages.message_file_name(*name))
            file, _records, _cut = records.open_records(
                path, messages.MESSAGE_FILE_MAGIC, messages.VERSION
            )
            close = True
        try:
            file.append([payload])
            file.sync()
        except OSError as exc:
            self._fatal(exc)
        finally:
            if close:
                file.close()
        return -1

    def _open_file(self) -> _MessageFile | None:
        self._counter += 1
        name = MessageFileName(self.epoch, self.worker, self._counter & 0xFFFFFFFF)
        slot = self.table.claim(name)
        if slot is None:
            log.error(
                "io-worker %d: all %d message file slots in use", self.worker, self.table.slots
            )
            return None
        try:
            writer = messages.MessageFileWriter(self.directory, messages.message_file_name(*name))
        except OSError as exc:
            self.table.free(slot)
            self._fatal(exc)
        self.message_file = _MessageFile(writer, slot, check_of(name))
        self.reserved = writer.size
        self.window = (
            slot,
            check_of(name),
            self.epoch,
            messages.MESSAGE_FILE_BYTES,
            records.HEADER_SIZE,
            self.table.live_word(slot),
        )
        return self.message_file

    def uncount(self, slot: int, entries: int = 1) -> None:
        """Reserved entries whose appends failed (the queue refused or was gone)."""
        self.table.add(slot, -entries)

    def complete(self, index: int, payload: bytes) -> None:
        records = self.records
        records[index - records[0].index].payload = encode_record(payload)
        self.schedule()

    # ---------------------------------------------- a publish lane's runs
    def add_run(self, framed: bytes, count: int, reserved: int) -> int:
        """A publish lane's run: `count` PUBLISH records, framed, reserved in
        the open message file from `reserved` (its store window's) with
        their entries counted, their messages tagged and appended. One
        record index for them all, returned: their confirms wait for its
        sync."""
        message_file = self.message_file
        assert message_file is not None and self.reserved == reserved, "a window moved"
        index, _offset = self._add_record(message_file, len(framed))
        record = self.records[-1]
        record.payload = framed
        record.count = count
        self.schedule()
        return index

    def wait(self, channel: Confirming) -> None:
        self.waiting.add(channel)

    # ------------------------------------------------------------ writing
    def schedule(self) -> None:
        """Flush at the end of this loop iteration (acks call it too)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        self.settles.flush()
        records = self.records
        batch: list[_Record] = []
        while records and records[0].payload is not None:
            record = records.popleft()
            if batch and record.message_file is not batch[0].message_file:
                self._write(batch)
                batch = []
            batch.append(record)
        if batch:
            if self.events is not None:
                self.events.before_write()
            self._write(batch)

    def _write(self, batch: list[_Record]) -> None:
        message_file = batch[0].message_file
        if message_file is not self._synced_file:
            self._switch(message_file)
        size = message_file.writer.size
        try:
            message_file.writer.append_framed(b"".join([r.payload for r in batch]))  # type: ignore[misc]
        except OSError as exc:
            self._fatal(exc)
        self.counters[stats.STORE_WRITTEN_BYTES] += message_file.writer.size - size
        upto = self.written = batch[-1].index + 1
        self._written_counts.append((upto, sum([r.count for r in batch])))
        loop = self.loop

        def done() -> None:  # on the sync thread
            try:
                loop.call_soon_threadsafe(self._synced, upto)
            except RuntimeError:  # the loop is closed: the worker is stopping
                pass

        assert self.sync is not None
        self.sync.request(done)

    def _switch(self, message_file: _MessageFile) -> None:
        """Records of a new message file: every sync of the old one runs first
        (set_fd waits for them), then the old one is sealed: once nothing
        points into it, its owner's sweep deletes it."""
        old = self._synced_file
        if self.sync is None:
            self.sync = GroupSync(
                message_file.writer.file.fd,
                name=f"shoal-sync-{self.worker}",
                what=f"io-worker {self.worker}: the message store failed",
            )
        else:
            self.sync.set_fd(message_file.writer.file.fd)
        if old is not None:
            old.writer.file.close()
            self.table.seal(old.slot, old.check)
        self._synced_file = message_file

    def _synced(self, upto: int) -> None:
        if upto <= self.synced:
            return
        counters = self.counters
        written, synced_records = self._written_counts, 0
        while written and written[0][0] <= upto:
            synced_records += written.popleft()[1]
        counters[stats.STORE_SYNCED_RECORDS] += synced_records
        syncs = self.sync.syncs if self.sync is not None else 0
        counters[stats.STORE_SYNCS] += syncs - self._syncs_counted
        self._syncs_counted = syncs
        self.synced = upto
        waiting, self.waiting = self.waiting, set()
        for channel in waiting:
            if channel.synced():
                self.waiting.add(channel)
        if self._synced_waiters:
            due = [w for w in self._synced_waiters if w[0] <= upto]
            self._synced_waiters = [w for w in self._synced_waiters if w[0] > upto]
            for _index, fut in due:
                if not fut.done():
                    fut.set_result(None)

    def _fatal(self, error: BaseException) -> NoReturn:
        """A write or a sync of the store failed: nothing can be confirmed
        any more (store/sync.py, the one rule for every durable write). The
        worker exits; its supervisor starts another, its clients reconnect
        and publish their unconfirmed messages again."""
        durability_lost(f"io-worker {self.worker}: the message store failed", error)

    async def durable(self, upto: int) -> None:
        """Return once records [0, upto) are durable, and every SETTLE this
        worker wrote (tx.commit)."""
        self.flush()
        self.settles.sync()
        if upto > self.synced:
            fut: asyncio.Future[None] = self.loop.create_future()
            self._synced_waiters.append((upto, fut))
            await fut

    # ------------------------------------------------------------ deleting
    def _sweep(self) -> None:
        """Delete our sealed message files that nothing points into any more;
        close ack files of message files deleted (by us or by their owners)."""
        self._sweeper = self.loop.call_later(on_grid(self.loop, SWEEP_INTERVAL), self._sweep)
        table = self.table
        open_ = self.message_file
        if (
            open_ is not None
            and not self.records
            and self.synced == self.written
            and self.reserved > records.HEADER_SIZE
            and table.live(open_.slot) <= 0
        ):
            # Drained: seal the open message file too (the next publish opens a
            # new one), so that disk use returns to its baseline.
            self.message_file = self.window = None  # (a publish lane's run stores nothing)
            if self._synced_file is open_:
                self._synced_file = None  # the next message file's first write seals nothing
            open_.writer.file.close()
            table.seal(open_.slot, open_.check)
        for slot, name, sealed in table.owned():
            if sealed and table.live(slot) <= 0:
                try:
                    messages.delete_message_file(self.directory, messages.message_file_name(*name))
                except OSError as exc:
                    log.error("cannot delete message file %s: %s", name, exc)
                    continue
                table.free(slot)
        self.settles.sweep()

    def close(self) -> None:
        """A clean stop: write what is buffered and wait for its sync."""
        self._sweeper.cancel()
        self.flush()
        self.settles.close()
        if self.sync is not None:
            self.sync.close()


# ------------------------------------------------- a publish's record
# The publish side of the message store, for a
# message that is persistent and routed to at least one durable queue
# (Pending.durable); workers/ingest.py calls these around its appends.
#
# `reserve` before the first append: the record's place is reserved and the
# body block tagged with it, so that an ack on any worker can name it.
# `appended` after each append to a durable queue: the entry's seq. `finish`
# once every append is done: the record is complete and is written at the
# end of the loop iteration. A queue that is full stops the appends half-way
# (`wait_for_room`): the record is completed at once with the entries still
# to do marked PENDING, so the worker's later records are not held behind it,
# and `finish` later writes an AMEND record with their seqs.


def _message_size(pending: Pending) -> int:
    """The message's bytes in its block (the tag excluded)."""
    return message_size(
        pending.exchange,
        pending.routing_key,
        pending.header,
        pending.body_size,
        pending.times is not None,
    )


def reserve(persist: Persister, shared: SharedQueues, pending: Pending) -> bool:
    """Reserve the record and tag the block (the queues not durable among
    the message's get no entry). False: no message file slot is free."""
    entries = {
        qid: (uid, shared.table.level(qid), UNAPPENDED)
        for qid in pending.qids
        if (uid := shared.table.uid(qid))
    }
    if entries:
        size = _message_size(pending)
        got = persist.reserve(len(entries), size)
        if got is None:
            return False
        pending.record, slot, check, offset = got
        pending.tag = (slot, check, offset)
        write_tag(persist.seg, pending.block, slot, check, offset)
    pending.entries = entries
    return True


def appended(
    persist: Persister, shared: SharedQueues, pending: Pending, qid: int, outcome: int
) -> None:
    """The append to durable queue `qid` is done: keep the entry's seq, or
    count the entry out of the message file if the queue refused the message or
    was gone."""
    entries = pending.entries
    assert entries is not None
    uid, level, _ = entries[qid]
    if outcome in (APPENDED, OVER_CAPACITY):
        entries[qid] = (uid, level, shared.last_seq)
    else:
        entries[qid] = (uid, level, UNAPPENDED)
        if outcome != REMOVED:  # remove() counted that one down itself
            persist.uncount(pending.tag[0])


def paged_out(pending: Pending, qid: int, tail: int) -> None:
    """The message went to a paging file for durable queue `qid`
    (workers/pager.py): the entry names the queue's tail at that moment,
    which puts it after every message the worker appended before it and
    before every one it appends after, in recovery's order."""
    entries = pending.entries
    assert entries is not None
    uid, level, _ = entries[qid]
    entries[qid] = (uid, level, tail)


def wait_for_room(persist: Persister, pending: Pending) -> None:
    """A queue is full: complete the record now (once), the entries not yet
    appended PENDING, and remember them for the AMEND record."""
    entries = pending.entries
    assert entries is not None
    if pending.late is not None:
        return
    pending.late = [qid for qid in pending.qids if qid in entries]
    for qid in pending.late:
        uid, level, _ = entries[qid]
        entries[qid] = (uid, level, PENDING)
    _complete(persist, pending)


def finish(persist: Persister, pending: Pending) -> None:
    """Every append is done."""
    if pending.late is None:
        _complete(persist, pending)
    else:
        _amend(persist, pending)


def abandon(persist: Persister, pending: Pending) -> None:
    """The message is dropped before all its appends (its channel closed):
    the entries never appended are counted out; those appended since the
    record was written get their AMEND record."""
    entries = pending.entries
    assert entries is not None
    for qid in pending.qids:
        if qid in entries:
            persist.uncount(pending.tag[0])
            uid, level, _ = entries[qid]
            entries[qid] = (uid, level, UNAPPENDED)
    if pending.late is None:
        _complete(persist, pending)
    else:
        _amend(persist, pending)


def _complete(persist: Persister, pending: Pending) -> None:
    entries = pending.entries
    assert entries is not None
    epoch = persist.epoch
    payload = encode_publish(
        [Entry(uid, level, epoch, seq) for uid, level, seq in entries.values()],
        record_bytes(persist.seg, pending.block, _message_size(pending)),
    )
    persist.complete(pending.record, payload)


def _amend(persist: Persister, pending: Pending) -> None:
    entries, late = pending.entries, pending.late
    assert entries is not None and late is not None
    epoch = persist.epoch
    done = [
        Entry(uid, level, epoch, seq)
        for qid in late
        for uid, level, seq in (entries[qid],)
        if seq < PENDING
    ]
    if done:
        slot, check, offset = pending.tag
        index = persist.amend(slot, check, encode_amend(offset, done))
        if index >= 0:
            pending.record = index  # the confirm waits for the AMEND's sync
