"""An MQTT device's gate (workers/_lane_device.h; docs/mqtt.md, "A device's
gate"): the inner connection of a device whose reads go to a DeviceRead holds
it as `device_gate`, and what may change one of the conditions that read
stands for, outside the device's own reads, shuts it. Its next read then
reads them all again. Every other connection's `device_gate` is None."""

from __future__ import annotations

from typing import Protocol

from shoal.workers._wire import DeviceRead


class GateHolder(Protocol):
    device_gate: DeviceRead | None


def shut(conn: GateHolder) -> None:
    """What `conn`'s device checks may change here: the next read checks."""
    gate = conn.device_gate
    if gate is not None:
        gate.shut_gate()
