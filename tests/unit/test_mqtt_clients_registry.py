"""The scheduler's map of MQTT client ids to their newest connection
(broker/scheduler/mqtt_clients.py): only the worker that holds an older
connection of a client id is told to close it."""

from __future__ import annotations

from shoal.broker.scheduler.mqtt_clients import MqttClients
from shoal.broker.scheduler.state import worker_of


def conn(worker: int, n: int) -> int:
    """A connection id of `worker` (WorkerContext.next_conn_id's layout)."""
    return worker << 40 | n


def test_a_first_connect_tells_no_worker() -> None:
    clients = MqttClients()
    assert clients.connected("/", "d1", conn(0, 1)) is None
    assert clients.connected("/", "d2", conn(1, 1)) is None
    assert clients.connected("other", "d1", conn(1, 2)) is None  # (another vhost)


def test_a_connect_again_on_another_worker_names_the_older_connection() -> None:
    clients = MqttClients()
    clients.connected("/", "d1", conn(0, 1))
    older = clients.connected("/", "d1", conn(1, 7))
    assert older == conn(0, 1) and worker_of(older) == 0
    assert clients.connected("/", "d1", conn(2, 3)) == conn(1, 7)  # the newest, not the first


def test_a_connect_again_on_the_same_worker_is_that_worker_s_own() -> None:
    clients = MqttClients()
    clients.connected("/", "d1", conn(0, 1))
    assert clients.connected("/", "d1", conn(0, 2)) is None
    assert clients.connected("/", "d1", conn(1, 1)) == conn(0, 2)


def test_a_closed_connection_is_forgotten_but_not_a_newer_one() -> None:
    clients = MqttClients()
    clients.connected("/", "d1", conn(0, 1))
    clients.closed(conn(0, 1))
    assert clients.connected("/", "d1", conn(1, 1)) is None
    clients.connected("/", "d1", conn(0, 2))  # takes over conn(1, 1)...
    clients.closed(conn(1, 1))  # ...whose close comes after: the newer stays
    assert clients.connected("/", "d1", conn(1, 2)) == conn(0, 2)
    clients.closed(conn(5, 5))  # (an AMQP connection's close: nothing)
    assert len(clients.by_key) == len(clients.by_conn) == 1


def test_a_worker_s_hello_and_death_replace_its_clients() -> None:
    clients = MqttClients()
    clients.connected("/", "d1", conn(0, 1))
    clients.connected("/", "d2", conn(0, 2))
    assert clients.known(0, [(conn(0, 9), "/", "d3")]) == []  # a HELLO: d1, d2 gone, d3 there
    assert clients.connected("/", "d1", conn(1, 1)) is None
    assert clients.connected("/", "d3", conn(1, 2)) == conn(0, 9)
    assert clients.known(1, []) == []  # worker 1 died
    assert clients.by_key == {} and clients.by_conn == {}


def test_a_new_scheduler_learns_every_worker_s_clients_from_their_hellos() -> None:
    clients = MqttClients()
    clients.known(0, [(conn(0, 1), "/", "d1")])
    clients.known(1, [(conn(1, 1), "/", "d2")])
    assert clients.connected("/", "d1", conn(1, 5)) == conn(0, 1)
    assert clients.connected("/", "d2", conn(0, 5)) == conn(1, 1)


def test_a_hello_s_client_id_that_a_notice_gave_another_worker_is_taken_over() -> None:
    """The notice came to this scheduler after the connect the HELLO reports
    (whose own notice went to a scheduler that died): the HELLO's goes."""
    clients = MqttClients()
    assert clients.connected("/", "d1", conn(1, 4)) is None  # (its older's notice was lost)
    assert clients.known(0, [(conn(0, 1), "/", "d1"), (conn(0, 2), "/", "d2")]) == [
        ("/", "d1", conn(1, 4))
    ]
    assert clients.by_key == {("/", "d1"): conn(1, 4), ("/", "d2"): conn(0, 2)}
    assert clients.known(1, [(conn(1, 4), "/", "d1")]) == []  # (its own HELLO: no change)
    assert clients.by_key[("/", "d1")] == conn(1, 4)
