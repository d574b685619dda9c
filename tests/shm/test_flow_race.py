"""The producer flow-control handshake on Q_FLOW (shm/flow.py,
shm/ARCHITECTURE.md section 10) raced across processes: no lost release.

Forked publishers append to one queue whose x-capacity is a few messages;
a publisher whose append took it above capacity arms the release (`arm`)
exactly as PublisherBlocks.flow_block does and, if that says block, waits
(bounded) for an UNBLOCK. Forked ackers acquire and ack as fast as they
can, calling `drained` after each ack as Channel._drained does. The parent
is the scheduler: it waits on the wake eventfd, drains the wake bits and,
for each `take_release`, sends the UNBLOCK, modelled as a generation word on
a shared control page: a publisher reads it just before arming and is
released by any bump after that (an UNBLOCK taken after its arm reaches its
worker after the block, as one already in the worker's pipe does).

Invariant: every publisher that blocked is released; none waits past
RELEASE_BOUND with nobody left to release it. Without the sweep, only the
handshake can release, so a missed drain (the acker and the publisher both
missing the other's write) or a release never kicked shows as a publisher
stuck. With ackers SIGKILLed (at random by the parent, and by themselves
right between the ack's byte decrement and the Q_FLOW check), the parent
also runs the scheduler's sweep rule (broker/scheduler/notify.py `_sweep`: a queue
whose Q_FLOW is not OPEN gets the acker's check and its release taken) and
puts the dead ackers' entries back (SharedQueues.release_owner, as
shm.recovery does) before starting replacements.

The flow functions run on a Jittery segment (random yields between their
steps) and publishers sometimes yield between the capacity check and arm,
so the windows the handshake must close are wide enough to be hit.
"""

from __future__ import annotations

import mmap
import os
import random
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from shoal.shm import flow
from shoal.shm import layout as L
from shoal.shm._atomic import Atomic
from shoal.shm.arena import Arena
from shoal.shm.queues import SharedQueues
from shoal.shm.recovery import release_owner
from shoal.shm.segment import Segment
from shoal.shm.wake import Waker

from ._support import SegmentFactory, publish_until_accepted, qword

# 16 cells per queue: a handful of messages fill the byte capacity first.
LIMITS = L.Limits(max_workers=8, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)
QID = 7
CAPACITY = 600  # bytes of bodies: above it, the publisher that got there blocks
RESUME = 300  # at or below it, blocked publishers are released
PUBLISHERS = (0, 1, 2)  # worker indices: arenas and process slots 0..2
ACKERS = (4, 5, 6)  # worker indices (owner = index + 1)
RELEASE_BOUND = 10.0  # seconds: a blocked publisher not released by then is stuck
CHILD_DEADLINE = 30.0  # seconds: a child gives up (publish_until_accepted, acks)
WAIT = 40.0  # the parent's bound on a whole run
SWEEP_INTERVAL = 0.2  # the scheduler's is 1 s; shorter keeps the test quick

# --- the control page: u64 words shared by the parent and the children ------
GEN = 0  # scheduler -> publishers: bumped once per release taken (UNBLOCK)
STOP = 8  # parent -> ackers: publishers done and the queue empty
BLOCKS = 16  # publishers: arm() said block
NOT_BLOCKED = 24  # publishers: over capacity, but arm() saw the queue drained
WAITING = 32  # publishers blocked right now
STUCK = 40  # publishers not released within RELEASE_BOUND
STUCK_FLOW = 48  # Q_FLOW, Q_BYTES when the last one gave up
STUCK_BYTES = 56
WINDOW_DEATHS = 64  # ackers that killed themselves between decrement and check
ACKED = 72
RELEASED = 80  # publishers: times released
CTRL_SIZE = 4096


def body_for(rng: random.Random) -> bytes:
    # 16..240 bytes: the queue crosses its capacity and its resume size at
    # varying fill levels, after one ack or after several.
    return bytes((rng.randrange(256),)) * rng.randrange(16, 241)


