"""The queue catalog's change ring (shm/queue_catalog.py, shm/ARCHITECTURE.md
section 2): a reader catches up on the queues that changed instead of
scanning every slot, and always ends where a full scan would, whatever the
changes, however far behind, and wherever the writer was killed."""

from __future__ import annotations

import os
import random
import select
import signal
import time
from typing import Any

import pytest

from shoal.shm import layout as L
from shoal.shm.queue_catalog import QueueCatalog
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment

from ._support import Died, Interposer, SegmentFactory, dies_after

LIMITS = L.Limits(max_workers=4, max_queues=128, queue_capacity=16, arena_bytes=1 << 16)
KINDS = (0, L.QF_STREAM, L.QF_DELAYED, L.QF_DEDUP)


def views(catalog: QueueCatalog) -> dict[str, Any]:
    """Everything a reader can ask the catalog, as plain values."""
    levels = {q: (p.max_priority, dict(p.by_level)) for q, p in catalog.priority_levels().items()}
    names = {(vhost, name): qid for vhost, name, qid in catalog.scan()}
    return {
        "lookup": {key: catalog.lookup(key[1], key[0]) for key in names},
        "levels": levels,
        "plain": catalog.plain_queues(),
        "streams": catalog.stream_queues(),
        "active": catalog.active_logs(),
        "delayed": catalog.delay_queues(),
        "timed": catalog.timed_queues(),
        "ttl": catalog.ttl_queues(),
        "dedup": catalog.dedup_now,
    }


def fresh(seg: Segment) -> dict[str, Any]:
    return views(QueueCatalog(seg))


class Writer:
    """The scheduler's side: random creates, rule changes and removals,
    priority queues with level slots among them."""

    def __init__(self, shared: SharedQueues, rng: random.Random, priority: bool = True) -> None:
        self.shared = shared
        self.rng = rng
        self.free = list(range(LIMITS.max_queues))
        self.plain: list[int] = []
        # declared qid -> its level slots; None: no priority queues
        self.priority: dict[int, list[int]] | None = {} if priority else None
        self.made = 0

    def step(self) -> None:
        rng, shared = self.rng, self.shared
        roll = rng.random()
        if self.free and (roll < 0.45 or not (self.plain or self.priority)):
            qid = self.free.pop(rng.randrange(len(self.free)))
            self.made += 1
            name = b"q%d" % self.made
            if self.priority is not None and rng.random() < 0.1:
                shared.create(qid, name, 0, 0, vhost=rng.randrange(2), max_priority=5)
                self.priority[qid] = []
            else:
                flags = rng.choice(KINDS)
                ttl = rng.choice((0, 0, 1001))
                shared.create(qid, name, flags, 0, vhost=rng.randrange(2), message_ttl=ttl)
                self.plain.append(qid)
        elif roll < 0.55 and self.priority and self.free:
            parent = rng.choice(list(self.priority))
            level = len(self.priority[parent]) + 1
            if level <= 5:
                qid = self.free.pop()
                shared.create(qid, b"", 0, 0, parent=parent, level=level)
                self.priority[parent].append(qid)
        elif roll < 0.7 and self.plain:
            qid = rng.choice(self.plain)
            shared.set_rules(qid, (0, 0, 0), rng.choice((0, 501)), 0, 0, 0)
        elif self.priority and roll < 0.75:
            parent = rng.choice(list(self.priority))
            for qid in [*self.priority.pop(parent), parent]:
                shared.remove(qid)
                self.free.append(qid)
        elif self.plain:
            qid = self.plain.pop(rng.randrange(len(self.plain)))
            shared.remove(qid)
            self.free.append(qid)


def test_a_reader_catches_up_on_one_change_without_a_scan(seg: Segment) -> None:
    sched, reader = SharedQueues(seg, 0), SharedQueues(seg, 1)
    assert reader.catalog.lookup(b"a") is None
    assert reader.catalog.rescans == 1  # the first look scans
    sched.create(3, b"a", 0, 0)
    sched.create(9, b"b", L.QF_STREAM, 0, message_ttl=11)
    assert reader.catalog.lookup(b"a") == 3
    assert reader.catalog.stream_queues() == {9}
    assert reader.catalog.ttl_queues() == {9}
    sched.remove(3)
    assert reader.catalog.lookup(b"a") is None
    assert reader.catalog.active_logs() == (9,)
    assert reader.catalog.rescans == 1
    assert views(reader.catalog) == fresh(seg)


