"""A client that reconnects by itself (aio-pika's connect_robust), given a
follower's address, carries on against the new leader after the leader's
kill -9: its connection is closed with 320 CONNECTION_FORCED by the
follower's proxy, it reconnects, and every message it had confirmed is
there (issue 29)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
import pytest

from tests.cluster.nodes import ClusterNode, in_sync, leader_of

pytestmark = pytest.mark.cluster


async def publish(channel: aio_pika.abc.AbstractChannel, bodies: list[bytes]) -> None:
    for body in bodies:
        await channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="robust",
        )


def test_connect_robust_through_a_follower_outlives_the_leaders_death(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    nodes = three_nodes()
    leader = leader_of(nodes)
    in_sync(nodes, 3)
    follower = next(n for n in nodes if n is not leader)

    async def main() -> list[bytes]:
        closed: list[BaseException | None] = []
        conn = await aio_pika.connect_robust(follower.url, reconnect_interval=0.2)
        conn.close_callbacks.add(lambda _conn, exc: closed.append(exc))
        try:
            channel = await conn.channel(publisher_confirms=True)
            await channel.declare_queue("robust", durable=True)
            await publish(channel, [b"before-%d" % i for i in range(50)])
            reconnected = asyncio.Event()
            conn.reconnect_callbacks.add(lambda _conn: reconnected.set())
            await asyncio.to_thread(leader.kill)
            await asyncio.wait_for(reconnected.wait(), 60)
            await publish(channel, [b"after-%d" % i for i in range(50)])
            queue = await channel.declare_queue("robust", durable=True)
            got: list[bytes] = []
            while len(got) < 100:
                message = await queue.get(timeout=10, fail=False)
                if message is None:
                    break
                got.append(message.body)
                await message.ack()
            assert closed and "320" in str(closed[0]), closed  # told as a broker would
            return got
        finally:
            await conn.close()

    got = asyncio.run(main())
    assert sorted(got) == sorted(
        [b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)]
    )
