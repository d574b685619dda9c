"""`shoal ctl cluster_status | step_down | transfer_leadership NODE`: the
operator's verbs of a cluster node, answered by its agent (node.py) on a
unix socket in the runtime directory, one JSON request and answer per
connection (issue 29)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from shoal.broker import json_socket

SOCKET = "cluster.sock"
VERBS = ("cluster_status", "step_down", "transfer_leadership")

Handler = json_socket.Handler


def socket_path(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, SOCKET)


async def serve(runtime_dir: str, handle: Handler) -> asyncio.base_events.Server:
    return await json_socket.serve(socket_path(runtime_dir), handle)


def request(runtime_dir: str, message: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    return json_socket.ask(socket_path(runtime_dir), message, timeout)


def render(status: dict[str, Any]) -> str:
    lines = [
        f"Cluster {status['name']}",
        f"This node: {status['node']} ({status['role']})",
        f"Leader: {status['leader'] or '(none)'}",
        f"In-sync set: {', '.join(status['isr']) or '-'}",
    ]
    followers = status.get("followers", [])
    if followers:
        lines.append("Followers:")
        for f in followers:
            state = "in sync" if f["in_sync"] else "syncing" if not f["streaming"] else "lagging"
            lines.append(
                f"  {f['node']} {f['address']}: {state}, lag {f['lag_bytes']} bytes, "
                f"{f['lag_seconds']} s"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="shoal ctl")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--runtime-dir", default="")
    p.add_argument("--formatter", choices=["table", "json"], default="table")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-s", "--silent", action="store_true")
    p.add_argument("verb", choices=VERBS)
    p.add_argument("node", nargs="?", default="")
    ns = p.parse_args(argv)
    from shoal.broker.config import Config

    runtime_dir = Config(port=ns.port, runtime_dir=ns.runtime_dir).runtime_path()
    if ns.verb == "transfer_leadership" and not ns.node:
        p.error("transfer_leadership needs the node to hand leadership to")
    try:
        answer = request(runtime_dir, {"op": ns.verb, "node": ns.node})
    except OSError as exc:
        print(f"Error: no cluster node answering at {runtime_dir}: {exc}", file=sys.stderr)
        return 69
    if "error" in answer:
        print(f"Error:\n{answer['error']}", file=sys.stderr)
        return 70
    if ns.formatter == "json":
        print(json.dumps(answer))
    elif ns.verb == "cluster_status":
        print(render(answer))
    elif not (ns.quiet or ns.silent):
        print(answer.get("message", "done"))
    return 0
