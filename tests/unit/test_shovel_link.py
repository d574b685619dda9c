"""A shovel's message path without sockets (broker/shovel/link.py): how the
destination's confirms settle the source's deliveries (RabbitMQ's
rabbit_amqp091_shovel: an ack or a nack with the same `multiple`, a nack
requeueing), src-delete-after's count, the routing of each message, and the
backoff of a shovel that cannot connect."""

from __future__ import annotations

import asyncio
from typing import Any

import pika.spec

from shoal.broker.amqp import shovel_definition as S
from shoal.broker.shovel.link import MAX_BACKOFF, Endpoints, Shovel, _Forwarding, backoff


class FakeChannel:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def basic_publish(self, exchange: str, key: str, body: bytes, props: Any) -> None:
        self.calls.append(("publish", exchange, key, body, props.headers))

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.calls.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.calls.append(("nack", tag, multiple, requeue))


class Frame:
    def __init__(self, method: Any) -> None:
        self.method = method


def deliver(tag: int, key: str = "k", exchange: str = "x", redelivered: bool = False) -> Any:
    return pika.spec.Basic.Deliver(
        delivery_tag=tag, exchange=exchange, routing_key=key, redelivered=redelivered
    )


def forwarding(
    value: dict[str, Any], **more: Any
) -> tuple[Shovel, _Forwarding, FakeChannel, FakeChannel]:
    spec = S.parse("s", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", **value})

    async def done(_shovel: Shovel) -> None:
        return None

    shovel = Shovel("/", "s", spec, Endpoints(5672, "guest", "guest"), "node", done)
    for k, v in more.items():
        setattr(shovel, k, v)
    into, out = FakeChannel(), FakeChannel()
    return shovel, _Forwarding(shovel, into, out, spec.ack_mode == "on-confirm"), into, out  # type: ignore[arg-type]


def test_confirms_settle_the_source_as_rabbitmq_does() -> None:
    async def scenario() -> None:
        shovel, path, into, out = forwarding({"dest-queue": "b"})
        for tag in (11, 12, 13, 14):
            path.on_message(
                None, deliver(tag, redelivered=tag == 14), pika.spec.BasicProperties(), b"m"
            )
        assert [c[:3] for c in out.calls] == [("publish", "", "b")] * 4
        assert into.calls == []  # nothing settled before the destination confirms
        path.on_confirm(Frame(pika.spec.Basic.Ack(delivery_tag=2, multiple=True)))
        path.on_confirm(Frame(pika.spec.Basic.Nack(delivery_tag=3, multiple=False)))
        path.on_confirm(Frame(pika.spec.Basic.Ack(delivery_tag=4, multiple=False)))
        assert into.calls == [("ack", 12, True), ("nack", 13, False, True), ("ack", 14, False)]
        assert shovel.forwarded == 4 and shovel.redelivered == 1
        assert path.unconfirmed == {}

    asyncio.run(scenario())


def test_src_delete_after_stops_publishing_at_its_count() -> None:
    async def scenario() -> None:
        _shovel, path, into, out = forwarding(
            {"dest-queue": "b", "src-delete-after": 2, "ack-mode": "on-publish"}, remaining=2
        )
        for tag in (1, 2, 3):
            path.on_message(None, deliver(tag), pika.spec.BasicProperties(), b"m")
        assert len(out.calls) == 2  # the third is left unacked: requeued at close
        assert into.calls == [("ack", 1, False), ("ack", 2, False)]
        assert path.finished.done()

    asyncio.run(scenario())


def test_each_message_keeps_its_routing_key_unless_the_definition_sets_one() -> None:
    async def scenario() -> None:
        _shovel, path, _into, out = forwarding({"dest-exchange": "amq.direct"})
        path.on_message(None, deliver(1, key="eu"), pika.spec.BasicProperties(), b"m")
        _shovel, keyed, _into, keyed_out = forwarding(
            {
                "dest-exchange": "amq.direct",
                "dest-exchange-key": "all",
                "dest-add-forward-headers": True,
            }
        )
        keyed.on_message(None, deliver(1, key="eu"), pika.spec.BasicProperties(), b"m")
        assert out.calls[0][1:3] == ("amq.direct", "eu")
        assert keyed_out.calls[0][1:3] == ("amq.direct", "all")
        [forwarded] = keyed_out.calls[0][4]["x-shovelled"]
        assert forwarded["dest-exchange"] == "amq.direct" and forwarded["src-queue"] == "a"

    asyncio.run(scenario())


def test_a_shovel_that_cannot_connect_backs_off() -> None:
    assert [backoff(1, n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff(5, 0) == 5  # after a session that ran: reconnect-delay
    assert backoff(60, 4) == 60  # a delay longer than the cap stays as set
    assert MAX_BACKOFF == 30
