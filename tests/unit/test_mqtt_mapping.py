"""broker/mqtt/mapping.py without sockets: a PUBLISH's 5.0 properties
through an AMQP content header (pamqp's bytes) and back, and the CONNACK or
DISCONNECT an inner AMQP connection's close becomes."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import header as amqp_header

from shoal.broker.amqp.routing import TopicTrie
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt.amqp_frames import properties_bytes
from shoal.broker.mqtt.packets import Properties


def through_amqp(properties: Properties) -> tuple[Properties, dict[str, Any]]:
    """The properties as a subscriber gets them, and the AMQP headers between."""
    raw = properties_bytes(M.amqp_properties(1, properties))
    header = amqp_header.ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + (0).to_bytes(8, "big") + raw)
    return M.mqtt_properties(header.properties), dict(header.properties.headers or {})


def test_short_text_fields_stay_amqp_fields() -> None:
    back, headers = through_amqp(
        {"correlation_data": b"req-1", "response_topic": "replies/a", "content_type": "text/x"}
    )
    assert back["correlation_data"] == b"req-1"
    assert back["response_topic"] == "replies/a"
    assert back["content_type"] == "text/x"
    assert M.CORRELATION_HEADER not in headers and M.REPLY_TOPIC_HEADER not in headers


def test_binary_correlation_data_goes_in_a_header_and_comes_back_whole() -> None:
    for correlation in (b"\xff\xfe" + bytes(14), b"a\x00b", b"x" * 256):
        back, headers = through_amqp({"correlation_data": correlation})
        assert back["correlation_data"] == correlation
        assert bytes(headers[M.CORRELATION_HEADER]) == correlation
        assert "user_property" not in back  # (the header is not a user property)


def test_a_long_response_topic_goes_in_a_header() -> None:
    topic = "r/" + "t" * 300
    back, headers = through_amqp({"response_topic": topic})
    assert back["response_topic"] == topic and headers[M.REPLY_TOPIC_HEADER] == topic


def test_what_amqp_cannot_hold_is_dropped_as_rabbitmq_drops_it() -> None:
    back, _headers = through_amqp(
        {"content_type": "c" * 256, "user_property": [("k" * 129, "x"), ("k", "v")]}
    )
    assert "content_type" not in back
    assert back["user_property"] == [("k", "v")]


def test_an_inner_connections_close_as_connack_or_disconnect() -> None:
    assert M.refusal_of(403, "ACCESS_REFUSED - Login was refused using ...") == M.BAD_LOGIN
    assert M.refusal_of(530, "NOT_ALLOWED - access to vhost 'v' refused") == M.NOT_AUTHORIZED
    assert M.refusal_of(541, "INTERNAL_ERROR") == M.UNAVAILABLE
    assert M.disconnect_reason_of(320, "CONNECTION_FORCED - broker forced 'shutdown'") == 0x8B
    assert M.disconnect_reason_of(320, "CONNECTION_FORCED - Closed via management") == 0x98
    assert M.disconnect_reason_of(541, "INTERNAL_ERROR") == 0x80


def test_a_password_sasl_plain_cannot_carry_is_no_users() -> None:
    assert M.sasl_text("pässword".encode()) and M.sasl_text(b"")
    assert not M.sasl_text(b"\xff\xfe") and not M.sasl_text(b"pass\x00word")


@pytest.mark.parametrize(
    ("topic", "key"),
    [
        ("sensors/3/temp", "sensors.3.temp"),  # RabbitMQ's mapping, as AMQP consumers bind
        ("devices/192.168.0.5/status", "devices.192/168/0/5.status"),
        ("spBv1.0/plant/NBIRTH/edge", "spBv1/0.plant.NBIRTH.edge"),  # Sparkplug B
        ("/leading/", ".leading."),
        ("a.b", "a/b"),
    ],
)
def test_a_topic_keeps_its_levels_and_its_dots_both_ways(topic: str, key: str) -> None:
    """A dot in a topic is no AMQP level separator: it maps to `/`, and back."""
    assert M.mqtt_to_amqp(topic) == key
    assert M.amqp_to_mqtt(key) == topic


def test_a_filter_with_a_dot_matches_as_mqtt_does() -> None:
    """devices/+/status matches devices/192.168.0.5/status in MQTT: its binding
    key matches the routing key on a topic exchange."""
    trie = TopicTrie()
    binding = M.mqtt_to_amqp("devices/+/status")
    assert binding == "devices.*.status"
    trie.add(binding, ("q", "sub"))
    assert trie.match(M.mqtt_to_amqp("devices/192.168.0.5/status")) == {("q", "sub")}
    assert trie.match(M.mqtt_to_amqp("devices/a/b/status")) == set()
