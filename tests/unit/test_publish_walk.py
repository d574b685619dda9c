"""The walk of a publish, followed call by call.

docs/ARCHITECTURE.md ("The walk, module by module") names the modules a
publish passes through, from its frames to the queue's log and back as a
confirm, and what each calls below it. Here a real publish runs through one
IO worker's real parts without sockets (tests/unit/test_connection.py's
client), transient and persistent, under Python's profiler hook, which sees
every call from one module into another. A call into a module the walk does
not name fails: a hidden hook, or a walk the document no longer tells.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.body import ContentBody

import shoal.workers
from shoal.shm import layout as L
from shoal.shm.queues import SharedQueues
from shoal.workers.context import WorkerContext
from tests.unit.test_connection import Client, worker_context

DOC = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"
MAX_WALK = 6


def documented_walk() -> tuple[list[str], set[str]]:
    """(the walk's modules in order, the modules they call below them), from
    the table under docs/ARCHITECTURE.md's "The walk, module by module"."""
    text = DOC.read_text()
    section = text.split("### The walk, module by module", 1)[1].split("\n#", 1)[0]
    walk: list[str] = []
    below: set[str] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        walk.append(cells[1].strip("`"))
        below.update(re.findall(r"`((?:workers|shm|store|broker)/[\w/]+\.(?:py|c))`", cells[3]))
    return walk, below


# Where the broker's packages are imported from (.build/import/shoal/): by
# that prefix, not by a "/shoal/" anywhere in the path, which a checkout in a
# directory called shoal (git clone's default) has in every file's, its
# virtual environment's and the tests' too.
PACKAGE = str(Path(shoal.workers.__file__).parent.parent).replace("\\", "/") + "/"


def module_of(code: Any) -> str | None:
    """`workers/publish.py` for a function of the broker's packages, else None."""
    name = code.co_filename.replace("\\", "/")
    if not name.startswith(PACKAGE):
        return None
    return name[len(PACKAGE) :]


class CallTrace:
    """Every call from one module of the broker into another (Python
    functions; C functions are part of the module that calls them)."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, str]] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = module_of(frame.f_code)
        caller = module_of(frame.f_back.f_code) if frame.f_back is not None else None
        if callee is not None and callee != caller:
            edge = (caller or "(event loop)", callee, frame.f_code.co_qualname)
            if edge not in self.edges:
                self.edges.append(edge)

    def __enter__(self) -> CallTrace:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    limits = L.Limits(max_workers=1, max_queues=64, queue_capacity=64, arena_bytes=1 << 20)
    for context in worker_context(tmp_path, limits):
        dirs = [tmp_path / sub for sub in ("messages", "paging", "streams")]
        for d in dirs:
            d.mkdir()
        context.open_store(*map(str, dirs))
        yield context
        if context.persist is not None:
            context.persist.close()


def publish(client: Client, persistent: bool) -> bytes:
    props = C.Basic.Properties(delivery_mode=2 if persistent else None)
    return (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="walk"), 1)
        + pamqp_frame.marshal(pamqp_header.ContentHeader(0, 5, props), 1)
        + pamqp_frame.marshal(ContentBody(b"hello"), 1)
    )


def confirmed(client: Client, tag: int) -> bool:
    return any(isinstance(f, C.Basic.Ack) and f.delivery_tag == tag for _ch, f in client.received())


def walk_of(ctx: WorkerContext, persistent: bool) -> CallTrace:
    """Three publishes (the first goes the general way, later ones may take
    the connection's lane), each followed until its confirm is written."""
    SharedQueues(ctx.seg).create(0, b"walk", L.QF_DURABLE if persistent else 0, 0, uid=7)
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(1, C.Confirm.Select())
    client.received()
    with CallTrace() as trace:
        for tag in (1, 2, 3):
            client.send(publish(client, persistent))
            for _ in range(500):  # the sync thread's answer: at most 5 s
                if confirmed(client, tag):
                    break
                ctx.loop.run_until_complete(asyncio.sleep(0.01))
            else:
                raise AssertionError(f"publish {tag} was not confirmed")
    assert SharedQueues(ctx.seg).table.ready(0) == 3
    return trace


def stray_calls(edges: list[tuple[str, str, str]], walk: list[str], below: set[str]) -> list[str]:
    """The calls into a module neither in the walk nor below one of its steps."""
    return [
        f"{caller} -> {callee} ({function})"
        for caller, callee, function in edges
        if callee not in walk and callee not in below and caller != "(event loop)"
    ]


def walk_order(edges: list[tuple[str, str, str]], walk: list[str]) -> list[str]:
    """The walk's modules in the order the calls first reached them."""
    return [m for m in dict.fromkeys(callee for _c, callee, _f in edges) if m in walk]


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_a_publish_goes_only_through_the_documented_walk(
    ctx: WorkerContext, persistent: bool
) -> None:
    walk, below = documented_walk()
    assert 0 < len(walk) <= MAX_WALK, f"the walk names {len(walk)} modules"
    trace = walk_of(ctx, persistent)
    assert stray_calls(trace.edges, walk, below) == [], "calls the documented walk does not name"
    visited = walk_order(trace.edges, walk)
    assert visited == [m for m in walk if m in visited], "the walk's modules, out of order"
    if persistent:
        assert visited == walk, "a persistent publish passes every step of the walk"
    else:
        assert "workers/persist.py" not in visited, "a transient publish touched the store"


def test_the_walk_check_sees_a_stray_call_and_an_order_it_does_not_tell() -> None:
    walk, below = documented_walk()
    hook = ("workers/persist.py", "workers/message_ttl.py", "Expiry.tick")
    assert stray_calls([hook], walk, below) == [
        "workers/persist.py -> workers/message_ttl.py (Expiry.tick)"
    ]
    backwards = [("(event loop)", walk[1], "f"), (walk[1], walk[0], "g")]
    assert walk_order(backwards, walk) == [walk[1], walk[0]] != walk[:2]
