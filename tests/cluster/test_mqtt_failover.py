"""MQTT on a three-node cluster (issue 41): a follower pipes MQTT clients to
the leader as it does AMQP ones, and a persistent session (its queues, its
subscriptions, its QoS 2 state) and the retained messages outlive the
leader's SIGKILL: they are in the data directory every in-sync follower
copies."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shoal.broker.mqtt import packets as P
from tests.broker_process import wait_for
from tests.cluster.nodes import ClusterNode, in_sync, leader_of
from tests.mqtt_raw import RawClient

pytestmark = pytest.mark.cluster

SESSION = {"session_expiry_interval": 3600}


def mqtt_port(node: ClusterNode) -> int:
    return int(node.cmd[node.cmd.index("--mqtt-port", node.cmd.index("--cluster-etcd")) + 1])


def connect(node: ClusterNode, client_id: str, clean: bool = True) -> tuple[RawClient, bool]:
    """A client on `node`'s MQTT port, once it accepts (a new leader's
    broker starts its listeners a moment after it wins)."""
    made: list[tuple[RawClient, bool]] = []

    def attempt() -> bool:
        try:
            client = RawClient(mqtt_port(node))
            present, code, _props = client.connect(client_id, SESSION, clean=clean)
        except (OSError, EOFError):
            return False
        if code != 0:
            client.close()
            return False
        made.append((client, present))
        return True

    wait_for(attempt, 30, f"{node.name}'s MQTT listener to serve")
    return made[0]


def test_mqtt_sessions_and_retained_messages_outlive_the_leader(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    nodes = three_nodes("--mqtt-port")
    leader = leader_of(nodes)
    in_sync(nodes, 3)
    follower = next(n for n in nodes if n is not leader)

    device, present = connect(follower, "device-7", clean=False)  # through the follower's pipe
    assert not present
    assert device.subscribe("fleet/#", 2) == b"\x02"
    device.close()  # away: its session stays, its messages wait
    publisher, _ = connect(follower, "hq")
    publisher.publish("fleet/cmd", b"reboot", qos=2, packet_id=1)
    publisher.read(P.PUBREC)  # confirmed: on every in-sync follower
    publisher.publish("fleet/state", b"green", qos=1, packet_id=2, retain=True)
    publisher.read(P.PUBACK)
    publisher.close()
    # (the PUBACK of a retained publish waits for the retained store's write,
    # which is on every in-sync follower before it returns)

    leader.kill()
    new = leader_of([n for n in nodes if n is not leader], 30)
    device, present = connect(new, "device-7", clean=False)
    assert present  # the session came along: its subscriptions too
    _flags, waiting = device.received()
    assert (waiting.topic, waiting.payload, waiting.qos) == ("fleet/cmd", b"reboot", 2)
    watcher, _ = connect(new, "watcher")
    watcher.subscribe("fleet/state", 1)
    flags, kept = watcher.received()
    assert kept.payload == b"green" and flags & 1  # the retained message, RETAIN set
    device.close()
    watcher.close()
