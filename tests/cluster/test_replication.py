"""Replication of a data directory, leader to follower, over real sockets:
catch-up by comparison, then every change as it happens, and a sync's
answer only once the in-sync follower has it (broker/cluster/shipper.py,
receiver.py, store/mirror.py, store/replica.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.cluster import protocol as P
from shoal.broker.cluster.receiver import LeaderRefused, Receiver
from shoal.broker.cluster.shipper import Shipper
from shoal.store import disk, mirror, records, replica
from shoal.store.replica import ReplicaLink, ReplicaRefused
from tests.broker_process import free_port


def contents(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in mirror.files(str(root))}


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Pair:
    """A shipper over `leader` and a receiver into `follower`."""

    def __init__(
        self, tmp: Path, min_isr: int = 1, max_lag: float = 2.0, presumed: tuple[str, ...] = ()
    ) -> None:
        self.leader = tmp / "leader"
        self.follower = tmp / "follower"
        self.leader.mkdir()
        self.socket = str(tmp / "replica.sock")
        self.port = free_port()
        self.isr_log: list[list[str]] = []
        self.lease_ok = True  # what the agent's lease_valid() would say
        self.shipper = Shipper(
            P.Identity(str(self.leader), "A", "c", "s"),
            min_isr=min_isr,
            max_lag=max_lag,
            on_isr=self._isr,
            lease_valid=lambda: self.lease_ok,
            presumed=list(presumed),
        )
        self.receiver = Receiver(P.Identity(str(self.follower), "B", "c", "s"))
        self.task: asyncio.Task[None] | None = None

    async def _isr(self, isr: list[str]) -> bool:
        self.isr_log.append(isr)
        return True

    async def start(self, follow: bool = True) -> None:
        await self.shipper.start(self.socket, "127.0.0.1", self.port)
        if follow:
            self.follow()

    def follow(self) -> None:
        self.receiver = Receiver(P.Identity(str(self.follower), "B", "c", "s"))
        self.task = asyncio.ensure_future(self.receiver.run("127.0.0.1", self.port))

    async def in_sync(self) -> None:
        await until(lambda: self.shipper.isr() == ["A", "B"])

    async def follower_dies(self) -> None:
        """Once in sync, the follower is gone (its connection closed)."""
        await self.in_sync()
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def mirror(self, path: Path) -> None:
        await asyncio.to_thread(ReplicaLink(self.socket).mirror, str(path))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.shipper.close()


def run(tmp: Path, body: Callable[[Pair], Awaitable[None]], **kw: object) -> None:
    async def main() -> None:
        pair = Pair(tmp, **kw)  # type: ignore[arg-type]
        try:
            await body(pair)
        finally:
            await pair.stop()

    asyncio.run(main())


def test_a_new_follower_gets_every_file_and_joins_the_in_sync_set(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        (p.leader / "msgs").mkdir()
        (p.leader / "msgs" / "1.seg").write_bytes(os.urandom(3 << 20))
        (p.leader / "epoch").write_bytes(b"4\n")
        (p.leader / "shoal.lock").write_bytes(b"123\n")  # never copied
        (p.leader / "paging").mkdir()
        (p.leader / "paging" / "q1").write_bytes(b"x" * 100)  # never copied
        await p.start()
        await p.in_sync()
        assert contents(p.follower) == contents(p.leader)
        assert set(contents(p.follower)) == {"msgs/1.seg", "epoch"}
        # The shipper's set changes first, its record (on_isr) a task later.
        await until(lambda: p.isr_log[-1:] == [["A", "B"]])

    run(tmp_path, body)


def test_a_sync_returns_only_once_the_follower_has_the_bytes_durably(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        seg = p.leader / "seg"
        with open(seg, "ab") as f:
            for i in range(50):
                f.write(b"record %d;" % i)
                f.flush()
                await p.mirror(seg)
                # No wait here: the answer itself says the follower has it.
                assert (p.follower / "seg").read_bytes() == seg.read_bytes()
        assert p.shipper.batches >= 1 and p.receiver.acked >= 50

    run(tmp_path, body)


def test_replaced_and_removed_files_follow_through_the_directory_sync(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        (p.leader / "d").mkdir()
        (p.leader / "d" / "old").write_bytes(b"old")
        await p.start()
        await p.in_sync()
        records.replace_file(str(p.leader / "epoch"), b"7\n")
        os.unlink(p.leader / "d" / "old")
        await p.mirror(p.leader)
        await p.mirror(p.leader / "d")
        assert contents(p.follower) == {"epoch": b"7\n"}
        records.replace_file(str(p.leader / "epoch"), b"8\n")  # another inode, same size
        await p.mirror(p.leader)
        assert (p.follower / "epoch").read_bytes() == b"8\n"
        assert not list(p.follower.glob("**/*" + mirror.ASIDE))

    run(tmp_path, body)


def test_a_returning_follower_gets_only_what_it_misses(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        big = os.urandom(4 << 20)
        (p.leader / "seg").write_bytes(big)
        p.follower.mkdir(exist_ok=True)
        (p.follower / "seg").write_bytes(big[: 3 << 20])  # a prefix: only the tail is sent
        (p.follower / "stale").write_bytes(b"gone on the leader")
        (p.follower / "differs").write_bytes(b"AAAA")
        (p.leader / "differs").write_bytes(b"BBBB")
        await p.start()
        await p.in_sync()
        assert contents(p.follower) == contents(p.leader)
        follower = p.shipper.followers["B"]
        assert follower.sent_bytes < (1 << 20) + 100

    run(tmp_path, body)


def test_a_dead_follower_leaves_the_in_sync_set_before_the_next_answer(tmp_path: Path) -> None:
    """With min-isr 0 an answer needs no follower: a dead one is dropped,
    and the set recorded, before the answer."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.follower_dies()
        seg = p.leader / "seg"
        seg.write_bytes(b"after")
        await asyncio.wait_for(p.mirror(seg), 5)
        assert p.isr_log[-1] == ["A"]

    run(tmp_path, body, max_lag=0.5, min_isr=0)


