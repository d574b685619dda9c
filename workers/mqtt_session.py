"""What an MQTT session keeps beyond its queues (issue 41): its subscriptions
with their options, and the packet identifiers of QoS 2 exchanges under way
in both directions. A persistent session's outlive the connection and the
broker: they are written to `<data>/mqtt-sessions/<hash>` before what they
promise is said to the client, so a kill -9 of the broker neither loses a
QoS 2 message the client was told of nor delivers one twice.

    received   inbound QoS 2: packet ids published, PUBREC'd, not yet PUBREL'd
               (a resend of one is not published again; MQTT-4.3.3-9)
    sent       outbound QoS 2: packet id -> the message's fingerprint, sent in
               a PUBLISH, no PUBREC yet. The message is still in its queue: a
               redelivery of it (same fingerprint) goes with the same packet
               id and DUP (MQTT-4.4.0-1)
    released   outbound QoS 2: PUBREC'd (the queue's copy acked), PUBREL sent,
               no PUBCOMP yet: PUBREL is sent again when the client comes back

A clean session keeps all this in memory only (`path` None): it ends with its
connection. Writes are whole files (store/records.py replace_unless_newer:
synced, renamed), off the event loop, one at a time per session; a change's
callbacks run once a write that holds it is done.

A client that connects again may land on another worker while its older
connection's write is still under way. Each file carries its version:
(generation, writes), the generation one more than the file's it was
opened from, the writes counted by the connection. A write renames its file
into place only over an older version, under the session's lock file, so an
older connection's late write never replaces what the newer one wrote or
read. A clean start leaves a tombstone of the next generation (`cleared`),
not nothing, for the same reason.

And a connection reads the file only once it owns the session: an exclusive
flock of `<hash>.owner` (store/owner_lock.py), held from before the read to the
connection's last write. A client that connects again, on any worker, waits
(at most OWNER_WAIT) for its older connection to be taken over: that one
writes its state (the QoS 2 ids it published, their resends not to be
published again) and lets go. Without it the newer connection could read
the file before the older one's last write and publish a QoS 2 message
twice. A killed worker's locks go with its file descriptors.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import time
from collections.abc import Callable

import msgspec

from shoal.broker.mqtt.mapping import UNAVAILABLE
from shoal.store.owner_lock import OwnerLock
from shoal.store.records import replace_unless_newer
from shoal.workers.unmade import UNMADE_SET

log = logging.getLogger("shoal.mqtt")

DIRECTORY = "mqtt-sessions"
OWNER_WAIT = 5.0  # s a connection waits for the older one of its client id to let go
# This process's session writes, their temporary files' names (a module's
# counter: a class attribute changed at every write would change the class,
# and with it its version tag, which workers/_attrs.h's cache keys on).
WRITE_NUMBERS = itertools.count(1)


class Subscribed(msgspec.Struct, array_like=True):
    """One topic filter's subscription and its options."""

    qos: int
    queue: str
    identifier: int = 0  # 5.0's subscription identifier (0: none)
    no_local: bool = False
    retain_as_published: bool = False


class SessionState(msgspec.Struct):
    vhost: str
    client_id: str
    expires_at: float = 0.0  # (wall clock) a 5.0 session's end, once disconnected; 0: none
    subscriptions: dict[str, Subscribed] = {}
    received: list[int] = []
    sent: dict[int, bytes] = {}
    released: dict[int, bytes] = {}
    # The x-expires (ms; 0: none) the session's queues were declared with: a
    # queue's arguments cannot change, so a reconnect with another expiry (or
    # protocol version) declares them as they are.
    queue_expires: int = -1  # -1: not declared yet
    generation: int = 0  # (the version: see above)
    writes: int = 0
    cleared: bool = False  # a tombstone: no session


def session_path(data_path: str, vhost: str, client_id: str) -> str:
    """A client id may hold any character: the file is named by a hash."""
    name = hashlib.sha256(f"{vhost}\0{client_id}".encode()).hexdigest()[:32]
    return os.path.join(data_path, DIRECTORY, name)


