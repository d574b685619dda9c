"""The inner AMQP connection of an MQTT client (workers/mqtt_connection.py),
from the client's side: the login in place (PLAIN, or EXTERNAL with a TLS
client certificate; no handshake frames), channel 1 with confirms and the
QoS windows, and its closes as MQTT refusals or disconnects; channel 2, the
subscriptions' queue.declares (Declares)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as C

from shoal.broker.mqtt import inner_frames
from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.workers.mqtt_client import MqttClient

Reply = Callable[[Any], None]
Follow = tuple[Any, Reply, Reply]  # (queue.bind, its BindOk's callback, its refusal's)


class InnerSide(MqttClient, Protocol):
    """What the handshake uses of the connection (workers/mqtt_connection.py)."""

    open: bool  # the CONNACK is out
    connect: P.Connect | None
    login: tuple[str, bytes, str]  # user, password, vhost
    external: bool  # log in with the TLS client certificate
    prefetch: int  # --mqtt-prefetch: QoS 1 and 2 deliveries in flight per queue
    expect: list[Callable[[Any], None]]  # channel 1's sync replies (a few at most)
    amqp: Any  # the inner connection (None once it ended)
    subscriptions: Any  # its Subscriptions (their declares: channel 2)

    def refuse(self, code: tuple[int, int]) -> None:
        """CONNACK with a refusal (3.1.1's code, 5.0's), then the close."""

    def start_session(self) -> None:
        """Channel 1 is ready: the session, then the CONNACK."""


log = logging.getLogger("shoal.mqtt")


def log_in(conn: InnerSide) -> None:
    """The inner connection's login, in place (Handshake.open_in_place:
    no handshake frames), then channel 1 once it is open: at once, or at
    connection.open-ok where the scheduler checks a connection limit first.
    A refusal comes back as the connection's close (`answer`)."""
    user, password, vhost = conn.login
    mechanism, response = "PLAIN", b"\x00" + user.encode() + b"\x00" + password
    if conn.external:
        mechanism, response = "EXTERNAL", b""
    assert conn.connect is not None
    props: dict[str, Any] = {"product": "Shoal MQTT", "client_id": conn.connect.client_id}
    props["capabilities"] = {"authentication_failure_close": True}  # (a refusal's 403)
    start_ok = C.Connection.StartOk(
        client_properties=props, mechanism=mechanism, response=response.decode()
    )
    amqp = conn.amqp
    opened = amqp.handshake.open_in_place(start_ok, vhost)
    conn.frame_max = amqp.frame_max or conn.frame_max  # (what tune would have said)
    if opened:
        open_channel(conn)


def answer(conn: InnerSide, channel: int, frame: Any) -> None:
    """A frame the inner connection wrote that is not a delivery or a confirm."""
    if channel == DECLARES:
        conn.subscriptions.declares.answer(frame)
    elif isinstance(frame, C.Connection.OpenOk):  # (after a connection limit's check)
        open_channel(conn)
    elif isinstance(frame, C.Channel.OpenOk):  # (the methods behind it went with it)
        pass
    elif isinstance(frame, C.Connection.Close):  # (the login refused, or closed later)
        code, text = frame.reply_code or 0, frame.reply_text or ""
        log.info("mqtt client %s: %s", conn.client_id or "(not connected)", text)
        conn.method(C.Connection.CloseOk(), 0)
        if conn.open:
            conn.disconnect(M.disconnect_reason_of(code, text))
        else:
            conn.refuse(M.refusal_of(code, text))
    elif isinstance(frame, C.Channel.Close):
        log.info("mqtt client %s: %s", conn.client_id or "(not connected)", frame.reply_text)
        conn.method(C.Channel.CloseOk(), 1)
        conn.disconnect(0x87 if frame.reply_code == 403 else 0x80)
    elif channel == 1 and conn.expect and conn.amqp is not None:  # (not once it ended)
        conn.expect.pop(0)(frame)


def open_channel(conn: InnerSide) -> None:
    """Channel 1, in confirm mode, with its flow control: QoS 1 and 2
    deliveries in flight --mqtt-prefetch per queue, and over all queues at
    most the 5.0 client's receive maximum (MQTT-3.3.4-9; the channel's
    global prefetch; QoS 0 queues go without acks). Its methods go
    together, not each at the reply to the one before: the inner
    connection takes them in order. The session starts at the last reply."""
    assert conn.connect is not None
    receive_maximum = conn.connect.properties.get("receive_maximum")
    methods = [OPEN, CONFIRM_SELECT, C.Basic.Qos(prefetch_count=conn.prefetch)]
    if receive_maximum is not None:
        methods.append(C.Basic.Qos(prefetch_count=receive_maximum, global_=True))
    replies = len(methods) - 1  # (channel.open-ok is not expected: answer)
    conn.expect += [ignore_reply] * (replies - 1)
    conn.expect.append(lambda _r: conn.start_session())
    conn.to_amqp(b"".join([inner_frames.encoded(method, 1) for method in methods]))


