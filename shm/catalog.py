"""The definitions journal: exchanges and bindings, shared by every process.

The scheduler is the only writer. It appends one record per change (an
operation of broker/amqp/definitions.py, msgpack-encoded) to the active half of a
two-half region; IO workers replay the records they have not seen yet before
they route a publish, so a change costs each reader only that change, not a
rebuild. When the active half is full the writer compacts: it writes the
current state, as a list of operations, into the other half and switches.

Region (`Layout.catalog`, `catalog_bytes` long):

    word C_EPOCH   even E: half (E // 2) % 2 is active and complete
                   odd E:  the writer is compacting into half ((E + 1) // 2) % 2;
                           half (E // 2) % 2 is still complete and readable
    word C_GEN     bumped after every append or compaction (readers' fast check)
    half 0, half 1 word H_USED (bytes of records) + records [u32 length][payload]

A record's bytes are written before `H_USED` is advanced past them (seq_cst
stores), so a reader never sees a partial record; a half is rewritten only
by the compaction two epochs later, which a reader detects by re-reading
C_EPOCH after copying (`_still_valid`) and then reloads from scratch. A
writer killed mid-append leaves `H_USED` unchanged: the record never existed
(and its client never got a reply).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from shoal.shm import layout
from shoal.shm.segment import Segment

C_EPOCH = 0
C_GEN = 8
REGION_HEADER = 64
H_USED = 0
HALF_HEADER = 64
_LEN = struct.Struct("<I")

_encode = msgspec.msgpack.Encoder().encode


class CatalogFull(Exception):
    """The current definitions do not fit in one half of the region."""


def _half(offsets: layout.Layout, epoch: int) -> int:
    size = offsets.limits.catalog_bytes
    half_size = (size - REGION_HEADER) // 2
    return offsets.catalog + REGION_HEADER + ((epoch // 2) % 2) * half_size


def half_capacity(offsets: layout.Layout) -> int:
    return (offsets.limits.catalog_bytes - REGION_HEADER) // 2 - HALF_HEADER


def _frame(ops: list[Any]) -> bytes:
    out = bytearray()
    for op in ops:
        payload = _encode(op)
        out += _LEN.pack(len(payload))
        out += payload
    return bytes(out)


def _parse(data: bytes, decode: Callable[[bytes], Any]) -> list[Any]:
    ops = []
    pos = 0
    while pos < len(data):
        (n,) = _LEN.unpack_from(data, pos)
        pos += 4
        ops.append(decode(data[pos : pos + n]))
        pos += n
    return ops


class CatalogWriter:
    """The scheduler's end. `record` is the msgspec type of one record
    (broker/definitions.py Op); this module knows nothing of its meaning."""

    def __init__(self, seg: Segment, record: Any) -> None:
        self.seg = seg
        self._decode = msgspec.msgpack.Decoder(record).decode
        self.a = seg.atomic
        self.base = seg.layout.catalog
        self.capacity = half_capacity(seg.layout)

    def load(self) -> list[Any]:
        """Every operation in the active half (a restarted scheduler replays
        them). An interrupted compaction is finished by the next one."""
        epoch = self.a.load(self.base + C_EPOCH)
        if epoch % 2:  # killed while compacting: the old half is complete
            epoch -= 1
            self.a.store(self.base + C_EPOCH, epoch)
        half = _half(self.seg.layout, epoch)
        used = self.a.load(half + H_USED)
        start = half + HALF_HEADER
        # A predecessor killed after an append but before its C_GEN bump:
        # make sure readers look.
        self.a.fetch_add(self.base + C_GEN, 1)
        return _parse(bytes(self.seg.buf[start : start + used]), self._decode)

    def append(self, op: Any, snapshot: Any) -> None:
        """Journal one operation. `snapshot()` gives the state *after* the
        operation as a list of operations, used when the half is full.
        Raises CatalogFull (nothing written) if even that does not fit."""
        record = _frame([op])
        a = self.a
        epoch = a.load(self.base + C_EPOCH)
        half = _half(self.seg.layout, epoch)
        used = a.load(half + H_USED)
        if used + len(record) <= self.capacity:
            start = half + HALF_HEADER + used
            self.seg.buf[start : start + len(record)] = record
            a.store(half + H_USED, used + len(record))
            a.fetch_add(self.base + C_GEN, 1)
            return
        self.compact(snapshot())

    def compact(self, ops: list[Any]) -> None:
        data = _frame(ops)
        if len(data) > self.capacity:
            raise CatalogFull(len(data))
        a = self.a
        epoch = a.load(self.base + C_EPOCH)
        a.store(self.base + C_EPOCH, epoch + 1)  # readers: the other half is being rewritten
        half = _half(self.seg.layout, epoch + 2)
        start = half + HALF_HEADER
        self.seg.buf[start : start + len(data)] = data
        a.store(half + H_USED, len(data))
        a.store(self.base + C_EPOCH, epoch + 2)
        a.fetch_add(self.base + C_GEN, 1)


class CatalogReader:
    """An IO worker's end: `poll()` returns what changed since the last call,
    decoded as `record` (see CatalogWriter)."""

    __slots__ = ("_decode", "a", "base", "epoch", "gen", "offset", "seg")

    def __init__(self, seg: Segment, record: Any) -> None:
        self.seg = seg
        self._decode = msgspec.msgpack.Decoder(record).decode
        self.a = seg.atomic
        self.base = seg.layout.catalog
        self.gen = -1
        self.epoch = -1
        self.offset = 0

    @property
    def gen_word(self) -> int:
        """The offset of the word changed() looks at (a C reader's own look:
        workers/_lane_device.h); `gen` is its value as of the last poll."""
        return self.base + C_GEN

    def changed(self) -> bool:
        """One atomic load: is there anything new?"""
        return self.a.load(self.base + C_GEN) != self.gen

    def poll(self) -> tuple[bool, list[Any]]:
        """(reset, operations): on reset, discard all state and replay the
        operations from nothing; otherwise apply them on top."""
        a = self.a
        while True:
            gen = a.load(self.base + C_GEN)
            epoch = a.load(self.base + C_EPOCH)
            readable = epoch - (epoch % 2)  # the complete half
            reset = readable != self.epoch
            offset = 0 if reset else self.offset
            half = _half(self.seg.layout, readable)
            used = a.load(half + H_USED)
            start = half + HALF_HEADER
            data = bytes(self.seg.buf[start + offset : start + used])
            if not self._still_valid(epoch):
                self.epoch = -1  # torn by a compaction: start again from scratch
                continue
            self.gen = gen
            self.epoch = readable
            self.offset = used
            return reset, _parse(data, self._decode)

    def _still_valid(self, epoch_before: int) -> bool:
        # The half we read is next rewritten by the compaction that starts
        # at (epoch_before | 1) + 2 (odd: compacting into it).
        return self.a.load(self.base + C_EPOCH) < (epoch_before | 1) + 2


class Applies(Protocol):
    def apply(self, op: Any) -> None: ...


_State = TypeVar("_State", bound=Applies)


class CatalogFollower(Generic[_State]):
    """What the journal holds now, replayed into a state of its own by a
    process that only reads it (the management API, the shovel process):
    `current()` applies what changed since its last call."""

    def __init__(self, seg: Segment, record: Any, fresh: Callable[[], _State]) -> None:
        self.reader = CatalogReader(seg, record)
        self.fresh = fresh
        self.state = fresh()

    def current(self) -> _State:
        if self.reader.changed():
            reset, ops = self.reader.poll()
            if reset:
                self.state = self.fresh()
            for op in ops:
                self.state.apply(op)
        return self.state
