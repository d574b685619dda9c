"""The management API's `<name>_details` (broker/management/rates.py): the
rate over the last interval, and with a range the samples in it, newest
first, their average and average rate, as RabbitMQ 3.10 answers the web
UI's ?msg_rates_age=60 (its charts read `samples`)."""

from __future__ import annotations

from collections import deque
from typing import Any

from shoal.broker.management.rates import HISTORY, QUEUE_HISTORY, Rates, requested_age


class FakeSample:
    def __init__(self, at: float, value: int, queue: int | None = None) -> None:
        self.at = at
        self.wall_ms = int(at * 1000)
        self.overview = {"publish": value, "messages": value}
        values = {"messages": queue, "messages_ready": queue, "messages_unacknowledged": 0}
        values.update(publish=queue, ack=0)
        self.queues = {} if queue is None else {(0, b"q"): values}
        self.vhosts: dict[int, Any] = {}


def rates_with(samples: list[FakeSample]) -> Rates:
    rates = Rates.__new__(Rates)
    rates.history = deque(samples, maxlen=HISTORY)  # type: ignore[arg-type]
    return rates


def test_a_counters_rate_is_the_last_interval_and_never_negative() -> None:
    rates = rates_with([FakeSample(0, 0), FakeSample(5, 100), FakeSample(10, 350)])
    assert rates.details(lambda s: s.overview["publish"], None) == {"rate": 50.0}
    dropped = rates_with([FakeSample(0, 100), FakeSample(5, 40)])  # counters reset
    assert dropped.details(lambda s: s.overview["publish"], None) == {"rate": 0.0}
    draining = rates_with([FakeSample(0, 100), FakeSample(5, 40)])
    assert draining.details(lambda s: s.overview["messages"], None, gauge=True)["rate"] == -12.0


def test_a_range_gives_the_samples_in_it_newest_first() -> None:
    rates = rates_with([FakeSample(t, t * 10) for t in range(0, 100, 5)])  # 0..95 s
    details = rates.details(lambda s: s.overview["publish"], 60)
    assert [s["timestamp"] for s in details["samples"]] == [t * 1000 for t in range(95, 30, -5)]
    assert details["samples"][0]["sample"] == 950
    assert details["avg_rate"] == 10.0  # (950 - 350) / 60 s
    assert details["avg"] == sum(range(350, 951, 50)) / 13


def test_no_samples_yet_is_an_empty_chart_not_an_error() -> None:
    details = rates_with([]).details(lambda s: s.overview["publish"], 60)
    assert details == {"rate": 0.0, "samples": [], "avg": 0.0, "avg_rate": 0.0}


def test_a_queue_keeps_a_minute_of_history() -> None:
    samples = [FakeSample(t, 0, queue=t) for t in range(0, 5 * 40, 5)]
    rates = rates_with(samples)
    details = rates.queue({"/": 0}, "/", "q", 600)["messages_details"]
    assert len(details["samples"]) == QUEUE_HISTORY


def test_the_range_asked_is_the_longest_and_bounded_by_what_is_kept() -> None:
    assert requested_age({"lengths_age": "60", "msg_rates_age": "600", "x": "1"}) == 600
    assert requested_age({"msg_rates_age": "86400"}) == HISTORY * 5
    assert requested_age({"columns": "name"}) is None
