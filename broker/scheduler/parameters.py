"""Runtime parameters in the scheduler (RabbitMQ's `set_parameter`,
`clear_parameter`, `list_parameters`): a shovel's definition, checked
(broker/amqp/shovel_definition.py) and journaled with the definitions, so it is durable,
exported with them, replicated with the data directory and seen by the
shovel process, which reads the journal (broker/shovel/runner.py).

RabbitMQ's other components (federation, vhost-limits through this verb)
are refused as RabbitMQ refuses a component it does not have."""

from __future__ import annotations

import logging
from typing import Any

from shoal.broker.amqp import access
from shoal.broker.amqp import definitions as D
from shoal.broker.amqp import shovel_definition as spec
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.journal import Journal
from shoal.broker.scheduler.state import SchedulerState

log = logging.getLogger("shoal.scheduler")

# rabbitmqctl's exit codes: 65 a refused value (EX_DATAERR), 69 not found.
REFUSED = 65
NOT_FOUND = 69


class ParameterRefused(access.AccessError):
    """A value its component refuses: RabbitMQ's "Validation failed" text."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("Validation failed\n\n" + "\n".join(reasons) + "\n", REFUSED)


class Parameters:
    def __init__(self, state: SchedulerState, journal: Journal) -> None:
        self.state = state
        self._journal = journal.journal

    def _vhost(self, r: C.InVhost) -> str:
        vhost = r.in_vhost(self.state.vhost)
        if vhost not in self.state.definitions.vhost_ids:
            raise access.AccessError(f"Virtual host {vhost} does not exist", NOT_FOUND)
        return vhost

    def set_parameter(self, r: C.SetParameter) -> C.Ok:
        vhost = self._vhost(r)
        self.set(vhost, r.component, r.name, r.value)
        return C.OK

    def set(self, vhost: str, component: str, name: str, value: Any) -> None:
        if component != spec.COMPONENT:
            raise ParameterRefused([f"component {component} not found"])
        if not name:
            raise ParameterRefused(["a parameter's name cannot be empty"])
        reasons = spec.check(name, value)
        if reasons:
            raise ParameterRefused(reasons)
        self._journal(D.ParameterSet(vhost, component, name, value))
        log.info("parameter %r of %r set in vhost %r", name, component, vhost)

    def clear_parameter(self, r: C.ClearParameter) -> C.Ok:
        vhost = self._vhost(r)
        if (r.component, r.name) not in self.state.definitions.parameters.get(vhost, {}):
            raise access.AccessError("Parameter does not exist", NOT_FOUND)
        self._journal(D.ParameterCleared(vhost, r.component, r.name))
        log.info("parameter %r of %r cleared in vhost %r", r.name, r.component, vhost)
        return C.OK

    def list_parameters(self, r: C.ListParameters) -> C.Rows:
        vhost = self._vhost(r)
        named = self.state.definitions.parameters.get(vhost, {})
        return C.Rows(
            [
                {"vhost": vhost, "component": component, "name": name, "value": value}
                for (component, name), value in named.items()
                if r.component in ("", component)
            ]
        )
