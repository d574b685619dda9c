"""`shoal ctl`'s requests about queues, exchanges and bindings, the worker
count (set_worker_count, worker_count: broker/supervisor/scaling.py) and the
definitions file both ways (issue 16, item 5; the format is
broker/amqp/definitions_json.py): list_queues / list_exchanges /
list_bindings with rabbitmqctl's column names, purge_queue, delete_queue,
export_definitions, import_definitions. An import goes through the same
paths as a client's declares, so it is journaled and kept durable alike."""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.amqp import definitions as D
from shoal.broker.amqp import definitions_json as J
from shoal.broker.amqp import errors, policy_rules, routing
from shoal.broker.amqp import shovel_definition as shovel_spec
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.accounts import USER_LIMITS, VHOST_LIMITS, Accounts, checked_limits
from shoal.broker.scheduler.exchanges import Exchanges
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.parameters import Parameters
from shoal.broker.scheduler.policies import Policies
from shoal.broker.scheduler.queue_lifecycle import QueueLifecycle
from shoal.broker.scheduler.state import QueueState, SchedulerState
from shoal.shm import ownership
from shoal.shm.processes import Header, ProcessSlot

log = logging.getLogger("shoal.scheduler")

DELAY_QUEUES = routing.DELAY_QUEUE_PREFIX.encode()


