"""Where each MQTT client id is connected, for its takeover (issue 41).

A client id that connects again closes its older connection, on whichever
IO worker holds it (MQTT-3.1.4-2). The worker of the new connection closes
an older one of its own (workers/mqtt_connection.py start_session); one on
another worker is the scheduler's to find. It used to tell every worker of
every connect (a TakeOver each), so each connect woke every worker: with
16 workers, 16 wake-ups and decodes for a device that had no older
connection at all. Here the scheduler keeps each client id's newest
connection and tells only the worker that holds an older one.

The map is kept from the workers' notices (ClientIdConnected, ConnClosed)
and rebuilt from their HELLOs (a new scheduler: each worker lists its MQTT
clients) and their deaths (none left there). A notice lost with a dead
scheduler is in the HELLO that follows. Whichever connection's notice the
scheduler takes last is the newest, as when every worker was told; a
HELLO's connection is older than a notice's (see known()).
"""

from __future__ import annotations

from shoal.broker.scheduler.state import worker_of

Key = tuple[str, str]  # (vhost, client id)


class MqttClients:
    """Each (vhost, client id)'s newest connection, and back."""

    __slots__ = ("by_conn", "by_key")

    def __init__(self) -> None:
        self.by_key: dict[Key, int] = {}
        self.by_conn: dict[int, Key] = {}

    def connected(self, vhost: str, client_id: str, conn_id: int) -> int | None:
        """Connection `conn_id` took the client id: the older connection it
        takes over on another worker, if there is one (the worker that
        holds it is told; one on the same worker was closed there)."""
        key = (vhost, client_id)
        older = self.by_key.get(key)
        self.by_key[key] = conn_id
        self.by_conn[conn_id] = key
        if older is None or older == conn_id:
            return None
        self.by_conn.pop(older, None)
        return older if worker_of(older) != worker_of(conn_id) else None

    def closed(self, conn_id: int) -> None:
        """Connection `conn_id` ended (an MQTT one or not)."""
        key = self.by_conn.pop(conn_id, None)
        if key is not None and self.by_key.get(key) == conn_id:
            del self.by_key[key]

    def known(self, worker: int, clients: list[tuple[int, str, str]]) -> list[tuple[str, str, int]]:
        """A worker's HELLO (or its death, with none): its MQTT clients now,
        (conn_id, vhost, client id) each. What it must take over, (vhost,
        client id, the newer connection) each: a client id another worker's
        connection holds here came in a notice this scheduler took, after
        the connect the HELLO reports (whose notice went to a scheduler that
        died), or in an earlier HELLO (two connections left by a lost
        notice: the first reported stays, so that one is left)."""
        for conn_id in [c for c in self.by_conn if worker_of(c) == worker]:
            self.closed(conn_id)
        takeovers = []
        for conn_id, vhost, client_id in clients:
            key = (vhost, client_id)
            newer = self.by_key.get(key)
            if newer is not None and newer != conn_id:
                takeovers.append((vhost, client_id, newer))
                continue
            self.by_key[key] = conn_id
            self.by_conn[conn_id] = key
        return takeovers
