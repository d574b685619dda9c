"""JMS message selectors (broker.amqp.selector): parsing, SQL three-valued logic,
identifier resolution from encoded AMQP 0-9-1 content headers."""

from __future__ import annotations

import datetime
import functools
import operator
import pickle
import random
import struct
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import pytest
from pamqp import commands, header

from shoal.broker.amqp.selector import Selector, SelectorError, compile_selector


def encode(body_size: int = 0, **props: Any) -> bytes:
    """A content-header frame payload, as a publisher's client sends it."""
    return header.ContentHeader(0, body_size, commands.Basic.Properties(**props)).marshal()


def raw_table_header(entries: list[tuple[str, bytes]], tail: bytes = b"") -> bytes:
    """A header whose only property is a hand-encoded headers table, for the
    field types pamqp never writes (d, B, L, i, negative D, bad UTF-8)."""
    body = b"".join(bytes([len(k)]) + k.encode() + v for k, v in entries)
    return struct.pack(">HHQH", 60, 0, 0, 0x2000) + struct.pack(">I", len(body)) + body + tail


def truth(text: str, fields: Mapping[str, Any]) -> bool | None:
    """TRUE, FALSE or UNKNOWN: a selector matches only when TRUE, and its
    negation only when it is FALSE (NOT UNKNOWN is UNKNOWN)."""
    if compile_selector(text).matches_fields(fields):
        return True
    if compile_selector(f"NOT ({text})").matches_fields(fields):
        return False
    return None


def test_marshal_gives_the_frame_payload() -> None:
    # No frame header (type, channel, size) and no frame-end octet: the
    # payload starts with the class id and is what matches() takes.
    data = encode(10, priority=1)
    assert data[:2] == b"\x00\x3c"
    assert data[-1:] != b"\xce"
    assert struct.unpack_from(">HHQ", data) == (60, 0, 10)


# --------------------------------------------------------------------------
# Errors

ERRORS = [
    # (selector, position, words in the message)
    ("a = = 1", 4, "unexpected '='"),
    ("name = 'abc", 7, "unterminated string"),
    ("name = 'it''s", 7, "unterminated string"),
    ("a = ", 4, "unexpected end"),
    ("a = 1 AND", 9, "unexpected end"),
    ("(a = 1", 6, "expected ')'"),
    ("a = 1)", 5, "unexpected ')'"),
    ("a # 1", 2, "unexpected character '#'"),
    ("a != 1", 2, "unexpected character '!'"),
    ("a = 12abc", 4, "malformed number"),
    ("a = 1e", 4, "malformed number"),
    ("a = 1.5e+", 4, "malformed number"),
    ("a = 0x", 4, "malformed number"),
    ("a = 0xFG", 4, "malformed number"),
    ("a = 1.2.3", 4, "malformed number"),
    ("a = 09", 4, "malformed octal"),
    ("a = 1.5L", 4, "malformed number"),
    ("a LIKE 5", 7, "LIKE pattern must be a string literal"),
    ("a LIKE b", 7, "LIKE pattern must be a string literal"),
    ("a NOT LIKE", 10, "unexpected end"),
    ("a LIKE 'x' ESCAPE 5", 18, "ESCAPE character must be a string literal"),
    ("a LIKE 'x' ESCAPE", 17, "unexpected end"),
    ("a LIKE 'x' ESCAPE '!!'", 18, "ESCAPE must be exactly one character"),
    ("a LIKE 'x' ESCAPE ''", 18, "ESCAPE must be exactly one character"),
    ("a LIKE 'x!' ESCAPE '!'", 7, "ends with its ESCAPE"),
    ("a IN (1, 2)", 6, "IN list item must be a string literal"),
    ("a IN ('x', b)", 11, "IN list item must be a string literal"),
    ("a IN ()", 6, "must not be empty"),
    ("a IN 'x'", 5, "expected '('"),
    ("a IN ('x' 'y')", 10, "expected ')'"),
    ("a BETWEEN 1 2", 12, "expected AND"),
    ("a NOT = 1", 6, "expected BETWEEN, LIKE or IN"),
    ("a IS 1", 5, "expected NULL"),
    ("a IS NOT", 8, "unexpected end"),
    ("AND = 1", 0, "unexpected 'AND'"),
    ("a = 1 AND or = 2", 10, "unexpected 'or'"),
    ("between = 1", 0, "unexpected 'between'"),
    ("escape = 1", 0, "unexpected 'escape'"),
    ("x = like", 4, "unexpected 'like'"),
    ("x = NOT y", 4, "unexpected 'NOT'"),
    ("5", 0, "expected a boolean expression"),
    ("'abc'", 0, "expected a boolean expression"),
    ("a + 1", 0, "expected a boolean expression"),
    ("a = 1 AND (b + 1)", 10, "expected a boolean expression"),
    ("NOT 'x'", 4, "expected a boolean expression"),
    ("a = 1 OR 2", 9, "expected a boolean expression"),
]


@pytest.mark.parametrize(("text", "position", "words"), ERRORS)
def test_errors_carry_the_position(text: str, position: int, words: str) -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    assert info.value.position == position
    assert words in str(info.value)
    assert f"at position {position}" in str(info.value)


