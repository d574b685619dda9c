"""Exchange routing, as pure data structures (no IO, no shared memory).

Each IO worker will hold one `Router` built from the definitions catalog and
route every publish through it, so matching must stay fast with thousands of
bindings: direct is a dict, topic a trie walked once per routing key, fanout a
set. Destinations are queues or exchanges (exchange-to-exchange bindings);
routing follows exchange destinations once each (cycles are harmless) and
falls back to an exchange's `alternate-exchange` when nothing matched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from shoal.broker.amqp import consistent_hash
from shoal.broker.amqp.consistent_hash import CONSISTENT_HASH

# A destination: ("q", queue name) or ("e", exchange name).
Dest = tuple[str, str]


class TopicTrie:
    """AMQP topic matching: words separated by '.', '*' is exactly one word,
    '#' zero or more. One trie node per pattern word; matching walks the
    routing key once, branching only at '*' and '#' nodes."""

    __slots__ = ("_root",)

    def __init__(self) -> None:
        self._root = _Node()

    def add(self, pattern: str, dest: Dest) -> bool:
        """Whether `dest` is new to `pattern` (not there already)."""
        node = self._root
        for word in _words(pattern):
            children = node.children
            if children is _NO_CHILDREN:
                children = node.children = {}
            child = children.get(word)
            if child is None:
                child = children[word] = _Node()
            node = child
        dests = node.dests
        if dest in dests:
            return False
        if isinstance(dests, set):
            dests.add(dest)
        elif len(dests) < _FEW_DESTS:
            node.dests = (*dests, dest)
        else:
            node.dests = {*dests, dest}
        return True

    def remove(self, pattern: str, dest: Dest) -> None:
        path = [self._root]
        words = _words(pattern)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        leaf = path[-1]
        if isinstance(leaf.dests, set):
            leaf.dests.discard(dest)
        else:
            leaf.dests = tuple(d for d in leaf.dests if d != dest)
        # Prune empty nodes so a churn of bindings does not grow the trie.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str) -> set[Dest]:
        out: set[Dest] = set()
        words = _words(routing_key)
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
            out.update(node.dests)
            return
        word = words[i]
        exact = children.get(word)
        if exact is not None:
            self._match(exact, words, i + 1, out, seen)
        star = children.get("*")
        if star is not None:
            self._match(star, words, i + 1, out, seen)


def _words(key: str) -> list[str]:
    """RabbitMQ's split: the empty key has no words (not one empty word)."""
    return key.split(".") if key else []


_NO_CHILDREN: dict[str, _Node] = {}  # (shared by every leaf: never added to)
_FEW_DESTS = 4  # a node's dests in a tuple up to this many, then a set


class _Node:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        # A leaf's children and a node's few dests take no container of
        # their own: a fleet's subscriptions are a node each, with one dest
        # and no child (an empty dict is 64 bytes, a set of one 216, in the
        # scheduler and in every worker's copy of the routes).
        self.children: dict[str, _Node] = _NO_CHILDREN
        self.dests: set[Dest] | tuple[Dest, ...] = ()


X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


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
        ok = present and (value is None or _same_value(headers[key], value))
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    # all: nothing failed; any: nothing matched (an any-binding with no keys
    # matches nothing, as in RabbitMQ).
    return want_all


def _same_value(header: Any, bound: Any) -> bool:
    """RabbitMQ compares a header with a binding's value type and all: a
    boolean is not the number 1 (Python's True == 1 is)."""
    return header == bound and (header.__class__ is bool) == (bound.__class__ is bool)


MATCHING_TYPES = ("direct", "fanout", "topic", "headers")
# The delayed message exchange (RabbitMQ's community plugin, LavinMQ): a
# message with an x-delay header (ms > 0) is held in the exchange's delay
# queue (workers/delays.py) and routed when due, as its x-delayed-type
# exchange would route it; others are routed at once.
DELAYED = "x-delayed-message"
# RabbitMQ's message-deduplication plugin's exchange type: routes as fanout
# once its cache has let the message through (broker/amqp/dedup_arguments.py).
DEDUPLICATION = "x-message-deduplication"
EXCHANGE_TYPES = (*MATCHING_TYPES, DELAYED, DEDUPLICATION, CONSISTENT_HASH)
DELAY_QUEUE_PREFIX = "amq.delayed."


