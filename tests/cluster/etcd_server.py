"""Start and stop a real etcd for tests: a single member (EtcdServer), or a
cluster of three on this machine (EtcdCluster), whose members can be
killed, paused and put behind a fault proxy one by one.

Every wait here is a bounded poll of a condition (the member answers /health,
the process is gone), never a bare sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from tests.broker_process import free_port, wait_for


class EtcdServer:
    def __init__(self, directory: Path, name: str = "default") -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install -y etcd-server")
        self.binary = binary
        self.name = name
        self.directory = directory
        self.data_dir = directory / "etcd-data"
        self.log_path = directory / "etcd.log"
        # Kept across restart(): the member's peer URL is stored in its data dir.
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        # The members of its cluster (EtcdCluster sets it): name=peer URL, ...
        self.initial_cluster = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, timeout: float = 15.0) -> EtcdServer:
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> None:
        """Start the process (a cluster's members all start before any is
        healthy: a member needs a majority to elect a leader)."""
        client, peer = self.url, self.peer_url
        args = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.initial_cluster or f'{self.name}={peer}'}",
        ]
        if not self.initial_cluster:
            # A lone member elects itself after one election timeout (1 s by
            # default); it has no peer to lose leadership to, so a short one
            # only makes every test start faster. A cluster keeps etcd's
            # defaults (100 ms heartbeats, 1 s elections), as deployed.
            args += ["--heartbeat-interval=10", "--election-timeout=100"]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        wait_for(self._healthy, timeout, f"etcd on {self.url} (log: {self.log_path})", 0.05)

    def status(self) -> dict[str, Any]:
        """The member's maintenance status ({} if it does not answer):
        header.member_id, and leader, the id of etcd's leader."""
        request = urllib.request.Request(self.url + "/v3/maintenance/status", data=b"{}")
        try:
            with urllib.request.urlopen(request, timeout=1) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
                return answer
        except (urllib.error.URLError, OSError, ValueError):
            return {}

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"etcd exited with {self.proc.returncode}: see {self.log_path}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                return b'"true"' in resp.read()  # {"health":"true"} once it has a leader
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                # A paused etcd acts on SIGTERM only once woken.
                self.proc.send_signal(signal.SIGCONT)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> EtcdServer:
        """Stop and start again on the same ports and data."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """Freeze the process: connections are accepted by the kernel, never answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        # kill() returns before every thread has stopped: one still running
        # could answer a request meant to find the member frozen.
        wait_for(self._stopped, 5, f"etcd {self.proc.pid} to stop on SIGSTOP", 0.01)

    def _stopped(self) -> bool:
        assert self.proc is not None
        for stat in Path(f"/proc/{self.proc.pid}/task").glob("*/stat"):
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # a thread that just ended
            if state not in ("T", "t"):
                return False
        return True

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


class EtcdCluster:
    """Three etcd members on this machine, each in a directory of its own."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        self.members = [EtcdServer(directory / f"etcd{i}", name=f"m{i}") for i in range(size)]
        everyone = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = everyone

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for m in self.members:
            m.launch()
        for m in self.members:
            m.wait_healthy(timeout)
        return self

    def stop(self) -> None:
        for m in self.members:
            m.stop()

    def leader(self, timeout: float = 15.0) -> EtcdServer:
        """The member etcd's Raft elected, once one is."""

        def find() -> EtcdServer | None:
            for m in self.members:
                if m.proc is None or m.proc.poll() is not None:
                    continue
                status = m.status()
                ids = {str(x.status().get("header", {}).get("member_id")): x for x in self.members}
                leader = ids.get(str(status.get("leader")))
                if leader is not None:
                    return leader
            return None

        return wait_for(find, timeout, "an etcd leader", 0.05)
