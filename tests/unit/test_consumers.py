"""Qpid's QueueConsumerManager as a pure state machine."""

from __future__ import annotations

import pytest

from shoal.broker.scheduler.consumers import QueueConsumerManager, State, new_tally


def test_notifies_one_at_a_time_round_robin() -> None:
    qcm = QueueConsumerManager()
    for c in (1, 2, 3):
        qcm.add((0, c))
    assert qcm.notify_next() == (0, 1)
    assert qcm.notify_next() is None, "only one acquiring consumer is notified at a time"
    assert qcm.done((0, 1))
    assert [qcm.notify_next(), qcm.done((0, 2)), qcm.notify_next()] == [(0, 2), True, (0, 3)]
    qcm.done((0, 3))
    assert qcm.notify_next() == (0, 1), "a consumer that ran dry goes to the back"


def test_more_may_be_notified_but_never_of_a_lower_priority() -> None:
    """Qpid's Notified list holds several consumers when each event notifies
    one more (notify_more: the scheduler's backlog rule); a lower priority
    never joins a higher one, a higher one joins lower ones."""
    qcm = QueueConsumerManager()
    qcm.add((0, 1), priority=5)
    qcm.add((1, 2), priority=5)
    qcm.add((0, 3), priority=0)
    assert qcm.notify_more() == (0, 1)
    assert qcm.notify_next() is None, "notify_next adds nobody to a busy queue"
    assert qcm.notify_more() == (1, 2)
    assert list(qcm.notified) == [(0, 1), (1, 2)]
    assert qcm.notify_more() is None, "priority 0 waits while the 5s have work"
    assert qcm.notify_more(skip=lambda k: True) is None
    assert qcm.done((1, 2)) and not qcm.done((1, 2)), "a second done is stale"
    assert qcm.set_interest((0, 1), False) and not qcm.notified
    assert qcm.notify_more() == (1, 2)
    qcm.set_interest((1, 2), False)
    assert qcm.notify_more() == (0, 3), "the lower priority when the higher cannot"
    qcm.set_interest((0, 1), True)
    assert qcm.notify_more() == (0, 1), "a higher priority joins a lower one"
    assert qcm.remove((0, 3)) and list(qcm.notified) == [(0, 1)]


def test_priorities_win_and_uninterested_are_skipped() -> None:
    qcm = QueueConsumerManager()
    qcm.add((0, 1), priority=0)
    qcm.add((0, 2), priority=10)
    qcm.add((0, 3), priority=10, interested=False)
    assert qcm.notify_next() == (0, 2)
    assert qcm.set_interest((0, 2), False), "the notified consumer lost interest"
    assert qcm.state((0, 2)) is State.NOT_INTERESTED
    assert qcm.notify_next() == (0, 1), "the lower priority gets work when the higher cannot"
    qcm.done((0, 1))
    qcm.set_interest((0, 3), True)
    assert qcm.notify_next() == (0, 3)


def test_stale_done_is_ignored_and_removal_clears_notified() -> None:
    qcm = QueueConsumerManager()
    qcm.add((0, 1))
    qcm.add((1, 1))
    assert qcm.notify_next() == (0, 1)
    assert not qcm.done((1, 1)), "only the notified consumer may report done"
    assert qcm.remove((0, 1))
    assert not qcm.notified
    assert qcm.notify_next() == (1, 1)
    assert not qcm.remove((5, 5))


def test_non_acquiring_consumers_are_kept_apart() -> None:
    qcm = QueueConsumerManager()
    qcm.add((0, 1), acquiring=False)
    qcm.add((0, 2))
    assert qcm.non_acquiring() == [(0, 1)]
    assert qcm.notify_next() == (0, 2)
    qcm.set_interest((0, 1), False)
    assert qcm.counts()[State.NOT_INTERESTED] == 1


def test_adding_twice_is_an_error() -> None:
    qcm = QueueConsumerManager()
    qcm.add((0, 1))
    with pytest.raises(KeyError):
        qcm.add((0, 1))


