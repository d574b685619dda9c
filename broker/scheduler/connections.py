"""Client connections as the scheduler counts them (issue 16): per vhost
and user from the workers' CONN_OPEN (and HELLO), for RabbitMQ's
max-connections limits; users' channels per worker from their
CHANNEL_COUNTS, whose totals go back to every worker for max-channels
(workers/user_channels.py)."""

from __future__ import annotations

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.scheduler.state import SchedulerState, worker_of


class Connections:
    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        # Open client connections (conn_id -> (vhost, user)).
        self.client_connections: dict[int, tuple[str, str]] = {}
        self.user_channels: dict[str, dict[int, int]] = {}  # user -> worker -> open channels

    def connection_opened(self, worker: int, m: ipc.ConnOpen) -> ipc.Ok:
        if m.vhost not in self.state.definitions.vhost_ids:  # deleted since the worker looked
            raise errors.ConnectionError_(errors.NOT_ALLOWED, f"vhost {m.vhost} not found", 10, 40)
        if m.check:
            self._check_connection_limits(m.vhost, m.user)
        self.client_connections[m.conn_id] = (m.vhost, m.user)
        return ipc.Ok()

    def _check_connection_limits(self, vhost: str, user: str) -> None:
        """RabbitMQ's 530s for a connection over the vhost's or the user's
        max-connections."""
        definitions = self.state.definitions
        opened = self.client_connections.values()
        limit = definitions.vhost_limits.get(vhost, {}).get("max-connections")
        if limit is not None and sum(1 for v, _u in opened if v == vhost) >= limit:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED,
                f"access to vhost '{vhost}' refused for user '{user}': connection limit "
                f"({limit}) is reached",
                10,
                40,
            )
        record = definitions.users.get(user)
        limit = record.limits.get("max-connections") if record is not None else None
        if limit is not None and sum(1 for _v, u in opened if u == user) >= limit:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED,
                f"connection refused for user '{user}': user connection limit ({limit}) is reached",
                10,
                40,
            )

    def connection_closed(self, conn_id: int) -> None:
        self.client_connections.pop(conn_id, None)

    def known_connections(self, worker: int, connections: list[tuple[int, str, str]]) -> None:
        """A worker's HELLO (or its death, with none): its connections now.
        Its channel counts start again from its next report."""
        for conn_id in [c for c in self.client_connections if worker_of(c) == worker]:
            del self.client_connections[conn_id]
        for conn_id, vhost, user in connections:
            self.client_connections[conn_id] = (vhost, user)
        self.channel_counts(worker, {u: 0 for u, by in self.user_channels.items() if worker in by})

    def channel_counts(self, worker: int, counts: dict[str, int]) -> None:
        """A worker's channels per user (ipc.ChannelCounts): the totals that
        changed go to every worker, which check users' max-channels limits
        against them (eventually consistent, as RabbitMQ's tracking is)."""
        changed: dict[str, int] = {}
        for user, count in counts.items():
            by_worker = self.user_channels.get(user, {})
            if by_worker.get(worker, 0) == count:
                continue
            self.user_channels[user] = by_worker
            if count:
                by_worker[worker] = count
            else:
                by_worker.pop(worker, None)
            changed[user] = sum(by_worker.values())
            if not by_worker:
                del self.user_channels[user]
        if changed:
            self.state.send_all(ipc.ChannelTotals(changed))

    def channel_totals(self) -> dict[str, int]:
        """Every user's channels over all workers (a HELLO's snapshot)."""
        return {user: sum(by.values()) for user, by in self.user_channels.items()}
