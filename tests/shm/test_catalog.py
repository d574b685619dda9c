"""The definitions journal (shm/catalog.py): one writer, many readers.

The writer here plays the scheduler (apply an operation to its own
`Definitions`, then journal it) and readers play IO workers (replay what
`poll()` returns). States are compared through an independent reference
model: sets of exchange and binding tuples with an order-independent
fingerprint, kept for every prefix of a generated operation sequence, so a
reader can be checked to hold *exactly* the writer's state after some prefix,
never a mixture, never going backwards. The race and SIGKILL tests fork the
writer after the segment is mapped, as the supervisor forks the scheduler.
"""

from __future__ import annotations

import functools
import mmap
import os
import random
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import pytest

from shoal.broker.amqp.definitions import (
    Bound,
    Definitions,
    ExchangeDeclared,
    ExchangeDeleted,
    Op,
    QueueArgumentsSet,
    QueueGone,
    Unbound,
    default_exchange_ops,
    inverse,
)
from shoal.shm import layout as L
from shoal.shm._atomic import Atomic
from shoal.shm.catalog import (
    C_EPOCH,
    C_GEN,
    H_USED,
    CatalogFull,
    CatalogReader,
    CatalogWriter,
    half_capacity,
)
from shoal.shm.segment import Segment

from ._support import Interposer, SegmentFactory

# The smallest catalog there is: two halves of about 32 KiB, so a few hundred
# appends fill one and the writer compacts.
LIMITS = L.Limits(
    max_workers=4, max_queues=64, queue_capacity=16, arena_bytes=1 << 16, catalog_bytes=1 << 16
)
VHOSTS = ("/", "v2")
EXCHANGES = tuple(f"e{i}" for i in range(8))
QUEUES = tuple(f"q{i}" for i in range(16))
TYPES = ("direct", "fanout", "topic", "headers")
WORDS = ("a", "b", "c", "*", "#")
MASK = (1 << 64) - 1

PROBE_KEYS = ("", "a", "b", "c", "a.b", "a.b.c", "c.b.a", "a.a.a.a", "b.c", "x")
PROBE_HEADERS: tuple[dict[str, Any] | None, ...] = (
    None,
    {"h1": 1},
    {"h1": 1, "h2": "v"},
    {"h2": "v", "x-h": 1},
    {"h1": 2, "h3": None},
)

WAIT = 30.0  # the bound on any wait for a child


# -------------------------------------------------------------------- model
def frozen(args: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in args.items()))


def exchange_item(vhost: str, name: str, type_: str, d: bool, ad: bool, i: bool, args: Any) -> Any:
    return ("x", vhost, name, type_, bool(d), bool(ad), bool(i), frozen(args))


def binding_item(vhost: str, source: str, kind: str, dest: str, rk: str, args: Any) -> Any:
    return ("b", vhost, source, kind, dest, rk, frozen(args))


def queue_item(vhost: str, queue: str, args: Any) -> Any:
    return ("q", vhost, queue, frozen(args))


def fingerprint(defs: Definitions) -> int:
    """The fingerprint of a Definitions, from scratch (as the model's)."""
    fp = 0
    for vhost, router in defs.vhosts.items():
        for x in router.exchanges.values():
            item = exchange_item(
                vhost, x.name, x.type, x.durable, x.auto_delete, x.internal, x.arguments
            )
            fp = (fp + hash(item)) & MASK
            for (dest, rk, _f), args in x.bindings.items():
                fp = (fp + hash(binding_item(vhost, x.name, dest[0], dest[1], rk, args))) & MASK
    for (vhost, queue), args in defs.queue_arguments.items():
        fp = (fp + hash(queue_item(vhost, queue, args))) & MASK
    return fp


