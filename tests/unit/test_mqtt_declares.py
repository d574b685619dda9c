"""The declares' channel of an MQTT client's inner connection
(workers/mqtt_inner.py Declares): one declare at a time, the channel opened
for the first (the declare sent behind the open, not at its open-ok) and
closed when none waits, a declare that comes while it
closes sent once it is open again, a refused one answered and the channel
opened again for the next."""

from __future__ import annotations

from typing import Any

from pamqp import commands as C

from shoal.workers.mqtt_inner import DECLARES, Declares


class Conn:
    """What Declares uses of the connection: the frames it sends on channel 2."""

    client_id = "declaring"

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def method(self, method: Any, channel: int = 1) -> None:
        assert channel == DECLARES
        self.sent.append(method)

    def taken(self) -> list[type]:
        out, self.sent = [type(m) for m in self.sent], []
        return out


def declare(name: str) -> C.Queue.Declare:
    return C.Queue.Declare(queue=name)


def test_a_declare_opens_the_channel_and_the_last_answer_closes_it() -> None:
    conn, got = Conn(), []
    declares = Declares(conn)  # type: ignore[arg-type]
    declares.declare(declare("a"), got.append, got.append)
    assert conn.sent[1].queue == "a"
    assert conn.taken() == [C.Channel.Open, C.Queue.Declare]  # pipelined
    declares.declare(declare("b"), got.append, got.append)  # (waits behind a)
    assert conn.taken() == []
    declares.answer(C.Channel.OpenOk())
    assert conn.taken() == []  # (a is under way)
    declares.answer(C.Queue.DeclareOk(queue="a"))
    assert [m.queue for m in conn.sent] == ["b"]  # b next, the channel kept open
    conn.taken()
    declares.answer(C.Queue.DeclareOk(queue="b"))
    assert conn.taken() == [C.Channel.Close], "none waits: closed"
    assert [f.queue for f in got] == ["a", "b"]


def test_a_declare_while_the_channel_closes_goes_once_it_is_open_again() -> None:
    conn, got = Conn(), []
    declares = Declares(conn)  # type: ignore[arg-type]
    declares.declare(declare("a"), got.append, got.append)
    declares.answer(C.Channel.OpenOk())
    declares.answer(C.Queue.DeclareOk(queue="a"))
    assert conn.taken() == [C.Channel.Open, C.Queue.Declare, C.Channel.Close]
    declares.declare(declare("b"), got.append, got.append)  # the close under way
    assert conn.taken() == [], "not on a closing channel"
    declares.answer(C.Channel.CloseOk())
    assert conn.sent[1].queue == "b"
    assert conn.taken() == [C.Channel.Open, C.Queue.Declare]
    declares.answer(C.Channel.OpenOk())
    assert conn.taken() == []
    declares.answer(C.Queue.DeclareOk(queue="b"))
    assert conn.taken() == [C.Channel.Close]
    declares.answer(C.Channel.CloseOk())  # (nothing waits: stays closed)
    assert conn.taken() == [] and [f.queue for f in got] == ["a", "b"]


def test_a_refused_declare_is_answered_and_the_next_opens_the_channel_again() -> None:
    conn, done, refused = Conn(), [], []
    declares = Declares(conn)  # type: ignore[arg-type]
    declares.declare(declare("over"), done.append, refused.append)
    declares.answer(C.Channel.OpenOk())
    conn.taken()
    close = C.Channel.Close(reply_code=406, reply_text="queue limit", class_id=50, method_id=10)
    declares.answer(close)  # the broker's: the channel is closed (its close-ok sent)
    assert conn.taken() == [C.Channel.CloseOk] and refused == [close] and not done
    declares.declare(declare("next"), done.append, refused.append)
    assert conn.taken() == [C.Channel.Open, C.Queue.Declare]
    declares.answer(C.Channel.OpenOk())
    declares.answer(C.Queue.DeclareOk(queue="next"))
    assert conn.taken() == [C.Channel.Close]
    assert [f.queue for f in done] == ["next"]
