"""Queue lifecycle: queue.declare (its arguments checked by
broker/amqp/x_arguments.py), delete and purge, the exclusive and
auto-delete rules, priority levels' slots, delay queues, and the queue index
a restarted scheduler rebuilds from the segment. The scheduler is the only
creator and remover of queue table slots. A queue's x-expires timer is its
QueueExpiry's (queue_expiry.py), which this part owns.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from shoal.broker import ipc
from shoal.broker.amqp import (
    dead_letter_rules,
    dedup_arguments,
    definitions,
    errors,
    policy_rules,
    quorum,
    routing,
    stream_arguments,
    ttl,
)
from shoal.broker.amqp import x_arguments as X
from shoal.broker.scheduler import dedup_caches
from shoal.broker.scheduler.durable import Restored, new_uid
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.queue_expiry import QueueExpiry
from shoal.broker.scheduler.state import QueueState, SchedulerState
from shoal.shm import flow, stats
from shoal.shm.counters import OVERFLOW_CODES
from shoal.shm.queue_table import QueueFlag
from shoal.shm.stream_words import StreamSettings
from shoal.store.definitions_log import QueueDeclared, QueueDeleted
from shoal.store.stream_segments import remove_stream, stream_directory, streams_directory

log = logging.getLogger("shoal.scheduler")


def _no_exchanges(vhost: str, sources: set[str]) -> None:
    raise AssertionError("QueueLifecycle.unbound is wired by the Scheduler")


class QueueLifecycle:
    """Queues: over the definitions journal (a queue's arguments and
    bindings are journaled, and go with it)."""

    def __init__(self, state: SchedulerState, journal: Journal) -> None:
        self.state = state
        # The state's objects that are never replaced, bound once.
        self.shared = state.shared
        self.seg = state.seg
        self.queues = state.queues
        self.by_name = state.by_name
        self.level_of = state.level_of
        self.consumers = state.consumers
        self.links = state.links
        self.stats = state.stats
        self.free_qids: deque[int] = deque()  # queue table slots, oldest freed first
        # Each connection's exclusive queues (conn id -> its queues, a list:
        # most have one, and a list of one is a quarter of a dict's bytes): a
        # close deletes its own, without a scan of every queue (a fleet of
        # clean MQTT sessions leaving: n² in all).
        self.exclusive_of: dict[int, list[QueueState]] = {}
        self.journal = journal
        self._journal = journal.journal
        self._persist = journal.persist
        self.expiry = QueueExpiry(state, self.remove_queue)
        self.queue_used = self.expiry.queue_used
        # The exchanges that lost their last binding to a removed queue
        # (Exchanges.auto_delete, exchanges.py): wired by the Scheduler, as
        # exchanges need this part back for their delay queues.
        self.unbound: Callable[[str, set[str]], None] = _no_exchanges

    def load_queues(self) -> None:
        """Rebuild the queue index from the segment (a restarted scheduler)."""
        used = set()
        vhosts = {vhost_id: name for name, vhost_id in self.state.definitions.vhost_ids.items()}
        for vhost_id, name, qid in self.shared.catalog.scan():
            flags = self.shared.table.flags(qid)
            q = QueueState(
                qid,
                vhosts.get(vhost_id, self.state.vhost),
                name,
                bool(flags & QueueFlag.DURABLE),
                bool(flags & QueueFlag.EXCLUSIVE),
                bool(flags & QueueFlag.AUTO_DELETE),
                self.shared.table.owner_connection(qid),
                self.state.consumer_tally,
            )
            q.max_priority = self.shared.table.max_priority(qid)
            q.stream = bool(flags & QueueFlag.STREAM)
            arguments = self.state.definitions.queue_arguments.get((q.vhost, name.decode()), {})
            q.qcm.single_active = arguments.get("x-single-active-consumer") is True
            try:
                q.expires_ms = self.expires(q.vhost, name, arguments)
            except errors.AMQPError:
                q.expires_ms = 0
            self.queue_used(q)  # a restarted scheduler: the clock starts again
            self._add(q)
            used.add(qid)
        for parent, level, qid in self.shared.catalog.level_slots():
            owner = self.queues.get(parent)
            if owner is None:  # a predecessor died between the two removals
                self.shared.remove(qid)
                continue
            owner.levels[level] = qid
            self.level_of[qid] = owner
            used.add(qid)
        limit = self.seg.layout.limits.max_queues
        self.free_qids = deque(q for q in range(limit) if q not in used)
        self.shared.catalog_rescan()
        self.state.doorbell.ring()  # (what the rescan finds, the workers' polls see now)

    def known_uids(self, restored: Restored) -> None:
        """A restarted scheduler: its durable queues' uids, from the log
        (a queue a predecessor created but was killed before logging gets
        a new one, logged by the snapshot that follows)."""
        for q in self.queues.values():
            if q.durable and not q.exclusive:
                record = restored.queues.get((q.vhost, q.name.decode()))
                q.uid = record.uid if record is not None else new_uid()
                if not q.stream:  # a stream's uid names its files (shm/stream_words.py)
                    self.shared.table.set_uid(q.qid, q.uid)

    def restore_queues(self, restored: Restored) -> None:
        """A new broker: declare the durable queues the data directory
        holds (before the acceptor takes a connection). A queue that cannot
        be declared any more (a limit lowered since) is logged and left out
        of this start with its bindings, but kept in the log for a later
        one (`unrestored`). One that exists
        was restored by a scheduler killed before it finished: its
        arguments are journaled again (the journal was started afresh)."""
        self.journal.restoring = True
        try:
            for record in restored.queues.values():
                try:
                    q = self.by_name.get((record.vhost, record.queue.encode()))
                    if q is not None:
                        q.uid = record.uid
                        if not q.stream:
                            self.shared.table.set_uid(q.qid, q.uid)
                        q.qcm.single_active = (
                            record.arguments.get("x-single-active-consumer") is True
                        )
                        if record.arguments:
                            self._journal(
                                definitions.QueueArgumentsSet(
                                    record.vhost, record.queue, record.arguments
                                )
                            )
                        continue
                    self.declare(
                        record.vhost,
                        record.queue.encode(),
                        False,
                        True,
                        False,
                        record.auto_delete,
                        0,
                        0,
                        record.arguments,
                        record.uid,
                    )
                except errors.AMQPError as exc:
                    log.error(
                        "durable queue %r in vhost %r not restored (kept in the data "
                        "directory for a later start): %s",
                        record.queue,
                        record.vhost,
                        exc.reply_text,
                    )
                    router = restored.definitions.router(record.vhost)
                    self.state.unrestored[(record.vhost, record.queue)] = (
                        record,
                        [
                            definitions.Bound(record.vhost, x.name, "q", dest, key, arguments)
                            for x in router.exchanges.values()
                            for ((kind, dest), key, _frozen), arguments in x.bindings.items()
                            if kind == "q" and dest == record.queue
                        ],
                    )
        finally:
            self.journal.restoring = False

    def declare(
        self,
        vhost: str,
        name: bytes,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        owner: int,
        conn_id: int,
        arguments: dict[str, Any],
        uid: int = 0,
    ) -> ipc.QueueDeclared:
        self.stats.v[stats.QUEUES_DECLARED] += 1
        self.state.check_vhost_exists(vhost)
        if DELAY_QUEUE_ARGUMENT in arguments:
            q = self.by_name.get((vhost, name))  # the broker's own declare
        else:
            q = self.state.client_queue(vhost, name) if name else None
        if q is not None:
            q.check_exclusive(conn_id)
            if not passive:
                for arg, got, have in (
                    ("durable", durable, q.durable),
                    ("auto_delete", auto_delete, q.auto_delete),
                ):
                    if got != have:
                        raise errors.ChannelError(
                            errors.PRECONDITION_FAILED,
                            f"inequivalent arg '{arg}' for queue '{name.decode()}' in vhost "
                            f"'{vhost}': received '{str(got).lower()}' but current is "
                            f"'{str(have).lower()}'",
                        )
                if exclusive != q.exclusive:
                    raise errors.ChannelError(errors.RESOURCE_LOCKED, q.locked_text())
                self._check_queue_arguments(q, arguments)
            self.queue_used(q)
        elif passive:
            raise errors.ChannelError(
                errors.NOT_FOUND, errors.no_queue(name.decode(errors="replace"), vhost)
            )
        else:
            if not name:
                if stream_arguments.is_stream(arguments):
                    raise stream_arguments.server_named_refused()
                name = definitions.server_named_queue()
            if DELAY_QUEUE_ARGUMENT not in arguments and not name.startswith(REPLY_QUEUES):
                self._check_queue_limit(vhost, name)  # (not the broker's own queues)
            kind = quorum.queue_type(name, vhost, arguments)
            X.mode_and_version(name, vhost, arguments)
            stream = None
            counting = 0
            dedup_spec = None
            if kind == quorum.STREAM:
                stream = stream_arguments.declare_arguments(
                    name, vhost, arguments, durable, exclusive, auto_delete
                )
                max_priority, capacity, resume, limits = 0, 0, 0, (0, 0, 0)
                single_active = False
                message_ttl = 0
            else:
                if kind == quorum.QUORUM:
                    quorum.check_declare(name, vhost, arguments, durable, exclusive, auto_delete)
                else:
                    quorum.check_classic(name, vhost, arguments)
                max_priority = X.max_priority(name, vhost, arguments)
                single_active = X.single_active(name, vhost, arguments)
                rules = self.rules(vhost, name, arguments, kind)
                counting, capacity, resume = rules.delivery_limit, rules.capacity, rules.resume
                limits, message_ttl = rules.limits, rules.message_ttl
                dedup_spec = dedup_arguments.queue_spec(arguments, durable and not exclusive)
            expires = self.expires(vhost, name, arguments)
            if not self.free_qids:
                raise errors.ChannelError(
                    errors.RESOURCE_ERROR,
                    f"cannot declare queue '{name.decode()}': the limit of "
                    f"{self.seg.layout.limits.max_queues} queues is reached (--max-queues)",
                )
            if arguments:  # first: if the journal is full, nothing was created
                self._journal(definitions.QueueArgumentsSet(vhost, name.decode(), arguments))
            if durable and not exclusive:  # on disk before the queue exists
                self.state.unrestored.pop((vhost, name.decode()), None)  # this one takes its place
                uid = uid or new_uid()
                try:
                    self._persist(QueueDeclared(vhost, name.decode(), auto_delete, arguments, uid))
                except errors.ChannelError:
                    if arguments:
                        self._journal(definitions.QueueGone(vhost, name.decode()))
                    raise
            qid = self.free_qids.popleft()  # oldest free slot first: slow reuse
            flags = (
                (QueueFlag.DURABLE if durable else 0)
                | (QueueFlag.EXCLUSIVE if exclusive else 0)
                | (QueueFlag.AUTO_DELETE if auto_delete else 0)
                | (QueueFlag.STREAM if stream is not None else 0)
                | (QueueFlag.QUORUM if kind == quorum.QUORUM else 0)
                | (QueueFlag.DELAYED if _is_delay_queue(name, arguments) else 0)
                | (QueueFlag.DEDUP if dedup_spec is not None else 0)
            )
            if stream is not None:  # before create() makes the queue active
                self.state.stream_words.set_settings(
                    qid,
                    StreamSettings(uid, stream.max_bytes, stream.max_age_ms, stream.segment_bytes),
                )
            self.shared.create(
                qid,
                name,
                flags,
                owner,
                self.state.definitions.vhost_ids[vhost],
                max_priority,
                capacity=capacity,
                resume=resume,
                length_limits=limits,
                # A stream's messages are in its own files, not the message store.
                uid=uid if durable and not exclusive and stream is None else 0,
                message_ttl=message_ttl,
                delivery_limit=counting,
            )
            if dedup_spec is not None:
                cache = self._dedup_file(vhost, name, qid)
                dedup_caches.create(self.state.config, dedup_spec, cache)
            q = QueueState(
                qid, vhost, name, durable, exclusive, auto_delete, owner, self.state.consumer_tally
            )
            q.uid = uid if durable and not exclusive else 0
            q.stream = stream is not None
            q.expires_ms = expires
            q.max_priority = max_priority
            q.qcm.single_active = single_active
            self.stats.v[stats.QUEUES_CREATED] += 1
            self._add(q)
            self.queue_used(q)
        return ipc.QueueDeclared(q.qid, q.name, self.state.messages(q), len(q.qcm))

    def _check_queue_limit(self, vhost: str, name: bytes) -> None:
        """A vhost's max-queues (`shoal ctl set_vhost_limits`), as RabbitMQ
        refuses the queue over it."""
        limit = self.state.definitions.vhost_limits.get(vhost, {}).get("max-queues")
        if limit is None:
            return
        count = sum(
            1
            for q in self.queues.values()
            if q.vhost == vhost and not q.name.startswith(routing.DELAY_QUEUE_PREFIX.encode())
        )
        if count >= limit:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"cannot declare queue '{name.decode(errors='replace')}': queue limit in vhost "
                f"'{vhost}' ({limit}) is reached",
            )

    def _effective(self, vhost: str, name: bytes, arguments: dict[str, Any]) -> dict[str, Any]:
        """A queue's arguments with the policy that applies to it
        (broker/amqp/policy_rules.py); delay queues take no policy."""
        if _is_delay_queue(name, arguments):
            return arguments
        policy = self.state.definitions.policy_for(vhost, name.decode())
        return policy_rules.effective(arguments, policy)

    def rules(self, vhost: str, name: bytes, arguments: dict[str, Any], kind: str) -> Rules:
        """What a classic or quorum queue's record says of its rules, from
        its arguments and its policy. The queue's own arguments are checked
        (RabbitMQ's texts); a policy key that does not fit the queue (a
        dead-letter strategy on a classic queue, say) is ignored, as
        RabbitMQ ignores it: the queue then follows its own arguments."""
        own = self._checked_rules(vhost, name, arguments, kind)
        effective = self._effective(vhost, name, arguments)
        if effective is arguments:
            return own
        try:
            return self._checked_rules(vhost, name, effective, kind)
        except errors.AMQPError as exc:
            log.warning("queue %r in vhost %r: its policy does not apply: %s", name, vhost, exc)
            return own

    def _checked_rules(
        self, vhost: str, name: bytes, effective: dict[str, Any], kind: str
    ) -> Rules:
        quorum.dead_letter_strategy(name, vhost, effective, kind)
        counting = quorum.delivery_limit_word(name, vhost, effective, kind)
        capacity, resume = X.capacity(name, vhost, self._with_capacity_defaults(effective))
        max_length, max_bytes, overflow = X.length_limits(name, vhost, effective)
        if kind == quorum.QUORUM and overflow == "reject-publish-dlx":
            overflow = "drop-head"  # RabbitMQ 3.10: not a quorum queue's (it warns)
        message_ttl = ttl.message_ttl(name, vhost, effective)
        dead_letter_rules.check_arguments(name, vhost, effective)
        return Rules(
            _length_record(max_length, max_bytes, overflow),
            0 if message_ttl is None else message_ttl + 1,
            counting,
            capacity,
            resume,
        )

    def expires(self, vhost: str, name: bytes, arguments: dict[str, Any]) -> int:
        """x-expires in ms (0: none), the policy's applied; a policy value
        that does not fit is ignored."""
        own = X.expires(name, vhost, arguments) or 0
        try:
            return X.expires(name, vhost, self._effective(vhost, name, arguments)) or 0
        except errors.AMQPError:
            return own

    def delay_queue(self, vhost: str, exchange: str, durable: bool | None) -> None:
        name = routing.delay_queue(exchange).encode()
        q = self.by_name.get((vhost, name))
        if durable is None:
            if q is not None:
                self.remove_queue(q)
        elif q is None:
            arguments = {DELAY_QUEUE_ARGUMENT: True}
            self.declare(vhost, name, False, durable, False, False, 0, 0, arguments)

    def _with_capacity_defaults(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The broker-wide capacity (--default-capacity) for a queue declared
        without x-capacity; its own arguments win."""
        config = self.state.config
        if "x-capacity" in arguments or not config.default_capacity:
            return arguments
        defaults: dict[str, Any] = {"x-capacity": config.default_capacity}
        if config.default_flow_resume_capacity:
            defaults["x-flow-resume-capacity"] = config.default_flow_resume_capacity
        return {**defaults, **arguments}

    def _check_queue_arguments(self, q: QueueState, arguments: dict[str, Any]) -> None:
        current = self.state.definitions.queue_arguments.get((q.vhost, q.name.decode()), {})
        X.check_equivalent(q.name, q.vhost, arguments, current)

    def level(self, qid: int, level: int) -> ipc.LevelLog:
        """A publisher needs priority `level` of queue `qid`: give it a slot.
        Without a free slot the message goes to the nearest lower level that
        exists (level 0 always does), which only blurs order within it."""
        q = self.queues.get(qid)
        if q is None or not 0 < level <= q.max_priority:
            return ipc.LevelLog(-1)  # deleted meanwhile (or not a priority queue): drop it
        have = q.levels.get(level)
        if have is not None:
            return ipc.LevelLog(have)
        if not self.free_qids:
            log.warning("queue %r: no free slot for priority %d (--max-queues)", q.name, level)
            return ipc.LevelLog(q.levels[max(p for p in q.levels if p < level)])
        slot = self.free_qids.popleft()
        vhost_id = self.state.definitions.vhost_ids[q.vhost]
        # A level has its queue's capacity and length limits, so that a publish
        # to it finds them with the same one load as a queue's own publish.
        capacity, resume, length_limits = self.shared.table.limits_of(qid)
        self.shared.create(
            slot,
            b"",
            0,
            0,
            vhost_id,
            parent=qid,
            level=level,
            capacity=capacity,
            resume=resume,
            length_limits=length_limits,
            uid=q.uid,  # the message store names a level's entries by its queue
            message_ttl=self.shared.table.message_ttl(qid),
            delivery_limit=self.shared.table.delivery_limit(qid),
        )
        q.levels[level] = slot
        self.level_of[slot] = q
        # Watched from the start, so its first publisher wakes us if we wait.
        self.shared.table.set_watch(slot, True)
        return ipc.LevelLog(slot)

    def _lookup(self, vhost: str, name: bytes, conn_id: int) -> QueueState:
        q = self.state.client_queue(vhost, name)
        if q is None:
            raise errors.ChannelError(
                errors.NOT_FOUND, errors.no_queue(name.decode(errors="replace"), vhost)
            )
        q.check_exclusive(conn_id)
        return q

    def delete(self, vhost: str, name: bytes, if_unused: bool, if_empty: bool, conn_id: int) -> int:
        q = self.state.client_queue(vhost, name)
        if q is None:
            return 0  # RabbitMQ: deleting a missing queue succeeds
        q.check_exclusive(conn_id)
        if if_unused and len(q.qcm):
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"queue '{name.decode()}' in vhost '{vhost}' in use"
            )
        ready = self.state.messages(q)
        # RabbitMQ counts ready messages only: a message delivered and not
        # yet acknowledged does not make the queue "not empty" (rabbit_channel's
        # text, "~s not empty", word for word).
        if if_empty and ready:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"queue '{name.decode()}' in vhost '{vhost}' not empty",
            )
        self.remove_queue(q)
        return ready

    def purge(self, vhost: str, name: bytes, conn_id: int) -> int:
        q = self._lookup(vhost, name, conn_id)
        if q.stream:
            raise errors.ChannelError(
                errors.NOT_IMPLEMENTED,
                f"purge not supported by stream queue '{name.decode()}' in vhost '{vhost}'",
            )
        purged = sum(self.shared.purge(qid) for qid in q.levels.values())
        # May release its blocked publishers.
        flow.drained(self.seg, self.state.waker, *self.shared.table.flow_queue(q.qid))
        return purged

    def _dedup_file(self, vhost: str, name: bytes, qid: int) -> str:
        """Queue `qid`'s deduplication cache file (workers/dedup_filter.py names
        it alike): a durable queue's by its uid, which outlives restarts."""
        incarnation = self.shared.table.uid(qid) or self.shared.table.generation(qid)
        return dedup_arguments.cache_file("q", vhost, name.decode(), incarnation)

    def remove_queue(self, q: QueueState) -> None:
        if self.shared.table.flags(q.qid) & QueueFlag.DEDUP:
            dedup_caches.remove(self.state.config, self._dedup_file(q.vhost, q.name, q.qid))
        self.expiry.disarm(q)
        for key in list(q.qcm):
            self.consumers.pop(key, None)
            worker, cid = key
            link = self.links.get(worker)
            if link is not None:
                link.send(ipc.ConsumerGone(cid))
        q.qcm.clear()
        if not self.shared.table.flow_open(q.qid):
            self.state.send_all(ipc.Unblock(q.qid))  # its publishers wait for nothing now
        for level, qid in q.levels.items():
            self.shared.remove(qid)
            if level:
                self.level_of.pop(qid, None)
                self.free_qids.append(qid)
        self.queues.pop(q.qid, None)
        self.by_name.pop((q.vhost, q.name), None)
        if q.exclusive:
            mine = self.exclusive_of.get(q.owner)
            if mine is not None and q in mine:
                mine.remove(q)
                if not mine:
                    del self.exclusive_of[q.owner]
        if q.stream:  # its files go with it (a reader with one open reads on)
            remove_stream(stream_directory(streams_directory(self.state.config.data_path()), q.uid))
        if q.durable and not q.exclusive:
            try:
                self._persist(QueueDeleted(q.vhost, q.name.decode()))
            except errors.ChannelError:
                pass  # logged; gone until a restart brings it back
        self.stats.v[stats.QUEUES_DELETED] += 1
        self.free_qids.append(q.qid)
        dest = ("q", q.name.decode())
        router = self.state.definitions.router(q.vhost)
        sources = {source for source, _rk, _args in router.bindings_to(dest)}
        if sources or (q.vhost, dest[1]) in self.state.definitions.queue_arguments:
            self._journal(definitions.QueueGone(q.vhost, dest[1]))
            self.unbound(q.vhost, sources)

    def drop_stale_dedup_caches(self) -> None:
        """At a broker's start: memory caches start empty; disk caches stay
        for the durable queues and exchanges that name them."""
        keep = {
            self._dedup_file(q.vhost, q.name, q.qid)
            for q in self.queues.values()
            if self.shared.table.flags(q.qid) & QueueFlag.DEDUP
        }
        keep |= {
            dedup_arguments.cache_file("q", record.vhost, record.queue, record.uid)
            for record, _bindings in self.state.unrestored.values()
        }
        for vhost, router in self.state.definitions.vhosts.items():
            keep |= {
                dedup_arguments.cache_file("x", vhost, name, 0)
                for name, x in router.exchanges.items()
                if dedup_arguments.deduplicates(x.type, x.arguments)
            }
        dedup_caches.at_start(self.state.config, keep)

    def drop_stale_streams(self) -> None:
        """At a broker's start: the directories of streams that no durable
        queue names any more (a delete whose removal raced the stream's
        writer creating a segment) go."""
        root = streams_directory(self.state.config.data_path())
        keep = {
            os.path.basename(stream_directory(root, q.uid))
            for q in self.queues.values()
            if q.stream
        }
        keep |= {
            os.path.basename(stream_directory(root, record.uid))
            for record, _bindings in self.state.unrestored.values()
        }
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        for name in names:
            if name not in keep:
                log.warning("removing the files of a deleted stream (%s)", name)
                remove_stream(os.path.join(root, name))

    def connection_closed(self, conn_id: int) -> None:
        for q in list(self.exclusive_of.get(conn_id, ())):
            self.remove_queue(q)

    def _add(self, q: QueueState) -> None:
        self.queues[q.qid] = q
        self.by_name[(q.vhost, q.name)] = q
        if q.exclusive:
            self.exclusive_of.setdefault(q.owner, []).append(q)


