"""The message store's files: message files of PUBLISH records (`.seg`, a name
kept from when they were called segments), each written by one IO worker,
and per message file one file of SETTLE records per worker that
settled something in it (docs/durability.md, "The message store").

    <dir>/<name>.seg              PUBLISH records (record files, records.py)
    <dir>/<name>.acks.<writer>    SETTLE records for that message file

PUBLISH  u8 'P' | u16 n | n x (u64 queue uid, u8 level, u32 epoch, u64 seq) | message
         `message` is the body block's payload as shared memory holds it
         (shm/layout.py MSG_PREFIX, exchange, routing key, properties, body):
         written once, whatever the number of durable queues it went to.
AMEND    u8 'A' | u64 offset of a PUBLISH record in this message file | u16 n | n x entry
         the entries the PUBLISH record left PENDING (their queues were full)
SETTLE   u8 'S' | u64 offset of the PUBLISH record in its message file | u64 queue uid
SETTLES  u8 'T' | n x (u64 offset, u64 queue uid): SETTLE records in one
         (what one flush of a worker's acks settled in the message file; one
         checksum for them all, where SETTLE records cost one each)

A message file is deleted by unlinking the `.seg` first, then its ack files: a
crash in between leaves acks of nothing (removed by the next recovery),
never a message file without its acks. Recovery (`recover`) reads everything
back and returns, per queue and level, the live messages in queue order:
(epoch, seq), the broker start and the entry's place in its log.

This module keeps the format and the reading; which worker writes what,
when it syncs and when a message file may go belong to the workers.
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

from shoal.store import records, replica

MESSAGE_FILE_MAGIC = b"SHOALM"
ACKS_MAGIC = b"SHOALA"
VERSION = 1
MESSAGE_FILE_BYTES = 8 << 20  # a message file is sealed once it is this large
ZEROS_AHEAD = 1 << 20  # written past a message file's last record (RecordFile.zeros_ahead)
# The seq of an entry whose append failed (the queue refused the message, or
# was deleted meanwhile): its record was reserved for it, recovery skips it.
UNAPPENDED = (1 << 64) - 1
# The seq of an entry whose append waited for room in a full queue when its
# record was written: an AMEND record later in the same message file gives its
# (epoch, seq); without one, the append never happened.
PENDING = (1 << 64) - 2

_KIND = struct.Struct("<cH")
_AMEND = struct.Struct("<cQH")
_ONE = struct.Struct("<cHQBIQ")  # a PUBLISH record's head with one entry (the usual case)
_ENTRY = struct.Struct("<QBIQ")
_SETTLE = struct.Struct("<cQQ")


class Entry(NamedTuple):
    """A message's place in one durable queue."""

    uid: int  # the queue's uid (definitions.log)
    level: int  # its priority level (0 for a queue without priorities)
    epoch: int  # the broker start that appended it
    seq: int  # its sequence number in that level's log then


def publish_size(entries: int, message_len: int) -> int:
    """The bytes a PUBLISH record of `entries` queues takes in its message file."""
    return records.RECORD_OVERHEAD + _KIND.size + entries * _ENTRY.size + message_len


def parse_message_file_name(message_file: str) -> tuple[int, int, int]:
    """(epoch, writer, counter) of a message_file_name()."""
    epoch, writer, counter = message_file.split("-")
    return int(epoch), int(writer), int(counter)


def encode_publish(entries: Iterable[Entry], message: bytes | memoryview) -> bytes:
    entries = list(entries)
    if len(entries) == 1:  # the usual case: one durable queue
        return b"".join((_ONE.pack(b"P", 1, *entries[0]), message))
    head = _KIND.pack(b"P", len(entries)) + b"".join(_ENTRY.pack(*e) for e in entries)
    return b"".join((head, message))


def encode_publish_one(
    uid: int, level: int, epoch: int, seq: int, message: bytes | memoryview
) -> bytes:
    """encode_publish of one entry (the usual case), without the Entry."""
    return _ONE.pack(b"P", 1, uid, level, epoch, seq) + message


def encode_amend(offset: int, entries: Iterable[Entry]) -> bytes:
    entries = list(entries)
    return _AMEND.pack(b"A", offset, len(entries)) + b"".join(_ENTRY.pack(*e) for e in entries)


def decode_amend(payload: bytes) -> tuple[int, list[Entry]]:
    """Raises ValueError for anything but an AMEND record."""
    try:
        kind, offset, n = _AMEND.unpack_from(payload)
        if kind != b"A":
            raise ValueError(f"not an AMEND record: {kind!r}")
        at = _AMEND.size
        return offset, [Entry(*_ENTRY.unpack_from(payload, at + i * _ENTRY.size)) for i in range(n)]
    except struct.error as exc:
        raise ValueError(f"AMEND record cut short: {exc}") from None


def amend_size(entries: int) -> int:
    return records.RECORD_OVERHEAD + _AMEND.size + entries * _ENTRY.size


