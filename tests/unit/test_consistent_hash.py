"""The consistent-hash exchange's rules (broker/amqp/consistent_hash.py)."""

from __future__ import annotations

import pytest

from shoal.broker.amqp import consistent_hash as H
from shoal.broker.amqp import errors
from shoal.broker.amqp.routing import Router


def test_jump_spreads_evenly_and_a_new_bucket_takes_keys_only_for_itself() -> None:
    keys = range(0, 20_000 * 7919, 7919)
    before = [H.jump(k * 0x9E3779B97F4A7C15 & (2**64 - 1), 4) for k in keys]
    after = [H.jump(k * 0x9E3779B97F4A7C15 & (2**64 - 1), 5) for k in keys]
    shares = [before.count(b) / len(before) for b in range(4)]
    assert all(0.22 < share < 0.28 for share in shares), shares
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == 4 for _b, a in moved)  # a key moves only to the new bucket
    assert 0.17 < len(moved) / len(before) < 0.23


def test_weights_lay_buckets_end_to_end_in_binding_order() -> None:
    assert H.buckets([("a", "1"), ("b", "3"), ("c", "x")]) == ["a", "b", "b", "b"]


def test_a_routers_exchange_picks_one_queue_per_key_by_weight() -> None:
    router = Router()
    router.declare("h", H.CONSISTENT_HASH)
    for queue, weight in (("q1", "1"), ("q2", "1"), ("q3", "2")):
        router.bind("h", ("q", queue), weight, {})
    picked = [router.route("h", f"key-{i}") for i in range(4000)]
    assert all(len(p) == 1 for p in picked)
    counts = {q: sum(q in p for p in picked) for q in ("q1", "q2", "q3")}
    assert 850 < counts["q1"] < 1150 and 850 < counts["q2"] < 1150, counts
    assert 1800 < counts["q3"] < 2200, counts
    assert router.route("h", "key-7") == router.route("h", "key-7")
    router.unbind("h", ("q", "q3"), "2", {})
    assert {q for p in (router.route("h", f"key-{i}") for i in range(200)) for q in p} == {
        "q1",
        "q2",
    }
    assert Router().route("h", "k") == set()


def test_hash_header_and_hash_property_choose_the_key() -> None:
    router = Router()
    router.declare("hh", H.CONSISTENT_HASH, arguments={"hash-header": "user"})
    router.declare("hp", H.CONSISTENT_HASH, arguments={"hash-property": "message_id"})
    for x in ("hh", "hp"):
        for i in range(8):
            router.bind(x, ("q", f"q{i}"), "1", {})
    by_header = {
        frozenset(router.route_checked("hh", f"rk{i}", {"user": "alice"})[0]) for i in range(50)
    }
    assert len(by_header) == 1  # the routing key does not count
    routed, consulted = router.route_checked(
        "hp", "rk", None, properties=lambda: {"message_id": "m1"}
    )
    assert (
        consulted
        and routed
        == router.route_checked("hp", "other", None, properties=lambda: {"message_id": "m1"})[0]
    )
    assert router.route_checked("hh", "rk", None)[1]  # the headers read: not cached
    assert router.route_checked("hh", "rk", None)[0] != set()  # absent: still routed


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"hash-header": "h", "hash-property": "message_id"},
            "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive",
        ),
        ({"hash-property": "app_id"}, "PRECONDITION_FAILED - Unsupported property: app_id"),
    ],
)
def test_declare_arguments_are_refused_in_the_plugins_words(
    arguments: dict[str, str], text: str
) -> None:
    with pytest.raises(errors.ChannelError) as refused:
        H.check_arguments(arguments)
    assert (refused.value.reply_code, refused.value.reply_text) == (406, text)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("abc", 'The binding key must be an integer: <<"abc">>'),
        ("", "The binding key must be an integer: <<>>"),
        ("0", "The binding key must be greater than 0"),
        ("-1", "The binding key must be greater than 0"),
    ],
)
def test_a_weight_must_be_a_positive_integer(key: str, text: str) -> None:
    with pytest.raises(errors.ChannelError) as refused:
        H.check_weight(key)
    assert refused.value.reply_text == f"PRECONDITION_FAILED - {text}"
    H.check_weight("3")
