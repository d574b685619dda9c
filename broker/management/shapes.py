"""The fields RabbitMQ 3.10's web UI reads of queues, connections,
channels, vhosts and nodes, beyond what rabbitmqadmin and monitoring
scripts read (issue 27; compared field by field with a private RabbitMQ
node's answers: tests/browser/data/rabbitmq_3_10_ui.json).

What Shoal measures is filled from the broker; what belongs to Erlang's VM
(reductions, garbage collection, Mnesia, the cluster's distribution links)
is left out, and the test that compares the answers names each such field
and why. Data rates of connections are taken from the workers' byte
counts when the API is asked, not sampled in the background: a broker
nobody watches pays nothing for them."""

from __future__ import annotations

import time
from typing import Any

from shoal.broker.management.rates import Rates

# RabbitMQ's answer when a queue has no consumer, a policy or a timestamp.
QUEUE_DEFAULTS: dict[str, Any] = {
    "exclusive_consumer_tag": None,
    "single_active_consumer_tag": None,
    "head_message_timestamp": None,
    "operator_policy": None,
    "recoverable_slaves": None,
    "effective_policy_definition": {},
    "incoming": [],
    "deliveries": [],
}
DATA_RATE_MIN_INTERVAL_S = 4.0  # readings closer than this make no rate


def queue_fields(row: dict[str, Any], consumers: list[dict[str, Any]]) -> dict[str, Any]:
    """A queue's row completed: byte counts it does not track per state are
    split as the messages are, and its consumers as the queue page lists them."""
    messages = row.get("messages", 0)
    message_bytes = row.get("message_bytes", 0)
    ready, unacked = row.get("messages_ready", 0), row.get("messages_unacknowledged", 0)
    durable = bool(row.get("durable"))
    paged = row.get("messages_paged_out", 0)
    capacity = 1.0 if row.get("consumers") and not ready else 0.0
    out = {
        **QUEUE_DEFAULTS,
        "message_bytes": message_bytes,
        "message_bytes_ready": message_bytes * ready // messages if messages else 0,
        "message_bytes_unacknowledged": message_bytes * unacked // messages if messages else 0,
        "message_bytes_persistent": message_bytes if durable else 0,
        "message_bytes_ram": message_bytes,
        "message_bytes_paged_out": row.get("message_bytes_paged_out", 0),
        "messages_persistent": messages if durable else 0,
        "messages_ram": messages - paged,
        "messages_ready_ram": max(0, ready - paged),
        "messages_unacknowledged_ram": unacked,
        "messages_paged_out": paged,
        # RabbitMQ's is a time average; Shoal's a snapshot: its consumers
        # take every message now (1.0), or messages wait for them (0.0).
        "consumer_utilisation": capacity,
        "consumer_capacity": capacity,
        "consumer_details": consumers,
        "memory": message_bytes - row.get("message_bytes_paged_out", 0),  # in the arena
    }
    return {**out, **row}


def consumer_detail(consumer: dict[str, Any], channel: dict[str, Any] | None) -> dict[str, Any]:
    """A consumer as a queue's and a channel's page list it."""
    details = {"name": consumer["channel"], "node": consumer.get("node", "")}
    if channel is not None:
        details.update(
            {
                "connection_name": channel["connection"],
                "number": channel["number"],
                "peer_host": channel.get("peer_host", ""),
                "peer_port": channel.get("peer_port", 0),
                "user": channel["user"],
            }
        )
    return {
        "consumer_tag": consumer["consumer_tag"],
        "queue": {"name": consumer["queue_name"], "vhost": consumer["vhost"]},
        "channel_details": details,
        "ack_required": consumer["ack_required"],
        "exclusive": consumer["exclusive"],
        "prefetch_count": consumer["prefetch_count"],
        "active": consumer["active"],
        "activity_status": consumer["activity_status"],
        "arguments": consumer["arguments"],
    }


class CounterRates:
    """Rates of a row's counters from two readings of them, kept per row
    and replaced when the newer is DATA_RATE_MIN_INTERVAL_S old: the UI
    polls every 5 s, so a rate spans about one poll. Rows not seen in a
    listing are forgotten."""

    def __init__(self) -> None:
        # name -> [(at, counters) older, newer]
        self.readings: dict[str, list[tuple[float, tuple[int, ...]]]] = {}
        self.seen: set[str] = set()

    def rates(self, name: str, now: float, counters: tuple[int, ...]) -> list[float]:
        self.seen.add(name)
        reading = (now, counters)
        kept = self.readings.setdefault(name, [reading])
        if now - kept[-1][0] >= DATA_RATE_MIN_INTERVAL_S:
            kept[:] = [kept[-1], reading]
        (then, old), (at, new) = kept[0], kept[-1]
        span = at - then
        if span <= 0:
            return [0.0] * len(new)
        return [round((b - a) / span, 1) for a, b in zip(old, new, strict=True)]

    def forget_unseen(self) -> None:
        for gone in set(self.readings) - self.seen:
            del self.readings[gone]
        self.seen = set()