def test_a_dead_follower_stays_in_the_in_sync_set_while_answers_wait_for_min_isr(
    tmp_path: Path,
) -> None:
    """With min-isr 1 and one follower, dropping it would confirm nothing:
    it stays recorded (it holds every confirmed write, so it may still lead
    if the leader dies now), the answer waits, and goes once it is back."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.follower_dies()
        seg = p.leader / "seg"
        seg.write_bytes(b"after")
        mirrored = asyncio.ensure_future(p.mirror(seg))
        await asyncio.sleep(0.3)
        assert not mirrored.done(), "answered with fewer in-sync followers than min-isr"
        p.follow()  # it comes back, catches up, and the answer follows
        await asyncio.wait_for(mirrored, 10)
        assert (p.follower / "seg").read_bytes() == b"after"
        joined = p.isr_log.index(["A", "B"])
        assert p.isr_log[joined:] == [["A", "B"]], "the follower left the recorded set"

    run(tmp_path, body, max_lag=0.5)


def test_a_new_leader_keeps_the_set_it_won_with_until_a_member_must_go(tmp_path: Path) -> None:
    """A new leader's in-sync set starts as the one it won with, not as
    itself alone: until an answer needs a member dropped, every node that
    held every confirmed write may still lead (issue 38, 8). B comes and
    catches up; C never does: C is dropped before the first answer, and
    the set never shrinks to the leader alone."""

    async def body(p: Pair) -> None:
        await p.start(follow=False)
        await until(lambda: p.isr_log == [["A", "B", "C"]])
        seg = p.leader / "seg"
        seg.write_bytes(b"first write")
        mirrored = asyncio.ensure_future(p.mirror(seg))
        await asyncio.sleep(0.3)
        assert not mirrored.done(), "answered before any member had it"
        assert p.isr_log == [["A", "B", "C"]], "dropped a member with nothing confirmed"
        p.follow()
        await asyncio.wait_for(mirrored, 10)
        assert p.isr_log == [["A", "B", "C"], ["A", "B"]]
        assert (p.follower / "seg").read_bytes() == b"first write"

    run(tmp_path, body, presumed=("B", "C"))


def test_fenced_leader_refuses_and_a_wrong_secret_is_refused(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        await p.start(follow=False)
        wrong = Receiver(P.Identity(str(p.follower), "B", "c", "not the secret"))
        with pytest.raises(LeaderRefused):
            await asyncio.wait_for(wrong.run("127.0.0.1", p.port), 5)
        p.shipper.fence()
        (p.leader / "seg").write_bytes(b"x")
        with pytest.raises(ReplicaRefused):
            await p.mirror(p.leader / "seg")

    run(tmp_path, body, min_isr=0)


def test_a_file_changed_in_place_is_sent_whole_when_asked(tmp_path: Path) -> None:
    """A mapped file (a deduplication cache) changes in place, at the same
    size: only a request that says so sends it again."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        cache = p.leader / "cache"
        cache.write_bytes(b"a" * 4096)
        await p.mirror(cache)
        with open(cache, "r+b") as f:
            f.seek(100)
            f.write(b"changed")
        await p.mirror(cache)  # same inode, same size: nothing looks new
        assert (p.follower / "cache").read_bytes() == b"a" * 4096
        await asyncio.to_thread(ReplicaLink(p.socket).mirror, str(cache), True)
        assert (p.follower / "cache").read_bytes() == cache.read_bytes()

    run(tmp_path, body)


