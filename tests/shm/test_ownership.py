"""The ownership handover of shm/ownership.py under real concurrency: four
forked "workers" claim every queue they own (a CAS 0 -> index + 1 on a
claim word, which fails if another holds it) and give back what they no
longer own before acknowledging, while this process moves the count
between 1 and 4 hundreds of times, as the supervisor does; workers are
killed with SIGKILL and replaced in the middle. No queue may ever have two
owners, and at the end each queue is held by exactly its owner."""

from __future__ import annotations

import os
import random
import signal
import time

from shoal.shm import layout as L
from shoal.shm import ownership
from shoal.shm.ownership import OwnershipView
from shoal.shm.segment import Segment

from ._support import Children, fork_child

WORKERS = 4
QUEUES = 48
STOP_QID = 63  # its claim word is the "stop" flag
DEADLINE = 60.0


def claim_word(seg: Segment, qid: int) -> int:
    return seg.layout.queue(qid) + L.Q_OWNER


def violations_word(seg: Segment, index: int) -> int:
    return seg.layout.proc(index) + L.P_STATS


def worker(seg: Segment, index: int) -> None:
    a = seg.atomic
    me = index + 1
    view = OwnershipView(seg, index)
    # A predecessor killed with SIGKILL left its claims. What a dead worker
    # held (a stream's open files) ends with it: what this one owns is its
    # own now, the rest is let go before it acknowledges.
    held = set()
    for q in range(QUEUES):
        if a.load(claim_word(seg, q)) == me:
            if view.owns(q):
                held.add(q)
            else:
                a.store(claim_word(seg, q), 0)
    view.acknowledge()
    deadline = time.monotonic() + DEADLINE
    while not a.load(claim_word(seg, STOP_QID)) and time.monotonic() < deadline:
        if view.changed():
            view.refresh()
            for q in [q for q in held if not view.owns(q)]:
                if not a.cas(claim_word(seg, q), me, 0):
                    a.fetch_add(violations_word(seg, index), 1)  # someone took it from us
                held.discard(q)
            view.acknowledge()
        for q in range(QUEUES):
            if view.owns(q) and q not in held:
                if a.cas(claim_word(seg, q), 0, me):
                    held.add(q)
                else:
                    a.fetch_add(violations_word(seg, index), 1)  # two owners at once
        for q in held:
            if a.load(claim_word(seg, q)) != me:
                a.fetch_add(violations_word(seg, index), 1)


def test_no_queue_ever_has_two_owners(seg: Segment) -> None:
    a = seg.atomic
    ownership.initialise(seg, 1)
    pids = {i: fork_child(worker, seg, i) for i in range(WORKERS)}
    children = Children(list(pids.values()))
    rng = random.Random(7)
    transitions = 0
    try:
        deadline = time.monotonic() + DEADLINE
        while transitions < 300 and time.monotonic() < deadline:
            generation = ownership.begin(seg, rng.randint(1, WORKERS))
            if transitions % 40 == 20:  # a worker dies mid-handover, and is replaced
                victim = rng.randrange(WORKERS)
                os.kill(pids[victim], signal.SIGKILL)
                os.waitpid(pids[victim], 0)
                children.codes[pids[victim]] = 0
                pids[victim] = fork_child(worker, seg, victim)
                children.pids.append(pids[victim])
            while not ownership.acknowledged(seg, generation, list(range(WORKERS))):
                assert time.monotonic() < deadline, "workers did not acknowledge"
                assert children.running()
            ownership.finish(seg)
            transitions += 1
        assert transitions == 300
        _gen, current, nxt = ownership.word(seg)
        assert current == nxt
        wanted = {q: q % current + 1 for q in range(QUEUES)}
        while {q: a.load(claim_word(seg, q)) for q in range(QUEUES)} != wanted:
            assert time.monotonic() < deadline, "queues not held by their owners"
    finally:
        a.store(claim_word(seg, STOP_QID), 1)
        end = time.monotonic() + 10
        while children.running() and time.monotonic() < end:
            time.sleep(0.01)
        children.stop()
    assert children.all_succeeded()
    assert [a.load(violations_word(seg, i)) for i in range(WORKERS)] == [0] * WORKERS
