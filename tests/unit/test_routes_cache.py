"""The route cache of an IO worker (workers/routes.py) against routing
afresh: after every change of a random sequence (queue bindings of each
exchange type with and without wildcards, unbindings, queues ending, queues
made and deleted in the catalog, exchange bindings, alternate exchanges by
argument and by policy, permissions), each probe routed through the one
long-lived `Routes`, whose cache forgets only what a change may touch, gets
what a `Routes` built at that moment gets from the journal."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.amqp import definitions as D
from shoal.broker.amqp import errors
from shoal.broker.scheduler.durable import Restored
from shoal.shm import layout as L
from shoal.shm.catalog import CatalogWriter
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.workers.connection_access import WRITE, ConnectionAccess
from shoal.workers.routes import Routes

QUEUES = [f"q{i}" for i in range(6)]
BINDING_KEYS = ["a.b", "a.c", "b", "", "a.*", "*.b", "#", "a.#", "q1", "q2"]
ROUTING_KEYS = [b"a.b", b"a.c", b"b", b"", b"a.b.c", b"q1", b"q2", b"zz"]
EXCHANGES = {"xt": "topic", "xd": "direct", "xf": "fanout", "xh": "x-consistent-hash"}
VHOSTS = ["/", "v2"]


class Journal:
    """The scheduler's side: its definitions, the journal and the catalog."""

    def __init__(self, seg: Segment) -> None:
        self.defs = D.Definitions()
        self.writer = CatalogWriter(seg, D.Op)
        ops = [*Restored().operations("/", "guest", "guest"), D.VHostAdded("v2", 7)]
        for vhost in VHOSTS:
            for name, kind in EXCHANGES.items():
                ops.append(D.ExchangeDeclared(vhost, name, kind, True, False, False, {}))
            ops.append(D.ExchangeDeclared(vhost, "xi", "topic", True, False, True, {}))
            ops.append(D.ExchangeDeclared(vhost, "xa", "fanout", True, False, False, {}))
        for op in ops:
            self.defs.apply(op)
        self.writer.compact(ops)
        self.shared = SharedQueues(seg)
        self.qids: dict[tuple[str, str], int] = {}
        self.bindings: list[D.Bound] = []
        self.made = 0

    def do(self, op: D.Op) -> None:
        self.defs.apply(op)
        self.writer.append(op, self.defs.snapshot)

    def vhost_id(self, vhost: str) -> int:
        return self.defs.vhost_ids[vhost]

    def make_queue(self, vhost: str, name: str) -> None:
        if (vhost, name) in self.qids:
            return
        used = set(self.qids.values())
        qid = next(q for q in range(64) if q not in used)
        self.shared.create(qid, name.encode(), 0, 0, vhost=self.vhost_id(vhost))
        self.qids[(vhost, name)] = qid

    def delete_queue(self, vhost: str, name: str) -> None:
        qid = self.qids.pop((vhost, name), None)
        if qid is not None:
            self.shared.remove(qid)

    def step(self, rnd: random.Random) -> None:
        vhost = rnd.choice(VHOSTS)
        choice = rnd.random()
        if choice < 0.35:
            op = D.Bound(
                vhost,
                rnd.choice(list(EXCHANGES)) if rnd.random() < 0.9 else "xi",
                "q",
                rnd.choice(QUEUES),
                rnd.choice(BINDING_KEYS),
                {},
            )
            self.bindings.append(op)
            self.do(op)
        elif choice < 0.5 and self.bindings:
            b = self.bindings.pop(rnd.randrange(len(self.bindings)))
            self.do(D.Unbound(b.vhost, b.source, b.kind, b.dest, b.routing_key, b.arguments))
        elif choice < 0.6:
            name = rnd.choice(QUEUES)
            self.do(D.QueueGone(vhost, name))
            self.bindings = [b for b in self.bindings if (b.vhost, b.dest) != (vhost, name)]
            self.delete_queue(vhost, name)
        elif choice < 0.75:
            self.make_queue(vhost, rnd.choice(QUEUES))
        elif choice < 0.82:
            self.delete_queue(vhost, rnd.choice(QUEUES))
        elif choice < 0.86:
            source, dest = rnd.sample(list(EXCHANGES), 2)
            op = D.Bound(vhost, source, "e", dest, rnd.choice(BINDING_KEYS), {})
            self.bindings.append(op)
            self.do(op)
        elif choice < 0.89:
            self.made += 1
            arguments = {"alternate-exchange": "xa"}
            name = f"new{self.made}"
            self.do(D.ExchangeDeclared(vhost, name, "direct", True, False, False, arguments))
            self.do(D.Bound(vhost, "xa", "q", rnd.choice(QUEUES), "", {}))
        elif choice < 0.92:
            definition = {"alternate-exchange": "xa"}
            self.do(D.PolicySet(vhost, "ae", "^x[dt]$", "exchanges", 0, definition))
        elif choice < 0.94:
            self.do(D.PolicyCleared(vhost, "ae"))
        else:
            self.do(D.PermissionSet(vhost, "guest", ".*", ".*", ".*"))