class Model:
    """What the definitions must be, as plain sets: an exchange is declared
    once (a redeclare changes nothing), deleting one drops its bindings both
    ways, QueueArgumentsSet records a queue's x-arguments, QueueGone drops the
    bindings to a queue and its arguments. `fp` is kept incrementally."""

    def __init__(self) -> None:
        self.exchanges: dict[tuple[str, str], tuple[Any, str]] = {}  # -> (item, type)
        self.bindings: dict[Any, Bound] = {}  # item -> the Bound operation
        self.queue_args: dict[tuple[str, str], Any] = {}  # -> item
        self.fp = 0

    def _add(self, item: Any) -> None:
        self.fp = (self.fp + hash(item)) & MASK

    def _drop(self, item: Any) -> None:
        self.fp = (self.fp - hash(item)) & MASK

    def apply(self, op: Op) -> None:
        vhost = op.vhost
        if isinstance(op, ExchangeDeclared):
            _v, name, type_, d, ad, i, args = msgspec.structs.astuple(op)
            if (vhost, name) not in self.exchanges:
                item = exchange_item(vhost, name, type_, d, ad, i, args)
                self.exchanges[vhost, name] = (item, type_)
                self._add(item)
        elif isinstance(op, ExchangeDeleted):
            name = op.name
            entry = self.exchanges.pop((vhost, name), None)
            if entry is not None:
                self._drop(entry[0])
            for item in [
                b
                for b in self.bindings
                if b[1] == vhost and (b[2] == name or (b[3], b[4]) == ("e", name))
            ]:
                del self.bindings[item]
                self._drop(item)
        elif isinstance(op, Bound | Unbound):
            item = binding_item(*msgspec.structs.astuple(op))
            if isinstance(op, Bound):
                if (vhost, op.source) in self.exchanges and item not in self.bindings:
                    self.bindings[item] = op
                    self._add(item)
            elif self.bindings.pop(item, None) is not None:
                self._drop(item)
        elif isinstance(op, QueueArgumentsSet):
            old = self.queue_args.pop((vhost, op.queue), None)
            if old is not None:
                self._drop(old)
            self.queue_args[vhost, op.queue] = queue_item(vhost, op.queue, op.arguments)
            self._add(self.queue_args[vhost, op.queue])
        elif isinstance(op, QueueGone):
            for item in [b for b in self.bindings if b[1] == vhost and b[3:5] == ("q", op.queue)]:
                del self.bindings[item]
                self._drop(item)
            old = self.queue_args.pop((vhost, op.queue), None)
            if old is not None:
                self._drop(old)
        else:
            raise ValueError(op)


def random_args(rng: random.Random, type_: str) -> dict[str, Any]:
    if type_ != "headers" or rng.random() < 0.1:
        return {} if rng.random() < 0.9 else {"note": rng.randrange(3)}
    args: dict[str, Any] = {"x-match": rng.choice(("all", "any", "all-with-x", "any-with-x"))}
    for key in rng.sample(("h1", "h2", "h3", "x-h"), rng.randrange(1, 4)):
        args[key] = rng.choice((1, 2, "v", None))
    return args


def next_op(rng: random.Random, model: Model) -> Op:
    """A random operation that changes the state, as the scheduler journals
    them (never a no-op: consecutive prefixes have different fingerprints)."""
    while True:
        roll = rng.random()
        vhost = rng.choice(VHOSTS)
        declared = [n for (v, n) in model.exchanges if v == vhost]
        if roll < 0.10:
            name = rng.choice(EXCHANGES)
            if (vhost, name) in model.exchanges:
                continue
            type_ = rng.choice(TYPES)
            args: dict[str, Any] = {}
            if rng.random() < 0.3:
                args["alternate-exchange"] = rng.choice(EXCHANGES)
            flags = [rng.random() < 0.5 for _ in range(3)]
            return ExchangeDeclared(vhost, name, type_, *flags, args)
        if roll < 0.15:
            mine = [n for n in declared if not n.startswith("amq.")]
            if mine:
                return ExchangeDeleted(vhost, rng.choice(mine))
            continue
        if roll < 0.62:
            if not declared:
                continue
            source = rng.choice(declared)
            type_ = model.exchanges[vhost, source][1]
            if rng.random() < 0.8:
                dkind, dest = "q", rng.choice(QUEUES)
            else:
                dkind, dest = "e", rng.choice(declared)
            words = rng.choices(WORDS if type_ == "topic" else WORDS[:3], k=rng.randrange(1, 4))
            rk = ".".join(words)
            op = Bound(vhost, source, dkind, dest, rk, random_args(rng, type_))
            if binding_item(*msgspec.structs.astuple(op)) in model.bindings:
                continue
            return op
        if roll < 0.90:
            if not model.bindings:
                continue
            # bindings is insertion ordered: pick among the recent ones
            # most of the time, so that the state stays small.
            items = list(model.bindings)
            item = items[-1 - min(int(rng.expovariate(0.05)), len(items) - 1)]
            return inverse(model.bindings[item])
        queue = rng.choice(QUEUES)
        if roll < 0.95:
            if (vhost, queue) not in model.queue_args:  # a queue declared with x-arguments
                return QueueArgumentsSet(vhost, queue, {"x-max-length": rng.randrange(1, 100)})
            continue
        if (vhost, queue) in model.queue_args or any(
            b[1] == vhost and b[3:5] == ("q", queue) for b in model.bindings
        ):
            return QueueGone(vhost, queue)


