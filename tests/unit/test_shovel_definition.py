"""A shovel's definition, checked as RabbitMQ 3.10 checks it
(broker/amqp/shovel_definition.py): the same keys, defaults, order of
reasons and texts, so a definition RabbitMQ takes, Shoal takes, and one it
refuses is refused in the words its operators know."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.broker.amqp import shovel_definition as S

BASE = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://h", "dest-queue": "b"}


def test_a_minimal_definition_takes_rabbitmqs_defaults() -> None:
    spec = S.parse("s", BASE)
    assert spec.ack_mode == "on-confirm"
    assert spec.prefetch_count == 1000
    assert spec.reconnect_delay == 5  # the code's default (its docs say 1)
    assert spec.delete_after == "never"
    assert spec.src_exchange_key == ""  # not "#"
    assert spec.dest_exchange is None and spec.dest_exchange_key is None
    assert not spec.add_forward_headers and not spec.add_timestamp_header
    assert spec.src_uris == ("amqp://",) and spec.dest_uris == ("amqp://h",)


def test_the_dest_prefixed_keys_win_over_the_legacy_ones() -> None:
    spec = S.parse(
        "s",
        {
            **BASE,
            "add-forward-headers": False,
            "dest-add-forward-headers": True,
            "prefetch-count": 10,
            "src-prefetch-count": 20,
            "delete-after": 5,
            "src-delete-after": "queue-length",
            "dest-uri": ["amqp://h1", "amqp://h2"],
        },
    )
    assert spec.add_forward_headers and spec.prefetch_count == 20
    assert spec.delete_after == "queue-length"
    assert spec.dest_uris == ("amqp://h1", "amqp://h2")


@pytest.mark.parametrize(
    ("value", "reasons"),
    [
        (
            {},
            [
                "Must specify 'src-exchange' or 'src-queue'",
                'Key "dest-uri" not found in s',
                'Key "src-uri" not found in s',
            ],
        ),
        (
            {**BASE, "src-exchange": "x"},
            ["Cannot specify 'src-exchange' and 'src-queue'"],
        ),
        (
            {**BASE, "dest-exchange": "x"},
            ["Cannot specify 'dest-exchange' and 'dest-queue'"],
        ),
        (
            {**BASE, "ack-mode": "no-ack", "src-delete-after": 3},
            ["Cannot specify 'no-ack' and numerical 'delete-after'"],
        ),
        (
            {**BASE, "ack-mode": "whenever"},
            [
                'ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                'actually was <<"whenever">>'
            ],
        ),
        (
            {**BASE, "src-delete-after": -1},
            [
                'src-delete-after should be a number greater than or equal to 0, "never" or '
                '"queue-length", actually was -1'
            ],
        ),
        (
            {**BASE, "prefetch-count": "10"},
            ['prefetch-count should be a number, actually was <<"10">>'],
        ),
        (
            {**BASE, "dest-queue": "q" * 256},
            ["dest-queue should be less than 255 bytes, actually was 256"],
        ),
        (
            {**BASE, "add-forward-headers": "yes"},
            ['add-forward-headers should be boolean, actually was <<"yes">>'],
        ),
        ({**BASE, "colour": "red"}, ['Unrecognised terms [{<<"colour">>,<<"red">>}] in s']),
        (
            {**BASE, "src-uri": "derp"},
            ['"derp" not a valid URI: {{unable_to_parse_uri,no_scheme},"derp"}'],
        ),
        (
            {**BASE, "dest-uri": "http://x"},
            ['"http://x" not a valid URI: {{unexpected_uri_scheme,"http"},"http://x"}'],
        ),
        (
            {**BASE, "publish-properties": {"delivery_mode": "2"}},
            ['delivery_mode should be a number, actually was <<"2">>'],
        ),
        ("not an object", ['s not a list <<"not an object">>']),
    ],
)
def test_what_rabbitmq_refuses_is_refused_in_its_words(value: Any, reasons: list[str]) -> None:
    assert S.check("s", value) == reasons
    with pytest.raises(S.ShovelError):
        S.parse("s", value)


def test_no_uri_at_all_is_refused_where_rabbitmq_would_fail_to_start() -> None:
    """An empty list of URIs: RabbitMQ takes it and its shovel fails; here the
    definition is refused (it took the shovels process's reconciling down,
    every other shovel with it, found by random definitions)."""
    for key in ("src-uri", "dest-uri"):
        assert S.check("s", {**BASE, key: []}) == [f"{key} should be a non-empty list of URIs"]


def test_amqp10_is_refused_with_a_reason() -> None:
    [reason] = S.check("s", {**BASE, "src-protocol": "amqp10"})
    assert "amqp10" in reason and "not supported" in reason
