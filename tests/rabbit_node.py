"""A private RabbitMQ 3.10 node for the tests that run beside a real
RabbitMQ (definitions both ways, shovels both ways): bench/persistent.py's
`Rabbit` (the Debian package, on a free port, with its own directories),
stopped and removed after; epmd too when the node started it. Every wait
is bounded. Skipped where RabbitMQ is missing, unless CI says it must run
(SHOAL_RABBITMQ_REQUIRED=1)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.shm.processes import pid_alive
from tests.broker_process import ROOT

MISSING = [tool for tool in ("rabbitmq-server", "rabbitmqctl") if shutil.which(tool) is None]
# CI installs RabbitMQ and sets this: the round trip must run, not be skipped.
REQUIRED = os.environ.get("SHOAL_RABBITMQ_REQUIRED") == "1"


def _debian_wrapper_refuses() -> bool:
    """Debian's rabbitmq-server/rabbitmqctl wrappers run only as root or rabbitmq."""
    path = shutil.which("rabbitmqctl")
    if path is None or os.geteuid() == 0:
        return False
    try:
        wrapper = Path(path).read_text(errors="replace")
    except OSError:
        return False
    if "Only root or rabbitmq should run" not in wrapper:
        return False
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name != "rabbitmq"


RABBITMQ_MARKS = [
    pytest.mark.rabbitmq,
    pytest.mark.skipif(
        bool(MISSING) and not REQUIRED,
        reason=f"needs RabbitMQ: {', '.join(MISSING)} not found on PATH",
    ),
    pytest.mark.skipif(
        _debian_wrapper_refuses() and not REQUIRED,
        reason="Debian's rabbitmqctl wrapper runs only as root or the rabbitmq user",
    ),
]

RABBIT_CTL_TIMEOUT_S = 60
NODE_STOP_TIMEOUT_S = 60


# --- a private RabbitMQ node -------------------------------------------------------


def _epmd_running() -> bool:
    if shutil.which("epmd") is None:
        return False
    try:
        done = subprocess.run(["epmd", "-names"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def private_node() -> Iterator[Any]:
    """A private RabbitMQ node (bench/persistent.py's Rabbit), stopped after."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from persistent import Rabbit
    finally:
        sys.path.remove(str(ROOT / "bench"))
    epmd_before = _epmd_running()
    node = Rabbit()
    pid_file = node.base / "rabbit.pid"
    try:
        node.start()
        yield node
    finally:
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            # With the pid file, `stop` returns once the node's OS process is gone.
            subprocess.run(
                [*node.ctl, "stop", str(pid_file)],
                env=node.env,
                capture_output=True,
                timeout=NODE_STOP_TIMEOUT_S,
                check=False,
            )
        if pid is not None:
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not epmd_before and shutil.which("epmd"):
            # The node started epmd: leave the machine as we found it.
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10, check=False)
        shutil.rmtree(node.base, ignore_errors=True)


def rabbitmqctl(node: Any, *args: str) -> str:
    done = subprocess.run(
        [*node.ctl, *args],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=RABBIT_CTL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def rabbit_json(node: Any, *args: str) -> Any:
    return json.loads(rabbitmqctl(node, *args, "--formatter", "json"))
