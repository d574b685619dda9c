"""A Shoal on a loopback address of its own, for client suites that dial fixed
MQTT ports (1883, 8883) and take only a host name: 127.0.0.2 upwards, the
first whose ports are all free, so that a broker already on 127.0.0.1:1883 (a
mosquitto started for comparison) is not in the way (interop/go_mqtt.py,
interop/aiomqtt_suite.py, interop/gmqtt_suite.py)."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from run import REPO

from shoal.broker.cli import local_command

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30


def free_loopback(ports: Sequence[int]) -> str:
    """A loopback address on which every one of `ports` is free."""
    for last in range(2, 250):
        address = f"127.0.0.{last}"
        with contextlib.ExitStack() as stack:
            try:
                for port in ports:
                    s = stack.enter_context(socket.socket())
                    s.bind((address, port))
            except OSError:
                continue
            return address
    raise SystemExit(f"no loopback address 127.0.0.2-249 has ports {list(ports)} free")


class Stopped:
    """How the broker ended: `crashed` if it did not stop cleanly on SIGTERM."""

    crashed = False


@contextlib.contextmanager
def shoal_on(address: str, mqtt_port: int, extra: Sequence[str], log: Path) -> Iterator[Stopped]:
    """Shoal bound to `address` (its MQTT listener on `mqtt_port`) for the
    block, stopped after it; its output in `log`."""
    stopped = Stopped()
    with socket.socket() as s:  # (AMQP's port: these suites do not use it)
        s.bind((address, 0))
        amqp_port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="shoal-interop-") as rundir, open(log, "w") as out:
        cmd = local_command(
            amqp_port, 2, rundir, "--mqtt-port", str(mqtt_port), *extra, bind=address
        )
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_listening(address, mqtt_port, proc)
            yield stopped
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            stopped.crashed = proc.returncode != 0


def _wait_listening(address: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"Shoal did not listen on {address}:{port} (see its log)")
