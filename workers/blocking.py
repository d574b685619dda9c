"""A connection's publishers held back: its read holds (TCP back-pressure),
connection.blocked / unblocked and channel.flow, queues over their capacity
(Qpid's producer flow control, shm/flow.py) and the broker-wide memory and
disk alarms (shm/memory.py). The connection's part that decides whether its
client may publish: the channels, the handshake, pacing, the memory guard and
the scheduler's messages call it as `conn.blocks`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from pamqp import commands as C

from shoal.shm import flow, memory, stats
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stats import Counters
from shoal.workers import device_gate, framing
from shoal.workers._wire import DeviceRead
from shoal.workers.census import Census
from shoal.workers.handshake import OPEN
from shoal.workers.memory_guard import ALARM, ALARM_PENDING
from shoal.workers.unmade import UNMADE_SET, made_set

# Publish frames a flow-blocked connection's channels may keep before the
# socket stops being read.
MAX_HELD_BYTES = 4 << 20
FLOW_HELD = "flow-held"  # the read holder for that


class FlowChannel(Protocol):
    """What the part uses of a channel: whether it publishes, and its flow."""

    @property
    def publish_count(self) -> int: ...
    def send_flow(self, active: bool) -> None: ...
    def release_flow(self) -> None: ...


class BlockingContext(Protocol):
    """What the part uses of its worker: the queues' flow words and the
    counters of blocked connections."""

    @property
    def seg(self) -> Segment: ...
    @property
    def shared(self) -> SharedQueues: ...
    @property
    def stats(self) -> Counters: ...

    @property
    def census(self) -> Census: ...  # (the blocked counts of the statistics)


class BlockedConnection(Protocol):
    """What the part reads of its connection (workers/connection.py)."""

    transport: Any
    state: int
    closed: bool
    vhost: str
    capabilities: dict[str, Any]
    obeys_channel_flow: bool
    flow_blocked: dict[int, int]
    device_gate: DeviceRead | None  # (workers/device_gate.py)

    @property
    def alarm_reason(self) -> str: ...
    @property
    def channels(self) -> Mapping[int, FlowChannel]: ...
    @property
    def ctx(self) -> BlockingContext: ...

    def write(self, data: bytes) -> None: ...


class PublisherBlocks:
    """Why, and since when, a connection's publishers are held back."""

    __slots__ = (
        "alarm_reason",
        "blocked_at",
        "blocked_sent",
        "blocking_holders",
        "conn",
        "flow_blocked",
        "held_bytes",
        "read_holders",
    )

    def __init__(self, conn: BlockedConnection) -> None:
        self.conn = conn
        self.read_holders: set[object] = UNMADE_SET  # (made when one holds)
        self.blocking_holders: set[object] = UNMADE_SET  # those the client is told of
        self.blocked_sent = False
        self.blocked_at = 0.0  # monotonic time it was blocked at (0: it is not)
        # Its connection's queues over capacity (workers/connection.py):
        # kept here, read there on every publish.
        self.flow_blocked = conn.flow_blocked
        self.held_bytes = 0  # frames those channels keep
        self.alarm_reason = ""  # while the memory or disk alarm is raised (shm/memory.py)

    def released(self) -> None:
        """The connection ended: its queues' counts of blocked publishers
        and the time it was blocked are settled."""
        for qid, state in self.flow_blocked.items():
            self._count_blocked(qid, -1, state)
        self.flow_blocked.clear()
        if self.blocked_at:
            self._count_blocked_time(False)

    def hold_reading(self, holder: object, reason: str | None = "low on shared memory") -> None:
        """Stop reading this client (a full queue log or arena, too much held
        back by flow control) and tell it it is blocked; with no `reason`, a
        short internal wait (a scheduler round trip) it is not told of."""
        if not self.read_holders and self.conn.transport is not None:
            self.conn.transport.pause_reading()
        made_set(self, "read_holders").add(holder)
        if reason is not None:
            made_set(self, "blocking_holders").add(holder)
            self._blocked(reason)

    def release_reading(self, holder: object) -> None:
        if holder in self.read_holders:
            self.read_holders.discard(holder)
            if not self.read_holders and self.conn.transport is not None and not self.conn.closed:
                self.conn.transport.resume_reading()
            if holder in self.blocking_holders:
                self.blocking_holders.discard(holder)
                self._blocked()

    def _blocked(self, reason: str = "") -> None:
        """connection.blocked when something starts holding this publisher
        back, connection.unblocked when nothing does any more; and to a
        client that obeys channel.flow, channel.flow on its publishing channels."""
        flow_blocked = self.flow_blocked
        blocked = bool(self.blocking_holders or len(flow_blocked) > (ALARM_PENDING in flow_blocked))
        if blocked != bool(self.blocked_at):
            self._count_blocked_time(blocked)
        if self.conn.obeys_channel_flow:
            for channel in self.conn.channels.values():
                if channel.publish_count:
                    channel.send_flow(not blocked)
        if blocked == self.blocked_sent or not self.conn.capabilities.get("connection.blocked"):
            return
        self.blocked_sent = blocked
        if blocked:
            self.conn.write(framing.encode_method(0, C.Connection.Blocked(reason=reason[:255])))
        elif not self.conn.closed:
            self.conn.write(framing.encode_method(0, C.Connection.Unblocked()))

    def _count_blocked_time(self, blocked: bool) -> None:
        """How often and how long publishers are blocked (for the metrics)."""
        v = self.conn.ctx.stats.v
        now = time.monotonic()
        if blocked:
            v[stats.PUBLISHER_BLOCKS] += 1
            self.blocked_at = now
        else:
            v[stats.PUBLISHER_BLOCKED_MS] += int((now - self.blocked_at) * 1000)
            self.blocked_at = 0.0

    # ----------------------- flow control (Qpid Java broker's producer flow control)
    def flow_block(self, qid: int, logs: list[int] | None = None) -> None:
        """A publish took queue `qid` (`logs`: a priority queue's) above its
        capacity: hold further publishes until it is back at its resume size."""
        device_gate.shut(self.conn)  # (also inside a device's read: its count)
        if qid in self.flow_blocked or not flow.arm(self.conn.ctx.seg, qid, logs):
            return
        self.flow_blocked[qid] = self._count_blocked(qid, 1, None)
        name = self.conn.ctx.shared.table.name(qid).decode(errors="replace")
        self._blocked(f"queue '{name}' in vhost '{self.conn.vhost}' is over its capacity")

    def alarm(self, bits: int) -> None:
        """The broker-wide memory or disk alarm was raised (bits) or cleared (0).
        As in RabbitMQ only publishers are blocked, others at their first publish."""
        device_gate.shut(self.conn)  # (an MQTT device's inner connection writes nothing)
        if self.conn.state != OPEN:
            return  # told at connection.open, if still raised then
        self.alarm_reason = memory.reason(bits) if bits else ""
        self.conn.ctx.census.flow_changed(self.conn)  # (memory or disk: the statistics say which)
        if not bits:
            self.flow_blocked.pop(ALARM_PENDING, None)
            self.flow_unblock(ALARM)
        elif any(channel.publish_count for channel in self.conn.channels.values()):
            self.alarm_felt()
        elif ALARM not in self.flow_blocked:
            self.flow_blocked[ALARM_PENDING] = 0

    def alarm_felt(self) -> None:
        """A publisher meets the raised alarm: hold its publishes (as a
        queue over capacity does) and say why, in RabbitMQ's words."""
        device_gate.shut(self.conn)
        self.flow_blocked.pop(ALARM_PENDING, None)
        if ALARM not in self.flow_blocked:
            self.flow_blocked[ALARM] = 0
            self.conn.ctx.census.flow_changed(self.conn)
            self._blocked(self.alarm_reason)

    def flow_unblock(self, qid: int) -> None:
        if qid not in self.flow_blocked:
            return
        flow_blocked = self.flow_blocked
        self._count_blocked(qid, -1, flow_blocked.pop(qid))
        if len(flow_blocked) > (ALARM_PENDING in flow_blocked):
            return  # still held back by another queue (or the alarm)
        self._blocked()
        for channel in list(self.conn.channels.values()):
            channel.release_flow()
        self.release_reading(FLOW_HELD)

    def _count_blocked(self, qid: int, delta: int, state: int | None) -> int:
        """Keep the queue's count of blocked publishers (Q_BLOCKED_PUBLISHERS,
        for the metrics) unless the queue was deleted since (`state`, its
        Q_STATE when this connection blocked on it, changed). Returns Q_STATE."""
        self.conn.ctx.census.flow_changed(self.conn)  # (the connection's blocked or not)
        if qid < 0:  # ALARM, ALARM_PENDING
            return 0
        return self.conn.ctx.shared.table.count_blocked_publisher(qid, delta, state)

    def flow_held(self, size: int) -> None:
        """A channel kept a frame back: past a bound, stop reading too (a
        client that ignores connection.blocked gets TCP back-pressure)."""
        self.held_bytes += size
        if self.held_bytes > MAX_HELD_BYTES:
            self.hold_reading(FLOW_HELD)
