"""Policies in the scheduler (issue 15, item 9; rules in
broker/amqp/policies.py): set, clear and list them for `shoal policy`
(through the control socket, broker/scheduler/introspect.py), journaled
with the definitions (so IO workers dead-letter by them too) and kept in
the durable definitions; each change re-applies the rules of its virtual
host's queues to their records at once (TTL, expiry, length limits,
overflow, delivery limit, capacity)."""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.amqp import definitions, errors, policies, quorum
from shoal.broker.scheduler.queues import QueueLifecycle
from shoal.broker.scheduler.state import QueueState
from shoal.shm import layout

log = logging.getLogger("shoal.scheduler")


class Policies(QueueLifecycle):
    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A `shoal policy` request: {"op": set_policy | clear_policy |
        list_policies, ...}; the answer, or {"error": why}."""
        op = request.get("op")
        vhost = str(request.get("vhost", self.vhost))
        try:
            if op == "set_policy":
                self.set_policy(
                    vhost,
                    str(request.get("name", "")),
                    str(request.get("pattern", "")),
                    str(request.get("apply_to", "all")),
                    int(request.get("priority", 0)),
                    dict(request.get("definition") or {}),
                )
            elif op == "clear_policy":
                self.clear_policy(vhost, str(request.get("name", "")))
            elif op == "list_policies":
                named = self.definitions.policies.get(vhost, {})
                return {"policies": [{"vhost": vhost, **p} for p in named.values()]}
            else:
                return {"error": f"unknown request {op!r}"}
        except (policies.PolicyError, errors.AMQPError, TypeError, ValueError) as exc:
            return {"error": str(exc)}
        return {"ok": True}

    def set_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        if vhost not in self.definitions.vhost_ids:
            raise policies.PolicyError(f"no vhost '{vhost}'")
        policies.check(name, pattern, apply_to, definition)
        self._journal(definitions.PolicySet(vhost, name, pattern, apply_to, priority, definition))
        log.info("policy %r set in vhost %r: %r on %r", name, vhost, definition, pattern)
        self._apply_policies(vhost)

    def clear_policy(self, vhost: str, name: str) -> None:
        if name not in self.definitions.policies.get(vhost, {}):
            raise policies.PolicyError(f"no policy '{name}' in vhost '{vhost}'")
        self._journal(definitions.PolicyCleared(vhost, name))
        log.info("policy %r cleared in vhost %r", name, vhost)
        self._apply_policies(vhost)

    def _apply_policies(self, vhost: str) -> None:
        """The rules of every queue of `vhost`, from its arguments and the
        policies now (streams and delay queues take none of these keys)."""
        for q in list(self.queues.values()):
            if q.vhost == vhost and not q.stream:
                self._reapply(q)

    def _reapply(self, q: QueueState) -> None:
        flags = self.store.flags(q.qid)
        if flags & layout.QF_DELAYED:
            return
        kind = quorum.QUORUM if flags & layout.QF_QUORUM else quorum.CLASSIC
        arguments = self.definitions.queue_arguments.get((q.vhost, q.name.decode()), {})
        try:
            rules = self._rules(q.vhost, q.name, arguments, kind)
            expires = self._expires(q.vhost, q.name, arguments)
        except errors.AMQPError as exc:  # its own arguments were checked: never fatal
            log.warning("queue %r: its rules not applied again: %s", q.name, exc)
            return
        for log_qid in q.levels.values():
            self.store.set_rules(log_qid, *rules)
        q.expires_ms = expires or 0
        self._queue_used(q)  # a new expiry counts from now
