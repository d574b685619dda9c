"""A three-node cluster on etcd, over real sockets with pika: every
confirmed message outlives the leader's death (issue 29)."""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from tests.broker_process import wait_for
from tests.cluster.nodes import ClusterNode, in_sync, leader_of, shoal

pytestmark = pytest.mark.cluster


@pytest.fixture
def nodes(three_nodes: Callable[..., list[ClusterNode]]) -> list[ClusterNode]:
    return three_nodes("--metrics-port", "--management-port")


def role_by_status(node: ClusterNode) -> str:
    """`shoal status --json`'s cluster.role, as a script finds the leader."""
    done = shoal("status", "--runtime-dir", node.runtime_dir, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["cluster"]["role"])


def http_get(node: ClusterNode, flag: str, path: str) -> bytes:
    """GET from the port a node was given with `flag` (basic auth as guest),
    once its listener answers (the leader's metrics and management
    processes start beside its AMQP listener, not before it)."""
    port = node.cmd[node.cmd.index(flag, node.cmd.index("--cluster-etcd")) + 1]

    def get() -> bytes | None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return bytes(answer.read())
        except (OSError, http.client.HTTPException):
            return None

    return wait_for(get, 30, f"{path} on {node.name}", interval=0.1)


def connect(node: ClusterNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "?socket_timeout=5"))


def publish_confirmed(
    node: ClusterNode, queue: str, bodies: list[bytes], queue_type: str = "classic"
) -> None:
    conn = connect(node)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        ch.confirm_delivery()
        for body in bodies:
            # BlockingChannel raises on a nack or a return: this returns
            # only for a confirmed message.
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


def drain(node: ClusterNode, queue: str) -> list[tuple[bytes, bool]]:
    conn = connect(node)
    try:
        ch = conn.channel()
        got: list[tuple[bytes, bool]] = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((body, method.redelivered))
    finally:
        conn.close()