def test_a_reader_a_lap_behind_or_after_a_restarted_scheduler_rescans(seg: Segment) -> None:
    sched, reader = SharedQueues(seg, 0), SharedQueues(seg, 1)
    reader.catalog.lookup(b"x")
    for _ in range(L.CATALOG_RING // 2 + 1):  # two changes each: more than the ring holds
        sched.create(4, b"x", 0, 0)
        sched.remove(4)
    sched.create(4, b"y", 0, 0)
    assert reader.catalog.lookup(b"y") == 4
    assert reader.catalog.rescans == 2
    sched.catalog_rescan()
    assert reader.catalog.lookup(b"y") == 4
    assert reader.catalog.rescans == 3


def test_what_changed_between_two_generations_names_each_slot_and_its_queue_now(
    seg: Segment,
) -> None:
    """changed_since (a publish lane's look after a change, workers/lane.py):
    the slots the ring names, each with the queue it holds now (a removed
    one: none); None where the ring cannot tell, so the reader looks at
    everything."""
    sched, reader = SharedQueues(seg, 0), SharedQueues(seg, 1)
    catalog = reader.catalog
    sched.create(3, b"a", 0, 0)
    start = catalog.catalog_generation()
    assert catalog.changed_since(start, start) == (frozenset(), frozenset())
    sched.create(9, b"b", 0, 0, vhost=1)
    sched.remove(3)
    sched.create(5, b"c", 0, 0)
    gen = catalog.catalog_generation()
    assert catalog.changed_since(start, gen) == (
        frozenset({3, 9, 5}),
        frozenset({(1, b"b"), (0, b"c")}),
    )
    assert catalog.changed_since(gen - 1, gen) == (frozenset({5}), frozenset({(0, b"c")}))
    sched.catalog_rescan()  # (a restarted scheduler's mark: the ring cannot tell)
    assert catalog.changed_since(gen, catalog.catalog_generation()) is None
    later = catalog.catalog_generation()
    for _ in range(L.CATALOG_RING // 2 + 1):  # more changes than the ring holds
        sched.create(4, b"x", 0, 0)
        sched.remove(4)
    assert catalog.changed_since(later, catalog.catalog_generation()) is None
    assert catalog.changed_since(-1, catalog.catalog_generation()) is None  # (never looked)


@pytest.mark.parametrize("seed", range(6))
def test_catching_up_ends_where_a_scan_does(make_segment: SegmentFactory, seed: int) -> None:
    """Random changes, readers refreshing after 1 to 300 of them (a lap of
    the ring and more), compared with a fresh scan each time. Without
    priority queues (even seeds) a reader scans only at its first look and
    when it is more than a lap behind."""
    seg = make_segment(LIMITS)
    rng = random.Random(seed)
    writer = Writer(SharedQueues(seg, 0), rng, priority=seed % 2 == 1)
    readers = [SharedQueues(seg, 1).catalog, SharedQueues(seg, 2).catalog]
    seen = [-1, -1]
    scans_due = 0
    for _ in range(120):
        for _ in range(rng.choice((1, 1, 2, 5, 20, 300))):
            writer.step()
        index = rng.randrange(2)
        gen = seg.atomic.load(L.H_CATALOG_GEN)
        if seen[index] < 0 or gen - seen[index] > L.CATALOG_RING:
            scans_due += 1
        seen[index] = gen
        assert views(readers[index]) == fresh(seg)
    if writer.priority is not None:
        assert sum(r.rescans for r in readers) > scans_due  # a priority queue's changes scan
    else:
        assert sum(r.rescans for r in readers) == scans_due


def test_a_reader_racing_each_write_of_a_change_ends_current(seg: Segment) -> None:
    """A reader refreshing right after each of create's, set_rules' and
    remove's writes (the generation bumped, its ring word not yet written,
    among them) is current once the change is done."""
    sched = SharedQueues(seg, 0)
    sched.create(1, b"kept", 0, 0)
    changes = [
        lambda: sched.create(2, b"new", L.QF_DELAYED, 0, message_ttl=7),
        lambda: sched.set_rules(2, (0, 0, 0), 0, 0, 0, 0),
        lambda: sched.remove(2),
    ]
    for change in changes:
        reader = SharedQueues(seg, 1).catalog
        reader.lookup(b"")

        def refresh(n: int, op: str, offset: int, reader: QueueCatalog = reader) -> None:
            views(reader)

        sched.a = Interposer(seg.atomic, refresh)  # type: ignore[assignment]
        try:
            change()
        finally:
            sched.a = seg.atomic
        assert views(reader) == fresh(seg)


def test_a_scheduler_killed_in_a_change_then_restarted_leaves_readers_current(
    seg: Segment,
) -> None:
    """Killed after any write of a create or a remove (before its bump, or
    between the bump and the ring word), then a change of another queue: a
    reader may miss the killed change until the restarted scheduler's
    catalog_rescan, and is current after it."""
    for change in ("create", "remove"):
        for writes in range(1, 40):
            sched = SharedQueues(seg, 0)
            for qid in range(seg.layout.limits.max_queues):
                if seg.atomic.load(seg.layout.queue(qid) + L.Q_STATE) & 0xFF == L.QS_ACTIVE:
                    sched.remove(qid)
            if change == "remove":
                sched.create(5, b"doomed", 0, 0)
            reader = SharedQueues(seg, 1).catalog
            reader.lookup(b"")
            sched.a = Interposer(seg.atomic, dies_after(writes))  # type: ignore[assignment]
            try:
                if change == "create":
                    sched.create(5, b"doomed", 0, 0)
                else:
                    sched.remove(5)
            except Died:
                pass
            finally:
                sched.a = seg.atomic
            restarted = SharedQueues(seg, 0)
            restarted.create(6, b"other", 0, 0)
            restarted.catalog_rescan()
            assert views(reader) == fresh(seg), (change, writes)


def _wait_exit(pid: int, timeout: float) -> int:
    """The child's wait status, waited for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} still running after {timeout} s")


def test_readers_in_other_processes_follow_a_writer_killed_at_random(
    make_segment: SegmentFactory,
) -> None:
    """A forked writer makes random changes as fast as it can and is
    SIGKILLed at a random moment; forked readers refresh the whole time.
    After the restarted scheduler's catalog_rescan, every reader's views
    are a fresh scan's. Several rounds."""
    seg = make_segment(LIMITS)
    for round_ in range(4):
        control = SharedQueues(seg, 0)
        for qid in range(LIMITS.max_queues):  # a clean table for the round
            if seg.atomic.load(seg.layout.queue(qid) + L.Q_STATE) & 0xFF == L.QS_ACTIVE:
                control.remove(qid)
        writer_pid = os.fork()
        if writer_pid == 0:  # pragma: no cover - the forked writer
            try:
                writer = Writer(SharedQueues(seg, 0), random.Random(round_))
                while True:
                    writer.step()
            finally:
                os._exit(1)
        stop_r, stop_w = os.pipe()
        readers = []
        for index in range(2):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - a forked reader
                code = 1
                try:
                    os.close(r)
                    catalog = SharedQueues(seg, index + 1).catalog
                    while not select.select([stop_r], [], [], 0)[0]:
                        views(catalog)
                    same = views(catalog) == fresh(seg)
                    os.write(w, b"%d %d" % (same, catalog.rescans))
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            readers.append((pid, r))
        time.sleep(random.uniform(0.05, 0.3))  # how long the writer runs; not a synchronisation
        os.kill(writer_pid, signal.SIGKILL)
        assert _wait_exit(writer_pid, 10) & 0x7F == signal.SIGKILL
        SharedQueues(seg, 0).catalog_rescan()  # the restarted scheduler's load_queues
        os.write(stop_w, b"x")
        for pid, r in readers:
            assert _wait_exit(pid, 30) == 0
            same, rescans = os.read(r, 64).split()
            os.close(r)
            assert same == b"1"
            assert int(rescans) >= 1
        os.close(stop_r)
        os.close(stop_w)