def test_error_message_format() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector("a = = 1")
    assert str(info.value) == "invalid selector 'a = = 1': unexpected '=' at position 4"
    assert isinstance(info.value, ValueError)


def test_error_message_stays_short_for_long_selectors() -> None:
    text = "a = '" + "x" * 1000 + "' AND " + "b" * 500 + " = = 1"
    with pytest.raises(SelectorError) as info:
        compile_selector(text)
    message = str(info.value)
    assert info.value.position == len(text) - 3
    assert len(message) < 200
    assert "..." in message


def test_error_pickles() -> None:
    with pytest.raises(SelectorError) as info:
        compile_selector("a = = 1")
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.position == 4
    assert str(copy) == str(info.value)


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_empty_selector_matches_everything(text: str) -> None:
    sel = compile_selector(text)
    assert isinstance(sel, Selector)
    assert sel.text == text
    assert sel.matches(encode())
    assert sel.matches(b"garbage")
    assert sel.matches_fields({})


# --------------------------------------------------------------------------
# Literals, keywords, identifiers

LITERALS = [
    ("x = 31", 31),
    ("x = 0x1F", 31),
    ("x = 0X1fL", 31),
    ("x = 31L", 31),
    ("x = 037", 31),  # a leading 0 is octal in Qpid's grammar
    ("x = 0", 0),
    ("x = 1e3", 1000),
    ("x = 1E+3", 1000.0),
    ("x = 2.5", 2.5),
    ("x = 7.E-2", 0.07),
    ("x = 7.", 7),
    ("x = .5", 0.5),
    ("x = -5", -5),
    ("x = - -5", 5),
    ("x = +5", 5),
    ("x = -0x10", -16),
    ("x = 'it''s'", "it's"),
    ("x = ''''", "'"),
    ("x = ''", ""),
    ("x = 'caf\u00e9 \u2603'", "caf\u00e9 \u2603"),
    ("x = TRUE", True),
    ("x = false", False),
]


@pytest.mark.parametrize(("text", "value"), LITERALS)
def test_literals(text: str, value: Any) -> None:
    assert compile_selector(text).matches_fields({"x": value})


def test_keywords_are_case_insensitive() -> None:
    sel = compile_selector(
        "color = 'red' and NOT size Between 1 aNd 5 oR x iS nUlL AND y NOT in ('a') "
        "And z like 'q%' EsCaPe '!' AND flag = True"
    )
    assert sel.matches_fields({"color": "red", "size": 6})
    assert not sel.matches_fields({"color": "red", "size": 3})


def test_identifiers_are_case_sensitive() -> None:
    sel = compile_selector("Color = 'red'")
    assert sel.matches_fields({"Color": "red"})
    assert not sel.matches_fields({"color": "red"})


def test_java_identifier_characters() -> None:
    sel = compile_selector("$x_1 = 1 AND _y$ = 2 AND \u00e9t\u00e9 = 3")
    assert sel.matches_fields({"$x_1": 1, "_y$": 2, "\u00e9t\u00e9": 3})
    assert sel.identifiers == frozenset({"$x_1", "_y$", "\u00e9t\u00e9"})


def test_null_literal_is_unknown() -> None:
    assert truth("x = NULL", {"x": 1}) is None
    assert truth("NULL IS NULL", {}) is True


# --------------------------------------------------------------------------
# Comparisons

COMPARISONS = [
    # (selector, fields, TRUE / FALSE / UNKNOWN)
    ("x = 5", {"x": 5}, True),
    ("x = 5", {"x": 6}, False),
    ("x <> 5", {"x": 6}, True),
    ("x <> 5", {"x": 5}, False),
    ("x < 5", {"x": 4}, True),
    ("x < 5", {"x": 5}, False),
    ("x <= 5", {"x": 5}, True),
    ("x <= 5", {"x": 6}, False),
    ("x > 5", {"x": 6}, True),
    ("x > 5", {"x": 5}, False),
    ("x >= 5", {"x": 5}, True),
    ("x >= 5", {"x": 4}, False),
    ("5 < x", {"x": 6}, True),  # literal on the left
    ("5 >= x", {"x": 6}, False),
    ("x = y", {"x": 2, "y": 2}, True),
    ("x < y", {"x": 1, "y": 2.5}, True),
    ("x = 5", {"x": 5.0}, True),  # integers and floats compare numerically
    ("x > 4.5", {"x": 5}, True),
    ("x = 0.1", {"x": Decimal("0.1")}, True),
    ("x < 1", {"x": Decimal("0.5")}, True),
    ("x = 5", {}, None),  # absent: NULL
    ("x = 5", {"x": None}, None),
    ("x = 5", {"x": "5"}, None),  # string vs number
    ("x = '5'", {"x": 5}, None),
    ("x = 1", {"x": True}, None),  # boolean vs number
    ("x = TRUE", {"x": 1}, None),
    ("x = 'red'", {"x": "red"}, True),
    ("x = 'red'", {"x": b"red"}, True),  # bytes read as UTF-8 text
    ("x = 'red'", {"x": bytearray(b"red")}, True),
    ("x = 'red'", {"x": b"\xff"}, None),
    ("x <> 'red'", {"x": "blue"}, True),
    ("x = y", {"x": "a", "y": "a"}, True),
    ("x < 'b'", {"x": "a"}, None),  # strings: only = and <>
    ("x >= y", {"x": "b", "y": "a"}, None),
    ("x = TRUE", {"x": True}, True),
    ("x <> TRUE", {"x": True}, False),
    ("x = y", {"x": False, "y": False}, True),
    ("x > FALSE", {"x": True}, None),  # booleans: only = and <>
    ("x = 1", {"x": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}, None),
    ("x = 1", {"x": {"nested": 1}}, None),
    ("x = 1", {"x": [1]}, None),
    ("(x = 1) = TRUE", {"x": 1}, True),
    ("(x = 1) = (y = 2)", {"x": 1, "y": 3}, False),
]


