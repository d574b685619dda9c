"""MQTT 3.1.1 (protocol level 4) and 5.0 (level 5) control packets, sans IO.

A `PacketReader` splits a connection's bytes into packets (the fixed header's
type and flags, the remaining length as a variable byte integer) and `decode`
turns one into a typed packet; the `encode_*` functions build what a server
sends. Nothing here touches a socket, so every rule is tested on bytes
(tests/unit/test_mqtt_packets.py).

What is wrong with a packet raises `MalformedPacket` (5.0 reason 0x81: it
cannot be parsed) or `ProtocolError` (0x82: it parses, and breaks a rule),
each with the reason code a 5.0 DISCONNECT carries; a 3.1.1 server closes the
connection instead (MQTT-4.8.0-1). The spec's normative statements are named
where a check comes from (OASIS MQTT 3.1.1, MQTT 5.0).

Properties (5.0, section 2.2.2) decode into a `Properties` dict from the
property's name to its value; `user_property` and `subscription_identifier`
(which may repeat) hold lists.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

# Packet types (fixed header, bits 7-4).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)

MQTT_311 = 4
MQTT_5 = 5

# The largest remaining length a variable byte integer can say (2.2.3 / 1.5.5).
MAX_REMAINING = 268_435_455

# 5.0 reason codes used by the codec's errors (2.4).
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
PACKET_TOO_LARGE = 0x95

# Fixed-header flags each type must carry (2.2.2 / 2.1.3); PUBLISH's are its own.
_REQUIRED_FLAGS = {PUBREL: 0b0010, SUBSCRIBE: 0b0010, UNSUBSCRIBE: 0b0010}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class PacketError(Exception):
    """A packet the server cannot accept; `reason` is the 5.0 reason code of
    the DISCONNECT it leads to."""

    reason = PROTOCOL_ERROR

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class MalformedPacket(PacketError):
    reason = MALFORMED


class ProtocolError(PacketError):
    reason = PROTOCOL_ERROR


class PacketTooLarge(PacketError):
    reason = PACKET_TOO_LARGE


class TopicAliasInvalid(PacketError):
    reason = 0x94  # 5.0: a topic alias of 0 or over the maximum (MQTT-3.3.2-8, -9)


# ---------------------------------------------------------------- properties
# identifier -> (name, type); types: byte, u16, u32, varint, string, binary, pair
_PROPERTY_TYPES: dict[int, tuple[str, str]] = {
    0x01: ("payload_format_indicator", "byte"),
    0x02: ("message_expiry_interval", "u32"),
    0x03: ("content_type", "string"),
    0x08: ("response_topic", "string"),
    0x09: ("correlation_data", "binary"),
    0x0B: ("subscription_identifier", "varint"),
    0x11: ("session_expiry_interval", "u32"),
    0x12: ("assigned_client_identifier", "string"),
    0x13: ("server_keep_alive", "u16"),
    0x15: ("authentication_method", "string"),
    0x16: ("authentication_data", "binary"),
    0x17: ("request_problem_information", "byte"),
    0x18: ("will_delay_interval", "u32"),
    0x19: ("request_response_information", "byte"),
    0x1A: ("response_information", "string"),
    0x1C: ("server_reference", "string"),
    0x1F: ("reason_string", "string"),
    0x21: ("receive_maximum", "u16"),
    0x22: ("topic_alias_maximum", "u16"),
    0x23: ("topic_alias", "u16"),
    0x24: ("maximum_qos", "byte"),
    0x25: ("retain_available", "byte"),
    0x26: ("user_property", "pair"),
    0x27: ("maximum_packet_size", "u32"),
    0x28: ("wildcard_subscription_available", "byte"),
    0x29: ("subscription_identifier_available", "byte"),
    0x2A: ("shared_subscription_available", "byte"),
}
_PROPERTY_IDS = {name: (ident, kind) for ident, (name, kind) in _PROPERTY_TYPES.items()}

# Which properties a packet may carry (the 5.0 property table, 2.2.2.2);
# "will" is CONNECT's will properties.
_ALLOWED: dict[int | str, frozenset[int]] = {
    CONNECT: frozenset({0x11, 0x15, 0x16, 0x17, 0x19, 0x21, 0x22, 0x26, 0x27}),
    "will": frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x18, 0x26}),
    CONNACK: frozenset(
        {0x11, 0x12, 0x13, 0x15, 0x16, 0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x24, 0x25, 0x26}
        | {0x27, 0x28, 0x29, 0x2A}
    ),
    PUBLISH: frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x23, 0x26}),
    PUBACK: frozenset({0x1F, 0x26}),
    PUBREC: frozenset({0x1F, 0x26}),
    PUBREL: frozenset({0x1F, 0x26}),
    PUBCOMP: frozenset({0x1F, 0x26}),
    SUBSCRIBE: frozenset({0x0B, 0x26}),
    SUBACK: frozenset({0x1F, 0x26}),
    UNSUBSCRIBE: frozenset({0x26}),
    UNSUBACK: frozenset({0x1F, 0x26}),
    DISCONNECT: frozenset({0x11, 0x1C, 0x1F, 0x26}),
    AUTH: frozenset({0x15, 0x16, 0x1F, 0x26}),
}
_REPEATABLE = {0x26, 0x0B}  # user properties; subscription ids (in a PUBLISH)

Properties = dict[str, Any]


class _Cursor:
    """Reads a packet's body front to back; running out is malformed."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> memoryview:
        if n > self.left():
            raise MalformedPacket("packet shorter than its fields")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise MalformedPacket("packet shorter than its fields")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def u16(self) -> int:
        return int(_U16.unpack(self.take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise MalformedPacket("variable byte integer longer than 4 bytes")

    def binary(self) -> bytes:
        return bytes(self.take(self.u16()))

    def string(self) -> str:
        raw = self.take(self.u16())
        try:
            text = str(raw, "utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("a string is not valid UTF-8") from None  # MQTT-1.5.3-1
        if "\x00" in text:
            raise MalformedPacket("a string holds U+0000")  # MQTT-1.5.3-2
        return text

    def properties(self, allowed: frozenset[int]) -> Properties:
        length = self.varint()
        end = self.pos + length
        if end > len(self.data):
            raise MalformedPacket("properties longer than the packet")
        props: Properties = {}
        while self.pos < end:
            ident = self.varint()
            known = _PROPERTY_TYPES.get(ident)
            if known is None or ident not in allowed:
                raise ProtocolError(f"property 0x{ident:02X} is not allowed here")
            name, kind = known
            value = self._value(kind)
            if ident in _REPEATABLE:
                props.setdefault(name, []).append(value)
            elif name in props:
                raise ProtocolError(f"property {name} given twice")
            else:
                props[name] = value
        if self.pos != end:
            raise MalformedPacket("a property runs past the properties' length")
        return props

    def _value(self, kind: str) -> Any:
        if kind == "byte":
            return self.byte()
        if kind == "u16":
            return self.u16()
        if kind == "u32":
            return self.u32()
        if kind == "varint":
            return self.varint()
        if kind == "string":
            return self.string()
        if kind == "binary":
            return self.binary()
        return (self.string(), self.string())  # pair


# ------------------------------------------------------------------ packets
@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    protocol_name: str
    level: int
    client_id: str
    clean: bool  # clean session (3.1.1), clean start (5.0)
    keep_alive: int
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL or PUBCOMP."""

    kind: int
    packet_id: int
    reason: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class PingReq:
    pass


@dataclass(slots=True)
class Disconnect:
    reason: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason: int = 0
    properties: Properties = field(default_factory=dict)


Packet = Connect | Publish | Ack | Subscribe | Unsubscribe | PingReq | Disconnect | Auth


# ------------------------------------------------------------------- reader
class PacketReader:
    """A connection's bytes in, whole packets out: (type, flags, body).

    `max_size` bounds a packet (fixed header included), checked as soon as
    its remaining length is read, before its body arrives: a client cannot
    make the server buffer more than that."""

    __slots__ = ("buffer", "max_size")

    def __init__(self, max_size: int = MAX_REMAINING + 5) -> None:
        self.buffer = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buf = self.buffer
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            # The commonest read: whole packets and nothing held. They are
            # cut from `data` itself (no copy into the buffer and out again);
            # only a partial packet at its end is kept.
            src = data
        out: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(src)
        while end - pos >= 2:
            b = src[pos + 1]
            if b < 0x80:  # a remaining length of one byte: under 128
                length, i = b, pos + 2
            else:
                length, shift, i, complete = 0, 0, pos + 1, False
                while i < end:
                    b = src[i]
                    i += 1
                    length |= (b & 0x7F) << shift
                    if not b & 0x80:
                        complete = True
                        break
                    shift += 7
                    if shift > 21:
                        raise MalformedPacket("remaining length longer than 4 bytes")
                if not complete:
                    break  # the remaining length is not all here yet
            if i - pos + length > self.max_size:
                raise PacketTooLarge(f"packet of {i - pos + length} bytes")
            if end - i < length:
                break
            first = src[pos]
            out.append((first >> 4, first & 0x0F, bytes(src[i : i + length])))
            pos = i + length
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += data[pos:] if pos else data
        return out


# ------------------------------------------------------------------ decoding
def decode(ptype: int, flags: int, body: bytes, level: int) -> Packet:
    """The packet a client sent, for a connection at protocol `level`
    (MQTT_311 or MQTT_5; a CONNECT says its own)."""
    if ptype == PUBLISH:
        return _publish(flags, body, level)
    required = _REQUIRED_FLAGS.get(ptype, 0)
    if flags != required:
        raise MalformedPacket(f"packet type {ptype} with flags {flags:04b}")  # MQTT-2.2.2-2
    if ptype == CONNECT:
        return _connect(body)
    if ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        return _ack(ptype, body, level)
    if ptype == SUBSCRIBE:
        return _subscribe(body, level)
    if ptype == UNSUBSCRIBE:
        return _unsubscribe(body, level)
    if ptype == PINGREQ:
        if body:
            raise MalformedPacket("PINGREQ with a body")
        return PingReq()
    if ptype == DISCONNECT:
        return _disconnect(body, level)
    if ptype == AUTH and level == MQTT_5:
        cur = _Cursor(body)
        if not body:
            return Auth()
        auth = Auth(cur.byte(), cur.properties(_ALLOWED[AUTH]) if cur.left() else {})
        _end(cur)
        return auth
    raise ProtocolError(f"a client may not send packet type {ptype}")


def _end(cur: _Cursor) -> None:
    if cur.left():
        raise MalformedPacket("bytes after the packet's last field")


def _connect(body: bytes) -> Connect:
    cur = _Cursor(body)
    name = cur.string()
    level = cur.byte()
    # 3.1 ("MQIsdp", level 3) is answered by the caller: a CONNACK 0x01.
    flags = cur.byte()
    if flags & 0x01:
        raise MalformedPacket("CONNECT's reserved flag is set")  # MQTT-3.1.2-3
    keep_alive = cur.u16()
    properties = cur.properties(_ALLOWED[CONNECT]) if level == MQTT_5 else {}
    client_id = cur.string()
    will = None
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if flags & 0x04:
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")  # MQTT-3.1.2-14
        will_props = cur.properties(_ALLOWED["will"]) if level == MQTT_5 else {}
        will = Will(cur.string(), cur.binary(), will_qos, will_retain, will_props)
    elif will_qos or will_retain:
        raise MalformedPacket("will QoS or retain without a will")  # MQTT-3.1.2-11/13/15
    username = cur.string() if flags & 0x80 else None
    if flags & 0x40:
        if level != MQTT_5 and username is None:
            raise MalformedPacket("a password without a user name")  # MQTT-3.1.2-22
        password: bytes | None = cur.binary()
    else:
        password = None
    _end(cur)
    return Connect(
        name, level, client_id, bool(flags & 0x02), keep_alive, will, username, password, properties
    )


def _publish(flags: int, body: bytes, level: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")  # MQTT-3.3.1-4
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("DUP set on a QoS 0 PUBLISH")  # MQTT-3.3.1-2
    cur = _Cursor(body)
    topic = cur.string()
    packet_id = None
    if qos:
        packet_id = cur.u16()
        if packet_id == 0:
            raise MalformedPacket("packet identifier 0")  # MQTT-2.3.1-1
    properties = cur.properties(_ALLOWED[PUBLISH]) if level == MQTT_5 else {}
    if "subscription_identifier" in properties:
        raise ProtocolError("a client's PUBLISH carries a subscription identifier")
    if "#" in topic or "+" in topic:
        raise ProtocolError("a topic name with a wildcard")  # MQTT-3.3.2-2
    payload = bytes(cur.take(cur.left()))
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id, properties)


def _ack(ptype: int, body: bytes, level: int) -> Ack:
    cur = _Cursor(body)
    packet_id = cur.u16()
    if packet_id == 0:
        raise MalformedPacket("packet identifier 0")
    if level != MQTT_5:
        _end(cur)
        return Ack(ptype, packet_id)
    reason = cur.byte() if cur.left() else 0
    properties = cur.properties(_ALLOWED[ptype]) if cur.left() else {}
    _end(cur)
    return Ack(ptype, packet_id, reason, properties)


def _subscribe(body: bytes, level: int) -> Subscribe:
    cur = _Cursor(body)
    packet_id = cur.u16()
    if packet_id == 0:
        raise MalformedPacket("packet identifier 0")
    properties = cur.properties(_ALLOWED[SUBSCRIBE]) if level == MQTT_5 else {}
    if len(properties.get("subscription_identifier", ())) > 1:
        raise ProtocolError("two subscription identifiers")
    if 0 in properties.get("subscription_identifier", ()):
        raise ProtocolError("subscription identifier 0")  # MQTT 5.0 3.8.2.1.2
    subscriptions = []
    while cur.left():
        topic_filter = cur.string()
        options = cur.byte()
        qos = options & 0x03
        if qos == 3:
            raise MalformedPacket("subscription with QoS 3")  # MQTT-3.8.3-4
        if level == MQTT_5:
            if options & 0xC0:
                raise MalformedPacket("subscription options' reserved bits set")
            handling = (options >> 4) & 0x03
            if handling == 3:
                raise ProtocolError("retain handling 3")
            subscriptions.append(
                Subscription(
                    topic_filter, qos, bool(options & 0x04), bool(options & 0x08), handling
                )
            )
        else:
            if options & 0xFC:
                raise MalformedPacket("requested QoS byte's reserved bits set")  # MQTT-3-8.3-4
            subscriptions.append(Subscription(topic_filter, qos))
    if not subscriptions:
        raise ProtocolError("SUBSCRIBE with no topic filter")  # MQTT-3.8.3-3
    return Subscribe(packet_id, subscriptions, properties)


def _unsubscribe(body: bytes, level: int) -> Unsubscribe:
    cur = _Cursor(body)
    packet_id = cur.u16()
    if packet_id == 0:
        raise MalformedPacket("packet identifier 0")
    properties = cur.properties(_ALLOWED[UNSUBSCRIBE]) if level == MQTT_5 else {}
    filters = []
    while cur.left():
        filters.append(cur.string())
    if not filters:
        raise ProtocolError("UNSUBSCRIBE with no topic filter")  # MQTT-3.10.3-2
    return Unsubscribe(packet_id, filters, properties)


def _disconnect(body: bytes, level: int) -> Disconnect:
    if level != MQTT_5:
        if body:
            raise MalformedPacket("DISCONNECT with a body")
        return Disconnect()
    cur = _Cursor(body)
    if not body:
        return Disconnect()
    reason = cur.byte()
    properties = cur.properties(_ALLOWED[DISCONNECT]) if cur.left() else {}
    _end(cur)
    return Disconnect(reason, properties)


# ------------------------------------------------------------------ encoding
def varint(value: int) -> bytes:
    """A variable byte integer (1.5.5 / 2.2.3)."""
    if not 0 <= value <= MAX_REMAINING:
        raise ValueError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(text: str) -> bytes:
    raw = text.encode()
    return _U16.pack(len(raw)) + raw


def binary(data: bytes) -> bytes:
    return _U16.pack(len(data)) + data


def encode_properties(props: Properties) -> bytes:
    """5.0 properties, in the order given (user properties as a list of pairs)."""
    body = bytearray()
    for name, value in props.items():
        ident, kind = _PROPERTY_IDS[name]
        for one in value if ident in _REPEATABLE else (value,):
            body += varint(ident)
            if kind == "byte":
                body.append(one)
            elif kind == "u16":
                body += _U16.pack(one)
            elif kind == "u32":
                body += _U32.pack(one)
            elif kind == "varint":
                body += varint(one)
            elif kind == "string":
                body += string(one)
            elif kind == "binary":
                body += binary(one)
            else:
                body += string(one[0]) + string(one[1])
    return varint(len(body)) + bytes(body)


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes(((ptype << 4) | flags,)) + varint(len(body)) + body


def encode_connack(
    level: int, session_present: bool, code: int, properties: Properties | None = None
) -> bytes:
    body = bytes((1 if session_present else 0, code))
    if level == MQTT_5:
        body += encode_properties(properties or {})
    return packet(CONNACK, 0, body)


def encode_publish(
    level: int,
    topic: str,
    payload: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    properties: Properties | None = None,
) -> bytes:
    body = string(topic)
    if qos:
        assert packet_id
        body += _U16.pack(packet_id)
    if level == MQTT_5:
        body += encode_properties(properties or {})
    flags = (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    return packet(PUBLISH, flags, body + payload)


def publish_head(level: int, topic: str, flags: int, payload_size: int) -> bytes:
    """A PUBLISH without 5.0 properties up to its packet id: the packet is
    the head, the id (QoS 1 and 2), 5.0's empty properties (a zero byte) and
    the payload. The same bytes for every message of a topic and size: a
    fan-out's deliveries, a device's stream (the caller keeps them)."""
    raw = topic.encode()
    qos = (flags >> 1) & 3
    remaining = 2 + len(raw) + (2 if qos else 0) + (1 if level == MQTT_5 else 0) + payload_size
    return bytes(((PUBLISH << 4) | flags,)) + varint(remaining) + _U16.pack(len(raw)) + raw


def encode_ack(
    level: int, kind: int, packet_id: int, reason: int = 0, properties: Properties | None = None
) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; 5.0's short form when it can (3.4.2.1)."""
    body = _U16.pack(packet_id)
    if level == MQTT_5 and (reason or properties):
        body += bytes((reason,))
        if properties:
            body += encode_properties(properties)
    return packet(kind, 0b0010 if kind == PUBREL else 0, body)


def encode_suback(
    level: int, packet_id: int, codes: list[int], properties: Properties | None = None
) -> bytes:
    body = _U16.pack(packet_id)
    if level == MQTT_5:
        body += encode_properties(properties or {})
    return packet(SUBACK, 0, body + bytes(codes))


def encode_unsuback(
    level: int, packet_id: int, codes: list[int], properties: Properties | None = None
) -> bytes:
    body = _U16.pack(packet_id)
    if level == MQTT_5:  # 3.1.1's UNSUBACK has no payload
        body += encode_properties(properties or {}) + bytes(codes)
    return packet(UNSUBACK, 0, body)


def encode_pingresp() -> bytes:
    return b"\xd0\x00"


def encode_disconnect(reason: int = 0, properties: Properties | None = None) -> bytes:
    """A 5.0 server's DISCONNECT (3.1.1 servers send none: they close)."""
    if not reason and not properties:
        return packet(DISCONNECT, 0, b"")
    body = bytes((reason,))
    if properties:
        body += encode_properties(properties)
    return packet(DISCONNECT, 0, body)


def encode_auth(reason: int, properties: Properties | None = None) -> bytes:
    return packet(AUTH, 0, bytes((reason,)) + encode_properties(properties or {}))


def decode_properties(data: bytes, ptype: int) -> Properties:
    """The 5.0 properties `data` starts with, as packet type `ptype` may
    carry them (a client's view of a CONNACK, say)."""
    return _Cursor(data).properties(_ALLOWED[ptype])
