"""Start and stop a real Shoal broker as a separate process for tests.

Every wait here is a bounded poll of a condition (the segment says the workers
are ready, a port accepts, a process is gone), never a bare sleep.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from shoal.broker.cli import local_command
from shoal.broker.operate.status import snapshot
from shoal.shm import layout
from shoal.shm.segment import Segment

ROOT = Path(__file__).resolve().parent.parent


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks a connection's local port from."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _share(low: int, high: int) -> tuple[int, int]:
    """This test process's slice of [low, high]: under pytest-xdist each
    worker picks from a slice of its own. A test that restarts its broker
    on the same port frees it for a moment, and another worker's pick of
    that very port then took it (a SIGKILL restart failed: EADDRINUSE)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if count < 2 or not worker.startswith("gw") or not worker[2:].isdigit():
        return low, high
    size = (high - low + 1) // count
    start = low + int(worker[2:]) % count * size
    return start, start + size - 1


_EPHEMERAL = _ephemeral_ports()
_handed_out: set[int] = set()
_pick = random.Random()  # its own: a test that seeds `random` must not repeat ports


def free_port() -> int:
    """A port nothing listens on, for a broker or node a test starts.

    Picked below the kernel's ephemeral range, not by binding port 0:
    a port from that range can be taken, between this call and the
    broker's bind, as the local port of any outgoing connection (a
    client's, a follower's), and then the broker cannot listen on it
    (a cluster node that won an election failed so: EADDRINUSE). No port
    is handed out twice in one test process, nor by two pytest-xdist
    workers (_share)."""
    low, high = 10000, _EPHEMERAL[0] - 1
    if high - low >= 4000:
        low, high = _share(low, high)
    if high - low < 1000:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    while True:
        port = _pick.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def process_family(proc: subprocess.Popen[bytes] | None) -> list[psutil.Process]:
    """A started process and every process below it ([] once it is gone)."""
    if proc is None:
        return []
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def queue_gone(conn: Any, name: str) -> bool:
    """True once a passive declare of `name` on a fresh channel of the pika
    connection `conn` fails with 404 (a poll condition for wait_for)."""
    import pika

    try:
        conn.channel().queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return bool(exc.reply_code == 404)
    return False


class Broker:
    def __init__(
        self,
        tmp: Path,
        workers: int = 2,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        bind: str | None = "127.0.0.1",
    ) -> None:
        self.port = free_port()
        self.bind = bind  # None: the broker's default (every IPv4 and IPv6 address)
        self.workers = workers
        self.runtime_dir = str(tmp / f"run-{self.port}")
        # Beside the runtime directory, not in it: the broker removes its
        # runtime directory at a clean stop, and the data must stay.
        self.data_dir = str(tmp / f"data-{self.port}")
        self.log_path = tmp / f"broker-{self.port}.log"
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._seg: Segment | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self, wait: bool = True) -> Broker:
        cmd = local_command(
            self.port,
            self.workers,
            self.runtime_dir,
            *("--graceful-timeout", "5", "--arena-mb", "64", "--max-queues", "256"),
            *self.args,
            data_dir=self.data_dir,
            bind=self.bind,
        )
        env = dict(os.environ)
        env.update(self.env or {})
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            )
        if wait:
            wait_for(self.ready, 20, f"broker on port {self.port} to be ready")
        return self

    def segment(self) -> Segment:
        """The broker's segment (raises OSError/ValueError until it exists)."""
        if self._seg is None:
            self._seg = Segment.attach(os.path.join(self.runtime_dir, "shoal.shm"))
        return self._seg

    def status(self) -> dict[str, Any]:
        return snapshot(self.segment())

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
        if not os.path.exists(os.path.join(self.runtime_dir, "shoal.shm")):
            return False
        try:
            # Not the segment a killed predecessor left (until this broker
            # removes it, it is still there): this broker's own.
            if self.segment().atomic.load(layout.H_SUPERVISOR_PID) != self.proc.pid:  # type: ignore[union-attr]
                self._seg = None
                return False
            procs = self.status()["processes"]
        except (OSError, ValueError):
            self._seg = None
            return False
        workers = [p for p in procs if p["role"] == "io-worker" and p["ready"]]
        others = {p["role"] for p in procs if p["ready"]}
        if len(workers) < self.workers or not {"acceptor", "scheduler"} <= others:
            return False
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def pids(self, role: str) -> dict[int, int]:
        """index -> pid for io-workers; 0 -> pid for other roles ({} while the
        segment is still being created)."""
        out: dict[int, int] = {}
        try:
            processes = self.status()["processes"]
        except (OSError, ValueError):
            self._seg = None
            return out
        for p in processes:
            if p["role"] == role and p["ready"]:
                out[p.get("index", 0)] = p["pid"]
        return out

    def worker_of_pid(self, pid: int) -> int:
        return next(i for i, p in self.pids("io-worker").items() if p == pid)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def family(self) -> list[psutil.Process]:
        """The supervisor and every process it forked."""
        return process_family(self.proc)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        family = self.family()
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for p in family:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.wait(5)
            raise AssertionError(f"broker did not stop within {timeout}s:\n{self.log()}") from None
        # Children must be gone too (the supervisor reaps them before exiting).
        _gone, alive = psutil.wait_procs(family, timeout=5)
        for p in alive:
            p.kill()
        assert not alive, f"processes left behind: {alive}"
        self._seg = None
        return code

    def crash(self) -> None:
        """kill -9 of the whole broker at once, as a power cut would stop
        it; its stale segment is removed by the next start."""
        family = self.family()
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"processes survived SIGKILL: {alive}"
        if self.proc is not None:
            self.proc.wait(5)
        self._seg = None

    def restart(self, crash: bool = False) -> Broker:
        """Stop (SIGTERM, or SIGKILL of every process) and start again with
        the same command: same port, runtime and data directories."""
        if crash:
            self.crash()
        else:
            assert self.stop() == 0
        return self.start()

    def assert_clean(self) -> None:
        assert not os.path.exists(os.path.join(self.runtime_dir, "shoal.shm")), (
            "segment left behind"
        )
        leftovers = [
            p.info
            for p in psutil.process_iter(["pid", "cmdline"])
            if p.info["cmdline"] and f"(port {self.port})" in " ".join(p.info["cmdline"])
        ]
        assert not leftovers, f"processes left behind: {leftovers}"
