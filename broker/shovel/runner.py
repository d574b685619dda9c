"""The shovel process (one more child of the supervisor): runs every shovel
the definitions hold, and answers questions about them.

It reads the definitions journal in shared memory as the management
process does (shm/catalog.py): a shovel parameter set starts a shovel (or
restarts it with its new definition), one cleared stops it. So shovels are
as durable as the definitions (definitions.log), move with them in an
export, and run on a cluster's leader only (a follower runs no broker), the
new leader's from the replicated log after a failover.

Its socket (`<runtime dir>/shovels.sock`, shovel_socket.py) answers one JSON
request a connection: the status rows (GET /api/shovels, `shoal ctl
shovel_status`) and a restart. It holds nothing that is not in the
definitions: the supervisor may restart it at any time; a shovel's
unconfirmed messages are then still unacked at its source, and come again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from typing import Any

from setproctitle import setproctitle

from shoal.broker import json_socket, node_name
from shoal.broker.amqp import shovel_definition as S
from shoal.broker.amqp.definitions import Definitions, Op
from shoal.broker.config import Config
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.introspect import socket_path as control_socket
from shoal.broker.shovel.link import Endpoints, Shovel
from shoal.broker.shovel.shovel_socket import socket_path
from shoal.shm.catalog import CatalogFollower
from shoal.shm.segment import Segment

log = logging.getLogger("shoal.shovel")

POLL_INTERVAL = 0.2  # s: how often the journal is looked at for changes ...
# ... while no shovel runs: an idle broker's shovels process woke five times a
# second for nothing (0.13 % of a core, more than both IO workers together);
# a first shovel starts within a second of its definition.
IDLE_POLL_INTERVAL = 1.0
Key = tuple[str, str]  # (vhost, name)


class Shovels:
    """Every shovel of the definitions, each running as its definition says."""

    def __init__(self, config: Config, seg: Segment) -> None:
        self.config = config
        self.journal = CatalogFollower(seg, Op, Definitions)
        self.running: dict[Key, tuple[dict[str, Any], Shovel]] = {}
        # Definitions this version cannot run (said once in the log each).
        self.refused: dict[Key, dict[str, Any]] = {}
        self.node = node_name.node_name()
        self.endpoints = Endpoints(config.port, config.default_user, config.default_pass)

    def wanted(self) -> dict[Key, dict[str, Any]]:
        return {
            (vhost, name): value
            for vhost, parameters in self.journal.current().parameters.items()
            for (component, name), value in parameters.items()
            if component == S.COMPONENT
        }

    async def reconcile(self) -> None:
        wanted = self.wanted()
        for key in [k for k, (value, _) in self.running.items() if wanted.get(k) != value]:
            _value, shovel = self.running.pop(key)
            log.info("shovel %r in vhost %r stopped", key[1], key[0])
            await shovel.stop()
        self.refused = {k: v for k, v in self.refused.items() if wanted.get(k) == v}
        for key, value in wanted.items():
            if key not in self.running and self.refused.get(key) != value:
                self._start(key, value)

    def _start(self, key: Key, value: dict[str, Any]) -> None:
        vhost, name = key
        try:
            spec = S.parse(name, value)
        except S.ShovelError as exc:  # checked when set: only an older version's
            log.error("shovel %r in vhost %r not started: %s", name, vhost, exc)
            self.refused[key] = value
            return
        cluster_name = self.config.cluster_name or self.node
        try:
            shovel = Shovel(vhost, name, spec, self.endpoints, cluster_name, self._completed)
        except Exception:  # a bug with this definition: the other shovels start all the same
            log.exception("shovel %r in vhost %r not started", name, vhost)
            self.refused[key] = value
            return
        self.running[key] = (value, shovel)
        shovel.start()
        log.info("shovel %r in vhost %r started", name, vhost)

    async def _completed(self, shovel: Shovel) -> None:
        """src-delete-after done: the shovel removes its own parameter."""
        clear = C.ClearParameter(vhost=shovel.vhost, component=S.COMPONENT, name=shovel.name)
        try:
            reader, writer = await asyncio.open_unix_connection(
                control_socket(self.config.runtime_path())
            )
            try:
                writer.write(C.encode(clear))
                await writer.drain()
                answer = json.loads(await asyncio.wait_for(reader.readline(), 30.0))
            finally:
                writer.close()
        except (OSError, TimeoutError, ValueError) as exc:
            log.error("shovel %r done, but its parameter stays: %s", shovel.name, exc)
            return
        if "error" in answer:
            log.error("shovel %r done, but its parameter stays: %s", shovel.name, answer["error"])
        else:
            log.info("shovel %r in vhost %r done, its parameter removed", shovel.name, shovel.vhost)

    def rows(self, vhost: str | None) -> list[dict[str, Any]]:
        return [
            shovel.status(self.node)
            for (v, _name), (_value, shovel) in sorted(self.running.items())
            if vhost in (None, v)
        ]

    async def restart(self, vhost: str, name: str) -> bool:
        entry = self.running.pop((vhost, name), None)
        if entry is None:
            return False
        log.info("shovel %r in vhost %r will be restarted", name, vhost)
        await entry[1].stop()
        self._start((vhost, name), entry[0])
        return True

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """A request on the shovel socket (shovel_socket.py)."""
        op = message.get("op")
        if op == "status":
            vhost = message.get("vhost")
            return {"rows": self.rows(vhost if isinstance(vhost, str) else None)}
        if op == "restart":
            found = await self.restart(str(message.get("vhost")), str(message.get("name")))
            return {"ok": True} if found else {"error": "not_found"}
        return {"error": f"unknown request {op!r}"}

    async def stop_all(self) -> None:
        await asyncio.gather(*(shovel.stop() for _value, shovel in self.running.values()))
        self.running.clear()


async def _main(config: Config, seg: Segment) -> int:
    shovels = Shovels(config, seg)
    path = socket_path(config.runtime_path())
    server = await json_socket.serve(path, shovels.answer)
    os.chmod(path, 0o600)  # who can open it administers the shovels
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        try:
            await shovels.reconcile()
        except Exception:
            log.exception("shovels: reconciling with the definitions failed")
        with contextlib.suppress(TimeoutError):
            interval = POLL_INTERVAL if shovels.running else IDLE_POLL_INTERVAL
            await asyncio.wait_for(stop.wait(), interval)
    server.close()
    await shovels.stop_all()  # unconfirmed messages go back to their sources
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return 0


def run_shovels(config: Config, seg: Segment) -> int:
    setproctitle(f"shoal: shovels (port {config.port})")
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its own lines for every reconnect
    return asyncio.run(_main(config, seg))
