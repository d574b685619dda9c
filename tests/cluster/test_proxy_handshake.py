"""The follower's proxy knows when a piped connection is open (its
connection.open-ok from the leader), to close it as a broker would: 320
CONNECTION_FORCED (broker/cluster/proxy.py), without sockets."""

from __future__ import annotations

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.common import FieldTable

from shoal.broker.cluster.proxy import FORCED, Handshake


def handshake_frames() -> list[bytes]:
    server_props: FieldTable = {"product": "Shoal"}
    return [
        pamqp_frame.marshal(m, 0)
        for m in (
            commands.Connection.Start(server_properties=server_props),
            commands.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60),
            commands.Connection.OpenOk(),
        )
    ]


def leader_bytes() -> bytes:
    return b"".join(handshake_frames())


def test_open_only_after_the_open_ok_however_the_bytes_are_split() -> None:
    data = leader_bytes()
    for step in (1, 3, 7, len(data)):
        h = Handshake()
        for at in range(0, len(data), step):
            assert not h.open
            h.feed(data[at : at + step])
        assert h.open, step


def test_a_connection_refused_before_open_is_never_open() -> None:
    h = Handshake()
    h.feed(b"".join(handshake_frames()[:2]))  # start and tune, then a refusal
    h.feed(pamqp_frame.marshal(commands.Connection.Close(403, "ACCESS_REFUSED", 0, 0), 0))
    assert not h.open


def test_the_forced_close_is_a_320_on_channel_0() -> None:
    _used, channel, method = pamqp_frame.unmarshal(FORCED)
    assert channel == 0 and isinstance(method, commands.Connection.Close)
    assert method.reply_code == 320 and method.reply_text.startswith("CONNECTION_FORCED - ")
