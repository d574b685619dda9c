"""What a change of the definitions or the queues may touch, and an IO
worker's last change waves: how a device's read goes on in
C after a change elsewhere (workers/_lane_device.h device_wave_passes).

A device's publish lane holds places, (exchange, routing key) -> one
queue, checked under the journal's and the catalog's generations. After a
change anywhere, each of a worker's thousand devices re-checked its places
in Python at its next read (workers/mqtt_lane.py device_recheck, ~7 us out
of the cache): a fleet where clients come and go (each SUBSCRIBE a queue and
a binding, each clean session's end their removal) paid that per device per
change. Now the first device's re-check also writes down the wave: the
generations it went from and to and what changed in between, the way a
lane's signature is made (small exact sets, and a 64-bit bloom of exchanges):

- the queues the catalog's change ring names (QueueCatalog.changed_since)
  and the names those queues have now, as small exact sets;
- the (exchange, key) pairs whose routes the journal's operations may
  change (Routes.sync records them, as `_forget` decides which cached
  routes to drop: a binding of a direct exchange or a wildcard-free topic
  binding its key alone, other bindings their whole exchange in the bloom,
  anything else, or a permission, every exchange's bit).

A lane signs what its places depend on (PublishLane._sign, after Python
checked them all): its queues, its routes' queue names, its (exchange,
key)s and exchanges. Another device that held at the wave's `from` and
sees its `to`, whose signature meets none of the wave's, is where a
re-check would leave it, and goes on in C. Anything in common (the bloom's
false positive, a set too large, or a change that may touch it) sends it to
Python's re-check as before: the signatures only ever skip work that would
find nothing.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

ALL = (1 << 64) - 1  # every bit: a change that may touch anything
# A signature (a lane's, or what a wave touched; _wire.c SIG_*): a 64-bit
# bloom of exchanges, then the (exchange, key)s and queue names (64-bit
# hashes) and the queues (qid + 1) as sets of at most SET_MAX, each its
# count first (SET_ALL: more, meeting any set that is not empty). Those
# are exact: a fleet's devices all route to one queue, and a bloom's false
# positive there sent every device to Python (one of a key, 1 in 64 of them).
SET_MAX = 4
SET_ALL = 255
SIGNATURE = struct.Struct(f"={1 + 3 * (1 + SET_MAX)}Q")
# The wave's words (_lane_device.h WAVE_*): valid, from (journal, catalog),
# to (journal, catalog), and what it touched, as a signature.
_ENDS = struct.Struct("=5Q")
WAVE_SIZE = _ENDS.size + SIGNATURE.size
WAVE_SLOTS = 4  # the last waves kept, each for its own `from` (_lane_device.h)
# Journal syncs remembered (Routes.touches): a device further behind than
# these re-checks in Python.
TOUCHES_KEPT = 64

Place = tuple[bytes, bytes]


def bit(value: object) -> int:
    """`value`'s bit in a 64-bit bloom (hash is per process: blooms are
    made and compared in one worker)."""
    return 1 << (hash(value) & 63)


def exact(value: object) -> int:
    """`value`'s 64-bit hash in a signature's set (never 0). Two values with
    one hash only cost a re-check; one value has one hash in a process."""
    return hash(value) & ALL or 1


def key_hash(vhost_id: int, exchange: bytes, routing_key: bytes) -> int:
    return exact((vhost_id, exchange, routing_key))


def exchange_bit(vhost_id: int, exchange: bytes) -> int:
    return bit((vhost_id, exchange))


def name_hash(vhost_id: int, name: bytes) -> int:
    return exact((vhost_id, b"\x00q", name))  # (not a key's)


def signature(
    exchanges: int, keys: Iterable[int], queues: Iterable[int], names: Iterable[int]
) -> bytes:
    words = [exchanges]
    for values in (set(keys), set(queues), set(names)):
        if len(values) > SET_MAX:
            words += [SET_ALL] + [0] * SET_MAX
        else:
            words += [len(values), *values] + [0] * (SET_MAX - len(values))
    return SIGNATURE.pack(*words)


def lane_signature(
    vhost_id: int, known: Mapping[Place, int], names: Mapping[Place, Iterable[bytes]]
) -> bytes:
    """What a lane's places depend on: their exchanges, (exchange, key)s,
    queues and routes' queue names."""
    exchanges = 0
    keys: set[int] = set()
    queues: set[int] = set()
    route_names: set[int] = set()
    for place, qid in known.items():
        exchange, routing_key = place
        exchanges |= exchange_bit(vhost_id, exchange)
        keys.add(key_hash(vhost_id, exchange, routing_key))
        queues.add(qid + 1)
        route_names.update(name_hash(vhost_id, name) for name in names[place])
    return signature(exchanges, keys, queues, route_names)


class JournalTouches:
    """Routes.sync's record: for each sync that replayed operations, the
    generations it went from and to, the (exchange, key)s whose routes they
    may change, and a bloom of the exchanges all of whose keys' routes they
    may change (every bit: anything)."""

    __slots__ = ("exchanges", "kept", "keys")

    def __init__(self) -> None:
        self.kept: deque[tuple[int, int, frozenset[int], int]] = deque(maxlen=TOUCHES_KEPT)
        self.keys: set[int] = set()  # the sync under way's
        self.exchanges = 0

    def begin(self) -> None:
        self.keys = set()
        self.exchanges = 0

    def everything(self) -> None:
        self.exchanges = ALL  # (every place has an exchange)

    def binding(self, vhost_id: int, exchange: bytes, binding_key: bytes, one_key: bool) -> None:
        """A queue binding made or removed: its key's route (one_key: a
        direct or wildcard-free topic binding), else its exchange's every key."""
        if one_key:
            self.keys.add(key_hash(vhost_id, exchange, binding_key))
        else:
            self.exchanges |= exchange_bit(vhost_id, exchange)

    def end(self, gen_from: int, gen_to: int) -> None:
        self.kept.append((gen_from, gen_to, frozenset(self.keys), self.exchanges))

    def between(self, gen_from: int, gen_to: int) -> tuple[int, frozenset[int]] | None:
        """(the exchanges' bloom, the keys) of the syncs from `gen_from` to
        `gen_to`, or None where they are not all remembered."""
        if gen_from == gen_to:
            return 0, frozenset()
        keys: set[int] = set()
        exchanges = 0
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
                return exchanges, frozenset(keys)
        return None


class DeviceWave:
    """The worker's last change waves, read by every DeviceRead in C (a
    bytearray of WAVE_SLOTS waves, never resized: C holds it). Devices that
    missed a change are a wave or two behind the others: each `from` has a
    slot, the oldest given up first."""

    __slots__ = ("next", "words")

    def __init__(self) -> None:
        self.words = bytearray(WAVE_SIZE * WAVE_SLOTS)
        self.next = 0  # the slot the next new wave takes

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
            return  # (no wave: each device re-checks in Python)
        changed, changed_names = catalog
        exchanges, keys = journal
        touched = signature(
            exchanges,
            keys,
            {qid + 1 for qid in changed},
            {name_hash(vhost_id, name) for vhost_id, name in changed_names},
        )
        ends = (1, journal_from, catalog_from, journal_to, catalog_to)
        for slot in range(WAVE_SLOTS):  # (the same wave learnt again: its slot)
            if _ENDS.unpack_from(self.words, slot * WAVE_SIZE) == ends:
                break
        else:
            slot, self.next = self.next, (self.next + 1) % WAVE_SLOTS
        at = slot * WAVE_SIZE
        _ENDS.pack_into(self.words, at, *ends)
        self.words[at + _ENDS.size : at + WAVE_SIZE] = touched