@pytest.mark.parametrize(("text", "fields", "expected"), COMPARISONS)
def test_comparisons(text: str, fields: dict[str, Any], expected: bool | None) -> None:
    assert truth(text, fields) is expected


def test_constant_comparisons_fold() -> None:
    assert compile_selector("1 = 1").matches(b"not a header")
    assert not compile_selector("1 = 2").matches(encode())
    assert compile_selector("2 * 3 = 6 AND 'a' = 'a' AND TRUE").matches_fields({})
    assert truth("'a' < 'b'", {}) is None


# --------------------------------------------------------------------------
# Three-valued logic

T, F, U = True, False, None
AND_TABLE = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR_TABLE = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip
NOT_TABLE = {T: F, F: T, U: U}


def logic_fields(**values: bool | None) -> dict[str, Any]:
    # UNKNOWN comes from a comparison with an absent identifier.
    return {name: (int(v) if v is not None else None) for name, v in values.items()}


@pytest.mark.parametrize(("p", "q"), list(AND_TABLE))
def test_and_or_truth_tables(p: bool | None, q: bool | None) -> None:
    fields = logic_fields(p=p, q=q)
    assert truth("p = 1 AND q = 1", fields) is AND_TABLE[p, q]
    assert truth("p = 1 OR q = 1", fields) is OR_TABLE[p, q]
    # Boolean-valued identifiers used directly behave the same way.
    flags = {name: value for name, value in (("p", p), ("q", q)) if value is not None}
    assert truth("p AND q", flags) is AND_TABLE[p, q]
    assert truth("p OR q", flags) is OR_TABLE[p, q]


@pytest.mark.parametrize("p", [T, F, U])
def test_not_truth_table(p: bool | None) -> None:
    fields = logic_fields(p=p)
    assert truth("NOT p = 1", fields) is NOT_TABLE[p]
    assert truth("NOT NOT p = 1", fields) is p
    # The selector matches only when TRUE: NOT UNKNOWN selects nothing.
    assert compile_selector("NOT p = 1").matches_fields(fields) is (NOT_TABLE[p] is True)


TRIPLES = [(a, b, c) for a in (T, F, U) for b in (T, F, U) for c in (T, F, U)]


@pytest.mark.parametrize(("p", "q", "r"), TRIPLES)
def test_longer_chains_and_precedence(p: bool | None, q: bool | None, r: bool | None) -> None:
    fields = logic_fields(p=p, q=q, r=r)
    # NOT binds tighter than AND, AND tighter than OR.
    expected = OR_TABLE[AND_TABLE[NOT_TABLE[p], q], r]
    assert truth("NOT p = 1 AND q = 1 OR r = 1", fields) is expected
    expected = AND_TABLE[AND_TABLE[p, q], r]
    assert truth("p = 1 AND q = 1 AND r = 1", fields) is expected
    expected = OR_TABLE[OR_TABLE[p, q], r]
    assert truth("p = 1 OR q = 1 OR r = 1", fields) is expected
    expected = OR_TABLE[p, AND_TABLE[q, r]]
    assert truth("p = 1 OR q = 1 AND r = 1", fields) is expected
    expected = AND_TABLE[OR_TABLE[p, q], r]
    assert truth("(p = 1 OR q = 1) AND r = 1", fields) is expected


def test_non_boolean_identifier_in_logic_is_unknown() -> None:
    assert truth("x", {"x": 1}) is None
    assert truth("x AND TRUE", {"x": "true"}) is None
    assert truth("x OR TRUE", {"x": 1}) is True
    assert truth("x", {"x": True}) is True


# --------------------------------------------------------------------------
# Arithmetic

ARITHMETIC = [
    ("2 + 3 * 4 = x", {"x": 14}, True),
    ("(2 + 3) * 4 = x", {"x": 20}, True),
    ("x - 4 - 3 = 3", {"x": 10}, True),  # left-associative
    ("x / 4 / 2 = 1", {"x": 8}, True),
    ("x * 2 + y * 3 = 13", {"x": 2, "y": 3}, True),
    ("x + y * 2 > 10", {"x": 1, "y": 4}, False),
    ("-x = -5", {"x": 5}, True),
    ("-x * -2 = 10", {"x": 5}, True),
    ("+x = 5", {"x": 5}, True),
    ("x / 2 = 3.5", {"x": 7}, True),  # division is never integer division
    ("x + 0.5 = 3", {"x": 2.5}, True),
    ("x + 1 = 2", {"x": Decimal("1")}, True),
    ("x / 0 = 1", {"x": 1}, None),  # division by zero: UNKNOWN
    ("x / y > 0", {"x": 1, "y": 0.0}, None),
    ("x + 1 = 2", {}, None),
    ("x + 1 = 2", {"x": "1"}, None),
    ("x + 1 = 2", {"x": True}, None),
    ("-x = -1", {"x": "1"}, None),
    ("x * 1.0 > 0", {"x": 10**400}, None),  # too big for a double
    ("x * 2 = 4", {"x": 2}, True),
]


