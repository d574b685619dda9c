"""Start and stop a real single-member etcd for tests.

Every wait here is a bounded poll of a condition (the member answers /health,
the process is gone), never a bare sleep.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from tests.broker_process import free_port, wait_for


class EtcdServer:
    def __init__(self, directory: Path) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install -y etcd-server")
        self.binary = binary
        self.directory = directory
        self.data_dir = directory / "etcd-data"
        self.log_path = directory / "etcd.log"
        # Kept across restart(): the member's peer URL is stored in its data dir.
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 15.0) -> EtcdServer:
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            # A lone member elects itself after one election timeout (1 s by
            # default); it has no peer to lose leadership to, so a short one
            # only makes every test start faster.
            "--heartbeat-interval=10",
            "--election-timeout=100",
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        wait_for(self._healthy, timeout, f"etcd on {client} (log: {self.log_path})", 0.05)
        return self

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
