"""Cluster nodes as real processes for tests: each its own ports, data and
runtime directories, in a session of its own so that "the machine died"
is one SIGKILL of its process group (agent, broker and every child).

Every wait is a bounded poll (tests/broker_process.py wait_for)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from shoal.store import disk
from tests.broker_process import ROOT, free_port, process_family, wait_for
from tests.cluster.faultproxy import FaultProxy


class ClusterNode:
    def __init__(
        self,
        tmp: Path,
        name: str,
        etcd_url: str,
        *args: str,
        ttl: int = 2,
        disk_faults: bool = True,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.cluster_port = free_port()
        self.runtime_dir = str(tmp / f"{name}-run")
        self.data_dir = str(tmp / f"{name}-data")
        self.log_path = tmp / f"{name}.log"
        self.cmd = [
            sys.executable,
            "-m",
            "shoal.broker",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--runtime-dir",
            self.runtime_dir,
            "--data-dir",
            self.data_dir,
            "--metrics-port",
            "0",
            "--management-port",
            "0",
            "--arena-mb",
            "64",
            "--max-queues",
            "256",
            "--graceful-timeout",
            "3",
            # Three nodes on one machine: the MQTT listeners' default ports
            # would be wanted by an old leader's broker and a new one's.
            *("--mqtt-port", "0", "--mqtts-port", "0", "--mqtt-ws-port", "0"),
            "--cluster-etcd",
            etcd_url,
            "--cluster-name",
            "test",
            "--cluster-port",
            str(self.cluster_port),
            "--cluster-advertise",
            f"127.0.0.1:{self.cluster_port}",
            "--cluster-lease-ttl",
            str(ttl),
            *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.proxy: FaultProxy | None = None  # in front of its cluster port (conftest)
        # Its disk's faults, read by store/disk.py at each write and sync
        # (off for benchmarks: each write and sync then reads the file).
        self.disk_faults = tmp / f"{name}.disk"
        self.env = dict(os.environ)
        if disk_faults:
            self.env[disk.ENV] = str(self.disk_faults)

    def disk(self, fault: str) -> None:
        """Make the node's disk slow or failing from now on ("slow 0.5",
        "eio", "enospc"; "" heals it: store/disk.py)."""
        tmp = self.disk_faults.with_suffix(".new")
        tmp.write_text(fault)
        os.replace(tmp, self.disk_faults)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> ClusterNode:
        # A node killed earlier left its last view: not this start's.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.runtime_dir, "cluster.json"))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
                env=self.env,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        """The agent's cluster view ({} until it wrote one, or when dead)."""
        if not self.alive():
            return {}
        try:
            with open(os.path.join(self.runtime_dir, "cluster.json")) as f:
                answer: dict[str, Any] = json.load(f)
        except (OSError, ValueError):
            return {}
        return answer

    @property
    def role(self) -> str:
        return str(self.status().get("role", ""))

    def serving(self) -> bool:
        """Leader with its broker accepting AMQP connections."""
        if self.role != "leader":
            return False
        try:
            import pika

            pika.BlockingConnection(pika.URLParameters(self.url + "?socket_timeout=2")).close()
        except Exception:
            return False
        return True

    def family(self) -> list[psutil.Process]:
        """The agent and every process below it (its broker's tree)."""
        return process_family(self.proc)

    def signal_group(self, sig: int) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL of the node: agent, broker and children at once."""
        family = self.family()
        if self.proc is None:
            return
        try:
            self.signal_group(signal.SIGKILL)
        except ProcessLookupError:
            pass
        _gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"processes survived SIGKILL: {alive}"
        self.proc.wait(5)

    def stop(self, timeout: float = 30) -> None:
        family = self.family()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # What it waits on: its tasks (logged on SIGUSR1), its threads.
            size = self.log_path.stat().st_size
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: self.log_path.stat().st_size > size, 5, "the task dump")
            stacks = python_stacks(self.proc.pid)
            self.kill()
            raise AssertionError(
                f"node {self.name} did not stop:\n{self.log()}\n{stacks}"
            ) from None
        _gone, alive = psutil.wait_procs(family, timeout=10)
        for p in alive:
            p.kill()
        assert not alive, f"node {self.name} left processes behind: {alive}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-12000:]
        except OSError:
            return ""


def python_stacks(pid: int) -> str:
    """Every thread's Python stack in process `pid`, by py-spy where it is
    installed (a hang's diagnosis; "" where it is not)."""
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if spy is None:
        return ""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        done = subprocess.run(
            [spy, "dump", "--locals", "--pid", str(pid)], capture_output=True, text=True, timeout=20
        )
        return f"py-spy dump of {pid}:\n{done.stdout}{done.stderr}"
    return ""


def shoal(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m shoal.broker ARGS` (shoal ctl, shoal status), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "shoal.broker", *args], capture_output=True, text=True, timeout=60
    )


def init_cluster(etcd_url: str, name: str = "test") -> None:
    """`shoal cluster-init`: a new cluster, whose first node to start leads."""
    done = shoal("cluster-init", "--cluster-etcd", etcd_url, "--cluster-name", name)
    assert done.returncode == 0, done.stdout + done.stderr


def leader_of(nodes: list[ClusterNode], timeout: float = 30) -> ClusterNode:
    """The one node serving as leader, once there is one."""
    return wait_for(
        lambda: next((n for n in nodes if n.alive() and n.serving()), None),
        timeout,
        "a leader serving AMQP",
        interval=0.1,
    )


def acking(status: dict[str, Any]) -> list[str]:
    """A leader's followers that are in sync and acknowledging: its in-sync
    set may also name members that are gone or lag, until they are dropped
    (broker/cluster/shipper.py)."""
    return [
        f["node"]
        for f in status.get("followers", [])
        if f.get("in_sync") and f.get("lag_seconds", 0) < 1.0
    ]


def in_sync(nodes: list[ClusterNode], count: int, timeout: float = 30) -> list[str]:
    """Wait until the leader reports `count` nodes in its in-sync set, each
    follower among them connected and acknowledging."""

    def check() -> list[str] | None:
        for n in nodes:
            st = n.status()
            isr = st.get("isr", [])
            followers = sorted(m for m in isr if m != st.get("node"))
            if st.get("role") == "leader" and len(isr) == count and sorted(acking(st)) == followers:
                return list(isr)
        return None

    return wait_for(check, timeout, f"{count} nodes in sync", interval=0.1)


def kill_the_leader(nodes: list[ClusterNode], within: float = 60) -> float:
    """SIGKILL of the leader's node; returns once another node serves (in
    at most `within` s: the seconds it took), and the killed one is started
    again (it comes back as a follower)."""
    leader = leader_of(nodes, 60)
    leader.kill()
    started = time.monotonic()
    leader_of([n for n in nodes if n is not leader], within)
    took = time.monotonic() - started
    print(f"failover after kill -9 of {leader.name}: {took:.2f} s")
    leader.start()  # it comes back as a follower
    return took
