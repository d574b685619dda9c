"""Exchange routing, as pure data structures (no IO, no shared memory).

Each IO worker will hold one `Router` built from the definitions catalog and
route every publish through it, so matching must stay fast with thousands of
bindings: direct is a dict, topic a trie walked once per routing key, fanout a
set. Destinations are queues or exchanges (exchange-to-exchange bindings);
routing follows exchange destinations once each (cycles are harmless) and
falls back to an exchange's `alternate-exchange` when nothing matched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# A destination: ("q", queue name) or ("e", exchange name).
Dest = tuple[str, str]


class TopicTrie:
    """AMQP topic matching: words separated by '.', '*' is exactly one word,
    '#' zero or more. One trie node per pattern word; matching walks the
    routing key once, branching only at '*' and '#' nodes."""

    __slots__ = ("_root",)

    def __init__(self) -> None:
        self._root = _Node()

    def add(self, pattern: str, dest: Dest) -> None:
        node = self._root
        for word in pattern.split("."):
            node = node.children.setdefault(word, _Node())
        node.dests.add(dest)

    def remove(self, pattern: str, dest: Dest) -> None:
        path = [self._root]
        words = pattern.split(".")
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        path[-1].dests.discard(dest)
        # Prune empty nodes so a churn of bindings does not grow the trie.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str) -> set[Dest]:
        out: set[Dest] = set()
        words = routing_key.split(".")
        self._match(self._root, words, 0, out, set())
        return out

    def _match(
        self, node: _Node, words: list[str], i: int, out: set[Dest], seen: set[tuple[int, int]]
    ) -> None:
        # `seen` stops the exponential blow-up of patterns like #.#.#.
        key = (id(node), i)
        if key in seen:
            return
        seen.add(key)
        children = node.children
        hash_node = children.get("#")
        if hash_node is not None:
            # '#' swallows words[i:j] for every j >= i.
            for j in range(i, len(words) + 1):
                self._match(hash_node, words, j, out, seen)
        if i == len(words):
            out |= node.dests
            return
        word = words[i]
        exact = children.get(word)
        if exact is not None:
            self._match(exact, words, i + 1, out, seen)
        star = children.get("*")
        if star is not None:
            self._match(star, words, i + 1, out, seen)


class _Node:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.dests: set[Dest] = set()


def headers_match(binding: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """RabbitMQ's headers exchange: `x-match` is all (default), any,
    all-with-x or any-with-x; other `x-` binding arguments are ignored unless
    the mode ends in -with-x. A binding value of void (None) matches on the
    header's presence."""
    mode = binding.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode()
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    headers = headers or {}
    for key, value in binding.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        present = key in headers
        ok = present and (value is None or headers[key] == value)
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    # all: nothing failed; any: nothing matched (an any-binding with no keys
    # matches nothing, as in RabbitMQ).
    return want_all


class Exchange:
    __slots__ = ("alternate", "bindings", "direct", "fanout", "headers", "name", "topic", "type")

    def __init__(self, name: str, type_: str, alternate: str | None = None) -> None:
        if type_ not in ("direct", "fanout", "topic", "headers"):
            raise ValueError(f"unknown exchange type {type_!r}")
        self.name = name
        self.type = type_
        self.alternate = alternate
        # (dest, routing key, arguments) -> True: bindings are a set
        self.bindings: dict[tuple[Dest, str, tuple[tuple[str, Any], ...]], dict[str, Any]] = {}
        self.direct: dict[str, set[Dest]] = {}
        self.fanout: set[Dest] = set()
        self.topic = TopicTrie()
        self.headers: list[tuple[dict[str, Any], Dest]] = []

    def bind(
        self, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        args = dict(arguments or {})
        key = (dest, routing_key, _frozen(args))
        if key in self.bindings:
            return False
        self.bindings[key] = args
        if self.type == "direct":
            self.direct.setdefault(routing_key, set()).add(dest)
        elif self.type == "fanout":
            self._refanout()
        elif self.type == "topic":
            self.topic.add(routing_key, dest)
        else:
            self.headers.append((args, dest))
        return True

    def unbind(
        self, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        args = dict(arguments or {})
        key = (dest, routing_key, _frozen(args))
        if self.bindings.pop(key, None) is None:
            return False
        if self.type == "direct":
            still = any(d == dest and rk == routing_key for d, rk, _ in self.bindings)
            if not still:
                self.direct.get(routing_key, set()).discard(dest)
                if not self.direct.get(routing_key):
                    self.direct.pop(routing_key, None)
        elif self.type == "fanout":
            self._refanout()
        elif self.type == "topic":
            still = any(d == dest and rk == routing_key for d, rk, _ in self.bindings)
            if not still:
                self.topic.remove(routing_key, dest)
        else:
            self.headers.remove((args, dest))
        return True

    def _refanout(self) -> None:
        self.fanout = {d for d, _rk, _a in self.bindings}

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Dest]:
        if self.type == "direct":
            return set(self.direct.get(routing_key, ()))
        if self.type == "fanout":
            return set(self.fanout)
        if self.type == "topic":
            return self.topic.match(routing_key)
        return {dest for args, dest in self.headers if headers_match(args, headers)}


def _frozen(args: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in args.items()))


class Router:
    """All exchanges of a virtual host."""

    def __init__(self) -> None:
        self.exchanges: dict[str, Exchange] = {}

    def declare(self, name: str, type_: str, alternate: str | None = None) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            exchange = self.exchanges[name] = Exchange(name, type_, alternate)
        return exchange

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> set[str]:
        """Queue names a message reaches. The default exchange ("") routes to
        the queue named like the routing key (the caller checks it exists)."""
        if exchange == "":
            return {routing_key}
        queues: set[str] = set()
        self._route(exchange, routing_key, headers, queues, set())
        return queues

    def _route(
        self,
        name: str,
        routing_key: str,
        headers: Mapping[str, Any] | None,
        queues: set[str],
        visited: set[str],
    ) -> None:
        if name in visited:
            return  # exchange-to-exchange cycles route each message once
        visited.add(name)
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        before = len(queues)
        found_exchange = False
        for kind, dest in exchange.match(routing_key, headers):
            if kind == "q":
                queues.add(dest)
            else:
                found_exchange = True
                self._route(dest, routing_key, headers, queues, visited)
        if len(queues) == before and not found_exchange and exchange.alternate:
            self._route(exchange.alternate, routing_key, headers, queues, visited)

    def unbind_all(self, dest: Dest) -> None:
        """A queue or exchange was deleted: drop every binding to it."""
        for exchange in self.exchanges.values():
            for d, rk, args in list(exchange.bindings):
                if d == dest:
                    exchange.unbind(d, rk, dict(exchange.bindings[(d, rk, args)]))


def declare_defaults(router: Router) -> Iterable[Exchange]:
    """The amq.* exchanges every virtual host has."""
    return [
        router.declare("amq.direct", "direct"),
        router.declare("amq.fanout", "fanout"),
        router.declare("amq.topic", "topic"),
        router.declare("amq.headers", "headers"),
        router.declare("amq.match", "headers"),
    ]