@pytest.mark.parametrize(("text", "fields", "expected"), ARITHMETIC)
def test_arithmetic(text: str, fields: dict[str, Any], expected: bool | None) -> None:
    assert truth(text, fields) is expected


def test_constant_division_by_zero_does_not_raise() -> None:
    assert truth("1 / 0 = 1", {}) is None
    assert truth("(1 / 0) IS NULL", {}) is True


# --------------------------------------------------------------------------
# LIKE, BETWEEN, IN, IS NULL

LIKE_CASES = [
    # (pattern, escape, value, matches)
    ("red", None, "red", True),
    ("red", None, "Red", False),  # case-sensitive
    ("red", None, "reds", False),
    ("re%", None, "red", True),
    ("re%", None, "re", True),
    ("re%", None, "r", False),
    ("%ed", None, "red", True),
    ("%ed", None, "redx", False),
    ("%e%", None, "red", True),
    ("%e%", None, "rod", False),
    ("%", None, "", True),
    ("", None, "", True),
    ("", None, "x", False),
    ("r_d", None, "red", True),
    ("r_d", None, "rd", False),
    ("r_d", None, "reed", False),
    ("_%_", None, "ab", True),
    ("_%_", None, "a", False),
    ("a%b%c", None, "aXbYc", True),
    ("a%b%c", None, "aXcYb", False),
    ("%%a", None, "xa", True),
    ("r_d", None, "r\nd", True),  # wildcards match newlines too
    ("a%", None, "a\nb", True),
    # Regex metacharacters are literal.
    ("a.c", None, "abc", False),
    ("a.c", None, "a.c", True),
    ("[ab]*", None, "a", False),
    ("[ab]*", None, "[ab]*", True),
    ("(a|b)+?", None, "(a|b)+?", True),
    ("(a|b)%", None, "a", False),
    ("^a$", None, "^a$", True),
    ("^a$", None, "a", False),
    ("a\\d", None, "a\\d", True),
    ("a\\d", None, "a1", False),
    ("{1}%", None, "{1}x", True),
    # ESCAPE
    ("100!%", "!", "100%", True),
    ("100!%", "!", "1000", False),
    ("a!_b", "!", "a_b", True),
    ("a!_b", "!", "axb", False),
    ("a!!b", "!", "a!b", True),
    ("%!%%", "!", "50% off", True),
    ("%!%%", "!", "50 off", False),
    ("a\\%", "\\", "a%", True),
    ("a\\%", "\\", "ab", False),
    ("x.%", ".", "x%", True),  # a regex metacharacter as the escape
    ("x.%", ".", "x.y", False),
    ("!a", "!", "a", True),  # escaping an ordinary character is tolerated
]


@pytest.mark.parametrize(("pattern", "escape", "value", "expected"), LIKE_CASES)
def test_like(pattern: str, escape: str | None, value: str, expected: bool) -> None:
    quoted = pattern.replace("'", "''")
    text = f"s LIKE '{quoted}'" + (f" ESCAPE '{escape}'" if escape else "")
    assert truth(text, {"s": value}) is expected
    negated = text.replace(" LIKE ", " NOT LIKE ")
    assert truth(negated, {"s": value}) is (not expected)


@pytest.mark.parametrize("value", [None, 5, True, 1.5, {"a": 1}])
def test_like_on_non_strings_is_unknown(value: Any) -> None:
    assert truth("s LIKE 'a%'", {"s": value}) is None
    assert truth("s NOT LIKE 'a%'", {"s": value}) is None


def test_like_on_an_expression_and_constant() -> None:
    assert truth("'abc' LIKE 'a%'", {}) is True
    assert truth("'abc' NOT LIKE 'a%'", {}) is False


BETWEEN_CASES = [
    ("x BETWEEN 1 AND 5", {"x": 1}, True),
    ("x BETWEEN 1 AND 5", {"x": 5}, True),
    ("x BETWEEN 1 AND 5", {"x": 3.5}, True),
    ("x BETWEEN 1 AND 5", {"x": 0}, False),
    ("x BETWEEN 1 AND 5", {"x": 5.01}, False),
    ("x BETWEEN 5 AND 1", {"x": 3}, False),
    ("x NOT BETWEEN 1 AND 5", {"x": 0}, True),
    ("x NOT BETWEEN 1 AND 5", {"x": 3}, False),
    ("x BETWEEN 1 AND 5", {}, None),
    ("x NOT BETWEEN 1 AND 5", {}, None),
    ("x BETWEEN 1 AND 5", {"x": "3"}, None),
    ("x BETWEEN 'a' AND 'c'", {"x": "b"}, None),  # ordering strings: UNKNOWN
    ("x BETWEEN y AND z", {"x": 5, "y": 10}, False),  # FALSE AND UNKNOWN
    ("x BETWEEN y AND z", {"x": 5, "y": 1}, None),  # TRUE AND UNKNOWN
    ("x NOT BETWEEN y AND z", {"x": 5, "y": 10}, True),
    ("x BETWEEN y - 1 AND y + 1", {"x": 5, "y": 4}, True),
    ("x BETWEEN -1 AND 1 AND y = 2", {"x": 0, "y": 2}, True),  # the bounds bind first
    ("x * 2 BETWEEN 4 AND 6", {"x": 3}, True),
    ("3 BETWEEN 1 AND 5", {}, True),
]