class Jittery:
    """A stand-in segment for the shm.flow functions: the real layout, and
    the real atomics with a random yield before each operation. Every step
    is still one sequentially consistent operation on the shared words; the
    gaps between the steps just get wider, as under heavy load, so a
    handshake that relied on them being short would lose releases here."""

    def __init__(self, seg: Segment, rng: random.Random, rate: float = 0.3) -> None:
        self.layout = seg.layout
        self.atomic = self
        self._real = seg.atomic
        self._rng = rng
        self._rate = rate

    def _jitter(self) -> None:
        if self._rng.random() < self._rate:
            os.sched_yield()

    def load(self, offset: int) -> int:
        self._jitter()
        value: int = self._real.load(offset)
        return value

    def cas(self, offset: int, expected: int, desired: int) -> bool:
        self._jitter()
        ok: bool = self._real.cas(offset, expected, desired)
        return ok


def wait_for_release(seg: Segment, ctrl: Atomic, gen: int) -> None:
    """A blocked publisher's worker: wait (bounded) for an UNBLOCK taken after `gen`."""
    ctrl.fetch_add(BLOCKS, 1)
    ctrl.fetch_add(WAITING, 1)
    give_up = time.monotonic() + RELEASE_BOUND
    while ctrl.load(GEN) == gen:
        if time.monotonic() > give_up:
            flow_word, nbytes = qword(seg, QID, L.Q_FLOW), qword(seg, QID, L.Q_BYTES)
            ctrl.store(STUCK_FLOW, flow_word)
            ctrl.store(STUCK_BYTES, nbytes)
            ctrl.fetch_add(STUCK, 1)
            raise AssertionError(
                f"publisher blocked for {RELEASE_BOUND} s: a lost release "
                f"(Q_FLOW {flow_word}, Q_BYTES {nbytes}, resume {RESUME})"
            )
        time.sleep(0.0002)  # a polling loop bounded by give_up
    ctrl.fetch_add(WAITING, -1)
    ctrl.fetch_add(RELEASED, 1)


def publish(seg: Segment, ctrl: Atomic, efd: int, worker: int, count: int, seed: int) -> None:
    """Publish `count` messages; block as PublisherBlocks.flow_block does."""
    shared, arena = SharedQueues(seg, worker + 1), Arena(seg, worker)
    slot = seg.layout.proc(worker)
    waker = Waker(seg, efd)
    rng = random.Random(seed)
    jittery = Jittery(seg, rng)
    deadline = time.monotonic() + CHILD_DEADLINE
    for _ in range(count):
        message = (b"", b"", b"", body_for(rng))
        publish_until_accepted(seg, shared, arena, QID, message, slot, deadline)
        waker.work_added(QID)  # as Channel._append (nobody watches here)
        if not flow.over_capacity(seg, QID):
            continue
        if rng.random() < 0.3:
            os.sched_yield()  # let the ackers drain between the check and arm
        gen = ctrl.load(GEN)  # UNBLOCKs taken from here on reach this publisher
        if flow.arm(jittery, QID):  # type: ignore[arg-type]
            wait_for_release(seg, ctrl, gen)
        else:
            ctrl.fetch_add(NOT_BLOCKED, 1)


def ack(seg: Segment, ctrl: Atomic, efd: int, worker: int, die_at: int, seed: int) -> None:
    """Acquire and ack until told to stop, then release as Channel._drained
    does. With `die_at` > 0: SIGKILL itself the die_at-th time an ack left the
    queue BLOCKED at or below its resume size, after the byte decrement (in
    the C ack) and before the Q_FLOW check that would have released it."""
    shared = SharedQueues(seg, worker + 1)
    waker = Waker(seg, efd)
    a, q = seg.atomic, seg.layout.queue(QID)
    rng = random.Random(seed)
    jittery = Jittery(seg, rng)
    pointer = release_gen = windows = 0
    deadline = time.monotonic() + CHILD_DEADLINE
    while not ctrl.load(STOP):
        assert time.monotonic() < deadline, "the ackers were never told to stop"
        # Take up to a few entries before acking them, as a consumer with a
        # prefetch does: the queue backs up above capacity, then drops in
        # bursts (sometimes from above capacity to empty).
        held: list[int] = []
        want = rng.randint(1, 6)
        while len(held) < want:
            gen = shared.table.release_generation(QID)
            if gen != release_gen:
                release_gen, pointer = gen, 0
            got = shared.acquire(QID, pointer)
            if isinstance(got, int):
                pointer = got
                break
            held.append(got[0])
            pointer = got[0] + 1
        if not held:
            os.sched_yield()
            continue
        if rng.random() < 0.1:
            # Now and then, hold on (a slow consumer, for at most a moment)
            # until the publishers take the queue above capacity.
            hold_until = time.monotonic() + 0.002
            while not flow.over_capacity(seg, QID) and time.monotonic() < hold_until:
                os.sched_yield()
        for seq in held:
            assert shared.ack(QID, seq), f"seq {seq} was taken from us"
            ctrl.fetch_add(ACKED, 1)
            if (
                die_at
                and a.load(q + L.Q_FLOW) == L.FLOW_BLOCKED
                and a.load(q + L.Q_BYTES) <= a.load(q + L.Q_RESUME)
            ):
                windows += 1
                if windows >= die_at:
                    ctrl.fetch_add(WINDOW_DEATHS, 1)
                    os.kill(os.getpid(), signal.SIGKILL)
            if a.load(q + L.Q_FLOW):  # Channel._drained: one load unless blocked
                flow.drained(jittery, waker, QID)  # type: ignore[arg-type]