def decode_publish(payload: bytes) -> tuple[list[Entry], memoryview]:
    """Raises ValueError for anything but a PUBLISH record."""
    try:
        kind, n = _KIND.unpack_from(payload)
        if kind != b"P":
            raise ValueError(f"not a PUBLISH record: {kind!r}")
        at = _KIND.size
        entries = []
        for _ in range(n):
            entries.append(Entry(*_ENTRY.unpack_from(payload, at)))
            at += _ENTRY.size
    except struct.error as exc:
        raise ValueError(f"PUBLISH record cut short: {exc}") from None
    return entries, memoryview(payload)[at:]


def encode_settle(offset: int, uid: int) -> bytes:
    return _SETTLE.pack(b"S", offset, uid)


_PAIR = struct.Struct("<QQ")


def encode_settles(settled: list[tuple[int, int]]) -> bytes:
    """One SETTLES record of (PUBLISH offset, queue uid) pairs."""
    return b"T" + b"".join(_PAIR.pack(offset, uid) for offset, uid in settled)


def decode_settles(payload: bytes) -> list[tuple[int, int]]:
    """The pairs of a SETTLE or SETTLES record. Raises ValueError for
    anything else."""
    if payload[:1] == b"T" and len(payload) % _PAIR.size == 1:
        return list(_PAIR.iter_unpack(memoryview(payload)[1:]))
    return [decode_settle(payload)]


def decode_settle(payload: bytes) -> tuple[int, int]:
    """Raises ValueError for anything but a SETTLE record."""
    try:
        kind, offset, uid = _SETTLE.unpack(payload)
    except struct.error as exc:
        raise ValueError(f"not a SETTLE record: {exc}") from None
    if kind != b"S":
        raise ValueError(f"not a SETTLE record: {kind!r}")
    return offset, uid


def store_directory(data_dir: str) -> str:
    """The message store's directory in a data directory (made if missing)."""
    path = os.path.join(data_dir, "msgs")
    os.makedirs(path, exist_ok=True)
    return path


def message_file_name(epoch: int, writer: int, counter: int) -> str:
    """Unique in a data directory: the broker start, the IO worker, its count."""
    return f"{epoch:010d}-{writer:04d}-{counter:08d}"


def message_file_path(directory: str, message_file: str) -> str:
    return os.path.join(directory, message_file + ".seg")


def acks_path(directory: str, message_file: str, writer: int) -> str:
    return os.path.join(directory, f"{message_file}.acks.{writer}")


class MessageFileWriter:
    """The message file an IO worker appends its PUBLISH records to."""

    __slots__ = ("file", "message_file")

    def __init__(self, directory: str, message_file: str) -> None:
        self.message_file = message_file
        self.file, existing, _skipped = records.open_records(
            message_file_path(directory, message_file), MESSAGE_FILE_MAGIC, VERSION
        )
        if existing:
            self.file.close()
            raise FileExistsError(f"message file {message_file} already holds records")
        if replica.link is None:
            self.file.zeros_ahead(ZEROS_AHEAD)

    @property
    def size(self) -> int:
        return self.file.size

    def append(self, payloads: list[bytes]) -> list[int]:
        """Write PUBLISH records (durable after a sync of `file.fd`);
        returns each record's offset, by which SETTLE records name it."""
        offsets = []
        at = self.file.size
        for payload in payloads:
            offsets.append(at)
            at += records.RECORD_OVERHEAD + len(payload)
        self.file.append(payloads)
        return offsets

    def append_framed(self, data: bytes) -> None:
        """PUBLISH records framed already (records.encode's bytes, joined:
        Persister's, and a publish lane's run, workers/_wire.c)."""
        self.file.append_framed(data)

    def full(self) -> bool:
        return self.file.size >= MESSAGE_FILE_BYTES


class AckWriter:
    """One worker's SETTLE records for one message file."""

    __slots__ = ("file",)

    def __init__(self, directory: str, message_file: str, writer: int) -> None:
        self.file, _existing, _skipped = records.open_records(
            acks_path(directory, message_file, writer), ACKS_MAGIC, VERSION
        )

    def settle(self, settled: Iterable[tuple[int, int]]) -> None:
        """(offset, queue uid) pairs: those entries are gone."""
        self.file.append([encode_settles(list(settled))])


def delete_message_file(directory: str, message_file: str, acks: list[str] | None = None) -> None:
    """The message file first, then its ack files (see the module docstring):
    `acks` their names if the caller knows them, else the directory says."""
    try:
        os.unlink(message_file_path(directory, message_file))
    except FileNotFoundError:
        pass
    records.sync_directory(directory)  # the message file's unlink reaches the disk first
    if acks is None:
        prefix = message_file + ".acks."
        acks = [name for name in os.listdir(directory) if name.startswith(prefix)]
    for name in acks:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