@pytest.mark.parametrize(("text", "fields", "expected"), BETWEEN_CASES)
def test_between(text: str, fields: dict[str, Any], expected: bool | None) -> None:
    assert truth(text, fields) is expected


IN_CASES = [
    ("c IN ('red', 'green')", {"c": "red"}, True),
    ("c IN ('red', 'green')", {"c": "green"}, True),
    ("c IN ('red', 'green')", {"c": "blue"}, False),
    ("c IN ('red')", {"c": "red"}, True),
    ("c IN ('it''s')", {"c": "it's"}, True),
    ("c NOT IN ('red', 'green')", {"c": "blue"}, True),
    ("c NOT IN ('red', 'green')", {"c": "red"}, False),
    ("c IN ('red', 'green')", {}, None),
    ("c NOT IN ('red', 'green')", {}, None),
    ("c IN ('1')", {"c": 1}, None),
    ("c NOT IN ('1')", {"c": 1}, None),
    ("c IN ('RED')", {"c": "red"}, False),
    ("c IN ('red')", {"c": b"red"}, True),
]


@pytest.mark.parametrize(("text", "fields", "expected"), IN_CASES)
def test_in(text: str, fields: dict[str, Any], expected: bool | None) -> None:
    assert truth(text, fields) is expected


IS_NULL_CASES = [
    ("x IS NULL", {}, True),
    ("x IS NULL", {"x": None}, True),
    ("x IS NULL", {"x": 0}, False),
    ("x IS NULL", {"x": ""}, False),
    ("x IS NULL", {"x": False}, False),
    ("x IS NULL", {"x": {"a": 1}}, False),  # present, if not comparable
    ("x IS NOT NULL", {"x": 0}, True),
    ("x IS NOT NULL", {}, False),
    ("x + 1 IS NULL", {}, True),
    ("x + 1 IS NULL", {"x": 1}, False),
    ("(x = 1) IS NULL", {}, True),
    ("NOT x IS NULL", {"x": 1}, True),
]


@pytest.mark.parametrize(("text", "fields", "expected"), IS_NULL_CASES)
def test_is_null(text: str, fields: dict[str, Any], expected: bool) -> None:
    assert truth(text, fields) is expected


# --------------------------------------------------------------------------
# Identifiers from encoded headers

STAMP = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
FULL = encode(
    1234,
    content_type="application/json",
    content_encoding="gzip",
    headers={
        "color": "red",
        "size": 12,
        "big": 2**40,
        "neg": -70000,
        "weight": 2.5,
        "price": Decimal("19.99"),
        "flag": True,
        "raw": bytearray(b"bytes"),
        "when": STAMP,
        "nested": {"a": 1},
        "list": [1, 2],
        "void": None,
        "JMSType": "shadowed",
    },
    delivery_mode=2,
    priority=7,
    correlation_id="corr-1",
    reply_to="replies",
    expiration="60000",
    message_id="msg-1",
    timestamp=STAMP,
    message_type="order",
    user_id="guest",
    app_id="app",
)

HEADER_CASES = [
    "JMSPriority = 7",
    "JMSDeliveryMode = 'PERSISTENT'",
    "JMSCorrelationID = 'corr-1'",
    "JMSMessageID = 'msg-1'",
    "JMSType = 'order'",  # the property wins over a header of the same name
    f"JMSTimestamp = {int(STAMP.timestamp()) * 1000}",
    "JMSExpiration = 60000",
    "JMSReplyTo = 'replies'",
    "color = 'red'",
    "size = 12",
    "big = 1099511627776",
    "neg = -70000",
    "weight = 2.5",
    "price = 19.99",
    "flag",
    "flag = TRUE",
    "raw = 'bytes'",
    "when IS NOT NULL",
    "nested IS NOT NULL",
    "list IS NOT NULL",
    "void IS NULL",
    "missing IS NULL",
    "content_type IS NULL",  # only the headers table and JMS names resolve
]


@pytest.mark.parametrize("text", HEADER_CASES)
def test_identifiers_from_an_encoded_header(text: str) -> None:
    sel = compile_selector(text)
    assert sel.matches(FULL)
    assert sel.matches(memoryview(FULL))
    assert sel.matches(bytearray(FULL))


@pytest.mark.parametrize("name", ["when", "nested", "list"])
def test_unsupported_header_types_are_unknown(name: str) -> None:
    assert truth(f"{name} = 1", {}) is None
    sel = compile_selector(f"{name} = 1 OR {name} = 'x' OR {name} > 0")
    assert not sel.matches(FULL)
    assert not compile_selector(f"NOT ({name} = 1)").matches(FULL)