def test_an_answer_waits_while_the_lease_is_in_doubt_and_goes_once_renewed(
    tmp_path: Path,
) -> None:
    """A keep-alive failed (etcd paused): the follower has the bytes, but the
    answer waits for the agent; its next keep-alive succeeds and the answer
    is OK. The shipper never fences on its own (issue 38, 1)."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        seg = p.leader / "seg"
        seg.write_bytes(b"while etcd is paused")
        p.lease_ok = False
        mirrored = asyncio.ensure_future(p.mirror(seg))
        await until(lambda: (p.follower / "seg").exists())
        await asyncio.sleep(0.3)
        assert not mirrored.done(), "confirmed while the lease was in doubt"
        p.lease_ok = True
        p.shipper.lease_renewed()
        await asyncio.wait_for(mirrored, 5)  # OK: ReplicaRefused would raise
        assert not p.shipper.fenced

    run(tmp_path, body)


def test_an_answer_held_for_the_lease_is_refused_when_the_agent_fences(tmp_path: Path) -> None:
    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        seg = p.leader / "seg"
        seg.write_bytes(b"x")
        p.lease_ok = False
        mirrored = asyncio.ensure_future(p.mirror(seg))
        await asyncio.sleep(0.3)
        assert not mirrored.done()
        p.shipper.fence()  # the agent: the lease could not be renewed in time
        with pytest.raises(ReplicaRefused):
            await asyncio.wait_for(mirrored, 5)

    run(tmp_path, body)


def test_a_batch_that_cannot_be_shipped_fences_for_the_agent_to_step_down(
    tmp_path: Path,
) -> None:
    """EIO reading a file to ship: the waiting sync is refused, not left
    waiting under a valid lease, and the agent is told (fenced_event)."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()

        def broken(*_args: object, **_kw: object) -> None:
            raise OSError(errno.EIO, "Input/output error")

        p.shipper._ship = broken  # type: ignore[method-assign]
        seg = p.leader / "seg"
        seg.write_bytes(b"x")
        with pytest.raises(ReplicaRefused):
            await asyncio.wait_for(p.mirror(seg), 5)
        assert p.shipper.fenced and p.shipper.fenced_event.is_set()

    run(tmp_path, body)


