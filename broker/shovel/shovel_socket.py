"""Asking the shovel process (runner.py) about its shovels, over its socket
in the runtime directory: the status rows and a restart. Used by `shoal
ctl shovel_status | restart_shovel` and the management API."""

from __future__ import annotations

import os
from typing import Any

from shoal.broker import json_socket

SOCKET_NAME = "shovels.sock"
TIMEOUT = 10.0


def socket_path(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, SOCKET_NAME)


def ask(runtime_dir: str, message: dict[str, Any]) -> dict[str, Any]:
    """One request and its answer (OSError: no shovel process answers)."""
    return json_socket.ask(socket_path(runtime_dir), message, TIMEOUT)


def status(runtime_dir: str, vhost: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ask(runtime_dir, {"op": "status", "vhost": vhost})["rows"]
    return rows


def restart(runtime_dir: str, vhost: str, name: str) -> bool:
    """Whether a shovel by that name ran (and now starts again)."""
    return "error" not in ask(runtime_dir, {"op": "restart", "vhost": vhost, "name": name})
