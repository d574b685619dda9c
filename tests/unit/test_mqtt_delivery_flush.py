"""An MQTT subscriber's deliveries from its inner connection's flush to its
socket in one C call (workers/_mqtt_wire.c DeliveryFlush,
workers/_mqtt_flush.h), against the chain it stands for (AmqpSide's
flush_then_read, Connection.flush, read_amqp, Outbound.run, _flush): where
the inner connection's output is planned deliveries only it writes exactly
the PUBLISHes `deliveries` makes of it, in one write, and counts the output
as Connection.flush does; a run that stops early leaves the rest to
read_amqp after its packets, in one batch; and wherever one of the chain's
conditions does not hold it runs the chain instead, touching nothing.
Stand-ins with the attributes the chain reads; no sockets."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands as C
from pamqp import frame

from shoal.broker.mqtt import packets as P
from shoal.workers._mqtt_wire import DeliveryFlush, deliveries
from shoal.workers.mqtt_transport import AmqpSide
from tests.unit.test_mqtt_deliveries import delivery, planned

TOPIC = b"sensors/1/temp"


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing


class Inner:
    """The inner AMQP connection's part: its output and counters."""

    def __init__(self, out: list[bytes]) -> None:
        self.out = out
        self.transport: object | None = object()  # (its AmqpSide)
        self.closed = False
        self.eof_sent = False
        self.flush_scheduled = True
        self.send_oct = 0
        self.send_cnt = 0
        self.sent_since_tick = False


class Version:
    version = 3


class State:
    def __init__(self) -> None:
        self.sent: dict[int, Any] = {}
        self.released: dict[int, Any] = {}


class Session:
    def __init__(self) -> None:
        self.state = State()


class Outbound:
    def __init__(self, plans: dict) -> None:
        self.alias_max = 0
        self.max_packet: int | None = None
        self.line: list[Any] = []
        self.subscriptions = Version()
        self.planned_for = 3
        self.planned = plans
        self.unacked: dict[int, int] = {}
        self.next_packet_id = 1
        self.miss: bytes | None = b"stale"


class Bridge:
    """MqttConnection's part; read_amqp and _end_batch record what they see."""

    def __init__(self, outbound: Outbound, level: int = P.MQTT_311) -> None:
        self.amqp_reading = False
        self.amqp_out = bytearray()
        self.closed = False
        self.open = True
        self.out: list[bytes] | None = None
        self.delivery: list[Any] | None = None
        self.outbound: Outbound | None = outbound
        self.session = Session()
        self.level = level
        self.transport = Transport()
        self.reads: list[tuple[list[bytes] | None, bytes]] = []
        self.batches_ended = 0

    def read_amqp(self) -> None:
        self.reads.append((None if self.out is None else list(self.out), bytes(self.amqp_out)))
        del self.amqp_out[:]

    def _end_batch(self) -> None:
        self.batches_ended += 1
        out, self.out = self.out, None
        if out:
            self.transport.write(b"".join(out))


def _setup(
    frames: list[bytes], plan: tuple[bytes, int, bool] | None = (TOPIC, 1, False)
) -> tuple[Bridge, Inner, list[int], DeliveryFlush]:
    plans = planned(delivery(1, b"x"), plan)
    bridge = Bridge(Outbound(plans))
    inner = Inner(list(frames))
    fallbacks: list[int] = []
    flush = DeliveryFlush(bridge, inner, lambda: fallbacks.append(1), unexpected)
    return bridge, inner, fallbacks, flush


def unexpected(exc: Exception) -> None:
    raise AssertionError("the flush failed") from exc


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_planned_deliveries_go_out_as_the_chain_writes_them(level: int) -> None:
    frames = [delivery(1, b"one"), delivery(2, b"two") + delivery(3, b"three")]
    bridge, inner, fallbacks, flush = _setup(frames)
    bridge.level = level
    joined = b"".join(frames)
    # The oracle: what read_amqp's Outbound.run would get from `deliveries`.
    unacked: dict[int, int] = {}
    at, next_id, packets, _miss = deliveries(
        bytearray(joined), 0, dict(bridge.outbound.planned), unacked, 1, level == P.MQTT_5
    )
    assert at == len(joined) and packets is not None
    flush()
    assert fallbacks == []
    assert bridge.transport.writes == [packets]  # one write
    assert bridge.outbound.unacked == unacked == {1: 1, 2: 2, 3: 3}
    assert bridge.outbound.next_packet_id == next_id == 4
    assert bridge.outbound.miss is None
    # Connection.flush's part: the output taken, counted per write.
    assert inner.out == [] and not inner.flush_scheduled
    assert (inner.send_oct, inner.send_cnt, inner.sent_since_tick) == (len(joined), 1, True)
    assert bridge.reads == [] and bridge.out is None and not bridge.amqp_reading