def test_a_follower_that_has_every_confirmed_write_rejoins_though_a_mark_is_out(
    tmp_path: Path,
) -> None:
    """Under sustained load the next batch's mark is out before a follower a
    little slower than the others acknowledges this one: having every write
    confirmed so far is what counts, not the last mark (issue 38, 8), and
    the batch in flight then waits for it too."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        shipper = p.shipper
        follower = shipper.followers["B"]
        follower.in_sync = False  # dropped a while ago; streaming again since
        shipper.members.discard("B")
        shipper.confirmed_seq = shipper.seq  # every batch so far answered
        shipper.seq += 1  # the next batch's mark, out already
        shipper._acked(follower, shipper.confirmed_seq)
        assert follower.in_sync
        assert shipper._lagging(shipper.seq) == ["B"]  # the batch in flight waits

    run(tmp_path, body)


def test_bytes_shipped_unsynced_are_synced_on_the_follower_when_the_file_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks are shipped as written, unsynced; a later sync of the same file
    (a tx.commit, a purge) with nothing new to send must still have the
    follower fdatasync it before the answer (issue 38, 10)."""
    synced: list[str] = []
    real = disk.fdatasync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        acks = p.leader / "acks"
        acks.write_bytes(b"first;")
        await p.mirror(acks)  # a new file goes whole, synced
        with open(acks, "ab") as f:
            f.write(b"ack records")
        await asyncio.to_thread(ReplicaLink(p.socket).ship, str(acks))
        await until(lambda: (p.follower / "acks").read_bytes() == b"first;ack records")
        monkeypatch.setattr(disk, "fdatasync", recording)
        await p.mirror(acks)  # nothing new to send: the sync itself must reach it
        assert str(p.follower / "acks") in synced

    run(tmp_path, body)