def test_jms_defaults_when_properties_are_absent() -> None:
    bare = encode()
    assert compile_selector("JMSPriority = 4").matches(bare)
    assert compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'").matches(bare)
    assert compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'").matches(encode(delivery_mode=1))
    for name in ("JMSCorrelationID", "JMSMessageID", "JMSType", "JMSTimestamp", "JMSExpiration"):
        assert compile_selector(f"{name} IS NULL").matches(bare), name
    assert compile_selector("JMSReplyTo IS NULL AND color IS NULL").matches(bare)


def test_expiration_that_is_not_a_number_is_null() -> None:
    assert compile_selector("JMSExpiration IS NULL").matches(encode(expiration="soon"))
    assert compile_selector("JMSExpiration = 0").matches(encode(expiration="0"))


def test_timestamp_already_in_milliseconds() -> None:
    # pamqp's rule: a value beyond 32 bits is milliseconds already.
    ms = 1_700_000_000_123
    data = struct.pack(">HHQHQ", 60, 0, 0, 0x0040, ms)
    assert compile_selector(f"JMSTimestamp = {ms}").matches(data)


RAW_FIELDS = [
    ("d", struct.pack(">d", 0.1), "x = 0.1"),
    ("B", struct.pack(">B", 200), "x = 200"),
    ("u", struct.pack(">H", 60000), "x = 60000"),
    ("i", struct.pack(">I", 4_000_000_000), "x = 4000000000"),
    ("L", struct.pack(">q", -(2**40)), "x = -1099511627776"),
    ("l", struct.pack(">q", 2**62), "x = 0x4000000000000000"),
    ("f", struct.pack(">f", 0.25), "x = 0.25"),
    ("t", b"\x00", "x = FALSE"),
    ("D", struct.pack(">Bi", 2, -1999), "x = -19.99"),  # the mantissa is signed
    ("S", struct.pack(">I", 2) + b"\xff\xfe", "x IS NOT NULL AND (x = 'a') IS NULL"),
    ("x", struct.pack(">I", 3) + b"abc", "x = 'abc'"),
    ("V", b"", "x IS NULL"),
    ("T", struct.pack(">Q", 1_700_000_000), "x IS NOT NULL"),
]


@pytest.mark.parametrize(("code", "payload", "text"), RAW_FIELDS)
def test_field_table_types(code: str, payload: bytes, text: str) -> None:
    data = raw_table_header(
        [("a", b"S" + struct.pack(">I", 1) + b"a"), ("x", code.encode() + payload)]
    )
    assert compile_selector(text).matches(data)
    # Skipped, rather than decoded, when the selector does not read it.
    assert compile_selector("a = 'a'").matches(data)


def test_duplicate_table_keys_last_one_wins() -> None:
    s = b"S" + struct.pack(">I", 1)
    data = raw_table_header([("k", s + b"a"), ("k", s + b"b")])
    assert compile_selector("k = 'b'").matches(data)


# --------------------------------------------------------------------------
# Malformed headers and lazy decoding


def test_truncated_headers_never_raise() -> None:
    sel = compile_selector("color = 'red' AND size > 10 AND JMSType = 'order'")
    assert sel.matches(FULL)
    # JMSType is the last property the selector needs: the properties after
    # it (user-id, app-id) are never read, so cutting them off is harmless.
    needed = FULL.index(b"\x05order") + 6
    for cut in range(len(FULL)):
        assert sel.matches(FULL[:cut]) is (cut >= needed), cut


def test_garbage_never_raises() -> None:
    rng = random.Random(7)
    selectors = [
        compile_selector("color = 'red'"),
        compile_selector("JMSPriority > 1 OR JMSType = 'a'"),
        compile_selector("x IS NULL"),
    ]
    valid = [FULL, encode(headers={"color": "red"})]
    for _ in range(3000):
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        else:
            # Valid headers with a few bytes flipped.
            flipped = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            data = bytes(flipped)
        for sel in selectors:
            assert sel.matches(data) in (True, False)


def test_malformed_shapes_do_not_match() -> None:
    sel = compile_selector("x IS NULL")
    assert sel.matches(encode())
    assert not sel.matches(b"")
    assert not sel.matches(encode()[:13])
    # Another class id.
    assert not sel.matches(b"\x00\x3d" + encode()[2:])
    # An unknown field type, a table overrunning the header, a value
    # overrunning its table.
    assert not sel.matches(raw_table_header([("k", b"?")]))
    assert not sel.matches(raw_table_header([("k", b"b\x01")])[:-1])
    bad = struct.pack(">HHQH", 60, 0, 0, 0x2000) + struct.pack(">I", 3) + b"\x01kS\x00\x00"
    assert not sel.matches(bad)


