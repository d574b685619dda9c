"""Type=notify: READY=1 once everything serves, STATUS=, STOPPING=1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from shoal.broker.cli import local_command
from tests.broker_process import wait_for


def test_sd_notify_messages(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    messages: list[str] = []

    def receive() -> list[str]:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
        return messages

    broker = broker_factory(workers=2, env={"NOTIFY_SOCKET": path}, wait=False)
    wait_for(lambda: any("READY=1" in m for m in receive()), 20, "READY=1")
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=2/2 IO workers ready" in ready
    assert f"MAINPID={broker.proc.pid}" in ready
    # READY=1 means it serves: a client can connect at once.
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        assert s.recv(1)[:1] == b"\x01"
        # STATUS= follows the connection count.
        wait_for(
            lambda: "STATUS=2/2 IO workers ready, 1 connections" in receive(), 10, "STATUS update"
        )
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: any("STOPPING=1" in m for m in receive()), 10, "STOPPING=1")
    assert broker.stop(timeout=10) == 0
    assert time.monotonic() - started < 10
    sock.close()


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_the_watchdog_is_pet_only_while_every_child_beats(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """WatchdogSec=: WATCHDOG=1 every half interval while the IO workers
    and the scheduler beat; a hung worker (SIGSTOP) stops the pets, so
    systemd would restart the broker; they come back with it."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}
    broker = broker_factory(workers=2, env=env, wait=False)
    pets: list[float] = []

    def receive() -> int:
        try:
            if "WATCHDOG=1" in sock.recv(4096).decode():
                pets.append(time.monotonic())
        except TimeoutError:
            pass
        return len(pets)

    wait_for(lambda: receive() >= 3, 30, "three watchdog pets")
    worker = broker.pids("io-worker")[0]
    os.kill(worker, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        deadline = stopped + 8  # HEARTBEAT_STALE (5 s) and a margin
        while time.monotonic() < deadline:
            receive()
        assert not [t for t in pets if t > stopped + 6], "pets went on with a worker hung"
    finally:
        os.kill(worker, signal.SIGCONT)
    count = len(pets)
    wait_for(lambda: receive() > count, 20, "the pets to come back")


def test_socket_activation_serves_connections_that_waited(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """LISTEN_FDS: the broker takes systemd's listening socket instead of
    binding one; a client that connected before the broker ran waited in
    the kernel's backlog and is served."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    early = socket.create_connection(("127.0.0.1", port), timeout=20)
    early.sendall(b"AMQP\x00\x00\x09\x01")
    runtime = str(tmp_path / "run")
    cmd = local_command(port, 1, runtime, data_dir=str(tmp_path / "data"))
    fd = listener.fileno()
    # As systemd: the socket is fd 3, LISTEN_PID the broker's own pid.
    script = f'export LISTEN_FDS=1 LISTEN_PID=$$; exec "$@" 3<&{fd}'
    with open(tmp_path / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *cmd], pass_fds=(fd,), stdout=log, stderr=log
        )
    try:
        assert early.recv(1) == b"\x01"  # connection.start: it was served
        listener.close()  # the broker has its own copy
        with socket.create_connection(("127.0.0.1", port), timeout=5) as late:
            late.sendall(b"AMQP\x00\x00\x09\x01")
            assert late.recv(1) == b"\x01"
    finally:
        early.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "broker.log").read_text()
    assert "listening on 127.0.0.1 (amqp " + str(port) in (tmp_path / "broker.log").read_text()
