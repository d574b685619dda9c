"""What a clean stop leaves the next start about the message store: which
live persistent messages may have been delivered. RabbitMQ flags only those
`redelivered` after a restart; so does Shoal after a clean stop. After a
crash there is no such file and every recovered message is flagged: the
safe rule (a delivery may have happened that nothing on disk records).

    <store dir>/clean-stop   a record file (store/records.py), one record
                             per entry that may have been delivered:
                             u64 PUBLISH record offset | u64 queue uid |
                             the segment's name (utf-8)

The supervisor writes it once every IO worker and the scheduler stopped by
themselves (their settles written and synced), from the queue logs in
shared memory (shm/recovery.py delivered_entries). The next start's
recovery takes it (`take`): reads it and removes it, synced, before it
appends a message, so that a crash later in that run is never read as a
clean stop.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

from shoal.store import records

MAGIC = b"SHOALC"
VERSION = 1
FILE = "clean-stop"
_ENTRY = struct.Struct("<QQ")

# (segment name, PUBLISH record offset, queue uid)
Delivered = tuple[str, int, int]


def write(directory: str, delivered: Iterable[Delivered]) -> None:
    """The clean stop's record of what may have been delivered (all of it
    durable when this returns)."""
    payloads = [_ENTRY.pack(offset, uid) + name.encode() for name, offset, uid in delivered]
    records.replace_records(os.path.join(directory, FILE), MAGIC, VERSION, payloads).close()


def take(directory: str) -> set[Delivered] | None:
    """What the last clean stop recorded, the file removed (and the removal
    synced); None if the last stop was not clean (no file, or one that does
    not read whole)."""
    path = os.path.join(directory, FILE)
    if not os.path.exists(path):
        return None
    delivered: set[Delivered] | None = None
    try:
        file, payloads, skipped = records.open_records(path, MAGIC, VERSION)
        file.close()
        if skipped is None:
            delivered = set()
            for payload in payloads:
                offset, uid = _ENTRY.unpack_from(payload)
                delivered.add((payload[_ENTRY.size :].decode(), offset, uid))
    except (OSError, ValueError, records.FormatError, struct.error):
        delivered = None
    os.unlink(path)
    records.sync_directory(directory)
    return delivered