def ignore_reply(_reply: Any) -> None:
    """A reply nothing waits for (the bridge's calls whose answer only keeps the order)."""


CONFIRM_SELECT = C.Confirm.Select()


DECLARES = 2  # the inner connection's channel for the subscriptions' queue.declares


def refusal_code(close: C.Channel.Close, level5: bool) -> int:
    """The SUBACK code of a filter whose queue.declare `close` refused (5.0's;
    3.1.1 has 0x80 only): the queue limits (--max-queues: 506; a vhost's
    max-queues: 406 "... queue limit ...") are a quota (0x97), a
    permission's 403 is not authorized (0x87), the rest unspecified."""
    code, text = close.reply_code or 0, close.reply_text or ""
    if not level5:
        return 0x80
    if code == 506 or (code == 406 and "queue limit" in text):
        return 0x97
    return 0x87 if code == 403 else 0x80


class Declares:
    """Channel 2 of an MQTT client's inner connection: its subscriptions'
    queue.declares, one at a time. A declare the broker refuses (a queue
    limit, a permission) closes this channel and not channel 1, whose
    consumers deliver the client's other subscriptions: the SUBSCRIBE
    answers that filter with a failure code and the connection goes on
    (MQTT-3.9.3), and the channel opens again for the next declare. With
    nothing left to declare the channel closes: a channel is some 2 KiB of
    the worker's (its book, publisher, ingest...), and most clients
    subscribe once, at their connect. A declare may bring a queue.bind to
    send on this channel at its declare-ok (`follow`): the declare's
    callback sends the consume on channel 1 in the same turn, and the worker
    asks the scheduler for both at once (a SUBSCRIBE's round trips to it:
    two, not three)."""

    __slots__ = ("conn", "sent", "state", "waiting")

    def __init__(self, conn: MqttClient) -> None:
        self.conn = conn
        self.state = CHANNEL_CLOSED
        self.sent = False  # the first waiting declare is under way
        # (declare or its bind, its reply's callback, its refusal's, what follows it)
        self.waiting: list[tuple[Any, Reply, Reply, Follow | None]] = []

    def declare(
        self, method: Any, then: Reply, refused: Reply, follow: Follow | None = None
    ) -> None:
        """queue.declare `method`: `then` gets its DeclareOk, `refused` the
        Channel.Close. With `follow` (a queue.bind, its BindOk's callback,
        its Channel.Close's), the bind goes at the DeclareOk, before `then`."""
        self.waiting.append((method, then, refused, follow))
        if not self.sent:
            self._next()

    def answer(self, frame: Any) -> None:
        """A frame on channel 2."""
        if isinstance(frame, C.Channel.OpenOk):  # (its declare went with the open)
            self.state = CHANNEL_OPEN
            return
        if isinstance(frame, C.Channel.CloseOk):  # (ours, idle): open again if needed
            self.state = CHANNEL_CLOSED
            if self.sent:
                self._open()
            return
        if isinstance(frame, C.Channel.Close):
            self.conn.method(C.Channel.CloseOk(), DECLARES)
            self.state = CHANNEL_CLOSED
            log.info("mqtt client %s: %s", self.conn.client_id, frame.reply_text)
        elif not isinstance(frame, (C.Queue.DeclareOk, C.Queue.BindOk)):
            return
        if not (self.sent and self.waiting):  # (nothing of ours was under way)
            return
        _method, then, refused, follow = self.waiting.pop(0)
        if follow is not None and isinstance(frame, C.Queue.DeclareOk):
            bind, bound, bind_refused = follow
            self.waiting.insert(0, (bind, bound, bind_refused, None))
            self.conn.method(bind, DECLARES)  # (before `then`'s consume: one request batch)
            then(frame)
            return
        self.sent = False
        if self.waiting:  # (before the callback, which may declare again)
            self._next()
        elif self.state == CHANNEL_OPEN:  # nothing more to declare: the channel goes
            self.state = CHANNEL_CLOSING
            self.conn.method(IDLE_CLOSE, DECLARES)
        (refused if isinstance(frame, C.Channel.Close) else then)(frame)

    def _next(self) -> None:
        self.sent = True
        if self.state == CHANNEL_OPEN:
            self.conn.method(self.waiting[0][0], DECLARES)
        elif self.state == CHANNEL_CLOSED:
            self._open()
        # (opening: its declare under way; closing: opened again at its CloseOk)

    def _open(self) -> None:
        """channel.open and the first waiting declare behind it, not at its
        open-ok: the inner connection takes them in order, and the bridge
        saves a turn of its loop and a read of the inner frames a SUBSCRIBE."""
        self.state = CHANNEL_OPENING
        self.conn.method(OPEN, DECLARES)
        self.conn.method(self.waiting[0][0], DECLARES)


OPEN = C.Channel.Open()
IDLE_CLOSE = C.Channel.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0)
# Channel 2's states (Declares.state)
CHANNEL_CLOSED, CHANNEL_OPENING, CHANNEL_OPEN, CHANNEL_CLOSING = range(4)