def test_lazy_decoding_skips_what_is_not_needed() -> None:
    # A table whose length is right but whose content is garbage: skipped
    # whole by a selector that only reads properties after it...
    junk = b"\x05\xff\xff\xff\xff\xff"
    data = (
        struct.pack(">HHQH", 60, 0, 0, 0x2000 | 0x0800)
        + struct.pack(">I", len(junk))
        + junk
        + b"\x09"
    )
    assert compile_selector("JMSPriority = 9").matches(data)
    assert not compile_selector("JMSPriority = 9 AND color IS NULL").matches(data)
    # ...and properties after the last needed one are not even looked at.
    good = encode(headers={"color": "red"}, priority=3)
    assert compile_selector("color = 'red'").matches(good[:-1])
    assert not compile_selector("color = 'red' AND JMSPriority = 3").matches(good[:-1])


def test_identifiers_are_collected() -> None:
    sel = compile_selector("a = 1 AND (b LIKE 'x' OR a IN ('1')) AND JMSPriority > c")
    assert sel.identifiers == frozenset({"a", "b", "c", "JMSPriority"})
    assert compile_selector("1 = 1").identifiers == frozenset()


# --------------------------------------------------------------------------
# Agreement with a straightforward reference evaluation

OTHER = object()  # a present value of a type selectors cannot compare


def r_norm(v: Any) -> Any:
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int | float):
        return v
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode()
        except UnicodeDecodeError:
            return OTHER
    return OTHER


def r_resolve(props: commands.Basic.Properties, name: str) -> Any:
    if name == "JMSPriority":
        return 4 if props.priority is None else props.priority
    if name == "JMSDeliveryMode":
        return "PERSISTENT" if props.delivery_mode == 2 else "NON_PERSISTENT"
    if name == "JMSType":
        return props.message_type
    if name == "JMSCorrelationID":
        return props.correlation_id
    return r_norm((props.headers or {}).get(name))


def r_isnum(v: Any) -> bool:
    return type(v) in (int, float)


R_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
}


def r_cmp(a: Any, op: str, b: Any) -> bool | None:
    if r_isnum(a) and r_isnum(b):
        return bool(R_OPS[op](a, b))
    if op in ("=", "<>") and type(a) is type(b) and type(a) in (str, bool):
        return bool(R_OPS[op](a, b))
    return None


def r_arith(a: Any, op: str, b: Any) -> Any:
    if not (r_isnum(a) and r_isnum(b)) or (op == "/" and b == 0):
        return None
    return R_OPS[op](a, b)


def r_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def r_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def r_not(a: bool | None) -> bool | None:
    return None if a is None else not a


def r_bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def r_between(v: Any, lo: Any, hi: Any) -> bool | None:
    return r_and(r_cmp(lo, "<=", v), r_cmp(v, "<=", hi))


def r_in(v: Any, items: set[str]) -> bool | None:
    return v in items if isinstance(v, str) else None


def r_like(v: Any, pattern: str, escape: str | None = None) -> bool | None:
    """LIKE by dynamic programming over the pattern's pieces (no regex)."""
    if not isinstance(v, str):
        return None
    pieces: list[str | None] = []  # a literal character, "%" as None, "_" as ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            i += 1
            pieces.append(pattern[i])
        else:
            pieces.append(None if c == "%" else "" if c == "_" else c)
        i += 1

    @functools.cache
    def match(p: int, s: int) -> bool:
        if p == len(pieces):
            return s == len(v)
        piece = pieces[p]
        if piece is None:
            return match(p + 1, s) or (s < len(v) and match(p, s + 1))
        if s == len(v):
            return False
        return (piece == "" or piece == v[s]) and match(p + 1, s + 1)

    return match(0, 0)


Resolver = Callable[[str], Any]
REFERENCE: list[tuple[str, Callable[[Resolver], bool | None]]] = [
    (
        "color = 'red' AND size > 10",
        lambda g: r_and(r_cmp(g("color"), "=", "red"), r_cmp(g("size"), ">", 10)),
    ),
    (
        "NOT (color IN ('red', 'green')) OR weight BETWEEN 1.5 AND 7",
        lambda g: r_or(r_not(r_in(g("color"), {"red", "green"})), r_between(g("weight"), 1.5, 7)),
    ),
    (
        "(name LIKE 'a%!_%' ESCAPE '!' OR JMSPriority >= 5) AND NOT flag",
        lambda g: r_and(
            r_or(r_like(g("name"), "a%!_%", "!"), r_cmp(g("JMSPriority"), ">=", 5)),
            r_not(r_bool(g("flag"))),
        ),
    ),
    (
        "size * 2 + weight / size < 30 AND JMSDeliveryMode = 'PERSISTENT'",
        lambda g: r_and(
            r_cmp(
                r_arith(r_arith(g("size"), "*", 2), "+", r_arith(g("weight"), "/", g("size"))),
                "<",
                30,
            ),
            r_cmp(g("JMSDeliveryMode"), "=", "PERSISTENT"),
        ),
    ),
    (
        "JMSType = 'order' AND (color IS NULL OR size NOT BETWEEN 3 AND 8)"
        " OR JMSCorrelationID LIKE 'c-1%'",
        lambda g: r_or(
            r_and(
                r_cmp(g("JMSType"), "=", "order"),
                r_or(g("color") is None, r_not(r_between(g("size"), 3, 8))),
            ),
            r_like(g("JMSCorrelationID"), "c-1%"),
        ),
    ),
]

WORDS = ["red", "green", "blue", "", "a_b", "ax_", "a%_z", "A_b", "a\n_"]


