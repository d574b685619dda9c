from __future__ import annotations

import compileall
import gc
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import Broker

# Every broker the tests start, and this process, check an MQTT device's
# gate against the conditions it stands for (workers/_lane_device.h): a
# change that should have shut it and did not fails the client's read.
os.environ.setdefault("SHOAL_DEVICE_GATE_AUDIT", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--prometheus",
        action="store_true",
        help="run the tests that start a real Prometheus (their own CI step)",
    )
    parser.addoption(
        "--browser",
        action="store_true",
        help="run the web UI's tests in headless Chromium (their own CI step)",
    )
    parser.addoption(
        "--shovels",
        action="store_true",
        help="run the shovels' tests against a real RabbitMQ, kill rounds (their own CI step)",
    )
    parser.addoption(
        "--package",
        action="store_true",
        help="build the Debian package, install it on this machine, purge it (its own CI step)",
    )
    parser.addoption(
        "--slow",
        action="store_true",
        help="run the long kill rounds and volume tests (their own CI step, `-m slow`)",
    )
    parser.addoption(
        "--cluster",
        action="store_true",
        help="run the cluster's tests: etcd and three nodes (their own CI step)",
    )


# The folders of Shoal's packages (pyproject's package-dir), from the repository root.
PACKAGE_DIRS = ("broker", "workers", "shm", "store", "perf", "spark")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # (pytest-xdist's workers: the controller did)
        compile_packages()


def compile_packages() -> None:
    """Byte-compile Shoal's modules once, before the tests start brokers.
    Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it)
    Python writes no .pyc of its own, so every broker a test started
    compiled all of its modules again: 0.4 s of its 0.8 s start, over the
    suite's ~600 starts. compileall writes them regardless; an unchanged
    module is a stat (its .pyc is checked against the source's mtime)."""
    root = Path(__file__).resolve().parent.parent
    for name in PACKAGE_DIRS:
        compileall.compile_dir(root / name, quiet=1, workers=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for option in ("prometheus", "browser", "cluster", "shovels", "package", "slow"):
        if config.getoption(f"--{option}"):
            continue
        skip = pytest.mark.skip(reason=f"needs --{option} (a CI step of its own)")
        for item in items:
            # "cluster" is also tests/cluster's name (a keyword of every test
            # in it): there only the marker counts, so that the replication
            # tests without etcd run in make test. "slow" too (test_slow_readers).
            by_name = option not in ("cluster", "slow") and option in item.keywords
            if item.get_closest_marker(option) or by_name:
                item.add_marker(skip)


def _hang_up_clients_of(brokers: list[Broker]) -> None:
    """Shut down the sockets this process still holds to `brokers`: a client
    a test left open (kept alive by a reference cycle, or by a log record's
    traceback until the test's report is made) would have the broker's stop
    wait CLOSE_OK_TIMEOUT (3 s) for a close-ok it never sends."""
    ports = {b.port for b in brokers if b.proc is not None and b.proc.poll() is None}
    if not ports:
        return
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() >= 0:
            try:
                if obj.getpeername()[1] in ports:
                    obj.shutdown(socket.SHUT_RDWR)
            except (OSError, IndexError, TypeError):
                pass  # not connected, or not TCP


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type]:
    started: list[Broker] = []

    def make(
        workers: int = 2,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wait: bool = True,
        bind: str | None = "127.0.0.1",
    ) -> Broker:
        b = Broker(tmp_path, workers, args, env, bind)
        started.append(b)
        return b.start(wait)

    yield make  # type: ignore[misc]
    _hang_up_clients_of(started)
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            b.stop()
        b.assert_clean()


@pytest.fixture
def broker(broker_factory) -> Broker:  # type: ignore[no-untyped-def]
    return broker_factory(workers=2)
