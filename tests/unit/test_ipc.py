"""The control messages (broker/ipc.py): wire form, dispatch tables, and a
Link over a real SEQPACKET socketpair."""

from __future__ import annotations

import asyncio
import typing
from typing import Any

import msgspec
import pytest

from shoal.broker import ipc
from shoal.broker.scheduler import scheduler as sched
from shoal.workers import worker as worker_main

TO_SCHEDULER = typing.get_args(ipc.ToScheduler)
TO_WORKER = typing.get_args(ipc.ToWorker)


def _request(message: ipc.Request, req: int) -> ipc.Request:
    message.req = req
    return message


SAMPLES: list[ipc.Message] = [
    ipc.Hello(1, 3, [ipc.ConsumerRecord(7, 2, 5, True, False, True, 123)]),
    _request(ipc.Declare("/", b"q", False, True, False, False, 0, 1 << 40, {"x-a": [1, b"b"]}), 9),
    _request(ipc.Consume(7, 2, 0, True, False, False, 1 << 40), 10),
    ipc.Cancel(7),
    ipc.Interest(7, True),
    ipc.Done(7, -1),
    _request(ipc.ConnClosed(1 << 40), 11),
    _request(ipc.Delete("/", b"q", True, False, 1 << 40), 12),
    _request(ipc.Purge("/", b"q", 1 << 40), 13),
    ipc.WorkerGone(1),
    _request(ipc.ExchangeDeclare("/", "x", "topic", False, True, False, False, {}), 14),
    _request(ipc.ExchangeDelete("/", "x", True), 15),
    _request(ipc.Bind("/", "x", "q", "q", "a.*", {"x-match": "all"}, 1 << 40), 16),
    _request(ipc.Unbind("/", "x", "e", "y", "", {}, 1 << 40), 17),
    _request(ipc.Level(2, 4), 18),
    ipc.Consumers(5, [{"cid": 7, "pointer": {"1": 3}}]),
    ipc.Reply(9, ipc.QueueDeclared(2, b"q", 0, 0)),
    ipc.Reply(10, ipc.Refused(404, "NOT_FOUND - no queue 'q' in vhost '/'")),
    ipc.Reply(11, ipc.Registered(None)),
    ipc.Reply(12, ipc.Counted(3)),
    ipc.Reply(13, ipc.LevelLog(-1)),
    ipc.Reply(14, ipc.Ok()),
    ipc.Notify(7),
    ipc.Watch(7, True),
    ipc.ConsumerGone(7),
    ipc.Resync(),
    ipc.Inspect(5),
    ipc.Unblock(2),
    ipc.Disconnect("v", "u", 3, "vhost 'v' is deleted"),
    ipc.ClientIdConnected("/", "device-1", 7),
    ipc.TakeOver("/", "device-1", 7),
    ipc.Retain("/", ipc.RetainedMessage("a/b", b"x", 1, {"user_property": [["k", "v"]]})),
    ipc.RetainedFor("/", "a/#"),
    ipc.ChannelCounts({"u": 2, "gone": 0}),
    ipc.ChannelTotals({"u": 5}),
    ipc.ConnOpen(7, "v", "u", True),
]


def test_every_message_has_a_sample_and_a_unique_code() -> None:
    assert {type(m) for m in SAMPLES} == set(TO_SCHEDULER) | set(TO_WORKER)
    tags = [cls.__struct_config__.tag for cls in (*TO_SCHEDULER, *TO_WORKER)]
    assert len(set(tags)) == len(tags)
    assert all(isinstance(tag, int) for tag in tags)


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_is_an_array_led_by_its_code(message: ipc.Message) -> None:
    inbound = ipc.SCHEDULER_INBOUND if type(message) in TO_SCHEDULER else ipc.WORKER_INBOUND
    data = ipc.encode(message)
    (plain,) = msgspec.msgpack.decode(data)
    assert plain[0] == type(message).__struct_config__.tag
    if isinstance(message, ipc.Request):
        assert plain[-1] == message.req  # the req id comes last
    assert inbound.batch.decode(data) == [message]


