"""workers/_wire.c's check of a publish's content header: what pamqp (a
client's encoder) writes passes, with every property and nested tables and
arrays of every type; what RabbitMQ 3.10 cannot decode does not (measured
cases in tests/integration/test_malformed.py)."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

import pytest
from pamqp import commands, header

from shoal.workers._wire import properties_ok


def marshalled(**properties: object) -> bytes:
    return header.ContentHeader(0, 10, commands.Basic.Properties(**properties)).marshal()


def raw(flags: int, properties: bytes) -> bytes:
    return struct.pack(">HHQH", 60, 0, 1, flags) + properties


@pytest.mark.parametrize(
    "properties",
    [
        {},
        {"delivery_mode": 2},
        {"content_type": "text/plain", "content_encoding": "gzip", "priority": 5},
        {"correlation_id": "c", "reply_to": "r", "expiration": "6000", "message_id": "m"},
        {"timestamp": datetime.datetime(2026, 1, 1), "message_type": "t", "user_id": "u"},
        {"app_id": "a", "cluster_id": ""},
        {
            "headers": {
                "int": 1,
                "big": 1 << 40,
                "str": "x" * 300,
                "bool": True,
                "float": 1.5,
                "decimal": Decimal("1.23"),
                "none": None,
                "when": datetime.datetime(2026, 1, 1),
                "list": [1, "a", [2, {"deep": {"deeper": [True]}}]],
                "table": {"a": {"b": {"c": 1}}},
                "CC": ["k1", "k2"],
            }
        },
    ],
)
def test_what_a_client_encodes_passes(properties: dict[str, object]) -> None:
    assert properties_ok(marshalled(**properties))


@pytest.mark.parametrize(
    ("flags", "properties"),
    [
        (0x0100, b"\x0a12"),  # a short string past the end
        (0x1000, b""),  # an octet missing
        (0x0040, b"\x00" * 7),  # a timestamp one byte short
        (0x0000, b"\x00"),  # a byte after the last property
        (0x2000, b"\x00\x00\x00"),  # a table's length cut
        (0x2000, struct.pack(">I", 12) + b"\x02CCA" + struct.pack(">I", 2) + b"Qx"),
        (0x2000, struct.pack(">I", 10) + b"\x02CCA" + struct.pack(">I", 2) + b"Qx"),
        (0x2000, struct.pack(">I", 7) + b"\x03abcQxx"),
        (0x2000, struct.pack(">I", 11) + b"\x03abcS" + struct.pack(">I", 16) + b"xy"),
        (0x2000, struct.pack(">I", 5) + b"\x03abcI"),  # a value cut short
        (0x2000, struct.pack(">I", 2) + b"\x05a"),  # a name past the table's end
    ],
)
def test_what_rabbitmq_cannot_decode_fails(flags: int, properties: bytes) -> None:
    assert not properties_ok(raw(flags, properties))


def test_nesting_is_bounded_not_recursed_without_end() -> None:
    value = b"V"
    for _ in range(300):  # tables in tables, 300 deep
        body = b"\x01a" + value
        value = b"F" + struct.pack(">I", len(body)) + body
    table = b"\x01a" + value
    assert not properties_ok(raw(0x2000, struct.pack(">I", len(table)) + table))
    assert not properties_ok(b"short")
