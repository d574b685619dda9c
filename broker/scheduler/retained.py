"""MQTT retained messages (issue 41): per vhost, the last message published
with RETAIN to each topic, handed to a new subscription whose filter matches
it (workers/mqtt_connection.py).

The scheduler keeps them because every IO worker's clients publish and
subscribe: a PUBLISH with RETAIN is a notice (ipc.Retain), a subscription
asks (ipc.RetainedFor). They are kept in `<data>/mqtt-retained`, written
whole at most every FLUSH_S after a change (store/records.py replace_file:
a temporary file, synced, renamed, the directory synced): a crash loses at most the last FLUSH_S of
changes, as RabbitMQ's retainer, whose store is synced on a timer too.
"""

from __future__ import annotations

import asyncio
import logging
import os

import msgspec

from shoal.broker import ipc
from shoal.broker.mqtt.topics import matches
from shoal.store.records import replace_file

log = logging.getLogger("shoal.scheduler")

FLUSH_S = 0.1
FILE = "mqtt-retained"

_Kept = list[tuple[str, ipc.RetainedMessage]]  # (vhost, message), the file's shape


class RetainedMessages:
    def __init__(self, data_path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = os.path.join(data_path, FILE)
        self.loop = loop
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

    def retain(self, worker: int, m: ipc.Retain) -> None:
        key = (m.vhost, m.message.topic)
        if m.message.payload:
            self.by_topic[key] = m.message
        elif self.by_topic.pop(key, None) is None:
            return  # (nothing kept there: nothing to write)
        if self.flushing is None:
            self.flushing = self.loop.call_later(FLUSH_S, self.flush)

    def retained_for(self, worker: int, m: ipc.RetainedFor) -> ipc.RetainedList:
        return ipc.RetainedList(
            [
                message
                for (vhost, topic), message in self.by_topic.items()
                if vhost == m.vhost and matches(m.topic_filter, topic)
            ]
        )

    def flush(self) -> None:
        self.flushing = None
        kept: _Kept = [(vhost, message) for (vhost, _t), message in self.by_topic.items()]
        try:
            replace_file(self.path, msgspec.msgpack.encode(kept))
        except OSError as exc:
            log.error("MQTT retained messages not written to %s: %s", self.path, exc)
