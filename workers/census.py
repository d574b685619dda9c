"""A worker's counts of its clients, kept as they change: open channels,
those that published (RabbitMQ's "publishers"), channels per user (user
limits, the scheduler's totals), and the connections whose publishes are
held back (flow control, the memory and disk alarms).

Counted where channels open and leave a connection and where a channel
first publishes, not by walking every connection: at each statistics flush
(then four times a second) that walk, and the consumer time-outs' walk of every
channel once a second, were nearly all the idle CPU of a worker with 10,000
MQTT clients (4 % of a core against mosquitto's 0.15 %, docs/benchmarks.md)
and grew with every client a fleet added.

A channel is counted once and uncounted once, whatever the order of its
close and its connection's end; a publisher is counted at its first publish
only while its channel is counted, so a publish accounted after its channel
closed cannot leave the count high."""

from __future__ import annotations

from typing import Protocol


class CountedChannel(Protocol):
    counted_user: str | None  # the user it is counted under (None: not counted)


class CountedPublisher(Protocol):
    @property
    def channel(self) -> CountedChannel: ...


class FlowConnection(Protocol):
    """What the blocked counts read of a connection (workers/blocking.py)."""

    @property
    def flow_blocked(self) -> dict[int, int]: ...
    @property
    def alarm_reason(self) -> str: ...


class Census:
    __slots__ = ("changed", "channels", "flow_touched", "per_user", "publishing")

    def __init__(self) -> None:
        self.channels = 0
        self.per_user: dict[str, int] = {}  # user -> channels open ("" not counted)
        self.publishing: set[CountedChannel] = set()  # the channels that published
        # Connections whose flow_blocked changed; blocked() keeps those still blocked.
        self.flow_touched: set[FlowConnection] = set()
        self.changed = True  # since the statistics last took the counts

    @property
    def publishers(self) -> int:
        return len(self.publishing)

    def opened(self, channel: CountedChannel, user: str) -> None:
        channel.counted_user = user
        self.channels += 1
        if user:
            self.per_user[user] = self.per_user.get(user, 0) + 1
        self.changed = True

    def left(self, channel: CountedChannel) -> None:
        """The channel left its connection (its close, or the connection's end)."""
        user = channel.counted_user
        if user is None:
            return
        self.publishing.discard(channel)
        channel.counted_user = None
        self.channels -= 1
        if user:
            left = self.per_user[user] - 1
            if left:
                self.per_user[user] = left
            else:
                del self.per_user[user]
        self.changed = True

    def first_publish(self, publisher: CountedPublisher) -> None:
        """A channel's first publish (its publish count was 0)."""
        channel = publisher.channel
        if channel.counted_user is not None and channel not in self.publishing:
            self.publishing.add(channel)
            self.changed = True

    def flow_changed(self, conn: FlowConnection) -> None:
        """`conn`'s flow_blocked or alarm reason changed."""
        self.flow_touched.add(conn)
        self.changed = True

    def blocked(self, alarm: int) -> tuple[int, int, int]:
        """(capacity, memory, disk): connections held back by a queue over
        its capacity, and by the memory or the disk alarm (`alarm`: the key
        of flow_blocked the alarm holds). Walks only the connections whose
        flow changed, and forgets those no longer held."""
        capacity = memory = disk = 0
        for conn in list(self.flow_touched):
            flow_blocked = conn.flow_blocked
            if not flow_blocked:
                self.flow_touched.discard(conn)
                continue
            if alarm in flow_blocked:
                reason = conn.alarm_reason
                memory += "memory" in reason
                disk += "disk" in reason
            capacity += any(qid >= 0 for qid in flow_blocked)
        return capacity, memory, disk