@dataclass
class Child:
    role: str  # "publisher" or "acker"
    worker: int
    status: int | None = None


@dataclass
class Race:
    """The parent: scheduler (wake-ups, UNBLOCK, sweep) and supervisor
    (reaps children, recovers and restarts killed ackers)."""

    seg: Segment
    ctrl: Atomic
    efd: int
    rng: random.Random
    children: dict[int, Child] = field(default_factory=dict)  # by pid
    releases: int = 0  # taken on a wake-up
    sweep_releases: int = 0  # taken by the sweep
    deaths: int = 0  # ackers killed (by us or by themselves)

    def __post_init__(self) -> None:
        self.shared = SharedQueues(self.seg, 0)
        self.waker = Waker(self.seg, self.efd)

    def spawn(self, role: str, worker: int, fn: Callable[..., None], *args: object) -> int:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                fn(self.seg, self.ctrl, self.efd, worker, *args)
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        self.children[pid] = Child(role, worker)
        return pid

    def spawn_acker(self, worker: int, die_at: int) -> int:
        return self.spawn("acker", worker, ack, die_at, self.rng.randrange(1 << 30))

    def running(self, role: str) -> list[int]:
        return [p for p, c in self.children.items() if c.role == role and c.status is None]

    def unblock(self) -> None:
        """Scheduler._unblock: UNBLOCK(qid) to every worker."""
        self.ctrl.fetch_add(GEN, 1)

    def on_wake(self, timeout: float, poll: bool = False) -> None:
        """Scheduler._on_wake, if the eventfd becomes readable within
        `timeout`. With `poll`, the wake bits are drained anyway (see
        run_to_the_end)."""
        if not select.select([self.efd], [], [], timeout)[0] and not poll:
            return
        for qid in self.waker.drain(self.seg.layout.limits.max_queues):
            if flow.take_release(self.seg, qid):
                self.releases += 1
                self.unblock()

    def sweep(self) -> None:
        """The flow part of Scheduler._sweep."""
        if self.shared.table.word(QID, L.Q_FLOW) != L.FLOW_OPEN:
            flow.drained(self.seg, self.waker, QID)
            if flow.take_release(self.seg, QID):
                self.sweep_releases += 1
                self.unblock()

    def reap(self) -> list[Child]:
        """Reap the children that ended; returns them."""
        ended = []
        for pid in self.running("publisher") + self.running("acker"):
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                self.children[pid].status = status
                ended.append(self.children[pid])
        return ended

    def stop_all(self) -> None:
        """Teardown: whatever still runs is killed and reaped."""
        self.ctrl.store(STOP, 1)
        for pid, child in self.children.items():
            if child.status is None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.status = os.waitpid(pid, 0)[1]

    def state(self) -> str:
        words = {n: self.ctrl.load(w) for n, w in (("gen", GEN), ("blocks", BLOCKS))}
        words |= {n: self.ctrl.load(w) for n, w in (("waiting", WAITING), ("acked", ACKED))}
        return (
            f"Q_FLOW {qword(self.seg, QID, L.Q_FLOW)}, Q_BYTES {qword(self.seg, QID, L.Q_BYTES)}"
            f", head {qword(self.seg, QID, L.Q_HEAD)}, tail {qword(self.seg, QID, L.Q_TAIL)}"
            f", {words}, releases {self.releases}+{self.sweep_releases} (sweep)"
            f", acker deaths {self.deaths}"
        )

    def exit_codes(self, role: str) -> list[int | None]:
        return [
            None if c.status is None else os.waitstatus_to_exitcode(c.status)
            for c in self.children.values()
            if c.role == role
        ]


@pytest.fixture
def race(make_segment: SegmentFactory) -> Iterator[Race]:
    seg = make_segment(LIMITS)
    SharedQueues(seg, 0).create(QID, b"flow-race", 0, 0, capacity=CAPACITY, resume=RESUME)
    ctrl_buf = mmap.mmap(-1, CTRL_SIZE)  # anonymous and shared: inherited by fork
    efd = os.eventfd(0, os.EFD_NONBLOCK)  # as the supervisor makes it
    r = Race(seg, Atomic(ctrl_buf), efd, random.Random(0xF10))
    try:
        yield r
    finally:
        r.stop_all()
        os.close(efd)


def run_to_the_end(
    race: Race,
    sweep: bool,
    kills: int = 0,
    window_deaths: int = 0,
) -> int:
    """Schedule until the publishers are done and the queue is empty, then
    stop the ackers. With `kills`, SIGKILL up to that many ackers at random
    moments; with `window_deaths`, let that many ackers kill themselves
    inside the window; each dead acker is recovered and replaced. Returns
    how many were killed by us.

    With kills, the wake bits are drained every round, not only when the
    eventfd fires: an acker killed inside Waker.kick, between its bit and
    its eventfd write, would leave the bitmap word set and the eventfd never
    written again. That is the Waker's window, not this handshake's; here
    only Q_FLOW's own fallback (the sweep) is under test."""
    seg, ctrl, rng = race.seg, race.ctrl, race.rng
    poll = bool(kills or window_deaths)
    deadline = time.monotonic() + WAIT
    next_sweep = time.monotonic() + SWEEP_INTERVAL
    next_kill = time.monotonic() + rng.uniform(0.005, 0.04)
    killed = 0
    while race.running("acker"):
        now = time.monotonic()
        if now > deadline:
            pytest.fail(f"the race did not finish in {WAIT} s: {race.state()}")
        race.on_wake(0.002, poll)
        if sweep and now >= next_sweep:
            race.sweep()
            next_sweep = now + SWEEP_INTERVAL
        if killed < kills and now >= next_kill and not ctrl.load(STOP):
            victim = rng.choice(race.running("acker"))
            os.kill(victim, signal.SIGKILL)
            killed += 1
            next_kill = now + rng.uniform(0.005, 0.04)
        for child in race.reap():
            if child.role == "publisher" or os.waitstatus_to_exitcode(child.status or 0) >= 0:
                continue
            # A dead acker: what the supervisor does, then a replacement.
            race.deaths += 1
            release_owner(race.shared, child.worker + 1)
            if not ctrl.load(STOP):
                left = window_deaths - ctrl.load(WINDOW_DEATHS)
                race.spawn_acker(child.worker, rng.randint(1, 4) if left > 0 else 0)
        if (
            not race.running("publisher")
            and not ctrl.load(STOP)
            and qword(seg, QID, L.Q_HEAD) == qword(seg, QID, L.Q_TAIL)
        ):
            ctrl.store(STOP, 1)
    return killed


def start(race: Race, publishers: tuple[int, ...], ackers: tuple[int, ...], count: int) -> None:
    for worker in publishers:
        race.spawn("publisher", worker, publish, count, race.rng.randrange(1 << 30))
    for worker in ackers:
        race.spawn_acker(worker, 0)


def assert_all_released(race: Race, min_blocks: int = 10) -> None:
    ctrl = race.ctrl
    stuck = ctrl.load(STUCK)
    assert not stuck, (
        f"{stuck} publisher(s) never released (Q_FLOW {ctrl.load(STUCK_FLOW)}, "
        f"Q_BYTES {ctrl.load(STUCK_BYTES)} <= resume {RESUME}?): {race.state()}"
    )
    assert race.exit_codes("publisher") == [0] * len(race.exit_codes("publisher")), race.state()
    assert ctrl.load(WAITING) == 0, race.state()
    assert ctrl.load(BLOCKS) >= min_blocks, f"publishers hardly blocked: {race.state()}"
    assert race.releases + race.sweep_releases > 0, race.state()
    assert qword(race.seg, QID, L.Q_HEAD) == qword(race.seg, QID, L.Q_TAIL)