def initial_ops() -> list[Op]:
    return default_exchange_ops("/") + default_exchange_ops("v2")


def generate(seed: int, n: int) -> tuple[list[Op], list[int]]:
    """n operations after the initial state, and the model's fingerprint
    after each prefix (prints[0]: the initial state)."""
    rng = random.Random(seed)
    model = Model()
    for op in initial_ops():
        model.apply(op)
    ops: list[Op] = []
    prints = [model.fp]
    for _ in range(n):
        op = next_op(rng, model)
        model.apply(op)
        ops.append(op)
        prints.append(model.fp)
        assert prints[-1] != prints[-2], op
    return ops, prints


def replay(ops: list[Op]) -> Definitions:
    defs = Definitions()
    for op in ops:
        defs.apply(op)
    return defs


def routes(defs: Definitions) -> dict[tuple[str, str, str, int], frozenset[str]]:
    """Every exchange's routing of a set of probe messages."""
    out = {}
    for vhost, router in defs.vhosts.items():
        for name in router.exchanges:
            for rk in PROBE_KEYS:
                for i, headers in enumerate(PROBE_HEADERS):
                    out[vhost, name, rk, i] = frozenset(router.route(name, rk, headers))
    return out


def assert_equivalent(got: Definitions, want: Definitions) -> None:
    assert fingerprint(got) == fingerprint(want)
    assert routes(got) == routes(want)


class Scheduler:
    """The writer's side as broker/scheduler/journal.py drives it."""

    def __init__(self, seg: Segment, ops: list[Op] | None = None) -> None:
        self.writer = CatalogWriter(seg, Op)
        self.defs = replay(ops or [])

    def do(self, op: Op) -> None:
        self.defs.apply(op)
        self.writer.append(op, self.defs.snapshot)


class Replica:
    """The reader's side as workers/routes.py drives it."""

    def __init__(self, seg: Segment) -> None:
        self.reader = CatalogReader(seg, Op)
        self.defs = Definitions()
        self.resets = 0

    def sync(self) -> bool:
        if not self.reader.changed():
            return False
        reset, ops = self.reader.poll()
        if reset:
            self.defs = Definitions()
            self.resets += 1
        for op in ops:
            self.defs.apply(op)
        return True


def epoch(seg: Segment) -> int:
    return seg.atomic.load(seg.layout.catalog + C_EPOCH)


def gen(seg: Segment) -> int:
    return seg.atomic.load(seg.layout.catalog + C_GEN)


@pytest.fixture
def seg(make_segment: SegmentFactory) -> Segment:
    return make_segment(LIMITS)