class Transfer:
    """Listings and definitions both ways, through the parts that make
    each kind of definition (an import is checked as a client's declares)."""

    def __init__(
        self,
        state: SchedulerState,
        journal: Journal,
        accounts: Accounts,
        policies: Policies,
        parameters: Parameters,
        exchanges: Exchanges,
        lifecycle: QueueLifecycle,
    ) -> None:
        self.state = state
        self._journal = journal.journal
        self.accounts = accounts
        self.policies = policies
        self.parameters = parameters
        self.exchanges = exchanges
        self.lifecycle = lifecycle

    def _client_queues(self, vhost: str | None) -> list[QueueState]:
        """Clients' queues (not the delay queues), of one vhost or all."""
        return sorted(
            (
                q
                for q in self.state.queues.values()
                if (vhost is None or q.vhost == vhost) and not q.name.startswith(DELAY_QUEUES)
            ),
            key=lambda q: (q.vhost, q.name),
        )

    # ------------------------------------------------------ worker count
    def set_worker_count(self, r: C.SetWorkerCount) -> C.Workers:
        """Ask the supervisor for N IO workers (broker/supervisor/scaling.py
        reads H_WORKERS_WANTED in its loop)."""
        count = r.count
        ceiling = self.state.seg.layout.limits.max_workers
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= ceiling:
            raise ValueError(
                f"the worker count must be an integer from 1 to {ceiling} (--max-workers)"
            )
        Header(self.state.seg).set_workers_wanted(count)
        log.info("%d IO workers asked for (shoal ctl)", count)
        return self.worker_count(r)

    def worker_count(self, r: C.WorkerCount | C.SetWorkerCount) -> C.Workers:
        """The count asked for, the workers taking connections, whether
        queues' ownership has settled on them, and workers still retiring."""
        seg = self.state.seg
        header, offsets = Header(seg), seg.layout
        _gen, current, nxt = ownership.word(seg)
        workers = header.workers()
        retiring = [i for i in range(offsets.limits.max_workers) if ProcessSlot(seg, i).retiring()]
        serving = all(ProcessSlot(seg, i).ready() for i in range(workers))
        wanted = header.workers_wanted()
        settled = current == nxt == workers == wanted and serving and not retiring
        row = {
            "wanted": wanted,
            "workers": workers,
            "max_workers": offsets.limits.max_workers,
            "settled": settled,
            "retiring": retiring,
        }
        return C.Workers(
            wanted=wanted,
            workers=workers,
            max_workers=offsets.limits.max_workers,
            settled=settled,
            retiring=retiring,
            rows=[row],
        )

    def list_queues(self, r: C.ListQueues) -> C.Rows:
        rows = []
        for q in self._client_queues(self.accounts.vhost(r)):
            name = q.name.decode(errors="replace")
            arguments = self.state.definitions.queue_arguments.get((q.vhost, name), {})
            policy = self.state.definitions.policy_for(q.vhost, name)
            ready, unacked = self.state.messages(q), self.state.unacked(q)
            rows.append(
                {
                    "name": name,
                    "vhost": q.vhost,
                    "durable": q.durable,
                    "auto_delete": q.auto_delete,
                    "exclusive": q.exclusive,
                    "arguments": arguments,
                    "policy": policy["name"] if policy else "",
                    "messages_ready": ready,
                    "messages_unacknowledged": unacked,
                    "messages": ready + unacked,
                    "consumers": len(q.qcm),
                    "type": _queue_type(q, arguments),
                    "state": "running",
                }
            )
        return C.Rows(rows)

    def list_exchanges(self, r: C.ListExchanges) -> C.Rows:
        vhost = self.accounts.vhost(r)
        router = self.state.definitions.vhosts.get(vhost)
        rows = [
            {
                "name": "",
                "vhost": vhost,
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ]
        for name in sorted(router.exchanges if router else ()):
            x = router.exchanges[name]  # type: ignore[union-attr]
            rows.append(
                {
                    "name": name,
                    "vhost": vhost,
                    "type": x.type,
                    "durable": x.durable,
                    "auto_delete": x.auto_delete,
                    "internal": x.internal,
                    "arguments": x.arguments,
                }
            )
        return C.Rows(rows)

    def list_bindings(self, r: C.ListBindings) -> C.Rows:
        """As rabbitmqctl: the default exchange's implicit binding of each
        queue first, then the explicit ones."""
        vhost = self.accounts.vhost(r)
        rows = [
            _binding("", "queue", name, name, {})
            for q in self._client_queues(vhost)
            for name in [q.name.decode(errors="replace")]
        ]
        router = self.state.definitions.vhosts.get(vhost)
        for source in sorted(router.exchanges if router else ()):
            x = router.exchanges[source]  # type: ignore[union-attr]
            for ((kind, dest), routing_key, _f), arguments in x.bindings.items():
                dest_kind = "queue" if kind == "q" else "exchange"
                rows.append(_binding(source, dest_kind, dest, routing_key, arguments))
        return C.Rows(rows)

    def purge_queue(self, r: C.PurgeQueue) -> C.Counted:
        count = self.lifecycle.purge(self.accounts.vhost(r), r.queue.encode(), 0)
        return C.Counted(messages=count)

    def delete_queue(self, r: C.DeleteQueue) -> C.Counted:
        vhost, name = self.accounts.vhost(r), r.queue.encode()
        if self.state.client_queue(vhost, name) is None:
            raise errors.ChannelError(errors.NOT_FOUND, errors.no_queue(name.decode(), vhost))
        count = self.lifecycle.delete(vhost, name, r.if_unused, r.if_empty, 0)
        return C.Counted(messages=count)

    # ------------------------------------------------------- definitions
    def export_definitions(self, r: C.ExportDefinitions) -> C.Exported:
        rows = []
        for q in self._client_queues(None):
            if q.exclusive:
                continue  # as RabbitMQ 3.10: transient queues too, not exclusive ones
            name = q.name.decode(errors="replace")
            arguments = self.state.definitions.queue_arguments.get((q.vhost, name), {})
            rows.append(
                J.QueueRow(
                    q.vhost, name, q.durable, q.auto_delete, arguments, _queue_type(q, arguments)
                )
            )
        return C.Exported(J.export(self.state.definitions, rows, self.state.vhost))

    def import_definitions(self, r: C.ImportDefinitions) -> C.Ok:
        imported = J.parse(r.definitions)
        self._check_import(imported)  # what can be refused is, before anything changes
        ids = self.state.definitions.vhost_ids
        for vhost in imported.vhosts:
            if vhost not in ids:
                self.accounts.add(vhost)
        for user in imported.users:
            limits = checked_limits({}, user.limits, USER_LIMITS)
            self._journal(
                D.UserSet(user.user, user.password_hash, user.hashing_algorithm, user.tags, limits)
            )
        for vhost_limits in imported.vhost_limits:
            self._known_vhost(vhost_limits.vhost)
            limits = checked_limits({}, vhost_limits.limits, VHOST_LIMITS)
            self._journal(D.VHostLimitsSet(vhost_limits.vhost, limits))
        permissions: list[D.PermissionSet | D.TopicPermissionSet] = [
            *imported.permissions,
            *imported.topic_permissions,
        ]
        for permission in permissions:
            self._known_vhost(permission.vhost)
            if permission.user not in self.state.definitions.users:
                raise J.DefinitionsError(f"no user '{permission.user}' for its permissions")
            self._journal(permission)
        for p in imported.policies:
            self._known_vhost(p.vhost)
            policy_rules.check(p.name, p.pattern, p.apply_to, p.definition)
            self._journal(p)
            self.policies.apply_policies(p.vhost)
        for x in imported.exchanges:
            self._known_vhost(x.vhost)
            self.exchanges.exchange_declare(
                x.vhost,
                x.name,
                x.exchange_type,
                False,
                x.durable,
                x.auto_delete,
                x.internal,
                x.arguments,
            )
        for q in imported.queues:
            self._known_vhost(q.vhost)
            self.lifecycle.declare(
                q.vhost, q.name.encode(), False, q.durable, False, q.auto_delete, 0, 0, q.arguments
            )
        for b in imported.bindings:
            self._known_vhost(b.vhost)
            self.exchanges.bind(
                b.vhost, b.source, b.kind, b.dest, b.routing_key, b.arguments, 0, unbind=False
            )
        # Shovels last (RabbitMQ sets them before the queues): a shovel that
        # declared its queue first would make the queue's own declare fail.
        for parameter in imported.parameters:
            self._known_vhost(parameter.vhost)
            self.parameters.set(
                parameter.vhost, parameter.component, parameter.name, parameter.value
            )
        log.info(
            "definitions imported: %d users, %d vhosts, %d queues, %d exchanges, %d bindings",
            len(imported.users),
            len(imported.vhosts),
            len(imported.queues),
            len(imported.exchanges),
            len(imported.bindings),
        )
        return C.OK

    def _check_import(self, imported: J.Imported) -> None:
        """Refuse a document whose limits, policies, permissions' users or
        vhosts are wrong before journaling any of it (declares may still
        fail halfway, as RabbitMQ's import does)."""
        vhosts = set(self.state.definitions.vhost_ids) | set(imported.vhosts)
        users = set(self.state.definitions.users) | {u.user for u in imported.users}
        for user in imported.users:
            checked_limits({}, user.limits, USER_LIMITS)
        for vhost_limits in imported.vhost_limits:
            checked_limits({}, vhost_limits.limits, VHOST_LIMITS)
        for p in imported.policies:
            policy_rules.check(p.name, p.pattern, p.apply_to, p.definition)
        for parameter in imported.parameters:
            reasons = shovel_spec.check(parameter.name, parameter.value)
            if reasons:
                where = f"{parameter.vhost}/{parameter.component}/{parameter.name}"
                raise J.DefinitionsError(
                    "Validation failed\n\n" + "\n".join(reasons) + f"\n ({where})"
                )
        granted: list[D.PermissionSet | D.TopicPermissionSet] = [
            *imported.permissions,
            *imported.topic_permissions,
        ]
        for permission in granted:
            if permission.user not in users:
                raise J.DefinitionsError(f"no user '{permission.user}' for its permissions")
        every = (
            *imported.vhost_limits,
            *imported.permissions,
            *imported.topic_permissions,
            *imported.policies,
            *imported.parameters,
            *imported.exchanges,
            *imported.bindings,
        )
        for vhost in {x.vhost for x in every} | {q.vhost for q in imported.queues}:
            if vhost not in vhosts:
                raise J.DefinitionsError(f"no vhost '{vhost}' (list it under 'vhosts')")

    def _known_vhost(self, vhost: str) -> None:
        if vhost not in self.state.definitions.vhost_ids:
            raise J.DefinitionsError(f"no vhost '{vhost}' (list it under 'vhosts')")


def _queue_type(q: QueueState, arguments: dict[str, Any]) -> str:
    return "stream" if q.stream else str(arguments.get("x-queue-type", "classic"))


def _binding(
    source: str, kind: str, dest: str, routing_key: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source_name": source,
        "source_kind": "exchange",
        "destination_name": dest,
        "destination_kind": kind,
        "routing_key": routing_key,
        "arguments": arguments,
    }
