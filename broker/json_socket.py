"""One JSON request and its JSON answer per connection, on a unix socket
in the runtime directory: how the operator's verbs reach the processes
that answer them without the scheduler's control socket (a cluster node's
agent, broker/cluster/cluster_verbs.py; the shovel process,
broker/shovel/runner.py). Who can open the socket may ask: it is the
runtime directory's owner's (0700)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
READ_TIMEOUT = 10.0  # s: a client that connects and says nothing


async def serve(path: str, handle: Handler) -> asyncio.base_events.Server:
    """Answer each connection's one request line with `handle`'s answer."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise TypeError("a request is one JSON object")
                answer = await handle(request)
            except (ValueError, KeyError, TypeError) as exc:
                answer = {"error": f"bad request: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_unix_server(one, path)


def ask(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request and its answer (OSError: nobody answers at `path`)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(message).encode() + b"\n")
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer
