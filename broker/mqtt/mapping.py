"""MQTT <-> AMQP 0-9-1, as RabbitMQ's MQTT plugin maps them, without IO:
topic names and filters as routing and binding keys on `amq.topic`, and a
message's properties both ways (workers/mqtt_connection.py uses these)."""

from __future__ import annotations

import time
from typing import Any

from pamqp import commands as C

from shoal.broker.mqtt import packets as P
from shoal.broker.mqtt.packets import Properties

EXCHANGE = "amq.topic"
QOS_HEADER = "x-mqtt-publish-qos"  # the QoS a message was published with (RabbitMQ's)
# Set only when they say something, so a message that needs none pays nothing:
RETAIN_HEADER = "x-mqtt-retain"  # published with RETAIN (5.0's retain as published)
PUBLISHER_HEADER = "x-mqtt-publisher"  # the client id, when it has a no-local subscription
EXPIRES_HEADER = "x-mqtt-expires-at"  # 5.0 message expiry: when (Unix seconds)
FORMAT_HEADER = "x-mqtt-payload-format"  # 5.0 payload format indicator 1 (UTF-8)
# What does not fit AMQP's short strings goes in headers, as RabbitMQ 3.13's
# MQTT plugin puts it: correlation data that is not a short UTF-8 string
# (binary, a UUID's 16 bytes), a response topic of over 255 bytes.
CORRELATION_HEADER = "x-correlation-id"
REPLY_TOPIC_HEADER = "x-reply-to-topic"
_NOT_USER = frozenset({CORRELATION_HEADER, REPLY_TOPIC_HEADER})  # (not user properties)
SHORTSTR = 255
TABLE_KEY = 128  # pamqp's longest field name (it would cut a longer one)

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


# MQTT's level separator `/` is AMQP's `.`, as RabbitMQ maps them; and a `.`
# in a topic, an ordinary character in MQTT, is a `/` in AMQP, an ordinary
# character there. RabbitMQ 3.x leaves the `.` as it is: a topic such as
# `devices/192.168.0.5/status` or Sparkplug B's `spBv1.0/group/...` then has
# AMQP levels where MQTT has none, `devices/+/status` does not match it, and a
# subscriber gets it back as `devices/192/168/0/5/status`. Swapping the two
# keeps every dot-free topic as RabbitMQ maps it and every topic whole both ways
# (NATS maps MQTT's `.` to `//` for the same reason).
_TO_AMQP = str.maketrans({"/": ".", ".": "/", "+": "*"})
_TO_MQTT = str.maketrans({".": "/", "/": ".", "*": "+"})


def mqtt_to_amqp(topic: str) -> str:
    """A topic name or filter as a routing key or binding key."""
    return topic.translate(_TO_AMQP)


def legacy_amqp_key(topic_filter: str) -> str:
    """A filter's binding key as Shoal made it before 2d9b621 (RabbitMQ 3.x's
    mapping: a `.` left as a level separator); a returning session drops it."""
    return topic_filter.replace("/", ".").replace("+", "*")


def amqp_to_mqtt(key: str) -> str:
    """A routing key as the topic name MQTT subscribers get."""
    return key.translate(_TO_MQTT)


def amqp_properties(
    qos: int, properties: Properties, retain: bool = False, publisher: str | None = None
) -> C.Basic.Properties:
    """A PUBLISH's QoS and 5.0 properties as AMQP's: QoS 1 and 2 persistent;
    content type, response topic (reply-to), correlation data (correlation-id),
    message expiry (expiration, ms), user properties (headers). What AMQP's
    fields cannot hold: as RabbitMQ's plugin (a content type or user
    property name too long dropped, the rest in headers)."""
    headers: dict[str, Any] = {QOS_HEADER: qos}
    for key, value in properties.get("user_property", ()):
        if len(key.encode()) <= TABLE_KEY:
            headers[key] = value
    if retain:
        headers[RETAIN_HEADER] = 1
    if publisher is not None:
        headers[PUBLISHER_HEADER] = publisher
    if properties.get("payload_format_indicator"):
        headers[FORMAT_HEADER] = 1
    expiry = properties.get("message_expiry_interval")
    if expiry is not None:
        headers[EXPIRES_HEADER] = expires_at(properties)
    correlation_id = correlation = properties.get("correlation_data")
    if correlation is not None:
        correlation_id = _short_text(correlation)
        if correlation_id is None:
            headers[CORRELATION_HEADER] = bytearray(correlation)  # (a byte array, "x")
    reply_to = properties.get("response_topic")
    if reply_to is not None and len(reply_to.encode()) > SHORTSTR:
        headers[REPLY_TOPIC_HEADER], reply_to = reply_to, None
    content_type = properties.get("content_type")
    return C.Basic.Properties(
        delivery_mode=2 if qos else 1,
        headers=headers,
        content_type=content_type
        if content_type and len(content_type.encode()) <= SHORTSTR
        else None,
        correlation_id=correlation_id,
        reply_to=reply_to,
        expiration=None if expiry is None else str(expiry * 1000),
    )


def _short_text(data: bytes) -> str | None:
    """`data` as an AMQP short string, if it is one: text, 255 bytes at most."""
    return _text(data) if len(data) <= SHORTSTR else None


