"""The frames between an MQTT client's bridge (workers/mqtt_connection.py)
and its inner AMQP connection, without pamqp's work each time where the
bytes repeat.

The login itself has no frames (Handshake.open_in_place); what follows
it does: channel.open, confirm.select, basic.qos and their replies, each
encoded by pamqp on one side and decoded on the other. In a storm of 8,000
connects that was 35-40 % of the workers' CPU (docs/benchmarks.md). Most
are the same bytes for every client of a worker: the bridge's are encoded
once (`encoded`), and the replies it reads are decoded once (`decoded`).
"""

from __future__ import annotations

from typing import Any

from pamqp import commands as C
from pamqp import frame as pamqp_frame

CACHE_MAX = 64  # distinct frames kept each way

# What the bridge sends with the same fields at every connect of a worker
# (channel.open, confirm.select, basic.qos; the declares' channel closed
# when idle, workers/mqtt_inner.py Declares).
_SAME_EACH_TIME = (
    C.Channel.Open,
    C.Confirm.Select,
    C.Basic.Qos,
    C.Channel.Close,
)
# The inner connection's replies the bridge only tests the type of: one
# object per distinct frame serves every connection (open-ok: after a
# connection limit's check, Handshake.open_in_place).
_SAME_REPLIES = (
    C.Connection.OpenOk,
    C.Channel.OpenOk,
    C.Channel.CloseOk,
    C.Confirm.SelectOk,
    C.Basic.QosOk,
)
_encoded: dict[tuple[Any, ...], bytes] = {}
_decoded: dict[bytes, tuple[int, Any]] = {}


def encoded(method: Any, channel: int) -> bytes:
    """`method`'s frame on `channel`, as pamqp.frame.marshal writes it."""
    if not isinstance(method, _SAME_EACH_TIME):
        return pamqp_frame.marshal(method, channel)
    key = (type(method), channel, *dict(method).values())
    frame = _encoded.get(key)
    if frame is None:
        if len(_encoded) >= CACHE_MAX:
            _encoded.clear()
        frame = _encoded[key] = pamqp_frame.marshal(method, channel)
    return frame


def decoded(raw: bytes) -> tuple[int, Any]:
    """A whole frame's channel and method (or other frame), as
    pamqp.frame.unmarshal reads them."""
    hit = _decoded.get(raw)
    if hit is not None:
        return hit
    _used, channel, frame = pamqp_frame.unmarshal(raw)
    if isinstance(frame, _SAME_REPLIES):
        if len(_decoded) >= CACHE_MAX:
            _decoded.clear()
        _decoded[raw] = (channel, frame)
    return channel, frame
