"""A subscriber's run of PUBACKs settled in one C call (workers/_mqtt_wire.c
pubacks, Outbound.puback_run): the same tags, in the same order, that the
packet loop's PUBACK one by one (Outbound.puback) would ack, and nothing it
would not take."""

from __future__ import annotations

import pytest

from shoal.broker.mqtt import packets as P
from shoal.workers._mqtt_wire import pubacks
from shoal.workers.mqtt_outbound import NOTHING_TO_ACK


def puback(packet_id: int) -> bytes:
    return P.encode_ack(P.MQTT_311, P.PUBACK, packet_id)


def test_each_known_id_gives_its_tag_in_order_and_leaves_unacked() -> None:
    unacked = {1: 10, 2: 11, 7: 12, 9: 13}
    data = puback(2) + puback(1) + puback(9)
    assert pubacks(data, 0, unacked, NOTHING_TO_ACK) == (len(data), [11, 10, 13])
    assert unacked == {7: 12}


def test_an_unknown_id_and_a_retained_messages_settle_nothing() -> None:
    unacked = {3: NOTHING_TO_ACK, 4: 20}
    data = puback(5) + puback(3) + puback(4) + puback(4)
    assert pubacks(data, 0, unacked, NOTHING_TO_ACK) == (len(data), [20])
    assert unacked == {}


@pytest.mark.parametrize(
    "tail",
    [
        b"\x40\x02\x00\x00",  # id 0: malformed, the decoder's to refuse
        b"\x40\x03\x00\x05\x10",  # a 5.0 PUBACK with a reason code
        b"\x30\x05\x00\x01a\x00\x01",  # another packet
    ],
)
def test_the_run_stops_untouched_at_anything_else(tail: bytes) -> None:
    unacked = {1: 10, 5: 11}
    head = puback(1)
    assert pubacks(head + tail + puback(5), 0, unacked, NOTHING_TO_ACK) == (len(head), [10])
    assert unacked == {5: 11}


def test_a_puback_not_whole_in_the_read_is_left_for_the_next() -> None:
    unacked = {1: 10, 5: 11}
    head = puback(1)
    assert pubacks(head + puback(5)[:3], 0, unacked, NOTHING_TO_ACK) == (len(head), [10])
    assert unacked == {5: 11}


def test_it_starts_at_at_and_refuses_bad_arguments() -> None:
    unacked = {1: 10}
    data = b"xx" + puback(1)
    assert pubacks(data, 2, unacked, NOTHING_TO_ACK) == (len(data), [10])
    with pytest.raises(IndexError):
        pubacks(data, len(data) + 1, {}, NOTHING_TO_ACK)
    with pytest.raises(TypeError):
        pubacks(data, 0, [], NOTHING_TO_ACK)  # type: ignore[arg-type]
