"""A clean stop's record for the next start (store/clean_stop.py): the
durable entries that may have been delivered, read from the queue logs once
the IO workers are gone, their message files named as the recovery names them."""

from __future__ import annotations

import logging
import os

from shoal.shm.message_files import MessageFileTable
from shoal.shm.recovery import delivered_entries
from shoal.shm.segment import Segment
from shoal.store import clean_stop
from shoal.store.messages import message_file_name

log = logging.getLogger("shoal.supervisor")


def record_clean_stop(seg: Segment, directory: str) -> None:
    """Write the record; a failure only costs the next start its exact
    flags (it flags every recovered message, as after a crash)."""
    if not os.path.isdir(directory):
        return  # no message store: nothing to recover
    table = MessageFileTable(seg, 0)  # any worker's view names any slot
    delivered = []
    for (slot, check, offset), uid in delivered_entries(seg):
        name = table.name(slot, check)
        if name is not None:
            delivered.append((message_file_name(*name), offset, uid))
    try:
        clean_stop.write(directory, delivered)
    except OSError as exc:
        log.error("the clean stop's record of delivered messages was not written: %s", exc)