def read_stream(node: ClusterNode, queue: str, n: int) -> list[tuple[int, bytes]]:
    """(x-stream-offset, body) of a stream's first n messages."""
    conn = connect(node)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[tuple[int, bytes]] = []
        for method, props, body in ch.consume(
            queue, arguments={"x-stream-offset": "first"}, inactivity_timeout=5
        ):
            if method is None:
                break
            got.append((props.headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)
            if len(got) == n:
                break
        return got
    finally:
        conn.close()


def test_a_follower_proxies_clients_and_confirmed_messages_survive_the_leaders_sigkill(
    nodes: list[ClusterNode],
) -> None:
    leader = leader_of(nodes)
    in_sync(nodes, 3)
    follower = next(n for n in nodes if n is not leader)
    assert follower.role == "follower"
    assert role_by_status(leader) == "leader"
    assert role_by_status(follower) == "follower"
    ctl = shoal("ctl", "--runtime-dir", leader.runtime_dir, "cluster_status", "--formatter", "json")
    assert ctl.returncode == 0, ctl.stderr
    view = json.loads(ctl.stdout)
    assert sorted(f["node"] for f in view["followers"] if f["in_sync"]) == sorted(view["isr"][1:])
    assert len(view["isr"]) == 3
    metrics = http_get(leader, "--metrics-port", "/metrics").decode()
    assert "shoal_cluster_in_sync_nodes 3.0" in metrics
    assert metrics.count("shoal_cluster_follower_in_sync{") == 2
    # A follower, which runs no broker, answers a scrape with its own view.
    own = http_get(follower, "--metrics-port", "/metrics").decode()
    assert 'role="follower"' in own and f'leader="{leader.status()["node"]}"' in own
    assert "shoal_cluster_caught_up 1.0" in own
    assert "shoal_cluster_in_sync_nodes 3.0" in own
    # The management API answers for the cluster on a follower too (piped to the leader).
    api_nodes = json.loads(http_get(follower, "--management-port", "/api/nodes"))
    assert [n.get("cluster_role") for n in api_nodes] == ["leader", "follower", "follower"]
    # The UI's Shoal tab: the roles, the in-sync set and each follower's lag.
    cluster = json.loads(http_get(follower, "--management-port", "/api/shoal"))["cluster"]
    assert cluster["mode"] == "cluster" and cluster["leader"] == leader.status()["node"]
    assert sorted(cluster["in_sync_set"]) == sorted(n.status()["node"] for n in nodes)
    assert [n["role"] for n in cluster["nodes"]] == ["leader", "follower", "follower"]
    assert all(n["in_sync"] and n["replication_lag"] >= 0 for n in cluster["nodes"])
    bodies = [b"m-%d" % i for i in range(300)]
    publish_confirmed(follower, "q", bodies)  # through the follower's proxy
    publish_confirmed(follower, "qq", bodies[:100], "quorum")
    publish_confirmed(follower, "s", bodies[:100], "stream")
    offsets = read_stream(leader, "s", 100)

    leader.kill()
    rest = [n for n in nodes if n is not leader]
    new = leader_of(rest, 30)
    assert new.status()["leader"] == new.status()["node"] != leader.name
    got = drain(new, "q")
    assert [b for b, _ in got] == bodies  # every confirmed message, in order, once
    assert all(redelivered for _, redelivered in got)  # recovered after a crash
    assert [b for b, _ in drain(new, "qq")] == bodies[:100]
    assert read_stream(new, "s", 100) == offsets  # every message at its offset
    # Its metrics port, a follower's endpoint until now, is the broker's.
    assert "rabbitmq_queues" in http_get(new, "--metrics-port", "/metrics").decode()

    # The old leader comes back as a follower and gets in sync again.
    leader.start()
    wait_for(lambda: leader.role == "follower", 30, "the old leader to follow")
    in_sync(nodes, 3)


def test_leadership_moves_by_step_down_and_by_transfer(nodes: list[ClusterNode]) -> None:
    leader = leader_of(nodes)
    isr = in_sync(nodes, 3)
    publish_confirmed(leader, "moved", [b"before"])
    publish_confirmed(leader, "deleted-stream", [b"x"], "stream")
    conn = connect(leader)
    conn.channel().queue_delete("deleted-stream")  # its -ok follows the removal's sync
    conn.close()
    for n in nodes:
        streams = Path(n.data_dir) / "streams"
        assert not streams.exists() or list(streams.iterdir()) == [], n.name
    target = next(n for n in nodes if n is not leader)
    target_id = target.status()["node"]
    assert target_id in isr
    done = shoal("ctl", "--runtime-dir", leader.runtime_dir, "transfer_leadership", target_id)
    assert done.returncode == 0, done.stderr
    wait_for(target.serving, 30, "the transfer's target to lead", interval=0.1)
    assert leader.role == "follower"
    in_sync(nodes, 3)
    # A client that never answers the broker's connection.close holds the
    # stop for --graceful-timeout (3 s), past the lease's TTL (2 s): the
    # lease is renewed meanwhile, so the stop's writes are still confirmed.
    silent = connect(target)
    try:
        done = shoal("ctl", "--runtime-dir", target.runtime_dir, "step_down")
        assert done.returncode == 0, done.stderr
        third = leader_of([n for n in nodes if n is not target], 30)
        wait_for(lambda: target.role == "follower", 30, "the stepped-down leader to follow")
    finally:
        with contextlib.suppress(Exception):
            silent.close()
    # Two clean handovers: the clean stop's record reached the followers, so
    # a message never delivered comes back unflagged, as after a clean
    # restart (a refused stop would have flagged it).
    assert drain(third, "moved") == [(b"before", False)]
    refused = shoal("ctl", "--runtime-dir", target.runtime_dir, "step_down")
    assert refused.returncode != 0 and "not the leader" in refused.stderr


def test_acked_messages_stay_acked_after_the_leaders_death(nodes: list[ClusterNode]) -> None:
    """Acks are not synced (as standalone), but the leader ships them to the
    followers as they are written: after a failover, the messages acked
    before it do not come back; the unacked ones come back flagged."""
    leader = leader_of(nodes)
    in_sync(nodes, 3)
    bodies = [b"a-%d" % i for i in range(100)]
    publish_confirmed(leader, "acked", bodies)
    conn = connect(leader)
    ch = conn.channel()
    for body in bodies[:60]:
        method, _props, got = ch.basic_get("acked")
        assert got == body
        ch.basic_ack(method.delivery_tag)
    conn.close()

    def covered() -> bool:
        """Later confirmed writes: their marks cover the acks shipped
        before them, and then no follower lags."""
        publish_confirmed(leader, "later", [b"x"])
        return all(f["lag_bytes"] == 0 for f in leader.status()["followers"])

    wait_for(covered, 30, "the followers to have the acks", interval=0.1)
    leader.kill()
    new = leader_of([n for n in nodes if n is not leader], 30)
    got = drain(new, "acked")
    assert [b for b, _ in got] == bodies[60:]
    assert all(redelivered for _, redelivered in got)


def test_definitions_delayed_messages_and_dedup_keys_outlive_the_leader(
    nodes: list[ClusterNode],
) -> None:
    """What issue 29 lists beside messages: users and permissions, policies,
    what the delayed exchange keeps and a deduplication cache on disk, each
    confirmed (its -ok, or a publisher confirm) before the leader's SIGKILL,
    are all there on the new leader; and a shovel (issue 40), which the new
    leader runs."""
    leader = leader_of(nodes)
    in_sync(nodes, 3)
    run = ("--runtime-dir", leader.runtime_dir)
    for verb in (
        ("add_user", "alice", "s3cret"),
        ("set_permissions", "alice", ".*", ".*", ".*"),
    ):
        done = shoal("ctl", *run, *verb)
        assert done.returncode == 0, done.stderr
    done = shoal("policy", *run, "set", "short", "^short-", '{"max-length": 1}')
    assert done.returncode == 0, done.stderr
    shovel = {"src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp://", "dest-queue": "out"}
    done = shoal("ctl", *run, "set_parameter", "shovel", "in-out", json.dumps(shovel))
    assert done.returncode == 0, done.stderr

    conn = connect(leader)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare(
        "delayed", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    ch.queue_declare("due", durable=True)
    ch.queue_bind("due", "delayed", "k")
    later = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 4000})
    ch.basic_publish("delayed", "k", b"later", later)  # confirmed, due after the failover
    ch.queue_declare("dd", durable=True, arguments={"x-message-deduplication": True})
    once = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": "k1"})
    ch.basic_publish("", "dd", b"first", once)
    conn.close()

    leader.kill()
    new = leader_of([n for n in nodes if n is not leader], 30)
    # The user and its permissions.
    alice = pika.BlockingConnection(
        pika.URLParameters(f"amqp://alice:s3cret@127.0.0.1:{new.port}/?socket_timeout=5")
    )
    ch = alice.channel()
    ch.confirm_delivery()
    # The policy: a queue it names holds one message.
    ch.queue_declare("short-q", durable=True)
    for body in (b"1", b"2"):
        ch.basic_publish("", "short-q", body, pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare("short-q", passive=True).method.message_count == 1
    # The deduplication key: the same key again is dropped, a new one is not.
    ch.basic_publish("", "dd", b"again", once)
    other = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": "k2"})
    ch.basic_publish("", "dd", b"second", other)
    alice.close()
    assert [b for b, _ in drain(new, "dd")] == [b"first", b"second"]
    # The delayed message: routed when due, by the new leader.
    conn = connect(new)
    ch = conn.channel()

    def delivered() -> bytes | None:
        method, _props, body = ch.basic_get("due", auto_ack=True)
        return None if method is None else bytes(body)

    assert wait_for(delivered, 20, "the delayed message", interval=0.1) == b"later"
    # The shovel: the new leader's shovel process runs it.
    ch.queue_declare("in", durable=True)
    ch.queue_declare("out", durable=True)
    ch.basic_publish("", "in", b"shovelled by the new leader")
    got = wait_for(lambda: ch.basic_get("out", auto_ack=True)[2], 30, "the shovelled message")
    assert got == b"shovelled by the new leader"
    conn.close()
    rows = shoal("ctl", "--runtime-dir", new.runtime_dir, "shovel_status", "--formatter", "json")
    assert [(r["name"], r["state"]) for r in json.loads(rows.stdout)] == [("in-out", "running")]