# ---------------------------------------------------------- single process
def test_poll_returns_only_new_operations(seg: Segment) -> None:
    replica = Replica(seg)
    reader = replica.reader
    assert reader.changed()  # a new reader always looks once
    assert reader.poll() == (True, [])
    assert not reader.changed()

    sched = Scheduler(seg)
    ops = initial_ops()
    for op in ops[:3]:
        sched.do(op)
    assert reader.changed()
    assert reader.poll() == (False, ops[:3])
    assert not reader.changed()
    assert reader.poll() == (False, [])

    for op in ops[3:]:
        sched.do(op)
    bind = Bound("/", "amq.topic", "q", "q1", "a.*", {})
    sched.do(bind)
    assert reader.poll() == (False, [*ops[3:], bind])
    # A reader that starts late gets everything at once, as a reset.
    late = CatalogReader(seg, Op)
    assert late.poll() == (True, [*ops, bind])
    assert epoch(seg) == 0  # no compaction so far


def test_compaction_resets_readers_to_the_snapshot(seg: Segment) -> None:
    sched = Scheduler(seg)
    for op in initial_ops():
        sched.do(op)
    replica = Replica(seg)
    replica.sync()
    before = epoch(seg)
    # Bind and unbind the same thing over and over: the journal grows, the
    # state does not; the writer compacts when the half is full.
    n = 0
    while epoch(seg) == before:
        op = Bound("/", "amq.direct", "q", f"q{n % 4}", f"key-{n}", {})
        sched.do(op)
        sched.do(inverse(op))
        n += 1
        assert n < 10_000, "the writer never compacted"
    assert epoch(seg) == before + 2
    reset, ops = replica.reader.poll()
    assert reset
    # The compaction came with a bind or an unbind: the snapshot of the state
    # after it, then maybe the unbind appended to the fresh half.
    assert ops == sched.defs.snapshot() or (
        ops[-1] == inverse(op) and ops[:-1] == replay(ops[:-1]).snapshot()
    )
    replica.defs = replay(ops)
    assert_equivalent(replica.defs, sched.defs)

    # After the reset, appends are incremental again.
    more = Bound("/", "amq.fanout", "q", "q9", "", {})
    sched.do(more)
    assert replica.reader.poll() == (False, [more])

    # Explicit compactions (one per scheduler start) too.
    for k in range(3):
        sched.writer.compact(sched.defs.snapshot())
        assert replica.sync()
        assert replica.resets == 2 + k  # the first sync's, then one per compaction
        assert_equivalent(replica.defs, sched.defs)


def test_load_replays_to_the_same_state(seg: Segment) -> None:
    ops, prints = generate(seed=1, n=3000)
    sched = Scheduler(seg)
    for op in initial_ops():
        sched.do(op)
    appended = list(initial_ops())
    compacted = False
    for i, op in enumerate(ops):
        e = epoch(seg)
        sched.do(op)
        appended.append(op)
        if epoch(seg) != e:
            compacted = True
            appended = sched.defs.snapshot()
        if i in (0, 10, 100) or i % 500 == 499:
            loaded = CatalogWriter(seg, Op).load()
            # The last compaction's snapshot, then the very operations since.
            assert loaded == appended
            defs = replay(loaded)
            assert fingerprint(defs) == prints[i + 1]
            assert_equivalent(defs, sched.defs)
    assert compacted and epoch(seg) >= 6, "3000 operations should compact several times"
    # load() makes readers look once more, and changes nothing else.
    g, e = gen(seg), epoch(seg)
    CatalogWriter(seg, Op).load()
    assert (gen(seg), epoch(seg)) == (g + 1, e)