def test_each_end_accepts_only_its_own_direction() -> None:
    with pytest.raises(msgspec.ValidationError):
        ipc.WORKER_INBOUND.batch.decode(ipc.encode(ipc.Done(1, 2)))
    with pytest.raises(msgspec.ValidationError):
        ipc.SCHEDULER_INBOUND.batch.decode(ipc.encode(ipc.Notify(1)))


def test_a_malformed_message_costs_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    data = msgspec.msgpack.encode([ipc.Done(1, 5), [6, "one", 2], ipc.Interest(2, False)])
    with pytest.raises(msgspec.ValidationError):
        ipc.SCHEDULER_INBOUND.batch.decode(data)
    assert ipc.salvage(ipc.SCHEDULER_INBOUND, data) == [ipc.Done(1, 5), ipc.Interest(2, False)]
    assert "malformed control message" in caplog.text


def test_the_scheduler_handles_every_message_a_worker_sends() -> None:
    assert set(sched._NOTICES) | set(sched._REQUESTS) == set(TO_SCHEDULER)
    assert not set(sched._NOTICES) & set(sched._REQUESTS)
    # Exactly the requests get a Reply: a worker waits for it.
    assert {cls for cls in TO_SCHEDULER if issubclass(cls, ipc.Request)} == set(sched._REQUESTS)


def test_a_worker_handles_every_message_the_scheduler_sends() -> None:
    assert set(worker_main._HANDLERS) == set(TO_WORKER)


def test_a_link_delivers_a_batch_as_one_datagram_in_order() -> None:
    loop = asyncio.new_event_loop()
    a, b = ipc.socketpair()
    got: list[Any] = []
    try:
        worker_end = ipc.Link(a, loop, got.append, ipc.WORKER_INBOUND)
        scheduler_end = ipc.Link(b, loop, got.append, ipc.SCHEDULER_INBOUND)
        for cid in range(1000):  # two datagrams of at most 512
            worker_end.send(ipc.Done(cid, cid))
        scheduler_end.send(ipc.Notify(3))

        async def settle() -> None:
            while len(got) < 1001:
                await asyncio.sleep(0.01)

        loop.run_until_complete(asyncio.wait_for(settle(), 5))
        assert [m for m in got if isinstance(m, ipc.Done)] == [ipc.Done(c, c) for c in range(1000)]
        assert ipc.Notify(3) in got
        worker_end.close()
        scheduler_end.close()
    finally:
        loop.close()


def test_a_notice_sent_later_waits_for_company_or_its_delay() -> None:
    """Link.send_later: a notice goes with the next message sent at once,
    before it (the scheduler sees a worker's messages in order), or alone
    once its delay is up; never at once by itself."""
    loop = asyncio.new_event_loop()
    a, b = ipc.socketpair()
    got: list[Any] = []
    try:
        worker_end = ipc.Link(a, loop, lambda m: None, ipc.WORKER_INBOUND)
        scheduler_end = ipc.Link(b, loop, got.append, ipc.SCHEDULER_INBOUND)

        async def until(count: int) -> None:
            while len(got) < count:
                await asyncio.sleep(0.01)

        async def turns(count: int) -> None:
            for _ in range(count):  # (a loop turn each: no timed wait)
                await asyncio.sleep(0)

        worker_end.send_later(ipc.Done(1, 1), 60.0)
        worker_end.send_later(ipc.Done(2, 2), 60.0)
        # A message sent at once is flushed the next turn and read the turn after.
        loop.run_until_complete(turns(10))
        assert got == []  # (held: nothing else went)
        worker_end.send(ipc.Done(3, 3))
        loop.run_until_complete(asyncio.wait_for(until(3), 5))
        assert got == [ipc.Done(1, 1), ipc.Done(2, 2), ipc.Done(3, 3)]
        worker_end.send_later(ipc.Done(4, 4), 0.01)
        loop.run_until_complete(asyncio.wait_for(until(4), 5))
        assert got[3] == ipc.Done(4, 4)
        worker_end.close()
        scheduler_end.close()
    finally:
        loop.close()
