"""shm/dedup_cache.py: the shared deduplication cache, alone and raced by
processes (one of them SIGKILLed while it holds the lock)."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from shoal.shm import dedup_cache as D


def cache(tmp_path: Path, size: int = 64, name: str = "c.cache") -> D.DedupCache:
    return D.DedupCache(str(tmp_path / name), size)


def test_first_is_new_then_duplicate(tmp_path: Path) -> None:
    c = cache(tmp_path)
    assert c.check_and_add(b"a", 0) is False
    assert c.check_and_add(b"a", 0) is True
    assert c.check_and_add(b"b", 0) is False
    assert c.stats() == (1, 2)
    assert c.entries() == 2


def test_another_process_sees_the_same_cache(tmp_path: Path) -> None:
    a = cache(tmp_path)
    b = cache(tmp_path)
    assert a.check_and_add(b"k", 0) is False
    assert b.check_and_add(b"k", 0) is True


def test_ttl_expires_a_key_and_it_is_new_again(tmp_path: Path) -> None:
    c = cache(tmp_path)
    assert c.check_and_add(b"k", 100, now=1000) is False
    assert c.check_and_add(b"k", 100, now=1099) is True
    assert c.contains(b"k", now=1100) is False
    assert c.check_and_add(b"k", 100, now=1100) is False  # expired: new
    assert c.check_and_add(b"k", 100, now=1150) is True
    assert c.entries(now=1150) == 1


def test_size_evicts_the_oldest_first(tmp_path: Path) -> None:
    c = cache(tmp_path, size=8)
    for i in range(8):
        assert not c.check_and_add(b"k%d" % i, 0)
    assert c.entries() == 8
    assert not c.check_and_add(b"new", 0)  # evicts k0
    assert c.entries() == 8
    assert not c.contains(b"k0")
    assert all(c.contains(b"k%d" % i) for i in range(1, 8))
    assert c.check_and_add(b"k0", 0) is False  # gone: new again (evicts k1)
    assert not c.contains(b"k1")


def test_forget_takes_a_key_out(tmp_path: Path) -> None:
    c = cache(tmp_path)
    c.check_and_add(b"a", 0)
    c.check_and_add(b"b", 0)
    c.forget(b"a")
    assert not c.contains(b"a") and c.contains(b"b")
    assert c.check_and_add(b"a", 0) is False


def test_long_keys_are_exact_and_never_equal_a_short_one(tmp_path: Path) -> None:
    import hashlib

    c = cache(tmp_path)
    long_key = b"x" * 500
    assert not c.check_and_add(long_key, 0)
    assert c.check_and_add(long_key, 0)
    assert not c.check_and_add(b"x" * 499 + b"y", 0)
    # The digest's own bytes, sent as a 32-byte key, are another key.
    assert not c.check_and_add(hashlib.sha256(long_key).digest(), 0)
    assert not c.check_and_add(b"x" * D.KEY_MAX, 0)
    assert c.check_and_add(b"x" * D.KEY_MAX, 0)


def test_a_cache_of_another_size_is_refused(tmp_path: Path) -> None:
    cache(tmp_path, size=16)
    with pytest.raises(ValueError):
        cache(tmp_path, size=32)


def test_matches_a_model_through_churn(tmp_path: Path) -> None:
    """Random adds, forgets and expiries against a dict and a FIFO model:
    every answer equal (no false positive, no false negative), including
    after the index has been rebuilt."""
    size = 50
    c = cache(tmp_path, size=size)
    rng = random.Random(7)
    model: dict[bytes, int] = {}  # key -> expires (0 never)
    order: list[bytes] = []  # ring order of live records
    ring: list[bytes | None] = [None] * size
    head = 0
    now = 10_000
    for step in range(20_000):
        now += rng.randrange(3)
        key = b"k%d" % rng.randrange(120)
        if rng.random() < 0.1:
            c.forget(key)
            if key in model:
                ring[ring.index(key)] = None
                del model[key]
            continue
        ttl = rng.choice((0, 0, 50, 200))
        live = key in model and (model[key] == 0 or model[key] > now)
        got = c.check_and_add(key, ttl, now=now)
        assert got is live, (step, key)
        if not live:
            if key in model:
                ring[ring.index(key)] = None
            evicted = ring[head % size]
            if evicted is not None:
                del model[evicted]
            ring[head % size] = key
            head += 1
            model[key] = now + ttl if ttl else 0
        if step == 10_000:
            c._rebuild()
    del order


def _racer(path: str, size: int, keys: int, seed: int, out: mp.Queue) -> None:
    c = D.DedupCache(path, size)
    rng = random.Random(seed)
    order = list(range(keys))
    rng.shuffle(order)
    won = [k for k in order if not c.check_and_add(b"id-%d" % k, 0)]
    out.put(won)


def test_many_processes_same_ids_exactly_one_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "race.cache")
    keys, procs = 3000, 6
    D.DedupCache(path, 4096)
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    ps = [ctx.Process(target=_racer, args=(path, 4096, keys, s, out)) for s in range(procs)]
    for p in ps:
        p.start()
    won = [out.get(timeout=60) for _ in ps]
    for p in ps:
        p.join(timeout=30)
        assert p.exitcode == 0
    everything = sorted(k for w in won for k in w)
    assert everything == list(range(keys))  # each id won once, by one process


def _hold_lock_forever(path: str, size: int, ready: mp.Event) -> None:
    c = D.DedupCache(path, size)
    c.check_and_add(b"before", 0)
    c._lock()
    # Half a change: a record's state cleared (as _insert starts with).
    ready.set()
    signal.pause()


def test_a_holder_killed_inside_the_lock_is_taken_over(tmp_path: Path) -> None:
    path = str(tmp_path / "kill.cache")
    c = D.DedupCache(path, 64)
    for i in range(20):
        c.check_and_add(b"k%d" % i, 0)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_lock_forever, args=(path, 64, ready))
    p.start()
    assert ready.wait(30)
    assert c.a.load(D.H_LOCK) == p.pid
    os.kill(p.pid, signal.SIGKILL)
    p.join(timeout=30)
    # Whoever comes next takes the lock over and finds every key.
    assert c.check_and_add(b"k3", 0) is True
    assert c.check_and_add(b"before", 0) is True
    assert c.check_and_add(b"after", 0) is False
    assert c.a.load(D.H_LOCK) == 0


def _kill_many(path: str, size: int, seed: int) -> None:
    c = D.DedupCache(path, size)
    for i in range(100_000):
        c.check_and_add(b"s%d-%d" % (seed, i), 0)


def test_sigkill_mid_stream_leaves_no_false_positive(tmp_path: Path) -> None:
    """Writers SIGKILLed at random points: what they added is found or not
    (they were never confirmed), but a key nobody added is never a
    duplicate, and every key added before the kills is still there."""
    path = str(tmp_path / "k.cache")
    size = 2048
    c = D.DedupCache(path, size)
    base = [b"base-%d" % i for i in range(500)]
    for k in base:
        assert not c.check_and_add(k, 0)
    ctx = mp.get_context("fork")
    for round_ in range(5):
        p = ctx.Process(target=_kill_many, args=(path, size, round_))
        p.start()
        start = c.stats()[1]
        while c.stats()[1] < start + 200:  # it is adding
            os.sched_yield()
        os.kill(p.pid, signal.SIGKILL)
        p.join(timeout=30)
        # The ring holds 2048: by now the oldest base keys may be evicted,
        # but no key nobody sent may be a duplicate.
        for i in range(200):
            assert not c.check_and_add(b"never-%d-%d" % (round_, i), 0)
    # Index and ring agree: every record is found through the index.
    seen = 0
    for pos in range(size):
        rec = c.ring + pos * D.RECORD_SIZE
        h = c.a.load(rec + D.R_STATE)
        if h:
            assert c._slot_of(h, pos) >= 0
            seen += 1
    # (a writer killed inside an insert leaves at most its one record out)
    assert min(size, c.a.load(D.H_HEAD)) - 5 <= seen <= size


def test_the_c_call_leaves_the_same_memory_as_the_python_steps(tmp_path: Path) -> None:
    """Atomic.dedup_add is check_and_add_steps in C: same answers, same
    bytes in the file after every step of a churn with expiries, evictions
    and long keys."""
    c = cache(tmp_path, size=40, name="c.cache")
    py = cache(tmp_path, size=40, name="py.cache")
    rng = random.Random(11)
    now = 1_000
    for step in range(5000):
        now += rng.randrange(4)
        key = b"k%d" % rng.randrange(90)
        if rng.random() < 0.05:
            key = key * 40  # longer than KEY_MAX: kept as its digest
        ttl = rng.choice((0, 30, 100))
        assert c.check_and_add(key, ttl, now=now) is py.check_and_add_steps(key, ttl, now=now)
        if step % 500 == 0:
            assert c._buf[:] == py._buf[:], step
    assert c._buf[:] == py._buf[:]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-deduplication-header": "abc"},
        {"a": 1, "x-deduplication-header": "k" * 300, "z": [1, "x"]},
        {"x-deduplication-header": "é-utf8", "nested": {"t": True}},
        {"x-deduplication-header": 42},  # not a longstr: the Python parse
        {"x-deduplication-header": "k", "x-cache-ttl": 5},  # a TTL: the Python parse
        {"other": "x-deduplication-header"},
        {},
        None,
    ],
)
def test_the_c_key_is_the_python_key(headers: dict[str, Any] | None) -> None:
    """workers/_wire.c dedup_key gives message_key()'s key, or hands over."""
    from pamqp import commands as C
    from pamqp.header import ContentHeader

    from shoal.broker.amqp import dedup_arguments
    from shoal.workers._wire import dedup_key
    from shoal.workers.routes import message_headers

    props = C.Basic.Properties(content_type="text/plain", headers=headers)
    raw = ContentHeader(0, 10, props).marshal()  # a content header frame's payload
    fast = dedup_key(raw)
    expected = dedup_arguments.message_key(message_headers(raw))
    if fast is False:
        assert expected is not None
    elif fast is None:
        assert expected is None
    else:
        assert expected == (fast, 0)
    if headers and isinstance(headers.get("x-deduplication-header"), str):
        assert ("x-cache-ttl" in headers) is (fast is False)