def test_catalog_full_changes_nothing(seg: Segment) -> None:
    sched = Scheduler(seg)
    for op in initial_ops():
        sched.do(op)
    capacity = half_capacity(seg.layout)
    huge: list[Op] = [
        Bound("/", "amq.direct", "q", "q0", "k" * 200 + str(i), {}) for i in range(1000)
    ]
    reader = CatalogReader(seg, Op)
    reader.poll()
    g, e = gen(seg), epoch(seg)
    with pytest.raises(CatalogFull):
        sched.writer.compact(initial_ops() + huge)
    assert (gen(seg), epoch(seg)) == (g, e)
    assert not reader.changed()
    assert CatalogWriter(seg, Op).load() == initial_ops()

    # Grow the live state until an append needs a compaction that cannot fit.
    sched2 = Scheduler(seg, CatalogWriter(seg, Op).load())
    reader.poll()
    i = 0
    while True:
        op = Bound("/", "amq.topic", "q", f"q{i % 16}", f"{i}." + "w" * 150, {})
        before_gen, before_epoch = gen(seg), epoch(seg)
        before_ops = CatalogWriter(seg, Op).load()  # (bumps gen: readers look once)
        before_gen += 1
        sched2.defs.apply(op)
        try:
            sched2.writer.append(op, sched2.defs.snapshot)
        except CatalogFull:
            break
        i += 1
        assert i < 5000, "the state never outgrew a half"
    # Nothing was written: same generation, same epoch, same operations.
    assert (gen(seg), epoch(seg)) == (before_gen, before_epoch)
    assert CatalogWriter(seg, Op).load() == before_ops
    assert i * 150 > capacity // 2  # it did fill up first
    sched2.defs.apply(inverse(op))  # what the scheduler does on CatalogFull
    assert_equivalent(replay(before_ops), sched2.defs)


# ------------------------------------------------------------ with a fork
# The control page, shared with the writer child.
DONE = 0  # child: operations journaled (stored after each append returns)
PAUSED = 8  # child: stopped at the chosen write, waiting for SIGKILL
CTRL_SIZE = 4096


class Child:
    def __init__(self, fn: Callable[[], None]) -> None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fn()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.status: int | None = None

    def exited(self) -> bool:
        if self.status is None and select.select([self.pidfd], [], [], 0)[0]:
            self.status = os.waitpid(self.pid, 0)[1]
            os.close(self.pidfd)
        return self.status is not None

    def wait(self, timeout: float = WAIT) -> int:
        if self.status is None:
            if not select.select([self.pidfd], [], [], timeout)[0]:
                pytest.fail(f"writer {self.pid} still running after {timeout} s")
            self.exited()
        assert self.status is not None
        return os.waitstatus_to_exitcode(self.status)

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        assert self.wait() == -signal.SIGKILL

    def reap(self) -> None:
        if not self.exited():
            self.kill()


@pytest.fixture
def ctrl() -> Iterator[Atomic]:
    buf = mmap.mmap(-1, CTRL_SIZE)  # anonymous and shared: inherited by fork
    yield Atomic(buf)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.reap()


def run_writer(
    seg: Segment,
    ctrl: Atomic,
    ops: list[Op],
    start: int,
    pause: Callable[[Segment, int, str, int], bool] | None = None,
) -> None:
    """The scheduler (re)started: load() the journal, then journal ops[start:],
    storing DONE after each. With `pause`, stop at the first write it picks
    (PAUSED=1) and wait there to be killed."""
    sched = Scheduler(seg)
    sched.defs = replay(sched.writer.load())
    if pause is not None:
        done = [start]

        def hook(_n: int, op: str, offset: int) -> None:
            if pause(seg, done[0], op, offset):
                ctrl.store(PAUSED, 1)
                while True:
                    signal.pause()

        sched.writer.a = Interposer(seg.atomic, hook)  # type: ignore[assignment]
    for i in range(start, len(ops)):
        if pause is not None:
            done[0] = i
        sched.do(ops[i])
        ctrl.store(DONE, i + 1)


class Preempted:
    """A reader's view of the segment whose next copy of journal bytes is
    held back until the writer has compacted twice more (the reader was
    descheduled between loading H_USED and copying): the half it copies has
    been rewritten meanwhile, which the reader must notice and start again."""

    def __init__(self, seg: Segment, ctrl: Atomic, last: int) -> None:
        self.real = seg
        self.atomic = seg.atomic
        self.layout = seg.layout
        self.buf = self
        self.ctrl = ctrl
        self.last = last  # DONE when the writer is finished
        self.armed = False
        self.stalls = 0  # copies held back until the half was rewritten
        self.copies = 0

    def __getitem__(self, key: slice) -> bytes:
        self.copies += 1
        if self.armed:
            self.armed = False
            target = epoch(self.real) + 4
            deadline = time.monotonic() + WAIT
            while epoch(self.real) < target and self.ctrl.load(DONE) < self.last:
                assert time.monotonic() < deadline, "the writer stopped compacting"
                os.sched_yield()
            if epoch(self.real) >= target:
                self.stalls += 1
        return bytes(self.real.buf[key])


