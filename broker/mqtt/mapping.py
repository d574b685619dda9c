"""MQTT <-> AMQP 0-9-1, as RabbitMQ's MQTT plugin maps them, without IO:
topic names and filters as routing and binding keys on `amq.topic`, and a
message's properties both ways (workers/mqtt_connection.py uses these)."""

from __future__ import annotations

from typing import Any

from pamqp import commands as C

from shoal.broker.mqtt.packets import Properties

EXCHANGE = "amq.topic"
QOS_HEADER = "x-mqtt-publish-qos"  # the QoS a message was published with (RabbitMQ's)

# The 5.0 properties a message carries on to its receivers (3.3.2.3).
FORWARDED_PROPERTIES = frozenset(
    {
        "payload_format_indicator",
        "message_expiry_interval",
        "content_type",
        "response_topic",
        "correlation_data",
        "user_property",
    }
)


def mqtt_to_amqp(topic: str) -> str:
    """A topic name or filter as a routing key or binding key."""
    return topic.replace("/", ".").replace("+", "*")


def amqp_to_mqtt(key: str) -> str:
    return key.replace("*", "+").replace(".", "/")


def amqp_properties(qos: int, properties: Properties) -> C.Basic.Properties:
    """A PUBLISH's QoS and 5.0 properties as AMQP's: QoS 1 and 2 persistent;
    content type, response topic (reply-to), correlation data (correlation-id),
    message expiry (expiration, ms), user properties (headers)."""
    headers: dict[str, Any] = {QOS_HEADER: qos}
    for key, value in properties.get("user_property", ()):
        headers[key] = value
    expiry = properties.get("message_expiry_interval")
    correlation = properties.get("correlation_data")
    return C.Basic.Properties(
        delivery_mode=2 if qos else 1,
        headers=headers,
        content_type=properties.get("content_type"),
        correlation_id=None if correlation is None else correlation.decode(errors="replace"),
        reply_to=properties.get("response_topic"),
        expiration=None if expiry is None else str(expiry * 1000),
    )


def published_qos(props: C.Basic.Properties) -> int:
    """The QoS a message was published with: its MQTT header, else 1 for a
    persistent AMQP message and 0 for a transient one."""
    qos = (props.headers or {}).get(QOS_HEADER)
    if isinstance(qos, int) and 0 <= qos <= 2:
        return qos
    return 1 if props.delivery_mode == 2 else 0


def mqtt_properties(props: C.Basic.Properties) -> Properties:
    """An AMQP message's properties as a 5.0 PUBLISH carries them."""
    out: Properties = {}
    if props.content_type:
        out["content_type"] = props.content_type
    if props.reply_to:
        out["response_topic"] = props.reply_to
    if props.correlation_id:
        out["correlation_data"] = props.correlation_id.encode()
    headers = props.headers or {}
    users = [(k, str(v)) for k, v in headers.items() if not k.startswith("x-mqtt")]
    if users:
        out["user_property"] = users
    return out
