"""Users' max-channels limits (RabbitMQ's user limits): the channels a user
has open over all IO workers. Each worker reports its own counts per user
to the scheduler with its statistics (every 0.2 s, the users whose count
changed); the scheduler sends every worker the totals that changed. A
channel.open checks this worker's count now plus the others' last known:
as RabbitMQ's channel tracking, eventually consistent (RabbitMQ 3.10 let
three channel.opens sent back to back past a limit of 2; measured)."""

from __future__ import annotations

from collections.abc import Mapping

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.broker.amqp.definitions import UserSet


class UserChannels:
    __slots__ = ("reported", "totals")

    def __init__(self) -> None:
        self.reported: dict[str, int] = {}  # this worker's counts, as last sent
        self.totals: dict[str, int] = {}  # over all workers, as last heard

    def check_open(self, user: str, users: Mapping[str, UserSet], here: Mapping[str, int]) -> None:
        """Before a channel.open of `user` (`here`: this worker's channels
        per user, workers/census.py): RabbitMQ's 530 when the user's limit
        is reached."""
        record = users.get(user)
        limit = record.limits.get("max-channels") if record is not None else None
        if limit is None:
            return
        local = here.get(user, 0)
        others = max(0, self.totals.get(user, 0) - self.reported.get(user, 0))
        if local + others >= limit:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED,
                f"number of channels opened for user '{user}' has reached the maximum "
                f"allowed user limit of ({limit})",
                0,
                0,
            )

    def report(self, here: Mapping[str, int]) -> ipc.ChannelCounts | None:
        """The counts to send (those that changed since the last), or None.
        `here`: this worker's channels per user (workers/census.py)."""
        counts = dict(here)
        changed = {u: n for u, n in counts.items() if self.reported.get(u) != n}
        changed.update({u: 0 for u in self.reported if u not in counts})
        if not changed:
            return None
        self.reported = counts
        return ipc.ChannelCounts(changed)

    def on_totals(self, totals: dict[str, int], replace: bool = False) -> None:
        if replace:
            self.totals = {}
        for user, total in totals.items():
            if total:
                self.totals[user] = total
            else:
                self.totals.pop(user, None)

    def resync(self) -> None:
        """A new scheduler knows no counts: the next report sends them all
        (and its answer to the HELLO replaces the totals)."""
        self.reported = {}
