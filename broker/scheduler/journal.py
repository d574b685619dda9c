"""The definitions journal: each definitions change (an exchange, a
binding, a queue's arguments, a vhost, a user, a policy...) is applied to
the definitions and journaled in shared memory (shm/catalog.py) for the IO
workers before the reply; a restarted scheduler replays the journal. A
change to durable definitions is also on disk before the reply (durable.py),
and the durable log is rewritten from a snapshot of what holds now.
"""

from __future__ import annotations

import logging

from shoal.broker.amqp import dedup_arguments, definitions, errors
from shoal.broker.scheduler import dedup_caches, durable
from shoal.broker.scheduler.state import SchedulerState
from shoal.shm.catalog import CatalogFull
from shoal.store.definitions_log import QueueDeclared, UsersSeeded

log = logging.getLogger("shoal.scheduler")

# Changes that are always durable (besides users and their access).
LASTING_OPS = (
    definitions.VHostAdded,
    definitions.VHostDeleted,
    definitions.PolicySet,
    definitions.PolicyCleared,
    definitions.ParameterSet,
    definitions.ParameterCleared,
)


class Journal:
    """Definitions changes, in shared memory and on disk: every part that
    changes the definitions goes through `journal` (or `persist`, for a
    durable queue's own records)."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        # While the durable definitions are being restored (queues.py): not
        # logged again (the snapshot written once restored holds them).
        self.restoring = False

    def load_definitions(self, restored: durable.Restored | None) -> None:
        """Replay the journal (a restarted scheduler), or start it afresh
        with the `restored` durable definitions (the broker's first
        scheduler): vhosts, durable exchanges and the bindings between
        durable entities, the default vhost and its amq.* exchanges first
        if it is new. Durable queues come next (queues.py)."""
        if restored is None:
            ops = self.state.catalog.load()
        else:
            config = self.state.config
            ops = restored.operations(self.state.vhost, config.default_user, config.default_pass)
            self.state.catalog.compact(ops)
        for op in ops:
            self.state.definitions.apply(op)

    def drop_stale_definitions(self) -> None:
        """A predecessor killed between a queue change and its journal record
        may have left bindings or arguments of queues that do not exist."""
        stale = set(self.state.definitions.queue_arguments)
        for vhost, router in self.state.definitions.vhosts.items():
            stale |= {(vhost, name) for kind, name in router.by_dest if kind == "q"}
        for vhost, name in stale - {(v, n.decode()) for v, n in self.state.by_name}:
            self.journal(definitions.QueueGone(vhost, name))

    def journal(self, op: definitions.Op, persist: bool = True) -> None:
        """Apply a definitions change and journal it for the IO workers,
        before the reply: a client that got declare-ok or bind-ok can
        publish through it at once, from any connection. A change to
        durable definitions is on disk before the reply too."""
        lasting = persist and self._is_durable_change(op)
        caches_gone = self._dedup_caches_gone(op)
        self.state.definitions.apply(op)
        try:
            self.state.catalog.append(op, self.state.definitions.snapshot)
        except CatalogFull:
            if isinstance(op, (*definitions.ACCESS_OPS, definitions.VHostDeleted)):
                self.state.definitions = definitions.Definitions()  # as the journal still has it
                for journaled in self.state.catalog.load():
                    self.state.definitions.apply(journaled)
            else:
                self.state.definitions.apply(definitions.inverse(op))
            raise errors.ChannelError(
                errors.RESOURCE_ERROR,
                "the definitions journal is full (raise --catalog-mb)",
            ) from None
        for file_name in caches_gone:
            dedup_caches.remove(self.state.config, file_name)
        if isinstance(op, definitions.TracingSet):
            # The connections that only receive learn it from the workers'
            # poll (workers/firehose.py): now, not within a second.
            self.state.doorbell.ring()
        if not lasting or isinstance(
            op, definitions.QueueArgumentsSet | definitions.QueueGone | definitions.TracingSet
        ):
            return  # (never lasting: the firehose goes with a restart, as in RabbitMQ)
        try:
            self.persist(op)
        except errors.ChannelError:
            if isinstance(op, definitions.ExchangeDeclared | definitions.Bound):
                self.journal(definitions.inverse(op), persist=False)  # not on disk: undone
                raise
            # A removal stays done; the log says otherwise until the next
            # start's snapshot fails to find what it removed again.

    def _dedup_caches_gone(self, op: definitions.Op) -> list[str]:
        """The cache files of the deduplicating exchanges `op` deletes."""
        if isinstance(op, definitions.ExchangeDeleted):
            names = [op.name]
        elif isinstance(op, definitions.VHostDeleted):
            router = self.state.definitions.vhosts.get(op.vhost)
            names = list(router.exchanges) if router is not None else []
        else:
            return []
        router = self.state.definitions.vhosts.get(op.vhost)
        return [
            dedup_arguments.cache_file("x", op.vhost, name, 0)
            for name in names
            if router is not None
            and (x := router.exchanges.get(name)) is not None
            and dedup_arguments.deduplicates(x.type, x.arguments)
        ]

    def persist(self, *changes: durable.Record) -> None:
        """Durable changes to disk (fdatasync'd) before their reply. After
        a failed write, the log is first rewritten from memory."""
        if self.restoring:
            return  # the snapshot written once restored holds them
        try:
            if self.state.durable.dirty:
                self.state.durable.rewrite(self.durable_snapshot())
            self.state.durable.write(*changes)
        except OSError as exc:
            log.error("cannot write the durable definitions: %s", exc)
            raise errors.ChannelError(
                errors.RESOURCE_ERROR,
                f"cannot write the durable definitions to disk ({exc.strerror})",
            ) from None

    def _is_durable_change(self, op: definitions.Op) -> bool:
        """Whether `op` (not yet applied) changes the durable definitions."""
        if isinstance(op, (*definitions.ACCESS_OPS, *LASTING_OPS)):
            return True
        if isinstance(op, definitions.ExchangeDeclared):
            return op.durable
        if isinstance(op, definitions.ExchangeDeleted):
            return self.is_durable_entity(op.vhost, "e", op.name)
        if isinstance(op, definitions.Bound | definitions.Unbound):
            return self.is_durable_entity(op.vhost, "e", op.source) and (
                self.is_durable_entity(op.vhost, op.kind, op.dest)
            )
        return False  # a queue's own records are queues.py's

    def is_durable_entity(self, vhost: str, kind: str, name: str) -> bool:
        """A durable exchange ("e"), or a durable queue ("q") that is not
        exclusive: those outlive the broker (RabbitMQ's rule)."""
        if kind == "e":
            router = self.state.definitions.vhosts.get(vhost)
            x = router.exchanges.get(name) if router is not None else None
            return x is not None and x.durable
        q = self.state.by_name.get((vhost, name.encode()))
        return q is not None and q.durable and not q.exclusive

    def durable_snapshot(self) -> list[durable.Record]:
        """The durable definitions as they are now, as records that rebuild
        them: vhosts, durable exchanges, durable queues, then bindings."""
        snapshot: list[durable.Record] = [UsersSeeded(self.state.vhost)]
        snapshot += [
            definitions.VHostAdded(vhost, vhost_id)
            for vhost, vhost_id in self.state.definitions.vhost_ids.items()
        ]
        snapshot += self.state.definitions.access_snapshot()
        snapshot += [
            op
            for op in self.state.definitions.snapshot()
            if isinstance(op, definitions.PolicySet | definitions.ParameterSet)
        ]
        routers = self.state.definitions.vhosts.items()
        for vhost, router in routers:
            snapshot += [
                definitions.ExchangeDeclared(
                    vhost, x.name, x.type, True, x.auto_delete, x.internal, x.arguments
                )
                for x in router.exchanges.values()
                if x.durable
            ]
        for record, _bindings in self.state.unrestored.values():
            snapshot.append(record)
        for q in self.state.queues.values():
            if q.durable and not q.exclusive:
                name = q.name.decode()
                arguments = self.state.definitions.queue_arguments.get((q.vhost, name), {})
                snapshot.append(QueueDeclared(q.vhost, name, q.auto_delete, arguments, q.uid))
        for vhost, router in routers:
            for x in router.exchanges.values():
                if not x.durable:
                    continue
                for ((kind, dest), routing_key, _frozen), arguments in x.bindings.items():
                    if self.is_durable_entity(vhost, kind, dest):
                        snapshot.append(
                            definitions.Bound(vhost, x.name, kind, dest, routing_key, arguments)
                        )
        for _record, bindings in self.state.unrestored.values():
            snapshot += bindings
        return snapshot

    def compact_if_due(self) -> None:
        """Once the log's appended changes outgrow its snapshot: a new one."""
        if self.state.durable.needs_compaction():
            try:
                self.state.durable.rewrite(self.durable_snapshot())
            except OSError as exc:  # tried again after the next request
                log.error("cannot rewrite the durable definitions: %s", exc)

    def rewrite(self) -> None:
        """At every start, what holds now: also right after a predecessor
        killed between the queue table and the log."""
        try:
            self.state.durable.rewrite(self.durable_snapshot())
        except OSError as exc:  # dirty: rewritten before the next change
            log.error("cannot rewrite the durable definitions: %s", exc)