@pytest.mark.parametrize(
    ("publishers", "ackers", "count"),
    [(PUBLISHERS[:1], ACKERS[:2], 50_000), (PUBLISHERS, ACKERS[:2], 30_000)],
    ids=["1-publisher-2-ackers", "3-publishers-2-ackers"],
)
def test_a_blocked_publisher_is_always_released(
    race: Race, publishers: tuple[int, ...], ackers: tuple[int, ...], count: int
) -> None:
    """No sweep: every release comes from the handshake (an acker's drained,
    the scheduler's take_release on the wake-up)."""
    start(race, publishers, ackers, count)
    run_to_the_end(race, sweep=False)
    assert race.exit_codes("acker") == [0] * len(ackers), race.state()
    assert race.sweep_releases == 0
    assert_all_released(race)


def test_ackers_killed_anywhere_leave_no_publisher_blocked(race: Race) -> None:
    """Ackers SIGKILLed at random moments and right inside the window between
    their byte decrement and their Q_FLOW check: the sweep's rule (with the
    supervisor's release_owner for the dead ones' entries) still releases
    every blocked publisher."""
    start(race, PUBLISHERS, ACKERS[:2], 30_000)
    killed = run_to_the_end(race, sweep=True, kills=15, window_deaths=15)
    assert killed >= 5, f"only {killed} ackers killed: {race.state()}"
    assert race.ctrl.load(WINDOW_DEATHS) > 0, f"no acker died in the window: {race.state()}"
    assert_all_released(race)


def test_the_sweep_releases_what_an_acker_killed_in_the_window_left_blocked(
    race: Race,
) -> None:
    """Deterministic: one publisher blocks; the only acker drains the queue to
    its resume size and is killed right after that ack, before its Q_FLOW
    check. Nobody kicked the scheduler, so nothing but the sweep can release
    the publisher; its rule does."""
    ctrl = race.ctrl
    race.spawn("publisher", PUBLISHERS[0], publish, 300, 7)
    deadline = time.monotonic() + WAIT
    while not ctrl.load(WAITING):
        assert time.monotonic() < deadline, f"the publisher never blocked: {race.state()}"
        race.on_wake(0.002)
        assert not race.reap(), f"the publisher ended without blocking: {race.state()}"
    acker = race.spawn_acker(ACKERS[0], 1)
    while race.children[acker].status is None:
        assert time.monotonic() < deadline, f"the acker did not die: {race.state()}"
        race.on_wake(0.002)
        race.reap()
    assert os.waitstatus_to_exitcode(race.children[acker].status or 0) == -signal.SIGKILL
    assert ctrl.load(WINDOW_DEATHS) == 1
    release_owner(race.shared, ACKERS[0] + 1)
    # The lost release: BLOCKED at or below resume, no wake-up, publisher waiting.
    race.on_wake(0, poll=True)
    assert race.releases == 0 and ctrl.load(GEN) == 0
    assert qword(race.seg, QID, L.Q_FLOW) == L.FLOW_BLOCKED
    assert qword(race.seg, QID, L.Q_BYTES) <= RESUME
    assert ctrl.load(WAITING) == 1 and race.running("publisher")
    # The publisher stopped while the sweep releases it: once released, with
    # no acker draining, it fills the queue and blocks it again, and on a
    # busy machine it could do so before the look below.
    (publisher,) = race.running("publisher")
    os.kill(publisher, signal.SIGSTOP)
    try:
        race.sweep()
        assert race.sweep_releases == 1 and ctrl.load(GEN) == 1
        assert qword(race.seg, QID, L.Q_FLOW) == L.FLOW_OPEN
    finally:
        os.kill(publisher, signal.SIGCONT)
    while not ctrl.load(RELEASED):
        assert time.monotonic() < deadline, f"the publisher was not released: {race.state()}"
        time.sleep(0.0002)
    # A replacement acker; the publisher finishes.
    race.spawn_acker(ACKERS[0], 0)
    run_to_the_end(race, sweep=True)
    assert_all_released(race, min_blocks=2)