class DataRates(CounterRates):
    """Connections' byte rates (recv_oct, send_oct)."""

    def fields(self, rows: list[dict[str, Any]], age_s: int | None) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for row in rows:
            recv, send = row.get("recv_oct", 0), row.get("send_oct", 0)
            recv_rate, send_rate = self.rates(row["name"], now, (recv, send))
            out.append(
                {
                    **row,
                    "recv_oct_details": _details(recv_rate, recv, age_s),
                    "send_oct_details": _details(send_rate, send, age_s),
                }
            )
        self.forget_unseen()
        return out


# A channel's message_stats: what its worker counts of it (workers/channel.py
# describe, `counts`), in RabbitMQ's names.
CHANNEL_STATS = (
    "publish",
    "confirm",
    "drop_unroutable",
    "return_unroutable",
    "deliver_get",
    "ack",
)


class ChannelRates(CounterRates):
    """Channels' message_stats: counts since the channel opened, each with
    its rate over about the UI's last poll."""

    def fields(self, rows: list[dict[str, Any]], age_s: int | None) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for row in rows:
            counts = row.pop("counts", None) or {}
            values = tuple(int(counts.get(stat, 0)) for stat in CHANNEL_STATS)
            rates = self.rates(row["name"], now, values)
            stats: dict[str, Any] = {}
            for stat, value, rate in zip(CHANNEL_STATS, values, rates, strict=True):
                stats[stat] = value
                stats[f"{stat}_details"] = _details(rate, value, age_s)
            out.append({**row, "message_stats": stats})
        self.forget_unseen()
        return out


# An exchange's message_stats, RabbitMQ's names: messages published into it,
# and those it routed to a queue (the workers' counts, workers/publish.py and
# workers/lane.py; summed by broker/scheduler/introspect.py).
EXCHANGE_STATS = ("publish_in", "publish_out")


class ExchangeRates(CounterRates):
    """Exchanges' message_stats: counts since each worker started, each with
    its rate over about the UI's last poll. An exchange nothing was published
    into has none, as on RabbitMQ."""

    def fields(
        self,
        rows: list[dict[str, Any]],
        counts: dict[tuple[str, str], tuple[int, ...]],
        age_s: int | None,
        every: bool = True,
    ) -> list[dict[str, Any]]:
        """`every`: `rows` is the whole list (readings of exchanges not in it
        are forgotten); else a page of one exchange."""
        now = time.monotonic()
        out = []
        for row in rows:
            values = counts.get((row["vhost"], row["name"]))
            if values is None:
                out.append(row)
                continue
            rates = self.rates(f"{row['vhost']}/{row['name']}", now, values)
            stats: dict[str, Any] = {}
            for stat, value, rate in zip(EXCHANGE_STATS, values, rates, strict=True):
                stats[stat] = value
                stats[f"{stat}_details"] = _details(rate, value, age_s)
            out.append({**row, "message_stats": stats})
        if every:
            self.forget_unseen()
        return out


def _details(rate: float, value: int, age_s: int | None) -> dict[str, Any]:
    if age_s is None:
        return {"rate": rate}
    sample = {"sample": value, "timestamp": int(time.time() * 1000)}
    return {"rate": rate, "samples": [sample], "avg": float(value), "avg_rate": rate}


def connection_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A connection's row as the UI reads it (TLS details empty without TLS)."""
    props = row.get("client_properties", {})
    return {
        "type": "network",
        "user_provided_name": props.get("connection_name"),
        "user_who_performed_action": row.get("user", ""),
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "ssl_cipher": None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "recv_oct": 0,
        "send_oct": 0,
        "recv_cnt": 0,
        "send_cnt": 0,
        "send_pend": 0,
        **row,
    }


def channel_fields(
    row: dict[str, Any], connection: dict[str, Any] | None, consumers: list[dict[str, Any]]
) -> dict[str, Any]:
    """A channel's row with its connection's peer and its consumers."""
    peer = connection or {}
    return {
        "messages_unconfirmed": 0,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "user_who_performed_action": row.get("user", ""),
        "pending_raft_commands": 0,
        "deliveries": [],
        "publishes": [],
        **row,
        "connection_details": {
            "name": row["connection"],
            "peer_host": peer.get("peer_host", ""),
            "peer_port": peer.get("peer_port", 0),
        },
        "consumer_details": consumers,
        "state": "running",
    }


def vhost_fields(
    rates: Rates,
    vhost_id: int,
    node: str,
    connections: list[dict[str, Any]],
    age_s: int | None,
) -> dict[str, Any]:
    """A vhost's messages and rates (its queues' summed), its connections'
    bytes, and its state on the node."""
    recv = sum(c.get("recv_oct", 0) for c in connections)
    send = sum(c.get("send_oct", 0) for c in connections)
    recv_rate = sum(c.get("recv_oct_details", {}).get("rate", 0.0) for c in connections)
    send_rate = sum(c.get("send_oct_details", {}).get("rate", 0.0) for c in connections)
    return {
        **rates.vhost(vhost_id, age_s),
        "recv_oct": recv,
        "send_oct": send,
        "recv_oct_details": _details(round(recv_rate, 1), recv, age_s),
        "send_oct_details": _details(round(send_rate, 1), send, age_s),
        "cluster_state": {node: "running"},
        "default_queue_type": "classic",
    }