@pytest.mark.slow  # its own CI step (.ci/run: slow): out of make test's 10 minutes
def test_a_slow_comparison_of_a_big_copy_blocks_neither_the_leader_nor_the_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Comparing what a returning follower has (a CRC-32 of every file: slow
    with a few GB of streams) runs off the leader's event loop, which renews
    the lease; the follower, hearing heartbeats meanwhile, keeps its
    connection and joins once the comparison is done (issue 38, 3)."""
    real = mirror.prefix_crc

    def slow(path: str, length: int) -> int | None:
        if path.startswith(str(tmp_path / "leader")):
            time.sleep(6)  # longer than a follower waits for a byte (protocol.SILENCE)
        return real(path, length)

    async def body(p: Pair) -> None:
        (p.leader / "seg").write_bytes(b"x" * 4096)
        p.follower.mkdir(exist_ok=True)
        (p.follower / "seg").write_bytes(b"x" * 4096)
        await p.start(follow=False)
        monkeypatch.setattr(mirror, "prefix_crc", slow)
        p.follow()
        longest = 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while p.shipper.isr() != ["A", "B"]:
            assert loop.time() < deadline, "the follower did not join"
            before = loop.time()
            await asyncio.sleep(0.05)
            longest = max(longest, loop.time() - before)
        assert longest < 1.0, f"the leader's loop stood still for {longest:.1f} s"
        assert p.task is not None and not p.task.done(), "the follower reconnected"

    run(tmp_path, body)


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_follower_stopped_during_an_apply_closes_its_files_only_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cancels: int
) -> None:
    """A follower stopped (its leader changed, the node stops) while a thread
    applies the leader's writes: the mirror's descriptors are closed once that
    thread is done, not under it, where its writes would land in whatever file
    reused their numbers next (a failover opens the data directory's files).
    Cancelled again while it waits (cancel_and_wait does), it still waits."""
    events: list[str] = []
    closed = threading.Event()
    real_append, real_close = mirror.Mirror.append, mirror.Mirror.close
    real_close_locked = Receiver._close_locked

    def close_locked(self: Receiver) -> None:
        events.append("closing")
        real_close_locked(self)

    def slow_append(self: mirror.Mirror, *args: Any, **kw: Any) -> None:
        events.append("append")
        closed.wait(2)  # (bounded: with the close waiting for this thread, it never comes)
        events.append("appended")
        real_append(self, *args, **kw)

    def close(self: mirror.Mirror) -> None:
        events.append("close")
        closed.set()
        real_close(self)

    async def body(p: Pair) -> None:
        (p.leader / "seg").write_bytes(b"x" * 4096)
        monkeypatch.setattr(mirror.Mirror, "append", slow_append)
        monkeypatch.setattr(mirror.Mirror, "close", close)
        monkeypatch.setattr(Receiver, "_close_locked", close_locked)
        await p.start()
        await until(lambda: "append" in events)
        assert p.task is not None
        p.task.cancel()
        if cancels == 2:
            await until(lambda: "closing" in events)
            p.task.cancel()
        await asyncio.gather(p.task, return_exceptions=True)
        assert events[:4] == ["append", "closing", "appended", "close"]

    run(tmp_path, body)


def _records_of(path: Path) -> list[bytes]:
    """The records a recovery of `path` keeps (read only: nothing is cut)."""
    return records.decode_all(path.read_bytes(), records.HEADER_SIZE)[0]


async def _as_a_broker_process(p: Pair, script: str, path: Path) -> None:
    """Run `script` in a process of its own with the replica socket in its
    environment, as the broker's processes are (store/replica.py): its
    syncs and cuts of `path` (`seg`) go through the shipper."""
    env = dict(os.environ, **{replica.ENV: p.socket})
    code = "import os, errno\nfrom shoal.store import disk, records, replica\n"
    code += f"seg = {str(path)!r}\n" + textwrap.dedent(script)
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()


def _the_follower_gets_the_cut(tmp: Path, name: str, script: str) -> None:
    """Run `script` as a broker process on the leader's file `name`, open
    as `file` with one record (b"a" * 100) written and synced; the script
    ends with b"b" * 400 synced after a cut. The follower's copy must keep
    both records, the leader's bytes exactly."""

    async def body(p: Pair) -> None:
        await p.start()
        await p.in_sync()
        path = p.leader / name
        first = 'file, _, _ = records.open_records(seg, b"SHTEST", 1)\n'
        first += 'file.append([b"a" * 100])\nfile.sync()\n'
        await _as_a_broker_process(p, first + textwrap.dedent(script), path)
        assert _records_of(p.follower / name) == [b"a" * 100, b"b" * 400]
        assert (p.follower / name).read_bytes() == path.read_bytes()

    run(tmp, body)


def test_a_torn_tail_cut_at_recovery_then_regrown_reaches_the_follower_cut(
    tmp_path: Path,
) -> None:
    """A torn tail that reached a follower, cut by the leader's recovery
    (open_records) and written over by a longer record: same inode, a
    larger size, so a follower sent only the new tail would keep the torn
    bytes in the middle, and its own recovery would cut every record after
    them (issue 38, 5)."""
    script = """
        torn = records.encode(b"t" * 300)[:150]  # a write cut short
        os.pwrite(file.fd, torn, file.size)
        replica.link.mirror(seg)  # shipped as it was
        file.close()
        again, kept, skipped = records.open_records(seg, b"SHTEST", 1)
        assert kept == [b"a" * 100] and skipped is not None
        again.append([b"b" * 400])  # past the torn tail's end
        again.sync()
    """
    _the_follower_gets_the_cut(tmp_path, "seg", script)


def test_a_failed_write_cut_off_again_reaches_the_follower_cut(tmp_path: Path) -> None:
    """A write that failed half-way (ENOSPC) after its first bytes were
    shipped (an ack file's bytes go as written): RecordFile cuts them off
    and the next record takes their place; the follower must not keep
    them (issue 38, 5)."""
    script = """
        real_pwrite = disk.pwrite

        def half_then_full(fd, data, offset):
            real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
            replica.link.mirror(seg)  # the shipper looked now
            raise OSError(errno.ENOSPC, "No space left on device")

        disk.pwrite = half_then_full
        try:
            file.append([b"x" * 300])
            raise SystemExit("the write did not fail")
        except OSError:
            pass
        disk.pwrite = real_pwrite
        file.append([b"b" * 400])
        file.sync()
    """
    _the_follower_gets_the_cut(tmp_path, "acks", script)