def _text(data: bytes) -> str | None:
    """`data` decoded, if it is UTF-8 without a NUL."""
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


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
    headers = props.headers or {}
    reply_to = props.reply_to or headers.get(REPLY_TOPIC_HEADER)
    if isinstance(reply_to, str) and reply_to:
        out["response_topic"] = reply_to
    correlation = props.correlation_id or headers.get(CORRELATION_HEADER)
    if isinstance(correlation, str):
        correlation = correlation.encode()
    if isinstance(correlation, (bytes, bytearray)) and correlation:
        out["correlation_data"] = bytes(correlation)
    if headers.get(FORMAT_HEADER):
        out["payload_format_indicator"] = 1
    expiry_second = headers.get(EXPIRES_HEADER)
    if isinstance(expiry_second, int):  # what is left of it (MQTT-3.3.2-6)
        out["message_expiry_interval"] = max(1, expiry_left(expiry_second))
    users = [
        (k, str(v)) for k, v in headers.items() if k not in _NOT_USER and not k.startswith("x-mqtt")
    ]
    if users:
        out["user_property"] = users
    return out


# CONNACK refusals: (3.1.1's return code, 5.0's reason code)
BAD_PROTOCOL = (1, 0x84)
BAD_CLIENT_ID = (2, 0x85)
UNAVAILABLE = (3, 0x88)
BAD_LOGIN = (4, 0x86)
NOT_AUTHORIZED = (5, 0x87)
BAD_AUTH_METHOD = (5, 0x8C)  # 5.0 enhanced authentication: none is offered
BAD_WILL_TOPIC = (3, 0x90)  # (3.1.1 has no code for it: server unavailable)


# "mqtt-subscription-" + id + "qos1" + "-<connection id>" within a queue name's 255 bytes
MAX_CLIENT_ID = 216


def expires_at(properties: Properties) -> int:
    """The wall clock's second a 5.0 message expires at (0: it has no expiry)."""
    expiry = properties.get("message_expiry_interval")
    return 0 if expiry is None else int(time.time()) + expiry


def expiry_left(expires_at: int) -> int:
    """What is left of a message's expiry, in whole seconds (MQTT-3.3.2-6);
    0 or less: expired."""
    return expires_at - int(time.time())


def login_of(
    packet: P.Connect, default_vhost: str, default_user: str, default_pass: str
) -> tuple[str, str, bytes, bool]:
    """(vhost, user, password, anonymous) of a CONNECT: RabbitMQ's
    `vhost:user` user name picks the vhost; no user name, or an empty one
    with no or an empty password (as mosquitto takes it), logs in as the
    default user."""
    vhost, user = default_vhost, packet.username
    if user is not None and ":" in user:
        vhost, user = user.split(":", 1)
    if user is None or not (user or packet.password):
        return vhost, default_user, default_pass.encode(), True
    return vhost, user, packet.password or b"", False


def connect_refusal(packet: P.Connect, max_keep_alive: int) -> tuple[int, int] | None:
    """Why a CONNECT of a known protocol level is refused before its login,
    None if it is not. `max_keep_alive` is --mqtt-max-keep-alive."""
    if "authentication_method" in packet.properties:
        return BAD_AUTH_METHOD  # 5.0 enhanced authentication (4.12)
    if not packet.client_id and not packet.clean and packet.level == P.MQTT_311:
        return BAD_CLIENT_ID  # MQTT-3.1.3-8
    if len(packet.client_id.encode()) > MAX_CLIENT_ID:
        return BAD_CLIENT_ID
    if packet.level != P.MQTT_5 and keep_alive_over(packet.keep_alive, max_keep_alive):
        return BAD_CLIENT_ID  # 3.1.1 cannot be told another keep alive (mosquitto's answer)
    if packet.will is not None and len(mqtt_to_amqp(packet.will.topic).encode()) > 255:
        return BAD_WILL_TOPIC  # (an AMQP routing key: 255 bytes at most)
    return None


def keep_alive_over(asked: int, maximum: int) -> bool:
    """Whether a CONNECT's keep alive is past --mqtt-max-keep-alive (0: no
    maximum). None asked (0: never checked) is past any maximum, as with
    mosquitto's max_keepalive: the operator wants every dead client found."""
    return maximum > 0 and (asked == 0 or asked > maximum)


def sasl_text(data: bytes) -> bool:
    """Whether `data` can be a field of a SASL PLAIN response (UTF-8, no
    NUL): an MQTT password (binary data) that is not matches no user's, and
    the inner connection's login could not carry it."""
    return _text(data) is not None


def refusal_of(code: int, text: str) -> tuple[int, int]:
    """The CONNACK for a client whose inner AMQP connection was closed
    before it opened (its connection.close's code and text)."""
    if code == 403 and "Login was refused" in text:
        return BAD_LOGIN
    if code in (403, 530):  # (no access to the vhost)
        return NOT_AUTHORIZED
    return UNAVAILABLE


def disconnect_reason_of(code: int, text: str) -> int:
    """5.0's DISCONNECT reason for a connected client whose inner AMQP
    connection the broker closed: the broker stopping 0x8B (server shutting
    down), an operator's close (shoal ctl close_connection, a user or vhost
    deleted) 0x98 (administrative action), anything else 0x80."""
    if code == 320:
        return 0x8B if "'shutdown'" in text else 0x98
    return 0x80
