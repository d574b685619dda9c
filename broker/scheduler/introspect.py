"""The scheduler's control socket: what `shoal status --consumers` shows,
and the requests of `shoal ctl`, `shoal policy` and the management API (one
JSON object per line, typed in control.py, each answered by the handler
the scheduler's table names for its op, scheduler.py). Its file's permissions
(the runtime directory's) are the access check.

The scheduler knows each consumer's place in its queue's
QueueConsumerManager (interested, notified, not interested, non-acquiring);
only the consumer's IO worker knows its pointer, credit and unacked count.
A request on `<runtime dir>/scheduler.sock` (one line, `consumers`) makes
the scheduler ask every worker (INSPECT) and answer with one JSON document
that joins the two, per queue. A worker that does not answer within
REPLY_TIMEOUT is named in `missing_workers`; its consumers are listed with
the scheduler's half only. Nothing here is on the message path.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from shoal.broker import ipc, node_name
from shoal.broker.amqp.definitions import Definitions
from shoal.broker.scheduler import control as C
from shoal.broker.scheduler.state import QueueState

log = logging.getLogger("shoal.scheduler")

SOCKET_NAME = "scheduler.sock"
REPLY_TIMEOUT = 2.0
REQUEST_TIMEOUT = 5.0
MAX_REQUEST = 256 << 20
CLOSED_BY_DEFAULT = "Closed via management plugin"


def socket_path(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, SOCKET_NAME)


class SchedulerView(Protocol):
    """What the control socket reads of the scheduler's shared state
    (state.SchedulerState)."""

    @property
    def links(self) -> Mapping[int, ipc.Link[ipc.ToScheduler]]: ...

    @property
    def queues(self) -> Mapping[int, QueueState]: ...

    @property
    def definitions(self) -> Definitions: ...

    def ready(self, q: QueueState) -> int: ...
    def messages(self, q: QueueState) -> int: ...

    def unacked(self, q: QueueState) -> int: ...

    def changes(self, q: QueueState) -> int: ...


# A connection request's answer from the connections the workers described.
ConnectionAnswer = Callable[[Any, list[dict[str, Any]]], C.Reply]


class Introspection:
    def __init__(
        self, scheduler: SchedulerView, handlers: Mapping[type[C.Op], C.Handler], path: str
    ) -> None:
        self.scheduler = scheduler
        self.handlers = handlers  # op type -> the part's method that answers it (scheduler.py)
        self.path = path
        self._connection_answers: dict[type[C.Op], ConnectionAnswer] = {
            C.ListConnections: _list_connections,
            C.ListChannels: _list_channels,
            C.ListConsumers: _list_consumers,
            C.CloseConnection: self._close_connection,
        }
        self._reqs = itertools.count(1)
        # req -> (records by worker, workers still to answer, all answered)
        self._waiting: dict[int, tuple[dict[int, list[Any]], set[int], asyncio.Future[None]]] = {}
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        try:
            os.unlink(self.path)  # left by a predecessor killed with SIGKILL
        except FileNotFoundError:
            pass
        # One request is one line: an imported definitions file may be long.
        self._server = await asyncio.start_unix_server(
            self._serve, path=self.path, limit=MAX_REQUEST
        )

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def on_consumers(self, worker: int, req: int, records: list[Any]) -> None:
        """A worker's answer to INSPECT."""
        waiting = self._waiting.get(req)
        if waiting is None:
            return  # too late: the request has been answered already
        replies, expected, done = waiting
        replies[worker] = records
        expected.discard(worker)
        if not expected and not done.done():
            done.set_result(None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
            answer: C.Reply | dict[str, Any]
            try:
                if line.strip() == b"consumers":
                    answer = await self.consumers()
                elif line.startswith(b"{"):  # one JSON request (control.py)
                    answer = await self.answer(C.decode(line))
                else:
                    answer = C.Failed(f"unknown request {line.strip()[:40]!r}; try 'consumers'")
            except Exception:  # a bug: this request's failure, answered, not the scheduler's
                log.exception("control request %.80r failed", line)
                answer = C.Failed("internal error (see the broker's log)")
            writer.write(C.encode(answer))
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, request: C.Op | C.Failed) -> C.Reply:
        """A decoded request's answer (a refusal is its own)."""
        if isinstance(request, C.Failed):
            return request
        if isinstance(request, C.ExchangeStats):
            return await self.exchange_stats()
        if isinstance(request, C.CONNECTION_REQUESTS):
            return await self.connection_request(request)
        return C.run(self.handlers[type(request)], request)

    async def _ask_workers(self, what: str) -> tuple[dict[int, list[Any]], set[int]]:
        """Every worker's INSPECT answer (by worker), and the workers that
        did not answer within REPLY_TIMEOUT."""
        scheduler = self.scheduler
        req = next(self._reqs)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        replies: dict[int, list[Any]] = {}
        expected = set(scheduler.links)
        self._waiting[req] = (replies, expected, done)
        try:
            for link in scheduler.links.values():
                link.send(ipc.Inspect(req, what))
            if expected:
                await asyncio.wait_for(done, REPLY_TIMEOUT)
        except TimeoutError:
            pass
        finally:
            del self._waiting[req]
        return replies, expected

    async def connection_request(self, request: C.Op) -> C.Reply:
        """list_connections, list_channels, list_consumers (rabbitmqctl's
        items), close_connection: from the workers' answers."""
        replies, _missing = await self._ask_workers("connections")
        connections = [
            {**c, "pid": f"<{node_name.node_name()}.{worker}.{c['id']:x}>"}
            for worker, described in sorted(replies.items())
            for c in described
        ]
        reply = C.run(lambda r: self._connection_answers[type(r)](r, connections), request)
        if isinstance(request, C.CloseConnection) and not isinstance(reply, C.Failed):
            # Answered, as RabbitMQ's close_connection, once the close frame
            # is written: each worker reads its link in order, so its answer
            # to this question comes after it handled the Disconnect.
            await self._ask_workers("connections")
        return reply

    async def exchange_stats(self) -> C.Rows:
        """Each exchange's messages in and out, summed over the workers (a
        worker replaced since counts from nothing again)."""
        replies, _missing = await self._ask_workers("exchanges")
        vhosts = {i: name for name, i in self.scheduler.definitions.vhost_ids.items()}
        summed: dict[tuple[str, str], list[int]] = {}
        for counts in replies.values():
            for c in counts:
                vhost = vhosts.get(c["vhost_id"])
                if vhost is not None:
                    total = summed.setdefault((vhost, c["name"]), [0, 0])
                    total[0] += c["in"]
                    total[1] += c["out"]
        return C.Rows(
            [
                {"vhost": vhost, "name": name, "publish_in": n_in, "publish_out": n_out}
                for (vhost, name), (n_in, n_out) in sorted(summed.items())
            ]
        )

    def _close_connection(
        self, request: C.CloseConnection, connections: list[dict[str, Any]]
    ) -> C.Reply:
        name = request.name
        chosen = [c for c in connections if name in (c["name"], c["pid"])]
        if not chosen:
            return C.Failed(f"no connection '{name}'", 69)
        text = request.reason or CLOSED_BY_DEFAULT
        for link in self.scheduler.links.values():
            link.send(ipc.Disconnect("", "", chosen[0]["id"], text))
        return C.OK

    async def consumers(self) -> dict[str, Any]:
        scheduler = self.scheduler
        replies, expected = await self._ask_workers("consumers")
        by_key = {
            (worker, record["cid"]): record
            for worker, records in replies.items()
            for record in records
        }
        queues = sorted(scheduler.queues.values(), key=lambda q: (q.vhost, q.name))
        return {
            "queues": [self._queue(q, by_key) for q in queues],
            "missing_workers": sorted(expected),
        }

    def _queue(
        self, q: QueueState, by_key: dict[tuple[int, int], dict[str, Any]]
    ) -> dict[str, Any]:
        scheduler = self.scheduler
        now = scheduler.changes(q)
        active = q.qcm.active() if q.qcm.single_active else None
        consumers = []
        for key in q.qcm:
            entry: dict[str, Any] = {
                "worker": key[0],
                "state": q.qcm.state(key).value,
                # Ran dry at the queue's current state: skipped until it changes.
                "seen_everything": q.dry.get(key) == now or q.browsing.get(key) == now,
            }
            if q.qcm.single_active:
                entry["active"] = key == active
            entry.update(by_key.get(key, {"cid": key[1]}))
            consumers.append(entry)
        return {
            "vhost": q.vhost,
            "name": q.name.decode(errors="replace"),
            "max_priority": q.max_priority,
            "single_active_consumer": q.qcm.single_active,
            "messages_ready": scheduler.messages(q),
            "messages_unacked": scheduler.unacked(q),
            "consumers": consumers,
        }


