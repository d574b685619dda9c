"""connection.start's frame, encoded once per worker and what it depends on
(workers/handshake.py start_frame): what a client reads in it stays right."""

from __future__ import annotations

import os

from pamqp import commands as C
from pamqp import frame as pamqp_frame

from shoal.broker import node_name
from shoal.workers import handshake


def _start(frame: bytes) -> C.Connection.Start:
    _used, channel, method = pamqp_frame.unmarshal(frame)
    assert channel == 0
    assert isinstance(method, C.Connection.Start)
    return method


def test_the_frame_names_the_worker_the_process_and_the_mechanisms() -> None:
    method = _start(handshake.start_frame(3, False, "PLAIN AMQPLAIN"))
    props = method.server_properties
    assert (method.version_major, method.version_minor) == (0, 9)
    assert props["shoal_worker"] == "3"
    assert props["shoal_worker_pid"] == str(os.getpid())
    assert props["capabilities"]["publisher_confirms"] is True
    assert method.mechanisms == "PLAIN AMQPLAIN"
    other = _start(handshake.start_frame(4, False, "PLAIN"))
    assert other.server_properties["shoal_worker"] == "4"
    assert other.mechanisms == "PLAIN"


def test_an_amqp_0_8_client_gets_8_0_and_no_capabilities() -> None:
    method = _start(handshake.start_frame(0, True, "PLAIN"))
    assert (method.version_major, method.version_minor) == (8, 0)
    assert method.server_properties["capabilities"] == {}


def test_a_new_node_name_is_in_the_next_frame() -> None:
    saved = os.environ.get(node_name.ENVIRONMENT)
    try:
        node_name.adopt("shoal@first")
        first = _start(handshake.start_frame(0, False, "PLAIN"))
        node_name.adopt("shoal@second")
        second = _start(handshake.start_frame(0, False, "PLAIN"))
    finally:
        node_name.adopt(saved or "")
    assert first.server_properties["cluster_name"] == "shoal@first"
    assert second.server_properties["cluster_name"] == "shoal@second"