def _length_record(
    max_length: int | None, max_bytes: int | None, overflow: str
) -> tuple[int, int, int]:
    """Checked length limits as the queue record holds them: each limit + 1
    (0: none), and the overflow mode (0 while there is no limit)."""
    if max_length is None and max_bytes is None:
        return 0, 0, 0
    return (
        0 if max_length is None else max_length + 1,
        0 if max_bytes is None else max_bytes + 1,
        OVERFLOW_CODES[overflow],
    )


class Rules(NamedTuple):
    """The queue record's words a policy can change (shm/layout.py)."""

    limits: tuple[int, int, int]  # Q_MAX_LENGTH, Q_MAX_BYTES, Q_OVERFLOW
    message_ttl: int  # Q_MESSAGE_TTL
    delivery_limit: int  # Q_DELIVERY_LIMIT
    capacity: int  # Q_CAPACITY
    resume: int  # Q_RESUME


# The argument that marks a delayed message exchange's delay queue (kept with
# a durable one's definition, so a restart makes it a delay queue again);
# only a queue with the delay queues' amq.* prefix, which no client can
# declare, is one.
DELAY_QUEUE_ARGUMENT = "x-shoal-delay-queue"
# Direct reply-to's per-channel queues (workers/reply_to.py): not counted
# against a vhost's max-queues, as RabbitMQ's pseudo-queue is no queue.
REPLY_QUEUES = b"amq.rabbitmq.reply-to."


def _is_delay_queue(name: bytes, arguments: dict[str, Any]) -> bool:
    return arguments.get(DELAY_QUEUE_ARGUMENT) is True and name.startswith(
        routing.DELAY_QUEUE_PREFIX.encode()
    )