def delay_queue(exchange: str) -> str:
    """The name of a delayed message exchange's delay queue (amq.* names
    are the broker's: no client can declare one)."""
    return DELAY_QUEUE_PREFIX + exchange


def delay_ms(headers: Mapping[str, Any] | None) -> int:
    """A message's x-delay in ms (0: none, or not a positive integer)."""
    value = (headers or {}).get("x-delay")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 0


class Exchange:
    __slots__ = (
        "alternate",
        "arguments",
        "auto_delete",
        "bindings",
        "direct",
        "durable",
        "extra",
        "fanout",
        "headers",
        "internal",
        "kind",
        "name",
        "ring",
        "topic",
        "type",
    )

    def __init__(
        self,
        name: str,
        type_: str,
        alternate: str | None = None,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        if type_ not in EXCHANGE_TYPES:
            raise ValueError(f"unknown exchange type {type_!r}")
        self.name = name
        self.type = type_
        # How it matches bindings: its type, or a delayed exchange's x-delayed-type.
        kind = (arguments or {}).get("x-delayed-type") if type_ == DELAYED else type_
        if type_ == DEDUPLICATION:
            kind = "fanout"
        self.kind = kind if kind in (*MATCHING_TYPES, CONSISTENT_HASH) else "direct"
        self.alternate = alternate
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        # (dest, routing key, arguments) -> True: bindings are a set
        self.bindings: dict[tuple[Dest, str, tuple[tuple[str, Any], ...]], dict[str, Any]] = {}
        # The bindings beyond the first of one (dest, routing key) of a
        # direct or topic exchange, or of one dest of a fanout (they differ
        # in their arguments), by that pair or dest: whether an unbind
        # leaves the match its dest, without a scan of every binding (a
        # fleet's clean sessions leaving unbound one of n each: n² in all).
        # Most have one binding a pair, and no entry here.
        self.extra: dict[Any, int] = {}
        self.direct: dict[str, set[Dest]] = {}
        self.fanout: set[Dest] = set()
        self.topic = TopicTrie()
        self.headers: list[tuple[dict[str, Any], Dest]] = []
        # x-consistent-hash: each binding's destination as many times as its
        # weight (broker/amqp/consistent_hash.py).
        self.ring: list[Dest] = []

    def bind(
        self, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        args = _arguments(arguments)
        key = (dest, routing_key, frozen_args(args))
        if key in self.bindings:
            return False
        self.bindings[key] = args
        if self.kind == "direct":
            dests = self.direct.setdefault(routing_key, set())
            if dest in dests:
                self._count_extra((dest, routing_key), 1)
            dests.add(dest)
        elif self.kind == "fanout":
            if dest in self.fanout:
                self._count_extra(dest, 1)
            self.fanout.add(dest)
        elif self.kind == "topic":
            if not self.topic.add(routing_key, dest):
                self._count_extra((dest, routing_key), 1)
        elif self.kind == CONSISTENT_HASH:
            self._rering()
        else:
            self.headers.append((args, dest))
        return True

    def unbind(
        self, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None = None
    ) -> bool:
        args = _arguments(arguments)
        key = (dest, routing_key, frozen_args(args))
        if self.bindings.pop(key, None) is None:
            return False
        if self.kind == "direct":
            if not self._count_extra((dest, routing_key), -1):
                self.direct.get(routing_key, set()).discard(dest)
                if not self.direct.get(routing_key):
                    self.direct.pop(routing_key, None)
        elif self.kind == "fanout":
            if not self._count_extra(dest, -1):
                self.fanout.discard(dest)
        elif self.kind == "topic":
            if not self._count_extra((dest, routing_key), -1):
                self.topic.remove(routing_key, dest)
        elif self.kind == CONSISTENT_HASH:
            self._rering()
        else:
            self.headers.remove((args, dest))
        return True

    def _count_extra(self, key: Any, step: int) -> bool:
        """`extra[key] += step` (1: a binding more; -1: one fewer, where
        there was one more). Whether another binding stood behind the one
        an unbind takes (-1: it leaves the dest matched)."""
        n = self.extra.get(key, 0)
        if step < 0 and not n:
            return False
        if n + step:
            self.extra[key] = n + step
        else:
            del self.extra[key]
        return True

    def _rering(self) -> None:
        self.ring = consistent_hash.buckets([(d, rk) for d, rk, _a in self.bindings])

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Dest]:
        if self.kind == "direct":
            return set(self.direct.get(routing_key, ()))
        if self.kind == "fanout":
            return set(self.fanout)
        if self.kind == "topic":
            return self.topic.match(routing_key)
        return {dest for args, dest in self.headers if headers_match(args, headers)}


NO_ARGUMENTS: dict[str, Any] = {}  # every binding without arguments: read, never changed


def _arguments(arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """A binding's arguments as the routes keep them: most have none, and
    share one empty dict (64 bytes a binding twice, in the scheduler and in
    every worker's copy of the routes)."""
    return dict(arguments) if arguments else NO_ARGUMENTS


def frozen_args(args: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, repr(v)) for k, v in args.items()))


