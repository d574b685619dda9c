"""Exchange routing semantics (RabbitMQ's), as pure data structures."""

from __future__ import annotations

import pytest

from shoal.broker.amqp.routing import Router, TopicTrie, headers_match

# (pattern, routing key, matches) — RabbitMQ's topic semantics.
TOPIC_CASES = [
    ("a.b.c", "a.b.c", True),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("#", "", True),
    ("#", "anything.at.all", True),
    ("*", "", False),  # the empty key has no words (RabbitMQ)
    ("*", "a.b", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.b.x.c", True),
    ("a.#.c", "a.b.x.d", False),
    ("#.c", "c", True),
    ("#.#.c", "a.c", True),
    ("*.#", "a", True),
    ("*.*.#", "a", False),
    ("a.b", "a.b.c", False),
    ("a..b", "a..b", True),
    ("#.*", "", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_CASES)
def test_topic_matching(pattern: str, key: str, expected: bool) -> None:
    trie = TopicTrie()
    trie.add(pattern, ("q", "x"))
    assert (trie.match(key) == {("q", "x")}) is expected


def test_topic_remove_prunes_and_keeps_others() -> None:
    trie = TopicTrie()
    trie.add("a.*", ("q", "1"))
    trie.add("a.*.c", ("q", "2"))
    trie.remove("a.*.c", ("q", "2"))
    assert trie.match("a.b.c") == set()
    assert trie.match("a.b") == {("q", "1")}
    trie.remove("a.*", ("q", "1"))
    assert trie._root.children == {}


def test_a_pattern_keeps_its_dests_however_many_come_and_go() -> None:
    """A node keeps a few dests in a tuple and more in a set (routing.py
    _FEW_DESTS): each add and remove, across that line both ways, leaves
    the pattern matching exactly the dests bound to it."""
    trie = TopicTrie()
    dests = [("q", str(i)) for i in range(9)]
    bound: set[tuple[str, str]] = set()
    for d in dests:
        assert trie.add("a.*", d)
        assert not trie.add("a.*", d)  # (there already)
        bound.add(d)
        assert trie.match("a.b") == bound
    for d in dests[::2] + dests[1::2]:
        trie.remove("a.*", d)
        bound.discard(d)
        assert trie.match("a.b") == bound
        assert trie.add("a.#", d) and trie.match("a.b") == bound | {d}
        trie.remove("a.#", d)
    assert trie._root.children == {}
    for d in dests[:3]:  # and back: a tuple again
        assert trie.add("a.*", d)
    assert trie.match("a.b") == set(dests[:3])


def test_pathological_hashes_stay_fast() -> None:
    trie = TopicTrie()
    trie.add(".".join(["#"] * 20) + ".x", ("q", "p"))
    assert trie.match(".".join(["w"] * 60)) == set()  # would never finish without memo


@pytest.mark.parametrize(
    ("binding", "headers", "expected"),
    [
        ({"x-match": "all", "a": 1, "b": "2"}, {"a": 1, "b": "2", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "2"}, {"a": 1}, False),
        ({"x-match": "any", "a": 1, "b": "2"}, {"b": "2"}, True),
        ({"x-match": "any", "a": 1}, {"a": 2}, False),
        ({"a": 1}, {"a": 1}, True),  # all is the default
        ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # presence
        ({"x-match": "all", "x-k": 1}, {}, True),  # x- keys ignored ...
        ({"x-match": "all-with-x", "x-k": 1}, {}, False),  # ... unless -with-x
        ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "all"}, None, True),
        ({"a": True}, {"a": 1}, False),  # a boolean is not a number (RabbitMQ's types)
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": 1}, {"a": 1.0}, True),
    ],
)
def test_headers_matching(binding: dict, headers: dict | None, expected: bool) -> None:
    assert headers_match(binding, headers) is expected


def test_direct_fanout_and_unbind() -> None:
    r = Router()
    r.declare("d", "direct").bind(("q", "q1"), "rk")
    r.exchanges["d"].bind(("q", "q2"), "rk")
    assert r.route("d", "rk") == {"q1", "q2"}
    assert r.route("d", "other") == set()
    assert r.exchanges["d"].unbind(("q", "q1"), "rk")
    assert not r.exchanges["d"].unbind(("q", "q1"), "rk")
    assert r.route("d", "rk") == {"q2"}
    f = r.declare("f", "fanout")
    f.bind(("q", "a"), "")
    f.bind(("q", "b"), "ignored")
    assert r.route("f", "whatever") == {"a", "b"}
    assert r.route("", "named") == {"named"}


@pytest.mark.parametrize(
    ("kind", "key", "routed_by"),
    [
        ("direct", "rk", "rk"),
        ("topic", "a.*", "a.b"),
        ("fanout", "k1", "anything"),
    ],
)
def test_a_binding_that_differs_in_its_arguments_keeps_the_route(
    kind: str, key: str, routed_by: str
) -> None:
    """Two bindings of one queue and key that differ only in their
    arguments: unbinding one leaves the other routing; unbinding both
    stops it, and another queue's binding is untouched throughout."""
    r = Router()
    e = r.declare("x", kind)
    assert e.bind(("q", "twice"), key, {"x-a": 1})
    assert e.bind(("q", "twice"), key, {"x-a": 2})
    assert e.bind(("q", "twice"), "k2" if kind == "fanout" else key + "z", {})
    assert e.bind(("q", "other"), key)
    assert r.route("x", routed_by) == {"twice", "other"}
    assert e.unbind(("q", "twice"), key, {"x-a": 1})
    assert r.route("x", routed_by) == {"twice", "other"}
    assert not e.unbind(("q", "twice"), key, {"x-a": 1})  # (gone already: counted once)
    assert e.unbind(("q", "twice"), key, {"x-a": 2})
    # a fanout routes to a queue while any of its bindings is left
    assert r.route("x", routed_by) == ({"twice", "other"} if kind == "fanout" else {"other"})
    assert e.unbind(("q", "twice"), "k2" if kind == "fanout" else key + "z", {})
    assert r.route("x", routed_by) == {"other"}
    assert e.bind(("q", "twice"), key, {"x-a": 1})  # and back
    assert r.route("x", routed_by) == {"twice", "other"}


def test_exchange_to_exchange_with_a_cycle_routes_once() -> None:
    r = Router()
    r.declare("t", "topic").bind(("e", "f"), "orders.#")
    r.declare("f", "fanout").bind(("q", "all-orders"), "")
    r.exchanges["f"].bind(("e", "t"), "")  # a cycle back
    r.exchanges["t"].bind(("q", "eu"), "orders.eu.*")
    assert r.route("t", "orders.eu.new") == {"all-orders", "eu"}
    assert r.route("t", "invoices.x") == set()


def test_alternate_exchange_takes_the_unroutable() -> None:
    r = Router()
    r.declare("ae", "fanout").bind(("q", "unrouted"), "")
    r.declare("main", "direct", alternate="ae").bind(("q", "known"), "k")
    assert r.route("main", "k") == {"known"}
    assert r.route("main", "nope") == {"unrouted"}


def test_unbind_all_when_a_queue_goes() -> None:
    r = Router()
    r.declare("d", "direct").bind(("q", "gone"), "a")
    r.declare("t", "topic").bind(("q", "gone"), "#")
    r.exchanges["t"].bind(("q", "stays"), "#")
    r.unbind_all(("q", "gone"))
    assert r.route("d", "a") == set()
    assert r.route("t", "x") == {"stays"}