# A live message of one queue level, as recovery found it: (epoch, seq,
# message file, record offset, message). A plain tuple, not a NamedTuple: a
# recovery makes millions, and a NamedTuple's __new__ costs 2 us each.
Live = tuple[int, int, str, int, memoryview]
EPOCH, SEQ, MESSAGE_FILE, OFFSET, MESSAGE = range(5)


class Recovered(NamedTuple):
    queues: dict[tuple[int, int], list[Live]]  # (uid, level) -> live messages in order
    kept: dict[str, int]  # message file -> live entries of the `keep` uids (not loaded)
    skipped: list[tuple[str, records.Skipped]]  # torn tails cut off, per file
    removed: list[
        str
    ]  # files removed: acks of deleted message files, message files with nothing live


def recover(
    directory: str,
    uids: set[int],
    before_epoch: int | None = None,
    keep: frozenset[int] | set[int] = frozenset(),
) -> Recovered:
    """Read every message file and ack file of `directory`: the live messages of
    the queues whose uids are given, per queue and level in (epoch, seq)
    order. Entries of the `keep` uids (queues that exist but are not loaded
    now) are only counted, per message file; entries of other uids (deleted
    queues) are dead. A message file with nothing live or kept is deleted, and so
    are ack files of no message file. With `before_epoch`, files of that start
    and later ones are left alone."""

    def earlier(message_file: str) -> bool:
        try:
            epoch = parse_message_file_name(message_file)[0]
        except ValueError:
            return False  # not ours
        return before_epoch is None or epoch < before_epoch

    names = sorted(os.listdir(directory))
    message_files = [n[: -len(".seg")] for n in names if n.endswith(".seg") and earlier(n[:-4])]
    acks: dict[str, list[str]] = {}
    for name in names:
        if ".acks." in name and earlier(name.split(".acks.")[0]):
            acks.setdefault(name.split(".acks.")[0], []).append(name)
    skipped: list[tuple[str, records.Skipped]] = []
    removed: list[str] = []
    for orphan in set(acks) - set(message_files):
        for name in acks[orphan]:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
    queues: dict[tuple[int, int], list[Live]] = {}
    kept: dict[str, int] = {}
    for message_file in message_files:
        settled: set[tuple[int, int]] = set()
        for name in acks.get(message_file, []):
            payloads = _read(os.path.join(directory, name), ACKS_MAGIC, skipped)
            for p in payloads:
                settled.update(decode_settles(p))
        live = 0
        payloads = _read(message_file_path(directory, message_file), MESSAGE_FILE_MAGIC, skipped)
        amended: dict[tuple[int, int], Entry] = {}  # (PUBLISH offset, uid) -> entry
        for payload in payloads:
            if payload[:1] == b"A":
                target, late = decode_amend(payload)
                amended.update(((target, e.uid), e) for e in late)
        offset = records.HEADER_SIZE
        one, one_size = _ONE.unpack_from, _ONE.size
        for payload in payloads:
            if payload[0] == 0x50 and payload[1] == 1 and payload[2] == 0:  # 'P', one entry
                _kind, _n, uid, level, epoch, seq = one(payload)
                if seq == PENDING and (offset, uid) in amended:
                    uid, level, epoch, seq = amended[(offset, uid)]
                if uid in keep and seq < PENDING and (offset, uid) not in settled:
                    kept[message_file] = kept.get(message_file, 0) + 1
                elif uid in uids and seq < PENDING and (offset, uid) not in settled:
                    message = memoryview(payload)[one_size:]
                    got = queues.get((uid, level))
                    if got is None:
                        got = queues[(uid, level)] = []
                    got.append((epoch, seq, message_file, offset, message))
                    live += 1
            elif payload[:1] != b"A":
                entries, message = decode_publish(payload)
                for entry in entries:
                    if entry.seq == PENDING:
                        entry = amended.get((offset, entry.uid), entry)
                    uid, level, epoch, seq = entry
                    if uid in keep and seq < PENDING and (offset, uid) not in settled:
                        kept[message_file] = kept.get(message_file, 0) + 1
                    elif uid in uids and seq < PENDING and (offset, uid) not in settled:
                        queues.setdefault((uid, level), []).append(
                            (epoch, seq, message_file, offset, message)
                        )
                        live += 1
            offset += records.RECORD_OVERHEAD + len(payload)
        if not live and message_file not in kept:
            delete_message_file(directory, message_file, acks.get(message_file, []))
            removed.append(message_file + ".seg")
    for messages in queues.values():
        messages.sort(key=_queue_order)
    return Recovered(queues, kept, skipped, removed)


_queue_order = operator.itemgetter(EPOCH, SEQ)


def _read(path: str, magic: bytes, skipped: list[tuple[str, records.Skipped]]) -> list[bytes]:
    file, payloads, cut = records.open_records(path, magic, VERSION)
    file.close()
    if cut is not None and cut.reason != records.ZERO_TAIL:  # zeros: written ahead, no record
        skipped.append((os.path.basename(path), cut))
    return payloads
