"""MQTT topic names and filters (MQTT 3.1.1 4.7, 5.0 4.7), without IO.

`matches` says whether a topic filter (with `+` and `#`) matches a topic
name; `valid_filter` checks a filter's wildcards. A topic starting with `$`
is not matched by a filter starting with a wildcard (MQTT-4.7.2-1)."""

from __future__ import annotations

from shoal.broker.mqtt.packets import ProtocolError, Publish, TopicAliasInvalid


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


SHARE_PREFIX = "$share/"


def shared(topic_filter: str) -> tuple[str, str] | None:
    """A shared subscription's (group, filter) (5.0 4.8.2: `$share/group/filter`),
    None for any other filter. Raises ValueError for a malformed one: an empty
    or wildcard group, or no filter (MQTT 5.0 4.8.2)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, _slash, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or "+" in group or "#" in group or not _slash or not valid_filter(rest):
        raise ValueError(f"malformed shared subscription {topic_filter!r}")
    return group, rest


class TopicAliases:
    """5.0's topic aliases a client sets for its PUBLISHes (3.3.2.3.4), at
    most `maximum` (CONNACK's topic alias maximum)."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.topics: dict[int, str] = {}

    def topic(self, packet: Publish) -> str:
        """The PUBLISH's topic: its own (setting its alias, if it has one),
        or its alias's."""
        alias = packet.properties.pop("topic_alias", None)
        if alias is None:
            if not packet.topic:
                raise ProtocolError("a PUBLISH with no topic")  # MQTT-4.7.3-1
            return packet.topic
        if not 0 < alias <= self.maximum:
            raise TopicAliasInvalid(f"topic alias {alias} out of range")
        if packet.topic:
            self.topics[alias] = packet.topic
            return packet.topic
        topic = self.topics.get(alias)
        if topic is None:
            raise ProtocolError(f"topic alias {alias} was never set")
        return topic