def test_skipped_consumers_keep_their_place() -> None:
    """The scheduler skips consumers that already looked at the queue's
    current state (a selector that wants none of what is there)."""
    qcm = QueueConsumerManager()
    for c in (1, 2, 3):
        qcm.add((0, c))
    assert qcm.notify_next(skip=lambda k: k in {(0, 1), (0, 2)}) == (0, 3)
    assert qcm.notify_next() is None
    qcm.done((0, 3))
    assert list(qcm.candidates()) == [(0, 1), (0, 2), (0, 3)]
    assert qcm.notify_next(skip=lambda k: True) is None
    assert not qcm.notified and qcm.has_interested()


def test_single_active_consumer_is_the_first_registered() -> None:
    qcm = QueueConsumerManager(single_active=True)
    qcm.add((0, 9), acquiring=False)  # a browser is never the active consumer
    qcm.add((1, 1))
    qcm.add((0, 2), priority=10)
    assert qcm.active() == (1, 1)
    qcm.set_interest((1, 1), False)
    assert not qcm.has_interested(), "the others wait even while the active one has no credit"
    assert qcm.notify_next() is None
    qcm.remove((1, 1))
    assert qcm.active() == (0, 2)
    assert qcm.notify_next() == (0, 2)


def test_takers_counts_the_consumers_that_take_turns() -> None:
    """Q_TAKERS (a notified consumer's turn is shared with them): acquiring
    consumers; one for a single-active-consumer queue; browsers never."""
    qcm = QueueConsumerManager()
    assert qcm.takers() == 0
    qcm.add((0, 1))
    qcm.add((0, 2), acquiring=False)
    qcm.add((1, 3), interested=False)
    assert qcm.takers() == 2, "the browser takes no turns"
    sac = QueueConsumerManager(single_active=True)
    for cid in range(3):
        sac.add((0, cid))
    assert sac.takers() == 1, "the standbys take no turns"


def test_turns_are_interchangeable_among_equals_only() -> None:
    """Q_EAGER_ABOVE (a consumer may pull before its turn when the backlog
    is deep) only where any acquiring consumer may have any turn: not across
    consumer priorities, and never on a single-active-consumer queue."""
    qcm = QueueConsumerManager()
    assert qcm.turns_interchangeable()
    qcm.add((0, 1))
    qcm.add((1, 2))
    qcm.add((0, 3), priority=5, acquiring=False)  # a browser's priority decides nothing
    assert qcm.turns_interchangeable()
    qcm.add((1, 4), priority=5)
    assert not qcm.turns_interchangeable(), "the higher priority is served first"
    qcm.remove((1, 4))
    assert qcm.turns_interchangeable()
    sac = QueueConsumerManager(single_active=True)
    sac.add((0, 1))
    sac.add((1, 2))
    assert not sac.turns_interchangeable(), "only the active one may take"


def test_a_shared_tally_follows_every_move_and_a_queue_that_goes() -> None:
    """The scheduler's gauges: two queues' managers keep one tally as their
    consumers move; it always equals a count of both, and a queue cleared
    (deleted with its consumers) takes its own out."""
    tally = new_tally()
    a, b = QueueConsumerManager(tally=tally), QueueConsumerManager(tally=tally)

    def both() -> dict[State, int]:
        return {s: a.counts()[s] + b.counts()[s] for s in State}

    a.add((0, 1))
    a.add((0, 2), priority=5)
    a.add((1, 3), acquiring=False)
    b.add((1, 4), interested=False)
    assert tally == both()
    key = a.notify_next()
    assert key == (0, 2) and tally == both() and tally[State.NOTIFIED] == 1
    a.set_interest((0, 1), False)
    b.set_interest((1, 4), True)
    a.set_interest((1, 3), False)
    assert tally == both()
    a.done((0, 2))
    assert tally == both() and tally[State.NOTIFIED] == 0
    assert b.notify_next() == (1, 4)
    b.remove((1, 4))
    assert tally == both()
    a.clear()
    assert len(a) == 0 and tally == both() == new_tally()
