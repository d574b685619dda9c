"""shoal.broker.cluster.etcd against a real etcd (tests/cluster/etcd_server.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from shoal.broker.cluster.etcd import Etcd, EtcdError, EtcdUnavailable, KeyValue
from shoal.broker.cluster.isr import IsrRecord
from tests.broker_process import free_port
from tests.cluster.etcd_server import EtcdServer

pytestmark = pytest.mark.cluster

T = TypeVar("T")


def run(test: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(test(), timeout)

    return asyncio.run(bounded())


async def eventually(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll `condition` until it is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def dead_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_put_get_delete_round_trip(etcd: EtcdServer) -> None:
    value = bytes(range(256))  # every byte, NULs and invalid UTF-8 included

    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            assert await client.get("shoal/k") is None
            before = await client.revision()
            await client.put("shoal/k", value)
            kv = await client.get("shoal/k")
            assert kv == KeyValue("shoal/k", value, before + 1, before + 1, 0)
            await client.put("shoal/k", b"")
            kv = await client.get("shoal/k")
            assert kv is not None and kv.value == b""
            assert (kv.create_revision, kv.mod_revision) == (before + 1, before + 2)
            await client.delete("shoal/k")
            assert await client.get("shoal/k") is None
            await client.delete("shoal/k")  # already gone: no error
            assert await client.revision() == before + 3

    run(test)


def test_put_if_absent_lets_one_caller_win(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as first, Etcd([etcd.url]) as second:
            assert await first.put_if_absent("shoal/leader", b"node-1")
            assert not await second.put_if_absent("shoal/leader", b"node-2")
            kv = await second.get("shoal/leader")
            assert kv is not None and kv.value == b"node-1"
            # The winner repeating its own write (a retry) still wins.
            assert await first.put_if_absent("shoal/leader", b"node-1")
            await first.delete("shoal/leader")
            assert await second.put_if_absent("shoal/leader", b"node-2")

    run(test)


def test_key_of_an_unrenewed_lease_disappears(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            lease = await client.grant(1)
            assert await client.lease_ttl(lease) in (0, 1)
            await client.put("shoal/ephemeral", b"x", lease)
            kv = await client.get("shoal/ephemeral")
            assert kv is not None and kv.lease == lease

            async def gone() -> bool:
                return await client.get("shoal/ephemeral") is None

            await eventually(gone, 10, "the key of an expired lease to go")
            assert await client.lease_ttl(lease) == -1
            assert await client.keepalive(lease) == 0

    run(test)


def test_keepalive_keeps_the_lease_until_revoked(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            lease = await client.grant(1)
            await client.put("shoal/ephemeral", b"x", lease)
            end = time.monotonic() + 3  # three times the TTL
            while time.monotonic() < end:
                assert await client.keepalive(lease) > 0
                await asyncio.sleep(0.3)  # the renewal period, not a wait for a condition
            assert await client.get("shoal/ephemeral") is not None
            assert await client.lease_ttl(lease) >= 0
            await client.revoke(lease)
            assert await client.get("shoal/ephemeral") is None
            assert await client.keepalive(lease) == 0
            assert await client.lease_ttl(lease) == -1
            await client.revoke(lease)  # already gone: no error

    run(test)


def test_put_if_equal_and_delete_if_equal_need_the_guard_value(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            # No guard key at all: nothing is written.
            assert not await client.put_if_equal("shoal/leader", b"node-1", "shoal/isr", b"a")
            assert await client.get("shoal/isr") is None
            await client.put("shoal/leader", b"node-1")
            assert not await client.put_if_equal("shoal/leader", b"node-2", "shoal/isr", b"b")
            assert await client.get("shoal/isr") is None
            assert await client.put_if_equal("shoal/leader", b"node-1", "shoal/isr", b"c")
            kv = await client.get("shoal/isr")
            assert kv is not None and kv.value == b"c"

            assert not await client.delete_if_equal("shoal/leader", b"node-2")
            assert await client.get("shoal/leader") is not None
            assert await client.delete_if_equal("shoal/leader", b"node-1")
            assert await client.get("shoal/leader") is None
            assert not await client.delete_if_equal("shoal/leader", b"node-1")

    run(test)


def test_get_prefix_lists_only_keys_under_the_prefix(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            for key in ("shoal/q/b", "shoal/q/a", "shoal/q", "shoal/q0", "shoal/r/a", "shoal/p"):
                await client.put(key, key.encode())
            kvs = await client.get_prefix("shoal/q/")
            assert [(kv.key, kv.value) for kv in kvs] == [
                ("shoal/q/a", b"shoal/q/a"),
                ("shoal/q/b", b"shoal/q/b"),
            ]
            assert await client.get_prefix("shoal/none/") == []
            assert len(await client.get_prefix("")) == 6

    run(test)


def test_a_dead_endpoint_is_skipped(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([dead_endpoint(), etcd.url], timeout=1) as client:
            await client.put("shoal/k", b"v")
            kv = await client.get("shoal/k")
            assert kv is not None and kv.value == b"v"

    run(test)


def test_no_live_endpoint_raises_unavailable() -> None:
    async def test() -> None:
        async with Etcd([dead_endpoint(), dead_endpoint()], timeout=1) as client:
            start = time.monotonic()
            with pytest.raises(EtcdUnavailable):
                await client.get("shoal/k")
            assert time.monotonic() - start < 1.5

    run(test)


def test_a_paused_member_times_out_then_answers_again(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url], timeout=0.5) as client:
            await client.put("shoal/k", b"v")
            etcd.pause()
            try:
                start = time.monotonic()
                with pytest.raises(EtcdUnavailable):
                    await client.get("shoal/k")
                assert 0.4 < time.monotonic() - start < 1.5
            finally:
                etcd.resume()
            kv = await client.get("shoal/k")
            assert kv is not None and kv.value == b"v"

    run(test)


def test_data_and_the_client_survive_a_restart(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            await client.put("shoal/k", b"kept")
            # With the loop blocked, as a member that goes away just before a
            # call: the client cannot see the old connection close before it
            # sends the next request, so it must not reuse one.
            etcd.restart()
            kv = await client.get("shoal/k")
            assert kv is not None and kv.value == b"kept"

    run(test)


def test_an_error_answer_raises_etcd_error(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            with pytest.raises(EtcdError, match="lease not found") as caught:
                await client.put("shoal/k", b"v", lease=12345)
            assert (caught.value.status, caught.value.code) == (404, 5)
            assert await client.get("shoal/k") is None

    run(test)


def test_a_late_isr_write_cannot_undo_a_later_one(etcd: EtcdServer) -> None:
    """An in-sync set written, then a smaller one (a follower dropped); the
    first request, timed out and applied late, must fail: it was made over
    a revision that is no longer the key's (issue 38, 4)."""

    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            assert await client.put_if_absent("shoal/leader", b"node-a")
            record = IsrRecord(client, "shoal/", b"node-a", 0)
            late = IsrRecord(client, "shoal/", b"node-a", 0)  # the request as first sent
            assert await record.write(["a", "b", "c"])  # its retry, applied
            assert await record.write(["a", "c"])  # b dropped
            assert not await late.write(["a", "b", "c"])
            kv = await client.get("shoal/isr")
            assert kv is not None and kv.value == b'["a", "c"]'
            # A write that found the key changed knows its revision now.
            assert await late.write(["a", "c", "b"])

    run(test)


def test_a_campaign_fails_if_the_isr_changed_after_it_was_read(etcd: EtcdServer) -> None:
    async def test() -> None:
        async with Etcd([etcd.url]) as client:
            await client.put("shoal/isr", b'["a", "b"]')
            read = await client.get("shoal/isr")
            assert read is not None
            await client.put("shoal/isr", b'["a"]')  # b dropped after b read it
            stale = ("shoal/isr", read.mod_revision)
            assert not await client.put_if_absent("shoal/leader", b"node-b", 0, stale)
            now = await client.get("shoal/isr")
            assert now is not None
            fresh = ("shoal/isr", now.mod_revision)
            assert await client.put_if_absent("shoal/leader", b"node-a", 0, fresh)
            # No set recorded yet: revision 0 stands for "absent".
            assert await client.put_if_absent("shoal/other", b"x", 0, ("shoal/none", 0))

    run(test)
