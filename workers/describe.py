"""What list_connections / list_channels (and so the management API and
its web UI) show of an open client connection: rabbitmqctl's item names,
the byte counts of its socket, and its client properties as JSON can carry
them. Apart from workers/connection.py, which owns the transport."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from shoal.broker.listeners import socket_address


class Describable(Protocol):
    id: int
    user: str
    vhost: str
    auth_mechanism: str
    channel_max: int
    frame_max: int
    heartbeat: int
    connected_at: int
    recv_oct: int
    send_oct: int
    recv_cnt: int
    send_cnt: int
    client_properties: dict[str, Any]
    protocol: str

    @property
    def blocked_sent(self) -> bool: ...


def connection_name(transport: asyncio.BaseTransport) -> str:
    """RabbitMQ's name of a connection: "peer:port -> local:port"."""
    peer = socket_address(transport.get_extra_info("peername"))
    local = socket_address(transport.get_extra_info("sockname"))
    return f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"


def connection_row(
    conn: Describable, transport: asyncio.Transport, channels: list[dict[str, Any]]
) -> dict[str, Any]:
    peer = socket_address(transport.get_extra_info("peername"))
    local = socket_address(transport.get_extra_info("sockname"))
    ssl_object = transport.get_extra_info("ssl_object")
    return {
        "id": conn.id,
        "name": connection_name(transport),
        "user": conn.user,
        "vhost": conn.vhost,
        "host": local[0],
        "port": local[1],
        "peer_host": peer[0],
        "peer_port": peer[1],
        "ssl": ssl_object is not None,
        "ssl_protocol": ssl_object.version() if ssl_object is not None else "",
        "auth_mechanism": conn.auth_mechanism,
        "protocol": conn.protocol,
        "channel_max": conn.channel_max,
        "frame_max": conn.frame_max,
        "timeout": conn.heartbeat,
        "state": "blocked" if conn.blocked_sent else "running",
        "connected_at": conn.connected_at,
        "recv_oct": conn.recv_oct,
        "send_oct": conn.send_oct,
        "recv_cnt": conn.recv_cnt,
        "send_cnt": conn.send_cnt,
        "send_pend": transport.get_write_buffer_size(),
        "client_properties": plain_table(conn.client_properties),
        "channels": channels,
    }


def plain_table(table: dict[str, Any]) -> dict[str, Any]:
    """A field table as JSON can carry it (capabilities included, as
    RabbitMQ's API shows them); values JSON cannot carry are left out."""
    plain: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, bytes):
            plain[key] = value.decode(errors="replace")
        elif isinstance(value, dict):
            plain[key] = plain_table(value)
        elif isinstance(value, str | int | float | bool):
            plain[key] = value
    return plain
