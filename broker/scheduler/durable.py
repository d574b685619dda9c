"""The durable definitions: what of the definitions outlives the broker.

As RabbitMQ keeps them: virtual hosts, durable exchanges, durable queues
that are not exclusive (with their arguments), bindings whose source and
destination are both durable, and policies. Everything else vanishes with
the broker.

They live in `definitions.log` in the data directory, a record file
(store/records.py) of the journal's operations (broker/amqp/definitions.py)
plus two of its own, for queues, which the shared-memory journal does not
carry (queues live in the queue table there). A durable queue's uid (63
random bits) names it in the message store (docs/durability.md): a queue
deleted and declared again is another queue, and never inherits messages.

    D  QueueDeclared  vhost, queue, auto_delete, arguments, uid
    R  QueueDeleted   vhost, queue: and every binding to it
    I  UsersSeeded    vhost: the default user was made, in this vhost (once, at
                      the first start: deleting every user does not bring it back)

Users, their permissions and vhost limits are kept here too (as RabbitMQ
keeps them in its database, with the password hashes only).

The scheduler, the only writer, appends a change's record and fdatasyncs it
before the change's -ok reply (journal.py, queues.py). At every start it
replays the log and writes it again as a snapshot of what it then holds
(`rewrite`), which also drops a change that a scheduler killed between the
queue table and the log had left half done; it does the same once the
appended records outgrow the snapshot (`needs_compaction`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Union

import msgspec

from shoal.broker.amqp import access, definitions_json
from shoal.broker.amqp import definitions as D
from shoal.store import records

log = logging.getLogger("shoal.scheduler")

MAGIC = b"SHOALD"
VERSION = 1
FILENAME = "definitions.log"
MIN_COMPACTION_BYTES = 1 << 20
RETRY_INTERVAL = 1.0  # seconds between tries of a rewrite that failed (a full disk)


class QueueDeclared(D.Operation, tag="D"):
    queue: str
    auto_delete: bool
    arguments: dict[str, Any]
    uid: int


def new_uid() -> int:
    """A durable queue's uid: 63 random bits, never 0."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1


class QueueDeleted(D.Operation, tag="R"):
    queue: str


class UsersSeeded(D.Operation, tag="I"):
    pass


Record = Union[  # noqa: UP007 (a Union: mypy takes it as a type alias)
    D.VHostAdded,
    D.ExchangeDeclared,
    D.ExchangeDeleted,
    D.Bound,
    D.Unbound,
    QueueDeclared,
    QueueDeleted,
    D.PolicySet,
    D.PolicyCleared,
    D.VHostDeleted,
    D.VHostLimitsSet,
    D.UserSet,
    D.UserDeleted,
    D.PermissionSet,
    D.PermissionCleared,
    D.TopicPermissionSet,
    D.TopicPermissionCleared,
    UsersSeeded,
]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Record).decode


class UnreadableDefinitions(Exception):
    """definitions.log is not a log this version can read, or what it holds
    does not fit in the definitions journal: the broker does not start
    (rather than start without the definitions it promised)."""


def load_definitions_file(path: str) -> dict[str, Any]:
    """--load-definitions: RabbitMQ's definitions JSON, checked as an import
    checks it (broker/amqp/definitions_json.py). Unreadable, it stops the
    broker at start (RabbitMQ's node does not boot either)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        definitions: dict[str, Any] = msgspec.json.decode(raw)
        definitions_json.parse(definitions)
    except (OSError, msgspec.DecodeError, definitions_json.DefinitionsError) as exc:
        raise UnreadableDefinitions(f"--load-definitions {path}: {exc}") from None
    return definitions


class Restored:
    """The durable definitions as the log left them."""

    __slots__ = ("definitions", "queues", "seeded")

    def __init__(self) -> None:
        self.definitions = D.Definitions()  # vhosts, exchanges, bindings, users
        self.queues: dict[tuple[str, str], QueueDeclared] = {}  # in declaration order
        self.seeded = False

    def apply(self, record: Record) -> None:
        if isinstance(record, UsersSeeded):
            self.seeded = True
        elif isinstance(record, D.VHostDeleted):
            for key in [key for key in self.queues if key[0] == record.vhost]:
                del self.queues[key]
            self.definitions.apply(record)
        elif isinstance(record, QueueDeclared):
            self.queues[(record.vhost, record.queue)] = record
        elif isinstance(record, QueueDeleted):
            self.queues.pop((record.vhost, record.queue), None)
            self.definitions.apply(D.QueueGone(record.vhost, record.queue))
        else:
            self.definitions.apply(record)

    def operations(
        self, default_vhost: str, default_user: str = "", default_pass: str = ""
    ) -> list[D.Op]:
        """Vhosts, exchanges, bindings and users as journal operations. At
        the first start (an empty log, or one from before users were kept):
        the default vhost with its amq.* exchanges, and the default user,
        an administrator with every permission in it (RabbitMQ's first
        boot). Later, the default vhost only if the log has none at all."""
        ops = self.definitions.snapshot()
        ids = self.definitions.vhost_ids
        if not self.seeded:
            if default_vhost not in ids:
                ops[:0] = D.new_vhost_ops(default_vhost, max(ids.values(), default=-1) + 1)
            if default_user:
                password_hash = access.hash_password(default_pass)
                admin = ["administrator"]
                ops.append(D.UserSet(default_user, password_hash, access.SHA256, admin, {}))
                ops.append(D.PermissionSet(default_vhost, default_user, ".*", ".*", ".*"))
            self.seeded = True
        return ops


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
    restored = Restored()
    for payload in payloads:
        try:
            restored.apply(_decode(payload))
        except (msgspec.DecodeError, ValueError):
            break  # the scheduler's own reading stops the broker for that
    return {queue.uid for queue in restored.queues.values()}


class DefinitionsLog:
    """definitions.log, open for appending."""

    __slots__ = ("dirty", "file", "retry_at", "snapshot_size")

    def __init__(self, file: records.RecordFile) -> None:
        self.file = file
        self.snapshot_size = file.size
        # A write failed: the file may disagree with what holds (a record
        # written but not synced, a removal not written). It is rewritten
        # from memory before anything is appended again.
        self.dirty = False
        self.retry_at = 0.0  # after a failed rewrite: not before (time.monotonic)

    @classmethod
    def open(cls, data_dir: str) -> tuple[DefinitionsLog, Restored]:
        path = os.path.join(data_dir, FILENAME)
        try:
            file, payloads, skipped = records.open_records(path, MAGIC, VERSION)
        except records.FormatError as exc:
            raise UnreadableDefinitions(str(exc)) from None
        if skipped is not None:
            log.warning(
                "%s: skipped %d bytes at offset %d (%s): a change cut short by a crash, "
                "never acknowledged",
                path,
                skipped.size,
                skipped.offset,
                skipped.reason,
            )
        restored = Restored()
        for number, payload in enumerate(payloads):
            try:
                restored.apply(_decode(payload))
            except (msgspec.DecodeError, ValueError) as exc:
                file.close()
                raise UnreadableDefinitions(f"{path}: record {number}: {exc}") from None
        return cls(file), restored

    def write(self, *changes: Record) -> None:
        """Append changes and make them durable (before their -ok). Only
        when not `dirty` (the caller rewrites first)."""
        try:
            self.file.append([_encode(change) for change in changes])
            self.file.sync()
        except OSError:
            self.dirty = True
            raise

    def rewrite(self, snapshot: list[Record]) -> None:
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
