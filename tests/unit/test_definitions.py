"""Journal records (broker/definitions.py): their wire form and replay."""

from __future__ import annotations

import msgspec
import pytest

from shoal.broker.amqp import definitions as D

DECODE = msgspec.msgpack.Decoder(D.Op).decode

RECORDS: list[tuple[D.Op, list[object]]] = [
    (D.VHostAdded("/", 0), ["v", "/", 0]),
    (
        D.ExchangeDeclared("/", "x", "topic", True, False, False, {"alternate-exchange": "ae"}),
        ["x", "/", "x", "topic", True, False, False, {"alternate-exchange": "ae"}],
    ),
    (D.ExchangeDeleted("/", "x"), ["X", "/", "x"]),
    (D.Bound("/", "x", "q", "q1", "a.*", {}), ["b", "/", "x", "q", "q1", "a.*", {}]),
    (D.Unbound("/", "x", "e", "y", "", {}), ["u", "/", "x", "e", "y", "", {}]),
    (D.QueueArgumentsSet("/", "q1", {"x-max-length": 5}), ["q", "/", "q1", {"x-max-length": 5}]),
    (D.QueueGone("/", "q1"), ["Q", "/", "q1"]),
    (D.TracingSet("/", True), ["r", "/", True]),
]


@pytest.mark.parametrize("op, plain", RECORDS, ids=lambda v: type(v).__name__)
def test_a_record_is_an_array_led_by_its_letter(op: D.Op, plain: list[object]) -> None:
    data = msgspec.msgpack.encode(op)
    assert msgspec.msgpack.decode(data) == plain
    assert DECODE(data) == op


def test_inverse_undoes_a_growing_change() -> None:
    bind = D.Bound("/", "amq.direct", "q", "q1", "k", {})
    for op in (
        bind,
        D.ExchangeDeclared("/", "x", "direct", False, False, False, {}),
        D.QueueArgumentsSet("/", "q1", {"x-max-length": 5}),
    ):
        defs = D.Definitions()
        for setup in D.new_vhost_ops("/", 0):
            defs.apply(setup)
        before = defs.snapshot()
        defs.apply(op)
        assert defs.snapshot() != before
        defs.apply(D.inverse(op))
        assert defs.snapshot() == before
    assert D.inverse(D.inverse(bind)) == bind
    with pytest.raises(ValueError):
        D.inverse(D.QueueGone("/", "q1"))


def test_a_snapshot_replays_to_the_same_state() -> None:
    defs = D.Definitions()
    for op in [*D.new_vhost_ops("/", 0), *D.new_vhost_ops("v2", 1)]:
        defs.apply(op)
    defs.apply(D.Bound("/", "amq.topic", "q", "q1", "a.#", {}))
    defs.apply(D.Bound("v2", "amq.fanout", "e", "amq.direct", "", {}))
    defs.apply(D.QueueArgumentsSet("/", "q1", {"x-max-priority": 3}))
    copy = D.Definitions()
    for op in defs.snapshot():
        copy.apply(DECODE(msgspec.msgpack.encode(op)))
    assert copy.snapshot() == defs.snapshot()
    assert copy.vhost_ids == {"/": 0, "v2": 1}
    assert copy.router("/").route("amq.topic", "a.b", None) == {"q1"}


def test_tracing_is_kept_by_the_journal_not_by_the_durable_records() -> None:
    """The firehose (workers/firehose.py) replays in the shared-memory
    journal's snapshot; a restart (durable records) turns it off, as in
    RabbitMQ; a vhost kept by a version before the trace exchange gets it."""
    defs = D.Definitions()
    for op in [*D.new_vhost_ops("/", 0), D.TracingSet("/", True)]:
        defs.apply(op)
    assert D.TracingSet("/", True) in defs.snapshot() and defs.tracing == {"/"}
    trace = defs.router("/").exchanges[D.TRACE_EXCHANGE]
    assert (trace.type, trace.durable, trace.internal) == ("topic", True, True)
    defs.apply(D.TracingSet("/", False))
    assert defs.tracing == set() and not any(isinstance(op, D.TracingSet) for op in defs.snapshot())
    old = D.Definitions()
    for op in D.new_vhost_ops("/", 0)[:-1]:  # (the trace exchange is the last)
        old.apply(op)
    assert D.missing_default_exchanges(old) == [
        D.ExchangeDeclared("/", D.TRACE_EXCHANGE, "topic", True, False, True, {})
    ]
    assert D.missing_default_exchanges(defs) == []