def test_a_run_that_stops_leaves_the_rest_to_read_amqp_after_its_packets() -> None:
    confirm = frame.marshal(C.Basic.Ack(7, False), 1)
    first = delivery(1, b"one")
    unplanned = delivery(2, b"two", routing_key="sensors.2.temp")
    bridge, inner, fallbacks, flush = _setup([first, confirm + unplanned])
    packets = deliveries(bytearray(first), 0, dict(bridge.outbound.planned), {}, 1, False)[2]
    flush()
    assert fallbacks == []
    # read_amqp saw the run's packets already in its batch, and the rest.
    assert bridge.reads == [([packets], confirm + unplanned)]
    assert bridge.batches_ended == 1 and bridge.out is None
    assert bridge.transport.writes == [packets]  # (the stand-in read wrote nothing more)
    assert bridge.outbound.unacked == {1: 1} and bridge.outbound.next_packet_id == 2
    # Nothing planned at all: all of it is read_amqp's, with an empty batch.
    bridge, inner, fallbacks, flush = _setup([confirm, first])
    flush()
    assert bridge.reads == [([], confirm + first)] and bridge.batches_ended == 1
    assert inner.send_cnt == 1 and fallbacks == []


def test_a_rest_it_cannot_hand_on_opens_no_batch() -> None:
    # The rest goes to amqp_out before the batch opens: where it cannot (a
    # bridge whose buffer is not a bytearray), the flush fails, is given to
    # `failed` (the client disconnected: the rest is lost) and leaves no
    # batch that no _end_batch would close. The run's packets are written
    # all the same: their ids are booked (unacked, next_packet_id), and a
    # client that never got them would wait on those ids.
    confirm = frame.marshal(C.Basic.Ack(7, False), 1)
    first = delivery(1, b"one")
    bridge, inner, fallbacks, _ = _setup([first, confirm])
    failures: list[Exception] = []
    flush = DeliveryFlush(bridge, inner, lambda: fallbacks.append(1), failures.append)
    packets = deliveries(bytearray(first), 0, dict(bridge.outbound.planned), {}, 1, False)[2]
    bridge.amqp_out = b""  # type: ignore[assignment]
    flush()
    assert [type(e) for e in failures] == [TypeError] and "bytearray" in str(failures[0])
    assert bridge.out is None and bridge.reads == [] and fallbacks == []
    assert bridge.outbound.unacked == {1: 1} and bridge.outbound.next_packet_id == 2
    assert bridge.transport.writes == [packets]


def _reading(b: Bridge, i: Inner) -> None:
    b.amqp_reading = True


def _unread(b: Bridge, i: Inner) -> None:
    b.amqp_out += b"x"


def _gathering(b: Bridge, i: Inner) -> None:
    b.delivery = [None, None, bytearray()]


def _batch(b: Bridge, i: Inner) -> None:
    b.out = []


def _closed(b: Bridge, i: Inner) -> None:
    b.closed = True


def _not_open(b: Bridge, i: Inner) -> None:
    b.open = False


def _no_outbound(b: Bridge, i: Inner) -> None:
    b.outbound = None


def _alias(b: Bridge, i: Inner) -> None:
    assert b.outbound is not None
    b.outbound.alias_max = 10


def _max_packet(b: Bridge, i: Inner) -> None:
    assert b.outbound is not None
    b.outbound.max_packet = 1 << 20


def _qos2_line(b: Bridge, i: Inner) -> None:
    assert b.outbound is not None
    b.outbound.line = [object()]