def test_a_copied_cache_is_repaired_at_start(tmp_path: Path) -> None:
    """A disk cache as a cluster's follower may hold it after a failover
    (a copy taken while workers wrote) or as a kill -9 leaves it: the lock
    word names a pid that is alive here (not ours), one record is torn
    and one index word is lost. The start's repair (dedup_caches.repair)
    frees the lock, drops the torn record and finds every other key."""
    from shoal.broker.scheduler import dedup_caches

    path = str(tmp_path / "copy.cache")
    c = D.DedupCache(path, 64)
    keys = [b"key-%d" % i for i in range(10)] + [b"long-" + b"x" * 200]
    for k in keys:
        assert c.check_and_add(k, 0) is False
    torn = c.ring + 3 * D.RECORD_SIZE + D.R_KEY  # key-3's bytes, half new
    c._buf[torn : torn + 3] = b"new"
    lost = c._slot_of(c.a.load(c.ring + 5 * D.RECORD_SIZE + D.R_STATE), 5)
    c.a.store(c.index + lost * 8, 0)  # key-5's index word not copied
    c.a.store(D.H_LOCK, os.getppid())  # a live process that is not a worker
    c.close()
    assert D.stored_size(path) == 64

    dedup_caches.repair(path)

    c = D.DedupCache(path, 64)
    assert c.a.load(D.H_LOCK) == 0
    for k in keys:
        assert c.check_and_add(k, 0) is (k != b"key-3"), k
    assert c.check_and_add(b"new-3", 0) is False  # the torn bytes are no key
    assert c.check_and_add(b"never", 0) is False


def test_a_file_that_is_no_cache_is_removed_at_start(tmp_path: Path) -> None:
    from shoal.broker.scheduler import dedup_caches

    path = tmp_path / "junk.cache"
    path.write_bytes(b"not a cache")
    dedup_caches.repair(str(path))
    assert not path.exists()
