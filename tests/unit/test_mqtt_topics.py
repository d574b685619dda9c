"""MQTT topic filters (broker/mqtt/topics.py): the spec's own examples."""

from __future__ import annotations

import pytest

from shoal.broker.mqtt.topics import matches, valid_filter


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("sport/tennis/player1/#", "sport/tennis/player1", True),  # 4.7.1.2
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("#", "anything/at/all", True),
        ("sport/tennis/+", "sport/tennis/player1", True),  # 4.7.1.3
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/broker", False),  # 4.7.2: no wildcard at the first level for $
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/broker", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/b", "a/b", True),
        ("a/b", "a/B", False),  # case-sensitive
    ],
)
def test_filters_match_as_the_spec_says(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    ("topic_filter", "ok"),
    [
        ("a/#", True),
        ("#", True),
        ("+/x/+", True),
        ("a#", False),
        ("a/#/b", False),
        ("a+", False),
        ("", False),
    ],
)
def test_wildcards_only_as_whole_levels(topic_filter: str, ok: bool) -> None:
    assert valid_filter(topic_filter) is ok
