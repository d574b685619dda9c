"""Policies in the scheduler (issue 15, item 9; rules in
broker/amqp/policy_rules.py): set, clear and list them for `shoal policy`
(through the control socket, broker/scheduler/introspect.py), journaled
with the definitions (so IO workers dead-letter by them too) and kept in
the durable definitions; each change re-applies the rules of its virtual
host's queues to their records at once (TTL, expiry, length limits,
overflow, delivery limit, capacity)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from shoal.broker.amqp import definitions, errors, policy_rules, quorum
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.queue_lifecycle import Rules
from shoal.broker.scheduler.state import QueueState, SchedulerState
from shoal.shm.queue_table import QueueFlag

log = logging.getLogger("shoal.scheduler")


class QueueRules(Protocol):
    """What policies need of the queue lifecycle (queues.py): a queue's
    rules and expiry from its arguments and the policies now."""

    def rules(self, vhost: str, name: bytes, arguments: dict[str, Any], kind: str) -> Rules: ...

    def expires(self, vhost: str, name: bytes, arguments: dict[str, Any]) -> int: ...

    def queue_used(self, q: QueueState) -> None: ...


class Policies:
    def __init__(self, state: SchedulerState, journal: Journal, lifecycle: QueueRules) -> None:
        self.state = state
        self._journal = journal.journal
        self.lifecycle = lifecycle

    # ---------------------------------------------------- control requests
    def set_policy(self, r: C.SetPolicy) -> C.Ok:
        vhost = r.in_vhost(self.state.vhost)
        self.set(vhost, r.name, r.pattern, r.apply_to, r.priority, r.definition or {})
        return C.OK

    def clear_policy(self, r: C.ClearPolicy) -> C.Ok:
        vhost, name = r.in_vhost(self.state.vhost), r.name
        if name not in self.state.definitions.policies.get(vhost, {}):
            raise policy_rules.PolicyError(f"no policy '{name}' in vhost '{vhost}'")
        self._journal(definitions.PolicyCleared(vhost, name))
        log.info("policy %r cleared in vhost %r", name, vhost)
        self.apply_policies(vhost)
        return C.OK

    def list_policies(self, r: C.ListPolicies) -> C.PolicyRows:
        vhost = r.in_vhost(self.state.vhost)
        named = self.state.definitions.policies.get(vhost, {})
        return C.PolicyRows([{"vhost": vhost, **p} for p in named.values()])

    # ------------------------------------------------------------- rules
    def set(
        self,
        vhost: str,
        name: str,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        if vhost not in self.state.definitions.vhost_ids:
            raise policy_rules.PolicyError(f"no vhost '{vhost}'")
        policy_rules.check(name, pattern, apply_to, definition)
        self._journal(definitions.PolicySet(vhost, name, pattern, apply_to, priority, definition))
        log.info("policy %r set in vhost %r: %r on %r", name, vhost, definition, pattern)
        self.apply_policies(vhost)

    def apply_policies(self, vhost: str) -> None:
        """The rules of every queue of `vhost`, from its arguments and the
        policies now (streams and delay queues take none of these keys)."""
        for q in list(self.state.queues.values()):
            if q.vhost == vhost and not q.stream:
                self._reapply(q)

    def _reapply(self, q: QueueState) -> None:
        shared = self.state.shared
        flags = shared.table.flags(q.qid)
        if flags & QueueFlag.DELAYED:
            return
        kind = quorum.QUORUM if flags & QueueFlag.QUORUM else quorum.CLASSIC
        arguments = self.state.definitions.queue_arguments.get((q.vhost, q.name.decode()), {})
        try:
            rules = self.lifecycle.rules(q.vhost, q.name, arguments, kind)
            expires = self.lifecycle.expires(q.vhost, q.name, arguments)
        except errors.AMQPError as exc:  # its own arguments were checked: never fatal
            log.warning("queue %r: its rules not applied again: %s", q.name, exc)
            return
        for log_qid in q.levels.values():
            shared.set_rules(log_qid, *rules)
        q.expires_ms = expires or 0
        self.lifecycle.queue_used(q)  # a new expiry counts from now