BindingKey = tuple[str, str, tuple[tuple[str, Any], ...]]  # source, routing key, frozen args


class Router:
    """All exchanges of a virtual host, with an index of bindings by
    destination so deleting a queue costs its own bindings, not all."""

    def __init__(self) -> None:
        self.exchanges: dict[str, Exchange] = {}
        self.by_dest: dict[Dest, dict[BindingKey, dict[str, Any]]] = {}
        # Exchange -> the alternate exchange a policy gives it
        # (broker/amqp/policy_rules.py); its own argument comes first.
        self.policy_alternates: dict[str, str] = {}

    def declare(
        self,
        name: str,
        type_: str,
        alternate: str | None = None,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            exchange = Exchange(name, type_, alternate, durable, auto_delete, internal, arguments)
            self.exchanges[name] = exchange
        return exchange

    def bind(
        self, source: str, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None
    ) -> bool:
        exchange = self.exchanges.get(source)
        if exchange is None or not exchange.bind(dest, routing_key, arguments):
            return False
        args = _arguments(arguments)
        self.by_dest.setdefault(dest, {})[(source, routing_key, frozen_args(args))] = args
        return True

    def unbind(
        self, source: str, dest: Dest, routing_key: str, arguments: Mapping[str, Any] | None
    ) -> bool:
        exchange = self.exchanges.get(source)
        if exchange is None or not exchange.unbind(dest, routing_key, arguments):
            return False
        index = self.by_dest.get(dest)
        if index is not None:
            index.pop((source, routing_key, frozen_args(dict(arguments or {}))), None)
            if not index:
                del self.by_dest[dest]
        return True

    def bindings_to(self, dest: Dest) -> list[tuple[str, str, dict[str, Any]]]:
        return [(src, rk, args) for (src, rk, _f), args in self.by_dest.get(dest, {}).items()]

    def drop_dest(self, dest: Dest) -> set[str]:
        """Remove every binding to `dest`; returns the source exchanges that
        lost a binding (the caller auto-deletes those left with none)."""
        sources = set()
        for source, rk, args in self.bindings_to(dest):
            self.unbind(source, dest, rk, args)
            sources.add(source)
        return sources

    def delete(self, name: str) -> set[str]:
        """Delete an exchange with its bindings, both ways; returns the
        exchanges that lost a binding to it."""
        exchange = self.exchanges.get(name)
        if exchange is None:
            return set()
        for dest, rk, _f in list(exchange.bindings):
            self.unbind(name, dest, rk, exchange.bindings.get((dest, rk, _f)))
        sources = self.drop_dest(("e", name))
        del self.exchanges[name]
        sources.discard(name)
        return sources

    def route(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> set[str]:
        """Queue names a message reaches. The default exchange ("") routes to
        the queue named like the routing key (the caller checks it exists)."""
        return self.route_checked(exchange, routing_key, headers)[0]

    def route_checked(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        due: bool = False,
        also: Sequence[str] = (),
        properties: Callable[[], Mapping[str, Any]] | None = None,
    ) -> tuple[set[str], bool]:
        """route(), plus whether the headers were consulted (a headers or a
        delayed exchange: then the result depends on the message, not only
        on its routing key). `headers` may be a function: it is called only
        if needed. `due`: a delayed message whose delay is over, routed
        from its delayed exchange `exchange` (not held again). `also`: more
        routing keys (CC and BCC), matched with the first at every exchange
        on the way, as rabbit_exchange:route matches a message's keys.
        `properties`: the message's properties by name, for a consistent-hash
        exchange's hash-property (consulting them counts as the headers)."""
        keys = (routing_key, *also) if also else (routing_key,)
        if exchange == "":
            return set(keys), False
        queues: set[str] = set()
        lazy = _LazyHeaders(headers, properties)
        if due:
            lazy.get()  # never cached: the same key with a delay is held
            visited = {exchange}
            x = self.exchanges.get(exchange)
            if x is not None:
                self._route_matches(x, keys, lazy, queues, visited)
            return queues, True
        self._route(exchange, keys, lazy, queues, set())
        return queues, lazy.used

    def _route(
        self,
        name: str,
        keys: tuple[str, ...],
        headers: _LazyHeaders,
        queues: set[str],
        visited: set[str],
    ) -> None:
        if name in visited:
            return  # exchange-to-exchange cycles route each message once
        visited.add(name)
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if exchange.type == DELAYED and delay_ms(headers.get()):
            queues.add(delay_queue(name))  # held until due (workers/delays.py)
            return
        self._route_matches(exchange, keys, headers, queues, visited)

    def _route_matches(
        self,
        exchange: Exchange,
        keys: tuple[str, ...],
        headers: _LazyHeaders,
        queues: set[str],
        visited: set[str],
    ) -> None:
        before = len(queues)
        found_exchange = False
        table = headers.get() if exchange.kind == "headers" else None
        for routing_key in keys:
            if exchange.kind == CONSISTENT_HASH:  # (one destination, by the first key)
                picked = consistent_hash.pick(
                    exchange.ring, exchange.arguments, keys[0], headers.get, headers.props
                )
                matched: Iterable[Dest] = () if picked is None else (picked,)
            else:
                matched = exchange.match(routing_key, table)
            for kind, dest in matched:
                if kind == "q":
                    queues.add(dest)
                else:
                    found_exchange = True
                    self._route(dest, keys, headers, queues, visited)
            if exchange.kind == CONSISTENT_HASH:
                break
        if len(queues) == before and not found_exchange:
            alternate = exchange.alternate or self.policy_alternates.get(exchange.name)
            if alternate:
                self._route(alternate, keys, headers, queues, visited)

    def unbind_all(self, dest: Dest) -> None:
        """A queue or exchange was deleted: drop every binding to it,
        including those made directly on an Exchange (not indexed)."""
        self.drop_dest(dest)
        for exchange in self.exchanges.values():
            for d, rk, args in list(exchange.bindings):
                if d == dest:
                    exchange.unbind(d, rk, dict(exchange.bindings[(d, rk, args)]))


class _LazyHeaders:
    __slots__ = ("properties", "source", "table", "used")

    def __init__(
        self,
        source: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None,
        properties: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.source = source
        self.properties = properties
        self.table: Mapping[str, Any] | None = None
        self.used = False

    def props(self) -> Mapping[str, Any]:
        """The message's properties by name (none known: empty)."""
        self.used = True
        return self.properties() if self.properties is not None else {}

    def get(self) -> Mapping[str, Any]:
        if not self.used:
            self.used = True
            source = self.source
            self.table = source() if callable(source) else source
        return self.table or {}


def declare_defaults(router: Router) -> Iterable[Exchange]:
    """The amq.* exchanges every virtual host has."""
    return [
        router.declare("amq.direct", "direct"),
        router.declare("amq.fanout", "fanout"),
        router.declare("amq.topic", "topic"),
        router.declare("amq.headers", "headers"),
        router.declare("amq.match", "headers"),
    ]
