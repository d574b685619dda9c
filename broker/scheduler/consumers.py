"""Qpid's QueueConsumerManager: which consumer of a queue to notify next.

A pure state machine (no IO, no shared memory) kept by the scheduler per
queue. Consumers move between lists as their state changes:

    INTERESTED      ready for work; one ordered set per consumer priority
    NOTIFIED        told there is work; pulls until the queue gives it nothing
    NOT_INTERESTED  out of credit, or its connection is backed up
    NON_ACQUIRING   browsers: always notified, never take entries

Each event (a consumer becoming interested, new work, a turn's end) notifies
one consumer, as Qpid's QCM does ("only a single interested Consumer, to avoid
spurious wake-ups"); like Qpid's Notified list, this one may hold several
consumers: `notify_next` makes the first, `notify_more` adds one of the same
(or a higher) priority, which the scheduler does while a backlog has work for
several (broker/scheduler/notify.py). A notified consumer that runs dry, or
has taken its share of what was ready (workers/pull.py, turn_quota), goes
to the back of its priority's Interested set, which gives the round-robin
fairness Qpid calls "asymptotic".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum

ConsumerKey = tuple[int, int]  # (IO worker index, consumer id on that worker)


class State(Enum):
    INTERESTED = "interested"
    NOTIFIED = "notified"
    NOT_INTERESTED = "not_interested"
    NON_ACQUIRING = "non_acquiring"


# How many consumers are in each state, over every queue that shares it (the
# scheduler's gauges): kept as they move, not counted by a walk of every
# consumer once a second (10,000 idle MQTT subscribers: most of an idle
# scheduler's CPU).
Tally = dict[State, int]


def new_tally() -> Tally:
    return dict.fromkeys(State, 0)


class _Node:
    __slots__ = ("acquiring", "key", "priority", "since", "state")

    def __init__(
        self, key: ConsumerKey, priority: int, acquiring: bool, state: State, since: int
    ) -> None:
        self.key = key
        self.priority = priority
        self.acquiring = acquiring
        self.state = state
        self.since = since


class QueueConsumerManager:
    __slots__ = (
        "_interested",
        "_nodes",
        "_priorities",
        "held",
        "notified",
        "single_active",
        "tally",
    )

    def __init__(self, single_active: bool = False, tally: Tally | None = None) -> None:
        # x-single-active-consumer: only the acquiring consumer registered
        # first may be notified; the next one takes over when it goes.
        self.single_active = single_active
        # A restarted scheduler holds a single-active queue until every worker
        # has told it its consumers: it must know which one came first.
        self.held = False
        self._nodes: dict[ConsumerKey, _Node] = {}
        # Interested, by priority: dicts as ordered sets, not deques. A
        # deque is 760 bytes with one key in it (every queue with a
        # consumer, in the scheduler: a fleet's subscribers' queues), a
        # one-key dict 224; and a removal from the middle (a consumer
        # cancelled, out of credit) takes one step, not a walk.
        self._interested: dict[int, dict[ConsumerKey, None]] = {}
        self._priorities: list[int] = []  # descending
        # The Notified list, in the order they were notified (a dict as an
        # ordered set).
        self.notified: dict[ConsumerKey, None] = {}
        self.tally = new_tally() if tally is None else tally

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: ConsumerKey) -> bool:
        return key in self._nodes

    def __iter__(self) -> Iterator[ConsumerKey]:
        return iter(self._nodes)

    def takers(self) -> int:
        """Consumers that take turns: the acquiring ones, or just the active
        one of a single-active-consumer queue (browsers never do)."""
        acquiring = sum(1 for node in self._nodes.values() if node.acquiring)
        return min(acquiring, 1) if self.single_active else acquiring

    def turns_interchangeable(self) -> bool:
        """Whether any acquiring consumer may take any turn: all of them
        have one priority and none is the single active one. Then, with a
        backlog for all of them, a consumer may pull before its turn comes
        (notify.py _publish_consumers)."""
        if self.single_active:
            return False
        priorities = {node.priority for node in self._nodes.values() if node.acquiring}
        return len(priorities) <= 1

    def is_browser(self, key: ConsumerKey) -> bool:
        node = self._nodes.get(key)
        return node is not None and not node.acquiring

    def state(self, key: ConsumerKey) -> State:
        return self._nodes[key].state

    def counts(self) -> dict[State, int]:
        out = dict.fromkeys(State, 0)
        for node in self._nodes.values():
            out[node.state] += 1
        return out

    def add(
        self,
        key: ConsumerKey,
        priority: int = 0,
        acquiring: bool = True,
        interested: bool = True,
        since: int = 0,
    ) -> None:
        """Register a consumer; `since` orders registrations across scheduler
        restarts (for the single active one), else the order of add() does."""
        if key in self._nodes:
            raise KeyError(f"consumer {key!r} already registered")
        if not acquiring:
            state = State.NON_ACQUIRING if interested else State.NOT_INTERESTED
        else:
            state = State.INTERESTED if interested else State.NOT_INTERESTED
        node = _Node(key, priority, acquiring, state, since)
        self._nodes[key] = node
        self.tally[state] += 1
        if state is State.INTERESTED:
            self._push(node)

    def remove(self, key: ConsumerKey) -> bool:
        """Forget a consumer; True if it was the notified one."""
        node = self._nodes.pop(key, None)
        if node is None:
            return False
        self.tally[node.state] -= 1
        if node.state is State.INTERESTED:
            del self._interested[node.priority][key]
        return self.notified.pop(key, False) is None

    def set_interest(self, key: ConsumerKey, interested: bool) -> bool:
        """Returns True if this took the notified consumer out of NOTIFIED."""
        node = self._nodes.get(key)
        if node is None:
            return False
        was_notified = key in self.notified
        if not node.acquiring:
            self._set(node, State.NON_ACQUIRING if interested else State.NOT_INTERESTED)
            return False
        if interested:
            if node.state is State.NOT_INTERESTED:
                self._set(node, State.INTERESTED)
                self._push(node)
            return False
        if node.state is State.INTERESTED:
            del self._interested[node.priority][key]
        self._set(node, State.NOT_INTERESTED)
        if was_notified:
            del self.notified[key]
        return was_notified

    def since(self, key: ConsumerKey) -> int:
        return self._nodes[key].since

    def active(self) -> ConsumerKey | None:
        """The acquiring consumer registered first (the single active one):
        the least `since`, then the first added."""
        best: _Node | None = None
        for node in self._nodes.values():
            if node.acquiring and (best is None or node.since < best.since):
                best = node
        return None if best is None else best.key

    def candidates(self) -> Iterator[ConsumerKey]:
        """Interested acquiring consumers, in the order they are notified:
        highest priority first, round-robin within a priority."""
        if self.single_active:
            if self.held:
                return
            key = self.active()
            if key is not None and self._nodes[key].state is State.INTERESTED:
                yield key
            return
        for priority in self._priorities:
            yield from self._interested[priority]

    def has_interested(self) -> bool:
        return next(self.candidates(), None) is not None

    def notify_next(self, skip: Callable[[ConsumerKey], bool] | None = None) -> ConsumerKey | None:
        """Move the first candidate that `skip` does not exclude to NOTIFIED
        and return it; None if one is already notified or none qualifies."""
        if self.notified:
            return None
        return self._notify_first(skip, None)

    def notify_more(self, skip: Callable[[ConsumerKey], bool] | None = None) -> ConsumerKey | None:
        """notify_next(), or, with consumers notified already, one more of
        their priority or a higher one: a lower priority gets work only
        while the higher ones cannot take it (RabbitMQ's consumer
        priorities), so it never joins them. None if none qualifies."""
        if not self.notified:
            return self._notify_first(skip, None)
        nodes = self._nodes
        return self._notify_first(skip, max(nodes[key].priority for key in self.notified))

    def _notify_first(
        self, skip: Callable[[ConsumerKey], bool] | None, least: int | None
    ) -> ConsumerKey | None:
        for key in self.candidates():
            node = self._nodes[key]
            if least is not None and node.priority < least:
                return None  # candidates come highest priority first
            if skip is None or not skip(key):
                del self._interested[node.priority][key]
                self._set(node, State.NOTIFIED)
                self.notified[key] = None
                return key
        return None

    def done(self, key: ConsumerKey) -> bool:
        """A notified consumer ran dry (or yielded): back of Interested.
        False if `key` was not notified (a stale report)."""
        if self.notified.pop(key, False) is not None:
            return False
        node = self._nodes[key]
        self._set(node, State.INTERESTED)
        self._push(node)
        return True

    def clear(self) -> None:
        """The queue is gone: its consumers go with it (and from the tally)."""
        for node in self._nodes.values():
            self.tally[node.state] -= 1
        self._nodes.clear()
        self._interested.clear()
        self._priorities.clear()
        self.notified.clear()

    def _set(self, node: _Node, state: State) -> None:
        tally = self.tally
        tally[node.state] -= 1
        tally[state] += 1
        node.state = state

    def non_acquiring(self) -> list[ConsumerKey]:
        return [k for k, n in self._nodes.items() if n.state is State.NON_ACQUIRING]

    def _push(self, node: _Node) -> None:
        pending = self._interested.get(node.priority)
        if pending is None:
            pending = self._interested[node.priority] = {}
            self._priorities.append(node.priority)
            self._priorities.sort(reverse=True)
        pending[node.key] = None
