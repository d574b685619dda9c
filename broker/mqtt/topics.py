"""MQTT topic names and filters (MQTT 3.1.1 4.7, 5.0 4.7), without IO.

`matches` says whether a topic filter (with `+` and `#`) matches a topic
name; `valid_filter` checks a filter's wildcards. A topic starting with `$`
is not matched by a filter starting with a wildcard (MQTT-4.7.2-1)."""

from __future__ import annotations


def valid_filter(topic_filter: str) -> bool:
    """`#` only as the whole last level, `+` only as a whole level
    (MQTT-4.7.1-2, -3); not empty (MQTT-4.7.3-1)."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str, topic: str) -> bool:
    """Whether `topic_filter` matches topic name `topic`."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True  # (also the parent level: "a/#" matches "a")
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == len(topic_levels)
