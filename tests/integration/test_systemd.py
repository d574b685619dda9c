"""Type=notify: READY=1 once everything serves, STATUS=, STOPPING=1."""

from __future__ import annotations

import signal
import socket
import time

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