NATURAL: dict[str, Callable[[random.Random], Any]] = {
    "color": lambda rng: rng.choice(["red", "green", "blue"]),
    "size": lambda rng: rng.randrange(0, 15),
    "weight": lambda rng: rng.randrange(0, 40) / 4,
    "name": lambda rng: rng.choice(WORDS),
    "flag": lambda rng: rng.random() < 0.5,
}


def random_value(rng: random.Random, key: str) -> Any:
    """Mostly the key's usual type, sometimes anything at all."""
    if rng.random() < 0.7:
        return NATURAL[key](rng)
    kind = rng.randrange(10)
    if kind == 0:
        return rng.choice(WORDS)
    if kind in (1, 2):
        return rng.randrange(-3, 15)
    if kind == 3:
        return rng.randrange(-20, 60) / 4  # exact as the float32 pamqp writes
    if kind == 4:
        return rng.random() < 0.5
    if kind == 5:
        return Decimal(rng.randrange(0, 1000)).scaleb(-rng.randrange(3))
    if kind == 6:
        return bytearray(rng.choice(WORDS).encode())
    if kind == 7:
        return None
    if kind == 8:
        return rng.choice([STAMP, {"k": 1}, [1, "x"]])
    return rng.choice(["red", "green"])


def random_message(rng: random.Random) -> bytes:
    props: dict[str, Any] = {}
    if rng.random() < 0.9:
        props["headers"] = {
            key: random_value(rng, key)
            for key in ("color", "size", "weight", "name", "flag")
            if rng.random() < 0.75
        }
    if rng.random() < 0.7:
        props["priority"] = rng.randrange(10)
    if rng.random() < 0.7:
        props["delivery_mode"] = rng.choice([1, 2])
    if rng.random() < 0.6:
        props["message_type"] = rng.choice(["order", "other"])
    if rng.random() < 0.6:
        props["correlation_id"] = rng.choice(["c-1", "c-10", "c-2", "x"])
    if rng.random() < 0.3:
        props["content_type"] = "text/plain"
    if rng.random() < 0.3:
        props["app_id"] = "app"
    return encode(rng.randrange(1000), **props)


@pytest.mark.parametrize(("text", "reference"), REFERENCE, ids=[t for t, _ in REFERENCE])
def test_agrees_with_reference(text: str, reference: Callable[[Resolver], bool | None]) -> None:
    rng = random.Random(text)
    sel = compile_selector(text)
    negated = compile_selector(f"NOT ({text})")
    outcomes = {True: 0, False: 0, None: 0}
    for _ in range(2000):
        data = random_message(rng)
        decoded = header.ContentHeader()
        decoded.unmarshal(data)
        props = decoded.properties

        def resolve(name: str, props: commands.Basic.Properties = props) -> Any:
            return r_resolve(props, name)

        expected = reference(resolve)
        outcomes[expected] += 1
        assert sel.matches(data) is (expected is True), (text, props)
        assert negated.matches(data) is (expected is False), (text, props)
        fields = {name: resolve(name) for name in sel.identifiers}
        fields = {k: v for k, v in fields.items() if v is not OTHER}  # not expressible
        if all(resolve(name) is not OTHER for name in sel.identifiers):
            assert sel.matches_fields(fields) is (expected is True)
    # Each selector sees all three outcomes, so the comparison means something.
    assert min(outcomes.values()) >= 40, outcomes


# --------------------------------------------------------------------------
# Speed (reported, not asserted)


def test_report_match_speed(capsys: pytest.CaptureFixture[str]) -> None:
    data = encode(512, headers={"color": "red", "size": 12, "shape": "round"}, delivery_mode=2)
    cases = [
        ("color = 'red' AND size > 10", True),
        ("JMSPriority > 3 AND JMSDeliveryMode = 'PERSISTENT'", True),
        ("color IN ('green', 'blue') OR shape LIKE 'r%d'", True),
    ]
    lines = []
    for text, expected in cases:
        sel = compile_selector(text)
        assert sel.matches(data) is expected
        n = 20000
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                sel.matches(data)
            best = min(best, (time.perf_counter() - start) / n)
        lines.append(f"  {best * 1e6:6.2f} us/match  {text}")
    with capsys.disabled():
        print("\nselector match speed (best of 5 x 20000):\n" + "\n".join(lines))


# --------------------------------------------------------------------------
# Limits


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5000 + "a = 1" + ")" * 5000,
        "NOT " * 5000 + "a = 1",
        "a = " + "-" * 5000 + "1",
        "a " + "+ 1 " * 5000 + "= 1",
    ],
)
def test_pathological_nesting_is_a_selector_error(text: str) -> None:
    with pytest.raises(SelectorError, match="deeply"):
        compile_selector(text)


def test_long_flat_selectors_compile_and_run() -> None:
    text = " OR ".join(f"a = {i}" for i in range(5000))
    sel = compile_selector(text)
    assert sel.matches_fields({"a": 4999})
    assert not sel.matches_fields({"a": -1})
    nested = "(" * 40 + "a = 1" + ")" * 40 + " AND " + "NOT " * 40 + "b = 1"
    assert compile_selector(nested).matches_fields({"a": 1, "b": 1})
