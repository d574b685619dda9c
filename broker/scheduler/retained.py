"""MQTT retained messages (issue 41): per vhost, the last message published
with RETAIN to each topic, handed to a new subscription whose filter matches
it (workers/mqtt_connection.py).

The scheduler keeps them because every IO worker's clients publish and
subscribe: a PUBLISH with RETAIN asks it to keep the message (ipc.Retain), a
subscription asks for what its filter matches (ipc.RetainedFor). They are
kept in `<data>/mqtt-retained`, written whole at most FLUSH_S after a change
(store/records.py replace_file: a temporary file, synced, renamed, the
directory synced; a cluster's followers have it too), and each ipc.Retain is
answered once the write that holds it is done: the publisher's PUBACK waits
for it, so a retained message a client was told of outlives a crash (RabbitMQ's
retainer syncs on a timer and answers at once). The changes of FLUSH_S share
one write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import msgspec

from shoal.broker import ipc
from shoal.broker.mqtt.topics import matches
from shoal.store.records import replace_file

log = logging.getLogger("shoal.scheduler")

FLUSH_S = 0.1
FILE = "mqtt-retained"

_Kept = list[tuple[str, ipc.RetainedMessage]]  # (vhost, message), the file's shape


Reply = Callable[[int, int, ipc.Answer], None]  # (worker, req, answer)


class RetainedMessages:
    def __init__(
        self,
        data_path: str,
        loop: asyncio.AbstractEventLoop,
        reply: Reply,
        counted: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.path = os.path.join(data_path, FILE)
        self.loop = loop
        self.reply = reply
        # Told how many are kept at every change (the header's H_RETAINED:
        # workers ask for a new subscription's only while some are kept).
        self.counted = counted
        self.waiting: list[tuple[int, int]] = []  # (worker, req) answered at the next write
        self.by_topic: dict[tuple[str, str], ipc.RetainedMessage] = {}
        self.flushing: asyncio.TimerHandle | None = None
        try:
            with open(self.path, "rb") as f:
                kept = msgspec.msgpack.decode(f.read(), type=_Kept)
        except FileNotFoundError:
            kept = []
        except (OSError, msgspec.DecodeError) as exc:
            log.error("MQTT retained messages not read from %s: %s", self.path, exc)
            kept = []
        for vhost, message in kept:
            self.by_topic[(vhost, message.topic)] = message
        counted(len(self.by_topic))

    def retain(self, worker: int, m: ipc.Retain) -> ipc.Ok | None:
        """Kept; answered (Ok) once on disk: None now, the reply at the write."""
        key = (m.vhost, m.message.topic)
        if m.message.payload:
            self.by_topic[key] = m.message
        elif self.by_topic.pop(key, None) is None:
            return ipc.Ok()  # (nothing kept there: nothing to write)
        self.counted(len(self.by_topic))  # (before the answer: see shm/layout.py H_RETAINED)
        self.waiting.append((worker, m.req))
        if self.flushing is None:
            self.flushing = self.loop.call_later(FLUSH_S, self.flush)
        return None

    def retained_for(self, worker: int, m: ipc.RetainedFor) -> ipc.RetainedList:
        """Those `m.topic_filter` matches in its vhost. One whose 5.0 expiry
        has passed is dropped here (from the file at the next write)."""
        now = int(time.time())
        found = []
        for key, message in list(self.by_topic.items()):
            if key[0] != m.vhost or not matches(m.topic_filter, key[1]):
                continue
            if message.expires_at and message.expires_at <= now:
                del self.by_topic[key]
            else:
                found.append(message)
        self.counted(len(self.by_topic))
        return ipc.RetainedList(found)

    def flush(self) -> None:
        self.flushing = None
        kept: _Kept = [(vhost, message) for (vhost, _t), message in self.by_topic.items()]
        waiting, self.waiting = self.waiting, []
        try:
            replace_file(self.path, msgspec.msgpack.encode(kept))
        except OSError as exc:
            log.error("MQTT retained messages not written to %s: %s", self.path, exc)
            for worker, req in waiting:
                self.reply(worker, req, ipc.Refused(541, "INTERNAL_ERROR - retained not written"))
            return
        for worker, req in waiting:
            self.reply(worker, req, ipc.Ok())
