"""Queue and binding x-argument checks, without a broker: RabbitMQ 3.10's
error texts (the integration tests check them again through a client)."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.broker.amqp import errors as E
from shoal.broker.amqp import x_arguments as X


def refusal(check: Any, *args: Any) -> str:
    with pytest.raises(E.ChannelError) as info:
        check(*args)
    assert info.value.reply_code == E.PRECONDITION_FAILED
    return info.value.reply_text


def test_max_priority() -> None:
    assert X.max_priority(b"q", "/", {}) == 0
    assert X.max_priority(b"q", "/", {"x-max-priority": 10}) == 10
    assert refusal(X.max_priority, b"q", "/", {"x-max-priority": 256}).endswith(
        "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,256}"
    )
    assert refusal(X.max_priority, b"q", "/", {"x-max-priority": True}).endswith(
        '"expected integer, got bool"'
    )
    assert refusal(X.max_priority, b"q", "/", {"x-max-priority": -1}).endswith(
        "{value_negative,-1}"
    )


def test_length_limits_are_checked_even_without_a_limit() -> None:
    assert X.length_limits(b"q", "/", {}) == (None, None, "drop-head")
    assert X.length_limits(b"q", "/", {"x-max-length": 0, "x-overflow": b"reject-publish"}) == (
        0,
        None,
        "reject-publish",
    )
    assert refusal(X.length_limits, b"q", "/", {"x-overflow": "drop-tail"}).endswith(
        "invalid_overflow"
    )
    assert refusal(X.length_limits, b"q", "/", {"x-max-length-bytes": -1}).endswith(
        "{value_negative,-1}"
    )


def test_capacity_resumes_at_80_percent_by_default() -> None:
    assert X.capacity(b"q", "/", {}) == (0, 0)
    assert X.capacity(b"q", "/", {"x-capacity": 1000}) == (1000, 800)
    assert refusal(
        X.capacity, b"q", "/", {"x-capacity": 10, "x-flow-resume-capacity": 11}
    ).endswith("11 is above x-capacity 10")


def test_equivalence_names_both_values_as_rabbitmq_does() -> None:
    X.check_equivalent(b"q", "/", {"x-foo": 1}, {"x-foo": 2})  # not one RabbitMQ knows
    assert refusal(X.check_equivalent, b"q", "/", {"x-max-length": 5}, {}).endswith(
        "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
        "received the value '5' of type 'long' but current is none"
    )
    assert refusal(
        X.check_equivalent, b"q", "/", {"x-max-length": 5}, {"x-max-length": 6}
    ).endswith("received '5' but current is '6'")
    # 1 == True in Python; RabbitMQ tells a long from a bool.
    assert "inequivalent arg 'x-single-active-consumer'" in refusal(
        X.check_equivalent,
        b"q",
        "/",
        {"x-single-active-consumer": 1},
        {"x-single-active-consumer": True},
    )
    # An integer and a float are of other type classes (the Java client's
    # PerQueueTTL.queueReDeclareSemanticNonEquivalence: 10 then 10.0).
    assert refusal(
        X.check_equivalent, b"q", "/", {"x-message-ttl": 10.0}, {"x-message-ttl": 10}
    ).endswith("received '10.0' but current is '10'")


def test_x_match() -> None:
    X.check_x_match({})
    X.check_x_match({"x-match": "any-with-x"})
    assert 'Invalid x-match field value <<"some">>' in refusal(
        X.check_x_match, {"x-match": b"some"}
    )


def test_queue_mode_and_version_as_rabbitmq_3_10_checks_them() -> None:
    """Measured against RabbitMQ 3.10.8 through pika (tail of each reply text)."""
    for fine in ({}, {"x-queue-mode": "lazy"}, {"x-queue-mode": "default"}, {"x-queue-version": 2}):
        X.mode_and_version(b"q", "/", fine)
    where = "invalid arg '{}' for queue 'q' in vhost '/': "
    for args, tail in (
        ({"x-queue-mode": "LAZY"}, "\"unsupported queue mode 'LAZY'\""),
        ({"x-queue-mode": True}, "{unacceptable_type,bool}"),
        ({"x-queue-mode": b"lazy"}, "{unacceptable_type,binary}"),
        ({"x-queue-version": 0}, "\"unsupported queue version '0'\""),
        ({"x-queue-version": -1}, "{value_negative,-1}"),
        ({"x-queue-version": True}, '"expected integer, got bool"'),
        ({"x-queue-version": "2"}, '"expected integer, got longstr"'),
        ({"x-queue-mode": "foo", "x-queue-version": 9}, "\"unsupported queue mode 'foo'\""),
    ):
        key = next(iter(args)) if "x-queue-mode" not in args else "x-queue-mode"
        assert refusal(X.mode_and_version, b"q", "/", args).endswith(where.format(key) + tail)


def test_other_queue_types_arguments_are_refused_by_a_classic_queue() -> None:
    from shoal.broker.amqp import quorum

    quorum.check_classic(b"q", "/", {"x-delivery-limit": 5, "x-queue-mode": "lazy"})
    for key in ("x-max-age", "x-max-in-memory-length", "x-quorum-initial-group-size"):
        assert refusal(quorum.check_classic, b"q", "/", {key: 1}) == (
            f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/' of queue "
            "type rabbit_classic_queue"
        )