def fingerprint(routing_key: str, payload: bytes, headers: object) -> bytes:
    """What tells a redelivered message from another: its routing key, body
    and headers (two messages alike in all three are taken for one only
    when redelivered while the first is under way)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(routing_key.encode())
    digest.update(b"\0")
    digest.update(payload)
    digest.update(repr(headers).encode())
    return digest.digest()


class Session:
    __slots__ = (
        "detached",
        "failed",
        "owner",
        "path",
        "pending",
        "received",
        "state",
        "waiting",
        "writing",
    )

    def __init__(self, state: SessionState, path: str | None) -> None:
        self.state = state
        self.path = path  # None: a clean session's, kept in memory only
        self.received: set[int] = set(state.received) if state.received else UNMADE_SET
        self.writing = False
        self.pending = False  # a change came while a write was under way
        self.detached = False  # taken over: the newer connection writes it
        self.waiting: list[Callable[[], None]] = []
        self.failed: Callable[[], None] = _nothing  # a write failed (the connection ends)
        self.owner: OwnerLock | None = None  # held while this connection writes it

    def let_go(self) -> None:
        """Taken over: this connection, its state written, writes the session
        no more; the newer connection may read it now."""
        self.detached = True
        self.release_owner()

    def release_owner(self) -> None:
        if self.owner is not None:
            self.owner.release()
            self.owner = None

    @classmethod
    def in_memory(cls) -> Session:
        """The state before CONNECT names the session."""
        return cls(SessionState("", ""), None)

    @classmethod
    def open(
        cls, data_path: str, vhost: str, client_id: str, persistent: bool, clean: bool
    ) -> tuple[Session, bool]:
        """The session of `client_id`, and whether one was there (CONNACK's
        session present). Without a clean start an earlier session resumes,
        on disk, even for a connection whose own session would not outlive
        it (5.0 with no session expiry: MQTT-3.1.2-4, the caller then ends
        it with the connection). A clean start removes an earlier one's
        file; an expired one counts as gone; a new session that ends with
        its connection is kept in memory only."""
        path = session_path(data_path, vhost, client_id)
        state: SessionState | None = None
        try:
            with open(path, "rb") as f:
                state = msgspec.msgpack.decode(f.read(), type=SessionState)
        except FileNotFoundError:
            pass
        except (OSError, msgspec.DecodeError) as exc:
            log.error("MQTT session of %r not read from %s: %s", client_id, path, exc)
        generation = 1 if state is None else state.generation + 1
        if state is not None and (
            clean or state.cleared or (state.expires_at and state.expires_at < time.time())
        ):
            tombstone = SessionState(vhost, client_id, generation=generation, cleared=True)
            Session(tombstone, path).write_now(durable=True)  # (an older write's late rename loses)
            state = None
        if state is None:
            if not persistent:  # it ends with this connection
                return cls(SessionState(vhost, client_id), None), False
            state = SessionState(vhost, client_id)
            present = False
        else:
            present = True
            state.expires_at = 0.0
        state.generation, state.writes = generation, 0
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return cls(state, path), present

    def save(self, then: Callable[[], None] | None = None) -> None:
        """Write the state; `then` once it is on disk (at once for a clean session)."""
        if self.path is None or self.detached:
            if then is not None:
                then()
            return
        if then is not None:
            self.waiting.append(then)
        if not self.writing:
            self._write()
        else:
            self.pending = True

    def _write(self) -> None:
        assert self.path is not None
        self.writing, self.pending = True, False
        waiting, self.waiting = self.waiting, []
        data, newer_there = self._snapshot()
        # Each write its own temporary file: a takeover's older connection, in
        # this worker or another, may write the session at the same time.
        suffix = f".{os.getpid()}.{next(WRITE_NUMBERS)}.new"
        written = asyncio.get_running_loop().run_in_executor(
            None, replace_unless_newer, self.path, data, suffix, newer_there
        )

        def done(future: asyncio.Future[bool]) -> None:
            self.writing = False
            if future.exception() is not None:
                # What the callbacks would promise is not on disk: none runs,
                # the connection ends (the client sends its unacked packets again).
                log.error("MQTT session %r not written: %s", self.path, future.exception())
                self.failed()
                return
            for then in waiting:
                then()
            if (self.pending or self.waiting) and not self.detached:
                self._write()

        written.add_done_callback(done)

    def end(self, expiry_s: int | None) -> None:
        """The connection ended: a 5.0 session ends `expiry_s` from now
        (None or 0xFFFFFFFF: never). Its state is in the file at once, not
        only once the synced write is done: a client that reconnects at
        once, on any worker, reads it (QoS 2 ids received; Eclipse Paho's
        test45 reconnects right after its DISCONNECT)."""
        if expiry_s is not None and expiry_s != 0xFFFFFFFF:
            self.state.expires_at = time.time() + expiry_s
        self.save()
        self.show()
        self.release_owner()  # (the last write: a reconnect may read it now)

    def show(self) -> None:
        """The state in the file now, unsynced (the synced write follows):
        what a reconnect reads, before the client can see this end."""
        if self.path is not None and not self.detached:
            try:
                self.write_now(durable=False)
            except OSError as exc:
                log.error("MQTT session %r not shown at its end: %s", self.path, exc)

    def write_now(self, durable: bool) -> None:
        """The state in the file, on the event loop (unless a newer one is there)."""
        assert self.path is not None
        data, newer_there = self._snapshot()
        replace_unless_newer(self.path, data, f".{os.getpid()}.now", newer_there, durable)

    def _snapshot(self) -> tuple[bytes, Callable[[bytes], bool]]:
        """The state's bytes as its next version, and the test of a file's
        bytes for a newer version than that."""
        state = self.state
        state.received = sorted(self.received)
        state.writes += 1
        mine = (state.generation, state.writes)

        def newer_there(there: bytes) -> bool:
            try:
                other = msgspec.msgpack.decode(there, type=SessionState)
            except msgspec.DecodeError:
                return False  # (unreadable: replaced)
            return (other.generation, other.writes) > mine

        return msgspec.msgpack.encode(state), newer_there

    def ids_in_use(self) -> set[int]:
        return set(self.state.sent) | set(self.state.released)


def _nothing() -> None:
    pass


def open_owned(
    loop: asyncio.AbstractEventLoop,
    where: tuple[str, str, str],
    modes: tuple[bool, bool],
    closed: Callable[[], bool],
    then: Callable[[Session, bool], None],
    refuse: Callable[[tuple[int, int]], None],
) -> None:
    """Session.open for a CONNECT (`where`: data path, vhost, client id;
    `modes`: persistent, clean), then `then(session, present)`. A session
    that may be read or outlive the connection is opened once this
    connection owns it (store/owner_lock.py): tries every 1-50 ms while the older
    connection of the client id (told by the takeover) writes its last
    state; refused as unavailable if that one still holds it after
    OWNER_WAIT (a hung worker: the client tries again); nothing if the
    connection closed meanwhile."""
    (data_path, vhost, client_id), (persistent, clean) = where, modes
    if clean and not persistent:  # its state is new and ends with it: nothing to wait for
        then(*Session.open(data_path, vhost, client_id, persistent, clean))
        return
    owner = OwnerLock(session_path(data_path, vhost, client_id) + ".owner")
    deadline = loop.time() + OWNER_WAIT
    delay = 0.001

    def attempt() -> None:
        nonlocal delay
        if closed():
            return
        if not owner.try_take():
            if loop.time() > deadline:
                log.warning("MQTT session of %r still held by an older connection", client_id)
                refuse(UNAVAILABLE)
            else:
                loop.call_later(delay, attempt)
                delay = min(delay * 2, 0.05)
            return
        session, present = Session.open(data_path, vhost, client_id, persistent, clean)
        if session.path is None:
            owner.release()  # (kept in memory only)
        else:
            session.owner = owner
        then(session, present)

    attempt()
