"""SIGHUP reloads the settings file (issue 16, item 7; broker/settings.py):
limits for new connections (the heartbeat a client is offered), the log
level of every process, and the definitions file (RabbitMQ's
load_definitions: its users log in); a setting that needs a restart is
logged and kept; a broken file keeps the running settings. Pika over real
sockets."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from shoal.broker.amqp.access import hash_password
from tests.broker_process import Broker, wait_for


def definitions(user: str, password: str) -> str:
    return json.dumps(
        {
            "users": [
                {
                    "name": user,
                    "password_hash": hash_password(password),
                    "hashing_algorithm": "rabbit_password_hashing_sha256",
                    "tags": [],
                }
            ],
            "permissions": [
                {"user": user, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
            ],
        }
    )


def login(broker: Broker, user: str, password: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.port, credentials=pika.PlainCredentials(user, password)
    )
    return pika.BlockingConnection(params)


def offered_heartbeat(conn: pika.BlockingConnection) -> int:
    return int(conn._impl.params.heartbeat)


def hup(broker: Broker, done: str, times: int = 1) -> None:
    """SIGHUP, then wait until the log says `done` `times` times."""
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGHUP)
    wait_for(lambda: broker.log().count(done) >= times, 10, repr(done))


def test_sighup_reloads_settings_and_definitions(tmp_path: Path, broker_factory: Any) -> None:
    conf, defs = tmp_path / "shoal.toml", tmp_path / "defs.json"
    conf.write_text('heartbeat = 60\nlog-level = "info"\nload-definitions = "defs.json"\n')
    defs.write_text(definitions("alice", "a-pw"))
    broker = broker_factory(workers=2, args=("--config", str(conf)))
    alice = login(broker, "alice", "a-pw")
    assert offered_heartbeat(alice) == 60
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        login(broker, "bob", "b-pw")

    conf.write_text(
        'heartbeat = 7\nlog-level = "debug"\ncatalog-mb = 8\nload-definitions = "defs.json"\n'
    )
    defs.write_text(definitions("bob", "b-pw"))
    hup(broker, "took the settings", times=2)  # a debug line: the level applies
    wait_for(lambda: broker.log().count("definitions imported from") == 2, 10, "import")
    assert "SIGHUP: heartbeat: 60 -> 7" in broker.log()
    assert "SIGHUP: catalog_mb: 16 -> 8 needs a restart; still 16" in broker.log()
    bob = login(broker, "bob", "b-pw")
    assert offered_heartbeat(bob) == 7  # new connections get the new limits
    assert offered_heartbeat(login(broker, "alice", "a-pw")) == 7  # an import adds
    alice.channel().queue_declare("still-open")  # and the open one serves on

    # Unchanged definitions are not imported again; a broken file changes nothing.
    conf.write_text("heartbeat = [\n")
    hup(broker, "SIGHUP: settings not reloaded")
    assert broker.log().count("definitions imported from") == 2
    assert offered_heartbeat(login(broker, "bob", "b-pw")) == 7


def test_unreadable_files_stop_the_broker_at_start(tmp_path: Path, broker_factory: Any) -> None:
    conf = tmp_path / "shoal.toml"
    conf.write_text("no-such-setting = 1\n")
    broker = broker_factory(workers=1, args=("--config", str(conf)), wait=False)
    assert broker.proc is not None
    assert broker.proc.wait(timeout=30) == 2
    assert "unknown setting 'no-such-setting'" in broker.log()
    defs = tmp_path / "defs.json"
    defs.write_text('{"users": [{"name": "x"}]')
    broker = broker_factory(workers=1, args=("--load-definitions", str(defs)), wait=False)
    assert broker.proc is not None
    assert broker.proc.wait(timeout=30) == 1
    assert f"--load-definitions {defs}:" in broker.log()
