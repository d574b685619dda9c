"""The leader's side of replication: its data directory to every follower,
and each sync's answer only once the in-sync followers have it (issue 29).

Two listeners:

- the **replica socket** (unix, in the runtime directory): the broker's
  processes ask `mirror(path)` after each local sync (store/replica.py) and
  wait for one byte, OK or FENCED; `ship(path)` (acks as they are written)
  is sent with the next batch (or after SHIP_DELAY), not answered, and not
  synced by the followers at the mark;
- the **cluster port** (TCP): followers connect, say what they have
  (`Hello`) and are sent what differs, then every change as it happens.

Group commit across the network: requests that arrive while a batch is
being acknowledged form the next batch. A batch ships what changed in its
files to every streaming follower, sends one `Mark` and waits until every
in-sync follower has acknowledged it (written and synced), so one round
trip serves many publishes. What a follower is sent is decided by the file
itself against what that follower has (`Shipped`: inode and size): a file
that only grew gets its new bytes; one cut shorter (a torn tail, a failed
write: store/records.py `cut` asks before anything is written over the cut)
is cut there too; one replaced (another inode) is sent whole, written aside
and renamed in (store/mirror.py); a missing one is deleted.

The in-sync set (ISR, `members` and the leader): the nodes that hold every
confirmed write, recorded in etcd (`on_isr`); only a node of the recorded
set may become leader, so a confirmed write is on every node that may lead
next. A batch is answered once every member acknowledged its mark. A member
that does not within `max_lag` seconds (lagging, disconnected, or never
connected since this node won) is dropped, and the set recorded, **before**
any answer that did not wait for it; a follower that catches up again is
added. A new leader starts from the set it won with (`presumed`), not from
itself alone, so that a second failure right after a failover still finds
a node to lead.

`min_isr`: the in-sync followers an answer needs, as Kafka's
`min.insync.replicas`. A member is dropped only if enough others remain
for the answer it holds up; else it stays recorded (and eligible) and the
answers wait, because dropping it would confirm nothing and leave the
cluster with fewer nodes that may lead (Kafka's KIP-966, eligible leader
replicas).

`fence()` (the node lost its lease) answers every waiting and later request
FENCED and drops the followers: nothing is confirmed any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from shoal.broker.cluster import protocol as P
from shoal.broker.cluster import tcp
from shoal.broker.cluster.tasks import cancel_and_wait
from shoal.store import mirror
from shoal.store.replica import FENCED, OK, SHIP, WHOLE, address

log = logging.getLogger("shoal.cluster")

CHUNK = 1 << 20  # bytes per Append frame
SETTLED = 4 << 20  # a catch-up pass that sent less than this is the last
MAX_BUFFERED = 256 << 20  # bytes queued for one follower before it counts as stalled
STALLED = 10.0  # s without an acknowledgement before a follower counts as stalled
SHIP_DELAY = 0.02  # s an unanswered ship (acks) waits for a batch to go with


@dataclass
class Shipped:
    ino: int
    size: int


@dataclass
class Follower:
    node: str
    address: str
    writer: asyncio.StreamWriter
    shipped: dict[str, Shipped] = field(default_factory=dict)
    # Files it was sent bytes of that it need not sync (acks) since their
    # last synced append: a later sync of the file must reach it even when
    # nothing new is left to send (_ship).
    unsynced: set[str] = field(default_factory=set)
    streaming: bool = False  # caught up: sent every change as it happens
    in_sync: bool = False  # a member whose acks count (caught up on this connection)
    acked: int = 0  # the last mark it acknowledged
    sent_bytes: int = 0
    acked_bytes: int = 0
    marks: dict[int, tuple[float, int]] = field(default_factory=dict)  # seq -> (sent at, bytes)
    acked_event: asyncio.Event = field(default_factory=asyncio.Event)

    def lag_seconds(self, now: float) -> float:
        return now - min(t for t, _ in self.marks.values()) if self.marks else 0.0


IsrWriter = Callable[[list[str]], Awaitable[bool]]


class Shipper:
    def __init__(
        self,
        me: P.Identity,
        min_isr: int,
        max_lag: float,
        on_isr: IsrWriter,
        lease_valid: Callable[[], bool] = lambda: True,
        presumed: Sequence[str] = (),
    ) -> None:
        self.me = me
        self.root = os.path.realpath(me.root)
        self.node = me.node
        self.min_isr = min_isr
        self.max_lag = max_lag
        self.on_isr = on_isr
        self.lease_valid = lease_valid
        self.followers: dict[str, Follower] = {}
        # The ISR's other nodes: those of the set this node won with, until
        # they are dropped, and every follower that caught up since.
        self.members: set[str] = {n for n in presumed if n != me.node}
        self.fenced = False
        self.draining = False  # the node is stopping: no waiting for followers to come back
        self.seq = 0
        self.confirmed_seq = 0  # the mark of the last batch answered OK
        self.batches = 0
        self.requests = 0
        self._pending: list[tuple[str, bool, asyncio.Future[bytes]]] = []
        self._batch: list[tuple[str, bool, asyncio.Future[bytes]]] = []  # being shipped
        # Paths asked with `ship` (acks): sent with the next batch, or after
        # SHIP_DELAY if none comes first, unsynced and unanswered.
        self._ships: set[str] = set()
        self._ship_timer: asyncio.TimerHandle | None = None
        self._work = asyncio.Event()
        self._changed = asyncio.Event()  # a follower joined, left or acked
        self._renewed = asyncio.Event()  # the agent renewed the lease (lease_renewed)
        self.fenced_event = asyncio.Event()  # set with `fenced`: the agent gives up leading
        self._isr_written: list[str] | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ start/stop
    async def start(self, replica_socket: str, host: str, port: int) -> None:
        if not replica_socket.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(replica_socket)
        # Each server is kept as soon as it listens, so that close() after a
        # failed start (the cluster port taken) frees the replica socket's
        # name for the next try.
        self._servers.append(
            await asyncio.start_unix_server(self._serve_process, address(replica_socket))
        )
        self._servers.append(await asyncio.start_server(self._serve_follower, host, port))
        self._spawn(self._batches())
        self._spawn(self._heartbeats())
        await self._write_isr()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def wake(self) -> None:
        """Look again at what waits (after `draining` was set)."""
        self._changed.set()

    def lease_renewed(self) -> None:
        """The agent's keep-alive succeeded: answers held because the lease
        was not known to hold (_lease_held) may go."""
        self._renewed.set()

    def fence(self) -> None:
        """Answer FENCED from now on; drop the followers. Permanent: the
        agent, which watches `fenced_event`, gives the leadership up."""
        self.fenced = True
        self.fenced_event.set()
        for _, _, done in self._pending:
            if not done.done():
                done.set_result(FENCED)
        self._pending.clear()
        self._ships.clear()
        self._work.set()
        self._changed.set()
        for f in list(self.followers.values()):
            f.writer.close()

    async def close(self) -> None:
        self.fence()
        for server in self._servers:
            server.close()
        await cancel_and_wait(*self._tasks)

    def isr(self) -> list[str]:
        return [self.node, *sorted(self.members)]

    def in_sync_followers(self) -> list[str]:
        """Members connected and acknowledging: those that could take over now."""
        return sorted(f.node for f in self.followers.values() if f.in_sync)

    def status(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [
            {
                "node": f.node,
                "address": f.address,
                "in_sync": f.in_sync,
                "streaming": f.streaming,
                "lag_bytes": f.sent_bytes - f.acked_bytes,
                "lag_seconds": round(f.lag_seconds(now), 3),
            }
            for f in self.followers.values()
        ]

    # ------------------------------------------------------- broker processes
    async def _serve_process(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await reader.readexactly(P.LENGTH.size)
                (length,) = P.LENGTH.unpack(head)
                request = await reader.readexactly(length)
                whole, path = request[:1] == WHOLE, os.fsdecode(request[1:])
                if request[:1] == SHIP:  # sent with the next batch, not answered
                    if not self.fenced:
                        self._ships.add(path)
                        if self._ship_timer is None:
                            self._ship_timer = loop.call_later(SHIP_DELAY, self._ships_due)
                    continue
                done: asyncio.Future[bytes] = loop.create_future()
                if self.fenced:
                    done.set_result(FENCED)
                else:
                    self._pending.append((path, whole, done))
                    self._work.set()
                writer.write(await done)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _ships_due(self) -> None:
        self._ship_timer = None
        self._work.set()

    async def _batches(self) -> None:
        try:
            await self._batch_loop()
        except Exception:
            # A batch that cannot be shipped (EIO reading a file, a bug)
            # must not leave every sync waiting under a valid lease: fence,
            # and the agent steps down (node.py _keep_leading).
            log.exception("replication failed: fencing")
            self.fence()
            for _, _, done in self._batch:  # the batch it failed in is refused too
                if not done.done():
                    done.set_result(FENCED)

    async def _batch_loop(self) -> None:
        while not self.fenced:
            await self._work.wait()
            self._work.clear()
            self._batch = batch = self._pending
            self._pending = []
            ships, self._ships = self._ships, set()
            # relative path -> (sent whole, the follower syncs it at the mark)
            paths: dict[str, tuple[bool, bool]] = {}
            for path in ships:
                rel = self._relative(path)
                if rel is not None:
                    paths[rel] = (False, False)
            for path, whole, _ in batch:
                rel = self._relative(path)
                if rel is not None:
                    paths[rel] = (paths.get(rel, (False, False))[0] or whole, True)
            for f in list(self.followers.values()):
                if f.streaming:
                    for rel, (whole, sync) in paths.items():
                        self._ship(f, rel, whole, sync)
            if not batch:
                continue  # ships only: no answer to wait for
            self.batches += 1
            self.requests += len(batch)
            seq = self._mark()
            while True:
                confirmable = await self._confirmable(seq) and await self._lease_held()
                # A follower that rejoined while we waited (_acked) must have
                # this batch too before it is answered: no await from this
                # check to the answer, so none can rejoin in between.
                if not confirmable or not self._lagging(seq):
                    break
            answer = OK if confirmable and not self.fenced else FENCED
            if answer == OK:
                self.confirmed_seq = seq
            for _, _, done in batch:
                if not done.done():
                    done.set_result(answer)

    async def _lease_held(self) -> bool:
        """Checked last, right before answering: a leader paused past its
        lease (SIGSTOP) must not confirm when it resumes. While the lease is
        not known to hold (a keep-alive failed or is late: etcd paused,
        slow, unreachable), the answer waits for the agent to decide:
        either its next keep-alive succeeds, which proves the lease never
        ran out, so no other node can have led meanwhile (True), or it
        fences (False). The lease is the agent's to judge, not ours: a
        fence here would outlive its cause."""
        while not self.fenced and not self.lease_valid():
            self._renewed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._renewed.wait(), 0.5)
        return not self.fenced

    async def _heartbeats(self) -> None:
        """A heartbeat to every follower each P.HEARTBEAT seconds, so that
        one whose connection died without a FIN notices (receiver.py)."""
        beat = P.frame(P.Heartbeat())
        while not self.fenced:
            await asyncio.sleep(P.HEARTBEAT)
            for f in list(self.followers.values()):
                if not f.writer.is_closing():
                    f.writer.write(beat)

    def _relative(self, path: str) -> str | None:
        rel = os.path.relpath(os.path.realpath(path), self.root)
        if rel == "." or rel.startswith(".."):
            return None if rel != "." else ""
        return rel if mirror.mirrored(rel) else None

    def _mark(self) -> int:
        self.seq += 1
        now = time.monotonic()
        for f in list(self.followers.values()):
            if not f.streaming:
                continue
            if f.writer.transport.get_write_buffer_size() > MAX_BUFFERED or f.lag_seconds(
                now
            ) > max(STALLED, 5 * self.max_lag):
                # A follower that stopped reading (paused, hung) would make us
                # buffer everything for it: drop it; it catches up when back.
                log.warning("follower %s stalled: disconnected", f.node)
                f.writer.close()
                continue
            f.marks[self.seq] = (now, f.sent_bytes)
            f.writer.write(P.frame(P.Mark(self.seq)))
        return self.seq

    async def _confirmable(self, seq: int) -> bool:
        """Wait until every member acknowledged `seq`, dropping those that
        take longer than max_lag (while enough others remain), and the ISR
        is recorded."""
        deadline = time.monotonic() + self.max_lag
        held_up = False  # said once per batch: members kept for min_isr
        while not self.fenced:
            waiting = self._lagging(seq)
            now = time.monotonic()
            if waiting:
                # One with no connection is dropped at once; one connected
                # gets max_lag to answer.
                due = waiting if now >= deadline else self._disconnected(waiting)
                if due and len(self.members) - len(due) >= self.min_isr:
                    self._drop(due)
                    continue
                if due and self.draining and now >= deadline:
                    return False  # the node stops: refuse rather than wait for followers
                if due and not held_up:
                    held_up = True
                    log.warning(
                        "in-sync set kept at %s: dropping %s would leave fewer than "
                        "%d in-sync followers; answers wait",
                        ", ".join(self.isr()),
                        ", ".join(sorted(due)),
                        self.min_isr,
                    )
            if not waiting:
                if not await self._write_isr():
                    return False
                if len(self.isr()) - 1 >= self.min_isr:
                    return True
                if self.draining:
                    return False  # the node stops: refuse rather than wait for followers
                deadline = time.monotonic() + self.max_lag  # wait for followers to come back
            self._changed.clear()
            left = deadline - now
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5) if left > 0 else 0.5)
        return False

    def _lagging(self, seq: int) -> list[str]:
        """The members that have not acknowledged mark `seq` yet (on a
        connection on which they are in sync)."""
        lagging = []
        for node in self.members:
            f = self.followers.get(node)
            if f is None or not f.in_sync or f.acked < seq:
                lagging.append(node)
        return lagging

    def _disconnected(self, nodes: list[str]) -> list[str]:
        return [n for n in nodes if n not in self.followers]

    def _drop(self, nodes: list[str]) -> None:
        for node in nodes:
            self.members.discard(node)
            f = self.followers.get(node)
            if f is not None:
                f.in_sync = False
                log.warning("follower %s lags %.1f s: out of the in-sync set", node, self.max_lag)
            else:
                log.warning("follower %s is not connected: out of the in-sync set", node)

    async def _write_isr(self) -> bool:
        """Record the ISR in etcd if it changed; retried until it is, or fenced."""
        while not self.fenced:
            isr = self.isr()
            if isr == self._isr_written:
                return True
            if await self.on_isr(isr):
                self._isr_written = isr
                log.info("in-sync set: %s", ", ".join(isr))
                continue
            await asyncio.sleep(0.2)  # etcd unreachable: the lease logic fences in time
        return False

    # ----------------------------------------------------------- followers
    async def _serve_follower(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        frames = P.FrameReader()
        follower: Follower | None = None
        try:
            hello = await self._hello(reader, frames)
            if hello is None or self.fenced:
                writer.write(P.frame(P.Refused("not the leader" if self.fenced else "bad hello")))
                return
            if not self.me.admits(hello):
                writer.write(P.frame(P.Refused("wrong cluster name or secret")))
                return
            old = self.followers.pop(hello.node, None)
            if old is not None:
                old.writer.close()
            tcp.keep_alive(writer.get_extra_info("socket"))
            peer = writer.get_extra_info("peername")
            follower = Follower(hello.node, f"{peer[0]}:{peer[1]}" if peer else "?", writer)
            self.followers[hello.node] = follower
            writer.write(P.frame(P.Welcome(self.node)))
            # Off the event loop: a CRC-32 of every listed file takes long
            # with a big data directory, and the loop renews the lease.
            shipped, gone = await asyncio.to_thread(self._compare, hello.files)
            if self.followers.get(hello.node) is not follower or self.fenced:
                return
            follower.shipped.update(shipped)
            for rel in gone:
                self._send(follower, P.Delete(rel))
            self._spawn(self._catch_up(follower))
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for message in frames.feed(data):
                    if isinstance(message, P.Ack):
                        self._acked(follower, message.seq)
        except (ConnectionError, ValueError, OSError) as exc:
            log.info("follower connection ended: %s", exc)
        finally:
            writer.close()
            if follower is not None and self.followers.get(follower.node) is follower:
                del self.followers[follower.node]
                if follower.in_sync:
                    # Still a member (it holds every confirmed write): the
                    # next answer drops it if enough others remain.
                    log.warning("follower %s disconnected", follower.node)
                self._changed.set()

    async def _hello(self, reader: asyncio.StreamReader, frames: P.FrameReader) -> P.Hello | None:
        messages: list[P.Message] = []
        while not messages:
            data = await asyncio.wait_for(reader.read(1 << 20), 30)
            if not data:
                return None
            messages = frames.feed(data)
        first = messages[0]
        return first if isinstance(first, P.Hello) else None

    def _acked(self, f: Follower, seq: int) -> None:
        f.acked = max(f.acked, seq)
        for s in [s for s in f.marks if s <= seq]:
            f.acked_bytes = max(f.acked_bytes, f.marks.pop(s)[1])
        if f.streaming and not f.in_sync and f.acked >= self.confirmed_seq:
            # It has every write confirmed so far: counted again. Not "the
            # last mark": under sustained load the next batch's mark is out
            # before a follower a little slower than the others acks this
            # one, and it would never rejoin. The batch in flight now waits
            # for it (_batch_loop checks again before answering).
            f.in_sync = True
            log.info("follower %s is in sync", f.node)
            if f.node not in self.members:
                self.members.add(f.node)
                self._spawn(self._write_isr_task())
        self._changed.set()

    async def _write_isr_task(self) -> None:
        await self._write_isr()

    def _compare(self, files: dict[str, tuple[int, int]]) -> tuple[dict[str, Shipped], list[str]]:
        """What the follower has that is a prefix of ours needs only its
        tail; anything else is sent whole or deleted. Returns what it has
        (Shipped) and what to delete there; reads files only (a thread)."""
        shipped: dict[str, Shipped] = {}
        gone: list[str] = []
        for rel, (size, crc) in files.items():
            if not mirror.mirrored(rel):
                continue
            full = os.path.join(self.root, rel)
            try:
                st = os.stat(full)
                same = st.st_size >= size and mirror.prefix_crc(full, size) == crc
            except FileNotFoundError:
                gone.append(rel)
                continue
            # Differs: sent whole (an inode no file has).
            shipped[rel] = Shipped(st.st_ino, size) if same else Shipped(-1, 0)
        return shipped, gone

    async def _catch_up(self, f: Follower) -> None:
        try:
            while True:
                before = f.sent_bytes
                for rel in list(mirror.files(self.root)):
                    self._ship(f, rel)
                    await f.writer.drain()
                    if self.fenced or self.followers.get(f.node) is not f:
                        return
                if f.sent_bytes - before < SETTLED:
                    break
            # The last pass without a pause: from here on every change is
            # shipped as it happens, so the mark below covers everything.
            for rel in list(mirror.files(self.root)):
                self._ship(f, rel)
            for rel in [r for r in f.shipped if not os.path.exists(os.path.join(self.root, r))]:
                self._ship(f, rel)
            f.streaming = True
            self.seq += 1
            f.marks[self.seq] = (time.monotonic(), f.sent_bytes)
            f.writer.write(P.frame(P.Mark(self.seq)))
            log.info("follower %s caught up (%d bytes sent)", f.node, f.sent_bytes)
        except (ConnectionError, OSError) as exc:
            log.info("follower %s: catch-up ended: %s", f.node, exc)
            f.writer.close()

    def _send(self, f: Follower, message: P.Message) -> None:
        f.writer.write(P.frame(message))

    def _ship(self, f: Follower, rel: str, whole_file: bool = False, sync: bool = True) -> None:
        """Send `f` what differs in `rel` (a file or a directory), at once;
        `whole_file`: the file changed in place, send all of it; `sync`
        False: appends the follower need not fdatasync at the next mark
        (acks, which the leader does not sync either)."""
        full = os.path.join(self.root, rel) if rel else self.root
        try:
            st = os.stat(full)
        except FileNotFoundError:
            for gone in [r for r in f.shipped if r == rel or r.startswith(rel + os.sep)]:
                del f.shipped[gone]
                self._send(f, P.Delete(gone))
            return
        if os.path.isdir(full):
            # A directory's entries changed: new files and files renamed into
            # place (another inode) are sent whole, removed ones deleted.
            present = set()
            for sub in mirror.files(full):
                child = os.path.join(rel, sub) if rel else sub
                present.add(child)
                have = f.shipped.get(child)
                try:
                    ino = os.stat(os.path.join(self.root, child)).st_ino
                except FileNotFoundError:
                    continue
                if have is None or have.ino != ino:
                    self._ship(f, child)
            prefix = rel + os.sep if rel else ""
            for gone in [r for r in f.shipped if r.startswith(prefix) and r not in present]:
                del f.shipped[gone]
                self._send(f, P.Delete(gone))
            return
        have = f.shipped.get(rel)
        whole = whole_file or have is None or have.ino != st.st_ino
        if have is not None and not whole and have.size > st.st_size:
            # Cut shorter (store/records.py `cut`, which asks at once, before
            # anything is written over the cut bytes): what the follower has
            # up to the new end is ours, the rest goes.
            self._send(f, P.Truncate(rel, st.st_size))
            have.size = st.st_size
        offset = 0 if whole else have.size  # type: ignore[union-attr]
        try:
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        start = offset
        try:
            if whole:
                self._send(f, P.Reset(rel))
            while True:
                data = os.pread(fd, CHUNK, offset)
                if not data:
                    break
                self._send(f, P.Append(rel, offset, data, sync or whole))
                f.sent_bytes += len(data)
                offset += len(data)
            if whole:
                self._send(f, P.Commit(rel))
        finally:
            os.close(fd)
        f.shipped[rel] = Shipped(st.st_ino, offset)
        if sync or whole:
            if offset == start and rel in f.unsynced:
                # Its bytes went unsynced (acks shipped as written), and now a
                # sync of the file asks for them (a tx.commit, a purge): an
                # empty synced append has the follower fdatasync it at the mark.
                self._send(f, P.Append(rel, offset, b"", True))
            f.unsynced.discard(rel)
        elif offset > start:
            f.unsynced.add(rel)
