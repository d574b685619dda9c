"""definitions.log: the file of the durable definitions (docs/durability.md).

What of the definitions outlives the broker, and which change is durable,
is the scheduler's (broker/scheduler/durable.py); this module keeps the
file: its format, appending a change durably, replacing the log with a
snapshot (compaction), and reading it back.

It is a record file (store/records.py) of msgpack records, each a msgspec
Struct encoded as an array led by its letter: the journal's operations
(broker/amqp/definitions.py) plus the log's own, for queues, which the
shared-memory journal does not carry (queues live in the queue table
there). The queue records are defined here because the message store names
a queue by its uid: workers read which uids are durable (`logged_queue_uids`)
without the scheduler's types.

    D  QueueDeclared  vhost, queue, auto_delete, arguments, uid
    R  QueueDeleted   vhost, queue: and every binding to it
    I  UsersSeeded    vhost: the default user was made, in this vhost (once, at
                      the first start: deleting every user does not bring it back)

A durable queue's uid (63 random bits) names it in the message store: a
queue deleted and declared again is another queue, and never inherits
messages.

A change is appended and fdatasync'd before its -ok. A failed write or sync
refuses the change (the caller answers with an error: nothing unsynced is
confirmed) and marks the log `dirty`: no later sync of that file is trusted,
and the log is replaced whole from memory (a new file, synced, renamed)
before anything is appended again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from shoal.store import records

MAGIC = b"SHOALD"
VERSION = 1
FILENAME = "definitions.log"
MIN_COMPACTION_BYTES = 1 << 20
RETRY_INTERVAL = 1.0  # seconds between tries of a rewrite that failed (a full disk)


class _LogRecord(msgspec.Struct, array_like=True, gc=False):
    """Encoded as the journal's operations are (broker/amqp/definitions.py
    Operation): a msgpack array led by the record's letter, then its vhost."""

    vhost: str


class QueueDeclared(_LogRecord, tag="D"):
    queue: str
    auto_delete: bool
    arguments: dict[str, Any]
    uid: int


class QueueDeleted(_LogRecord, tag="R"):
    queue: str


class UsersSeeded(_LogRecord, tag="I"):
    pass


class _VHostDeleted(_LogRecord, tag="V"):
    """broker/amqp/definitions.py VHostDeleted, as far as queues go: it takes
    the vhost's queues with it."""


_queue_records = msgspec.msgpack.Decoder(QueueDeclared | QueueDeleted | _VHostDeleted).decode
_encode = msgspec.msgpack.Encoder().encode


def logged_queue_uids(data_dir: str) -> set[int]:
    """The uids of every durable queue definitions.log holds, declared at
    this start or not (a lowered --max-queues), read without writing: the
    message store's recovery keeps the messages of the latter on disk."""
    try:
        with open(os.path.join(data_dir, FILENAME), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    payloads, _end, _reason = records.decode_all(data, records.HEADER_SIZE)
    queues: dict[tuple[str, str], int] = {}
    for payload in payloads:
        try:
            record = _queue_records(payload)
        except msgspec.ValidationError:
            continue  # a record of the journal's, not about queues
        except msgspec.DecodeError:
            break  # the scheduler's own reading stops the broker for that
        if isinstance(record, QueueDeclared):
            queues[(record.vhost, record.queue)] = record.uid
        elif isinstance(record, QueueDeleted):
            queues.pop((record.vhost, record.queue), None)
        else:
            for key in [key for key in queues if key[0] == record.vhost]:
                del queues[key]
    return set(queues.values())


class DefinitionsLog:
    """definitions.log, open for appending (by its one writer, the scheduler)."""

    __slots__ = ("dirty", "file", "retry_at", "snapshot_size")

    def __init__(self, file: records.RecordFile) -> None:
        self.file = file
        self.snapshot_size = file.size
        # A write failed: the file may disagree with memory (a record
        # written but not synced, a removal not written). It is rewritten
        # from memory before anything is appended again.
        self.dirty = False
        self.retry_at = 0.0  # after a failed rewrite: not before (time.monotonic)

    @classmethod
    def open(cls, data_dir: str) -> tuple[DefinitionsLog, list[bytes], records.Skipped | None]:
        """The log (made if missing), its records' payloads, and what was cut
        off its tail (a change cut short by a crash, never acknowledged).
        Raises records.FormatError for a file this version cannot read."""
        path = os.path.join(data_dir, FILENAME)
        file, payloads, skipped = records.open_records(path, MAGIC, VERSION)
        return cls(file), payloads, skipped

    @property
    def path(self) -> str:
        return self.file.path

    def write(self, *changes: msgspec.Struct) -> None:
        """Append changes and make them durable (before their -ok). Only
        when not `dirty` (the caller rewrites first)."""
        try:
            self.file.append([_encode(change) for change in changes])
            self.file.sync()
        except OSError:
            self.dirty = True
            raise

    def rewrite(self, snapshot: Iterable[msgspec.Struct]) -> None:
        """Put a snapshot of the whole state in place of the log."""
        old = self.file
        try:
            self.file = records.replace_records(
                old.path, MAGIC, VERSION, [_encode(r) for r in snapshot]
            )
        except records.ReplacedUnsynced as exc:
            self.file = exc.file  # the old file is gone from the directory
            old.close()
            self.dirty = True
            self.retry_at = time.monotonic() + RETRY_INTERVAL
            raise
        except OSError:
            self.dirty = True
            self.retry_at = time.monotonic() + RETRY_INTERVAL
            raise
        old.close()
        self.snapshot_size = self.file.size
        self.dirty = False

    def needs_compaction(self) -> bool:
        """Time for a rewrite (a dirty log, or appends that outgrew the
        snapshot), unless one failed less than RETRY_INTERVAL ago."""
        if self.retry_at and time.monotonic() < self.retry_at:
            return False
        return self.dirty or self.file.size > max(MIN_COMPACTION_BYTES, 2 * self.snapshot_size)

    def close(self) -> None:
        self.file.close()