def routed(
    routes: Routes, vhost: str, vhost_id: int, exchange: bytes, key: bytes, own: bool
) -> Any:
    try:
        return sorted(routes.route(vhost, vhost_id, exchange, key, b"", own=own))
    except errors.AMQPError as exc:
        return type(exc), str(exc)


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[Segment]:
    seg = Segment.create(
        str(tmp_path / "seg"),
        L.Limits(max_workers=1, max_queues=64, queue_capacity=16, arena_bytes=1 << 16),
    )
    yield seg
    seg.unlink()


@pytest.mark.parametrize("seed", range(6))
def test_a_cached_route_is_what_routing_afresh_gives(seg: Segment, seed: int) -> None:
    rnd = random.Random(seed)
    journal = Journal(seg)
    cached = Routes(seg, SharedQueues(seg))
    probes = [
        (vhost, exchange.encode(), key, own)
        for vhost in VHOSTS
        for exchange in [*EXCHANGES, "xi", "new1"]
        for key in ROUTING_KEYS
        for own in (False, True)
    ]
    for step in range(150):
        journal.step(rnd)
        fresh = Routes(seg, SharedQueues(seg))
        for vhost, exchange, key, own in probes:
            vhost_id = journal.vhost_id(vhost)
            want = routed(fresh, vhost, vhost_id, exchange, key, own)
            for _ in range(2):  # (the second from the cache, where it keeps one)
                got = routed(cached, vhost, vhost_id, exchange, key, own)
                assert got == want, (seed, step, vhost, exchange, key, own)


def test_a_change_forgets_only_the_entries_it_touches(seg: Segment) -> None:
    """What the cache keeps (the reason it exists): a binding of another
    key, a queue made elsewhere and a permission leave an entry in place."""
    journal = Journal(seg)
    journal.make_queue("/", "q0")
    journal.do(D.Bound("/", "xt", "q", "q0", "a.b", {}))
    routes = Routes(seg, SharedQueues(seg))
    vhost_id = journal.vhost_id("/")
    assert routed(routes, "/", vhost_id, b"xt", b"a.b", False) == [journal.qids[("/", "q0")]]
    assert routes.cached(vhost_id, b"xt", b"a.b")
    journal.do(D.Bound("/", "xt", "q", "q1", "a.c", {}))
    journal.make_queue("/", "q2")
    journal.do(D.PermissionSet("/", "guest", ".*", ".*", ".*"))
    routes.sync()
    assert routes.cached(vhost_id, b"xt", b"a.b")
    journal.do(D.Bound("/", "xt", "q", "q1", "a.*", {}))
    routes.sync()
    assert not routes.cached(vhost_id, b"xt", b"a.b")


