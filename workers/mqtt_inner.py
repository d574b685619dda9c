"""The inner AMQP connection of an MQTT client (workers/mqtt_connection.py),
from the client's side: the login (PLAIN, or EXTERNAL with a TLS client
certificate), tune, open, channel 1 with confirms and the QoS windows, and
its closes as MQTT refusals or disconnects."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from pamqp import commands as C

from shoal.broker.mqtt import mapping as M
from shoal.broker.mqtt import packets as P
from shoal.workers.mqtt_client import MqttClient


class InnerSide(MqttClient, Protocol):
    """What the handshake uses of the connection (workers/mqtt_connection.py)."""

    open: bool  # the CONNACK is out
    connect: P.Connect | None
    login: tuple[str, bytes, str]  # user, password, vhost
    external: bool  # log in with the TLS client certificate
    prefetch: int  # --mqtt-prefetch: QoS 1 and 2 deliveries in flight per queue
    expect: list[Callable[[Any], None]]  # channel 1's sync replies (a few at most)
    amqp: Any  # the inner connection (None once it ended)

    def refuse(self, code: tuple[int, int]) -> None:
        """CONNACK with a refusal (3.1.1's code, 5.0's), then the close."""

    def start_session(self) -> None:
        """Channel 1 is ready: the session, then the CONNACK."""


log = logging.getLogger("shoal.mqtt")


def answer(conn: InnerSide, channel: int, frame: Any) -> None:
    """A frame the inner connection wrote that is not a delivery or a confirm."""
    if isinstance(frame, C.Connection.Start):
        user, password, _vhost = conn.login
        mechanism, response = "PLAIN", b"\x00" + user.encode() + b"\x00" + password
        if conn.external:
            mechanism, response = "EXTERNAL", b""
        assert conn.connect is not None
        props: dict[str, Any] = {"product": "Shoal MQTT", "client_id": conn.connect.client_id}
        props["capabilities"] = {"authentication_failure_close": True}  # (a refusal's 403)
        conn.method(
            C.Connection.StartOk(
                client_properties=props, mechanism=mechanism, response=response.decode()
            ),
            0,
        )
    elif isinstance(frame, C.Connection.Tune):
        conn.frame_max = frame.frame_max or conn.frame_max
        conn.method(C.Connection.TuneOk(frame.channel_max, frame.frame_max, 0), 0)
        conn.method(C.Connection.Open(virtual_host=conn.login[2]), 0)
    elif isinstance(frame, C.Connection.OpenOk):
        conn.method(C.Channel.Open(), 1)
    elif isinstance(frame, C.Channel.OpenOk):
        conn.call(C.Confirm.Select(), lambda _r: flow_control(conn))
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


def flow_control(conn: InnerSide) -> None:
    """QoS 1 and 2 deliveries in flight: --mqtt-prefetch per queue, and over all
    queues at most the 5.0 client's receive maximum (MQTT-3.3.4-9; the
    channel's global prefetch). QoS 0 queues go without acks."""
    assert conn.connect is not None
    receive_maximum = conn.connect.properties.get("receive_maximum")
    then = lambda _r: conn.start_session()  # noqa: E731
    if receive_maximum is not None:
        limit = C.Basic.Qos(prefetch_count=receive_maximum, global_=True)
        then = lambda _r: conn.call(limit, lambda _q: conn.start_session())  # noqa: E731
    conn.call(C.Basic.Qos(prefetch_count=conn.prefetch), then)