def _list_connections(request: C.ListConnections, connections: list[dict[str, Any]]) -> C.Rows:
    return C.Rows([{k: v for k, v in c.items() if k != "channels"} for c in connections])


def _channels(connections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **ch,
            "pid": f"{c['pid'][:-1]}.{ch['number']}>",
            "connection": c["name"],
            "connection_pid": c["pid"],
            "name": f"{c['name']} ({ch['number']})",
            "user": c["user"],
            "vhost": c["vhost"],
        }
        for c in connections
        for ch in c["channels"]
    ]


def _list_channels(request: C.ListChannels, connections: list[dict[str, Any]]) -> C.Rows:
    return C.Rows(
        [{k: v for k, v in ch.items() if k != "consumers"} for ch in _channels(connections)]
    )


def _list_consumers(request: C.ListConsumers, connections: list[dict[str, Any]]) -> C.Rows:
    vhost = request.vhost
    return C.Rows(
        [
            {
                **consumer,
                "queue_name": consumer["queue"],
                "channel_pid": ch["pid"],
                "channel": ch["name"],
                "activity_status": "up",
                "vhost": ch["vhost"],
                "user": ch["user"],
            }
            for ch in _channels(connections)
            for consumer in ch["consumers"]
            if vhost is None or ch["vhost"] == vhost
        ]
    )