@pytest.mark.parametrize("way", ["exchange binding", "alternate exchange", "policy's alternate"])
def test_a_binding_reached_through_another_exchange_changes_its_route(
    seg: Segment, way: str
) -> None:
    """A queue bound to exchange xa changes what xd routes where xd reaches
    xa: by an exchange binding, or as its alternate exchange (its argument
    or a policy's). The entry of xd's key is forgotten with the binding."""
    journal = Journal(seg)
    journal.make_queue("/", "q0")
    journal.make_queue("/", "q1")
    journal.do(D.Bound("/", "xd", "q", "q0", "k", {}))
    if way == "exchange binding":
        journal.do(D.Bound("/", "xd", "e", "xa", "other", {}))
        source = b"xd"
    elif way == "alternate exchange":
        arguments = {"alternate-exchange": "xa"}
        journal.do(D.ExchangeDeclared("/", "xn", "direct", True, False, False, arguments))
        source = b"xn"
    else:
        definition = {"alternate-exchange": "xa"}
        journal.do(D.PolicySet("/", "ae", "^xd$", "exchanges", 0, definition))
        source = b"xd"
    routes = Routes(seg, SharedQueues(seg))
    vhost_id = journal.vhost_id("/")
    key = b"other" if source == b"xd" else b"k"
    assert routed(routes, "/", vhost_id, source, key, False) == []
    assert routes.cached(vhost_id, source, key)
    journal.do(D.Bound("/", "xa", "q", "q1", "", {}))  # (fanout: any key)
    assert routed(routes, "/", vhost_id, source, key, False) == [journal.qids[("/", "q1")]]


ACCESS_EXCHANGES = [b"xt", b"xd", b"amq.topic", b""]
ACCESS_KEYS = [b"a.b", b"b", b"secret.x"]


def access_step(journal: Journal, rnd: random.Random) -> None:
    """A change of a permission, a topic permission, the firehose or the
    user, or (half the time) one of the queues and routes."""
    if rnd.random() < 0.5:
        journal.step(rnd)
        return
    choice = rnd.random()
    pattern = rnd.choice([".*", "^x.*", "^$", "^amq\\..*"])
    if choice < 0.3:
        journal.do(D.PermissionSet("/", "guest", ".*", pattern, ".*"))
    elif choice < 0.4:
        journal.do(D.PermissionCleared("/", "guest"))
    elif choice < 0.6:
        exchange = rnd.choice(["xt", "amq.topic"])
        journal.do(D.TopicPermissionSet("/", "guest", exchange, rnd.choice(["^a", ".*"]), ".*"))
    elif choice < 0.7:
        journal.do(D.TopicPermissionCleared("/", "guest", ""))
    elif choice < 0.85:
        journal.do(D.TracingSet("/", rnd.random() < 0.5))
    elif choice < 0.92:
        journal.do(D.UserDeleted("guest"))  # (its permissions with it)
    else:
        journal.do(D.UserSet("guest", "", "", ["administrator"], {}))


def decisions(access: ConnectionAccess) -> list[Any]:
    access.refresh()
    got: list[Any] = [access.tracing]
    for exchange in ACCESS_EXCHANGES:
        for key in ACCESS_KEYS:
            got.append(access.may_publish(exchange, key))
        got.append(access.allowed(WRITE, "exchange", exchange.decode()))
    return got


@pytest.mark.parametrize("seed", range(4))
def test_a_connections_access_decisions_follow_every_change(seg: Segment, seed: int) -> None:
    """ConnectionAccess keeps its decisions through changes that decide no
    permission (Routes.access_version: a fleet's queues and bindings coming
    and going): after each change of a random run, a connection that has
    lived through all of them decides as one made now."""
    rnd = random.Random(seed)
    journal = Journal(seg)
    routes = Routes(seg, SharedQueues(seg))
    lived = ConnectionAccess(routes, "guest", "/")
    kept = 0
    for step in range(200):
        before = routes.access_version
        access_step(journal, rnd)
        fresh = ConnectionAccess(Routes(seg, SharedQueues(seg)), "guest", "/")
        assert decisions(lived) == decisions(fresh), (seed, step)
        kept += routes.access_version == before
    assert kept > 50  # (the changes that decide nothing left the decisions in place)