def _qos2_sent(b: Bridge, i: Inner) -> None:
    b.session.state.sent[1] = object()


def _qos2_released(b: Bridge, i: Inner) -> None:
    b.session.state.released[1] = object()


def _new_version(b: Bridge, i: Inner) -> None:
    b.outbound.subscriptions = type("V", (), {"version": 4})()  # type: ignore[union-attr]


def _socket_closing(b: Bridge, i: Inner) -> None:
    b.transport.closing = True


def _inner_closed(b: Bridge, i: Inner) -> None:
    i.closed = True


def _inner_eof(b: Bridge, i: Inner) -> None:
    i.eof_sent = True


def _inner_gone(b: Bridge, i: Inner) -> None:
    i.transport = None


def _inner_empty(b: Bridge, i: Inner) -> None:
    i.out = []


CHANGES: list[Callable[[Bridge, Inner], None]] = [
    _reading,
    _unread,
    _gathering,
    _batch,
    _closed,
    _not_open,
    _no_outbound,
    _alias,
    _max_packet,
    _qos2_line,
    _qos2_sent,
    _qos2_released,
    _new_version,
    _socket_closing,
    _inner_closed,
    _inner_eof,
    _inner_gone,
    _inner_empty,
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_the_chain_runs_instead_when_a_condition_does_not_hold(
    change: Callable[[Bridge, Inner], None],
) -> None:
    frames = [delivery(1, b"one")]
    bridge, inner, fallbacks, flush = _setup(frames)
    change(bridge, inner)
    before = (list(inner.out), inner.send_oct, inner.send_cnt, bytes(bridge.amqp_out))
    flush()
    assert fallbacks == [1]
    assert bridge.transport.writes == [] and bridge.reads == []
    assert (list(inner.out), inner.send_oct, inner.send_cnt, bytes(bridge.amqp_out)) == before
    if bridge.outbound is not None:
        assert bridge.outbound.unacked == {} and bridge.outbound.next_packet_id == 1


def test_what_the_chain_raises_and_bad_calls() -> None:
    def fails() -> None:
        raise RuntimeError("the chain's own failure")

    def interrupted() -> None:
        raise KeyboardInterrupt

    bridge = Bridge(Outbound({}))
    bridge.closed = True
    failures: list[Exception] = []
    DeliveryFlush(bridge, Inner([b"x"]), fails, failures.append)()
    assert [str(e) for e in failures] == ["the chain's own failure"]
    assert failures[0].__traceback__ is not None  # (logged with where it failed)
    with pytest.raises(KeyboardInterrupt):  # (not an Exception: raised on)
        DeliveryFlush(bridge, Inner([b"x"]), interrupted, failures.append)()
    with pytest.raises(ValueError, match="failed's own"):  # failed's failure is raised

        def failing_failed(exc: Exception) -> None:
            raise ValueError("failed's own")

        DeliveryFlush(bridge, Inner([b"x"]), fails, failing_failed)()
    with pytest.raises(TypeError):
        DeliveryFlush(bridge, Inner([]), None, failures.append)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DeliveryFlush(bridge, Inner([]), fails)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        DeliveryFlush(bridge, Inner([]), fails, failures.append)(1)  # type: ignore[call-arg]


def test_a_failed_flush_disconnects_its_client_only(caplog: pytest.LogCaptureFixture) -> None:
    """The scheduled flush AmqpSide makes: a failure (here the inner
    connection's own flush, in the chain) is logged and disconnects that
    client with 0x83, as a fault in its read does; it does not reach the
    loop, whose other callbacks (other clients' flushes) go on."""

    class Failing(Inner):
        def flush(self) -> None:
            raise RuntimeError("lost output")

    bridge = Bridge(Outbound({}))
    bridge.closed = True  # (the chain, not the C path)
    reasons: list[int] = []
    bridge.client_id = "dev-1"  # type: ignore[attr-defined]
    bridge.disconnect = reasons.append  # type: ignore[attr-defined]
    flush = AmqpSide(bridge).scheduled_flush(Failing([b"x"]))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="shoal.mqtt"):
        flush()
    assert reasons == [0x83]
    assert "mqtt client dev-1: internal error in a flush" in caplog.text
    assert "lost output" in caplog.text