class Checker:
    """A reader in the parent: after every poll its state must be the
    writer's after some prefix k, lo <= k <= hi + 1 where lo and hi are DONE
    before and after the poll, and k never decreases."""

    def __init__(self, seg: Segment | Preempted, ctrl: Atomic, prints: list[int]) -> None:
        self.replica = Replica(seg)  # type: ignore[arg-type]
        self.ctrl = ctrl
        self.prints = prints
        self.k = 0
        self.polls = 0

    def check(self) -> None:
        lo = self.ctrl.load(DONE)
        if not self.replica.sync():
            return
        hi = self.ctrl.load(DONE)
        self.polls += 1
        fp = fingerprint(self.replica.defs)
        window = range(max(self.k, lo), min(hi + 1, len(self.prints) - 1) + 1)
        k = next((k for k in window if self.prints[k] == fp), None)
        assert k is not None, (
            f"poll {self.polls}: the reader's state is not the writer's after any of the "
            f"operations {window.start}..{window.stop - 1} (previously at {self.k})"
        )
        self.k = k


def test_reader_racing_the_writer_ends_with_its_state(
    make_segment: SegmentFactory, ctrl: Atomic, children: list[Child]
) -> None:
    """Many rounds: a forked writer journals thousands of operations,
    compacting dozens of times, while the parent polls as fast as it can
    (and, in half of the rounds, is now and then preempted mid-copy)."""
    deadline = time.monotonic() + 20
    total_resets = total_polls = total_compactions = stalls = torn = 0
    for seed in range(4):
        seg = make_segment(LIMITS)
        ops, prints = generate(seed=100 + seed, n=20_000)
        boot = Scheduler(seg)
        boot.writer.compact(initial_ops())  # as a new scheduler does
        ctrl.store(DONE, 0)
        # Rounds 2 and 3: every 5th poll, the reader is preempted mid-copy.
        view = Preempted(seg, ctrl, len(ops))
        checker = Checker(view if seed >= 2 else seg, ctrl, prints)
        child = Child(functools.partial(run_writer, seg, ctrl, ops, 0))
        children.append(child)
        while not child.exited():
            view.armed = seed >= 2 and checker.polls % 5 == 4
            copies = view.copies
            checker.check()
            if view.armed is False and view.copies - copies > 1:
                torn += 1  # the reader started again
            assert time.monotonic() < deadline, "the rounds took too long"
        stalls += view.stalls
        assert child.wait() == 0
        assert ctrl.load(DONE) == len(ops)
        checker.check()
        assert checker.k == len(ops)
        assert fingerprint(checker.replica.defs) == prints[-1]
        assert_equivalent(checker.replica.defs, replay(initial_ops() + ops))
        assert_equivalent(replay(CatalogWriter(seg, Op).load()), checker.replica.defs)
        total_resets += checker.replica.resets
        total_polls += checker.polls
        total_compactions += epoch(seg) // 2
    # The point: the reader really polled while compactions went on.
    assert total_compactions >= 4 * 15, total_compactions
    assert total_polls > 100 and total_resets > 4, (total_polls, total_resets)
    # Every copy held back past two compactions was read again.
    assert stalls >= 5 and torn >= stalls, (stalls, torn)


# Where a paused writer stops (it is then SIGKILLed), and whether the
# operation in hand (index DONE) made it into the journal.
def _is(seg: Segment, offset: int, where: int) -> bool:
    return offset == seg.layout.catalog + where


def _in_half(seg: Segment, offset: int) -> bool:
    base = seg.layout.catalog
    return offset > base + 64 and (offset - base - 64) % ((LIMITS.catalog_bytes - 64) // 2) == (
        H_USED
    )


def _epoch_odd(seg: Segment) -> bool:
    return epoch(seg) % 2 == 1


