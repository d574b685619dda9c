"""The bridge's frames encoded and decoded once
(broker/mqtt/inner_frames.py): the same bytes and methods as pamqp's."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame

from shoal.broker.mqtt import inner_frames

SENT = [
    (C.Channel.Open(), 1),
    (C.Channel.Open(), 2),
    (C.Confirm.Select(), 1),
    (C.Basic.Qos(prefetch_count=10), 1),
    (C.Basic.Qos(prefetch_count=20, global_=True), 1),
    (C.Queue.Declare(queue="mqtt-subscription-a"), 2),
]


@pytest.mark.parametrize(("method", "channel"), SENT)
def test_what_the_bridge_sends_is_pamqps_frame_each_time(method: Any, channel: int) -> None:
    expected = pamqp_frame.marshal(method, channel)
    assert inner_frames.encoded(method, channel) == expected
    assert inner_frames.encoded(method, channel) == expected  # (from the cache)


def test_frames_with_other_fields_are_other_frames() -> None:
    one = inner_frames.encoded(C.Basic.Qos(prefetch_count=10), 1)
    other = inner_frames.encoded(C.Basic.Qos(prefetch_count=11), 1)
    on_two = inner_frames.encoded(C.Basic.Qos(prefetch_count=10), 2)
    assert len({one, other, on_two}) == 3
    assert pamqp_frame.unmarshal(other)[2].prefetch_count == 11
    assert pamqp_frame.unmarshal(on_two)[1] == 2


REPLIES = [
    (C.Connection.OpenOk(), 0),
    (C.Channel.OpenOk(), 1),
    (C.Confirm.SelectOk(), 1),
    (C.Basic.QosOk(), 1),
    (C.Queue.DeclareOk(queue="q1", message_count=0, consumer_count=0), 2),
    (C.Queue.DeclareOk(queue="q2", message_count=3, consumer_count=1), 2),
    (C.Connection.Close(403, "ACCESS_REFUSED", 0, 0), 0),
]


@pytest.mark.parametrize(("method", "channel"), REPLIES)
def test_what_the_bridge_reads_is_pamqps_method(method: Any, channel: int) -> None:
    raw = pamqp_frame.marshal(method, channel)
    for _ in range(2):  # (the second from the cache where it keeps one)
        got_channel, got = inner_frames.decoded(raw)
        assert got_channel == channel
        assert type(got) is type(method)
        assert dict(got) == dict(method)
