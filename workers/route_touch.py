"""What a change of the definitions or the queues may touch, as 64-bit
blooms, and an IO worker's last change wave: how a device's read goes on in
C after a change elsewhere (workers/_lane_device.h device_wave_passes).

A device's publish lane holds places, (exchange, routing key) -> one
queue, checked under the journal's and the catalog's generations. After a
change anywhere, each of a worker's thousand devices re-checked its places
in Python at its next read (workers/mqtt_lane.py device_recheck, ~7 us out
of the cache): a fleet where clients come and go (each SUBSCRIBE a queue and
a binding, each clean session's end their removal) paid that per device per
change. Now the first device's re-check also writes down the wave: the
generations it went from and to and what changed in between, as blooms:

- the queues the catalog's change ring names (QueueCatalog.changed_since)
  and the names those queues have now;
- the (exchange, key) pairs whose routes the journal's operations may
  change (Routes.sync records them, as `_forget` decides which cached
  routes to drop: a binding of a direct exchange or a wildcard-free topic
  binding its key alone, other bindings their whole exchange, anything
  else, or a permission, every key).

A lane signs what its places depend on (PublishLane._sign, after Python
checked them all): its queues, its routes' queue names, its (exchange,
key)s and exchanges. Another device that held at the wave's `from` and
sees its `to`, whose signature meets none of the wave's bits, is where a
re-check would leave it, and goes on in C. A bit in common (a bloom's false
positive, or a change that may touch it) sends it to Python's re-check as
before: the blooms only ever skip work that would find nothing.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

ALL = (1 << 64) - 1  # every bit: a change that may touch anything
# The wave's words (_lane_device.h WAVE_*): valid, from (journal, catalog),
# to (journal, catalog), and the blooms of the queues, queue names, keys
# and exchanges touched.
_WAVE = struct.Struct("=9Q")
# Journal syncs remembered (Routes.touches): a device further behind than
# these re-checks in Python.
TOUCHES_KEPT = 64

Place = tuple[bytes, bytes]


def bit(value: object) -> int:
    """`value`'s bit in a 64-bit bloom (hash is per process: blooms are
    made and compared in one worker)."""
    return 1 << (hash(value) & 63)


def key_bit(vhost_id: int, exchange: bytes, routing_key: bytes) -> int:
    return bit((vhost_id, exchange, routing_key))


def exchange_bit(vhost_id: int, exchange: bytes) -> int:
    return bit((vhost_id, exchange))


def name_bit(vhost_id: int, name: bytes) -> int:
    return bit((vhost_id, b"\x00q", name))  # (not a key's or an exchange's)


def qid_bit(qid: int) -> int:
    return 1 << (qid & 63)


def lane_signature(
    vhost_id: int, known: Mapping[Place, int], names: Mapping[Place, Iterable[bytes]]
) -> tuple[int, int, int, int]:
    """The blooms of what a lane's places depend on: (queues, names, keys,
    exchanges), the order of the wave's."""
    queues = route_names = keys = exchanges = 0
    for place, qid in known.items():
        exchange, routing_key = place
        queues |= qid_bit(qid)
        for name in names[place]:
            route_names |= name_bit(vhost_id, name)
        keys |= key_bit(vhost_id, exchange, routing_key)
        exchanges |= exchange_bit(vhost_id, exchange)
    return queues, route_names, keys, exchanges


class JournalTouches:
    """Routes.sync's record: for each sync that replayed operations, the
    generations it went from and to and the blooms of the (exchange, key)s
    and exchanges whose routes they may change."""

    __slots__ = ("exchanges", "kept", "keys")

    def __init__(self) -> None:
        self.kept: deque[tuple[int, int, int, int]] = deque(maxlen=TOUCHES_KEPT)
        self.keys = self.exchanges = 0  # the sync under way's

    def begin(self) -> None:
        self.keys = self.exchanges = 0

    def everything(self) -> None:
        self.keys = self.exchanges = ALL

    def binding(self, vhost_id: int, exchange: bytes, binding_key: bytes, one_key: bool) -> None:
        """A queue binding made or removed: its key's route (one_key: a
        direct or wildcard-free topic binding), else its exchange's every key."""
        if one_key:
            self.keys |= key_bit(vhost_id, exchange, binding_key)
        else:
            self.exchanges |= exchange_bit(vhost_id, exchange)

    def end(self, gen_from: int, gen_to: int) -> None:
        self.kept.append((gen_from, gen_to, self.keys, self.exchanges))

    def between(self, gen_from: int, gen_to: int) -> tuple[int, int] | None:
        """The blooms (keys, exchanges) of the syncs from `gen_from` to
        `gen_to`, or None where they are not all remembered."""
        if gen_from == gen_to:
            return 0, 0
        keys = exchanges = 0
        at = gen_from
        for start, end, k, e in self.kept:
            if start != at:
                if at != gen_from:
                    return None  # (a gap: not one chain)
                continue
            keys |= k
            exchanges |= e
            at = end
            if at == gen_to:
                return keys, exchanges
        return None


class DeviceWave:
    """The worker's last change wave, read by every DeviceRead in C (a
    bytearray of _WAVE's words, never resized: C holds it)."""

    __slots__ = ("words",)

    def __init__(self) -> None:
        self.words = bytearray(_WAVE.size)

    def learn(
        self, ctx: Any, journal_from: int, catalog_from: int, journal_to: int, catalog_to: int
    ) -> None:
        """After a device's re-check in Python took it from (journal_from,
        catalog_from) to (journal_to, catalog_to): what changed in between,
        for the next devices at the same place; or no wave where that
        cannot be told (changes forgotten, a lap of the catalog's ring, a
        deduplicating queue or exchange anywhere: their lanes are Python's)."""
        shared, routes = ctx.shared, ctx.routes
        journal = routes.touches.between(journal_from, journal_to) if journal_from >= 0 else None
        catalog = shared.catalog.changed_since(catalog_from, catalog_to)
        if journal is None or catalog is None or shared.catalog.dedup_now or routes.dedup_exchanges:
            self.words[:8] = bytes(8)  # (not valid)
            return
        changed, changed_names = catalog
        queues = route_names = 0
        for qid in changed:
            queues |= qid_bit(qid)
        for vhost_id, name in changed_names:
            route_names |= name_bit(vhost_id, name)
        keys, exchanges = journal
        _WAVE.pack_into(
            self.words,
            0,
            1,
            journal_from,
            catalog_from,
            journal_to,
            catalog_to,
            queues,
            route_names,
            keys,
            exchanges,
        )