PAUSES: dict[str, tuple[Callable[[Segment, str, int], bool], bool]] = {
    # appended a record (H_USED advanced), before the C_GEN bump
    "after-append": (lambda s, op, off: _in_half(s, off) and not _epoch_odd(s), True),
    # started a compaction (odd epoch), nothing of the new half written
    "compaction-begun": (lambda s, op, off: _is(s, off, C_EPOCH) and _epoch_odd(s), False),
    # wrote the new half and its H_USED, the epoch is still odd
    "compaction-written": (lambda s, op, off: _in_half(s, off) and _epoch_odd(s), False),
    # switched to the new half, before the C_GEN bump
    "compaction-switched": (
        lambda s, op, off: _is(s, off, C_EPOCH) and not _epoch_odd(s),
        True,
    ),
    # the C_GEN bump of an append or a compaction
    "gen-bumped": (lambda s, op, off: _is(s, off, C_GEN), True),
}


def _pause_at(
    chosen: Callable[[Segment, str, int], bool], first: int, s: Segment, i: int, op: str, off: int
) -> bool:
    return i >= first and chosen(s, op, off)


def test_writer_killed_anywhere_leaves_a_consistent_prefix(
    make_segment: SegmentFactory, ctrl: Atomic, children: list[Child]
) -> None:
    """A writer (the scheduler) is SIGKILLed again and again, at random
    moments and at each write of an append and of a compaction; each time
    load() must replay exactly the operations journaled so far, the next
    writer carries on from there, and a reader polling throughout, across
    the restarts, always holds a prefix and ends with the final state."""
    seg = make_segment(LIMITS)
    ops, prints = generate(seed=7, n=100_000)
    CatalogWriter(seg, Op).compact(initial_ops())
    ctrl.store(DONE, 0)
    checker = Checker(seg, ctrl, prints)
    rng = random.Random(3)
    plan = [*PAUSES] * 6 + ["random"] * 30
    rng.shuffle(plan)
    start = 0
    deadline = time.monotonic() + 25
    odd_epochs_left = 0
    for what in plan:
        skip = rng.randrange(1, 600)
        ctrl.store(PAUSED, 0)
        pause = None
        if what != "random":
            chosen = PAUSES[what][0]
            pause = functools.partial(_pause_at, chosen, start + skip)
        child = Child(functools.partial(run_writer, seg, ctrl, ops, start, pause))
        children.append(child)
        target = start + skip
        while not (ctrl.load(PAUSED) if pause else ctrl.load(DONE) >= target) and not (
            child.exited()
        ):
            checker.check()
            assert time.monotonic() < deadline, f"writer stuck ({what})"
        assert not child.exited(), f"writer exited early with {child.wait()} ({what})"
        child.kill()
        done = ctrl.load(DONE)
        odd_epochs_left += epoch(seg) % 2
        checker.check()  # readers may poll a dead writer's journal

        loaded = replay(CatalogWriter(seg, Op).load())
        fp = fingerprint(loaded)
        if what == "random":
            assert fp in (prints[done], prints[done + 1]), f"not a prefix after a kill at {done}"
            k = done if fp == prints[done] else done + 1
        else:
            k = done + 1 if PAUSES[what][1] else done
            assert fp == prints[k], f"killed at {what} with {done} done: not the state after {k}"
        assert epoch(seg) % 2 == 0  # load() finished off an interrupted compaction
        ctrl.store(DONE, k)
        start = k
        checker.check()
        assert checker.k == k
    assert odd_epochs_left >= 6  # the compaction-begun and -written kills

    # The last writer runs to the end; the reader follows it there.
    end = start + 2000
    assert end <= len(ops)
    child = Child(lambda: run_writer(seg, ctrl, ops[:end], start))
    children.append(child)
    while not child.exited():
        checker.check()
    assert child.wait() == 0
    checker.check()
    assert checker.k == end
    want = replay(initial_ops() + ops[:end])
    assert_equivalent(checker.replica.defs, want)
    assert_equivalent(replay(CatalogWriter(seg, Op).load()), want)
