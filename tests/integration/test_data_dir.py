"""The data directory (--data-dir): one broker at a time, and where it is by
default. The lock comes first so that two brokers can never write one store
(what is kept there: test_durable_definitions.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from shoal.broker.config import Config
from shoal.broker.supervisor import datadir
from tests.broker_process import Broker, wait_for
from tests.clients import connect

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_broker_on_the_same_data_dir_stops_and_names_the_first(
    broker_factory,  # type: ignore[no-untyped-def]
) -> None:
    first: Broker = broker_factory(workers=1)
    second: Broker = broker_factory(workers=1, args=("--data-dir", first.data_dir), wait=False)
    assert second.proc is not None
    assert second.proc.wait(20) == 1
    assert (
        f"data directory {first.data_dir} is in use by another broker (pid {first.proc.pid})"  # type: ignore[union-attr]
        in second.log()
    )
    # The first one is untouched: its runtime directory and clients carry on.
    conn = connect(first)
    conn.channel().queue_declare("still-served")
    conn.close()
    assert os.path.exists(os.path.join(first.runtime_dir, "shoal.shm"))


def test_the_lock_goes_with_a_broker_killed_with_sigkill(broker_factory) -> None:  # type: ignore[no-untyped-def]
    first: Broker = broker_factory(workers=1)
    family = first.family()
    for p in family:
        p.kill()
    psutil.wait_procs(family, timeout=10)
    first.proc.wait(5)  # type: ignore[union-attr]
    first._seg = None
    # Same data directory, another port: the kernel dropped the flock.
    second: Broker = broker_factory(workers=1, args=("--data-dir", first.data_dir))
    conn = connect(second)
    conn.channel().queue_declare("after-crash")
    conn.close()
    with open(os.path.join(first.data_dir, datadir.LOCK_NAME)) as f:
        assert f.read().strip() == str(second.proc.pid)  # type: ignore[union-attr]
    assert second.stop(signal.SIGTERM) == 0
    # first's stale segment: a clean start on its runtime dir removes it.
    first.start()
    assert first.stop(signal.SIGTERM) == 0


def test_children_do_not_hold_the_lock(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """Only the supervisor holds the lock's descriptor: a worker that
    outlived a killed supervisor would otherwise keep the directory locked."""
    broker: Broker = broker_factory(workers=2)
    lock_path = os.path.realpath(os.path.join(broker.data_dir, datadir.LOCK_NAME))

    def holders() -> set[int]:
        found = set()
        for p in broker.family():
            try:
                if any(f.path == lock_path for f in p.open_files()):
                    found.add(p.pid)
            except psutil.NoSuchProcess:
                pass
        return found

    wait_for(lambda: bool(holders()), 10, "the supervisor to hold the lock")
    assert holders() == {broker.proc.pid}  # type: ignore[union-attr]


def test_default_data_dir(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", "/var/tmp/xdg")
    assert Config(port=5673).data_path() == "/var/tmp/xdg/shoal/5673"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", "/home/ops")
    assert Config().data_path() == "/home/ops/.local/share/shoal/5672"
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/shoal:/var/lib/other")
    assert Config().data_path() == "/var/lib/shoal"
    assert Config(data_dir="/srv/shoal").data_path() == "/srv/shoal"


def test_the_systemd_unit_has_a_state_directory() -> None:
    unit = (ROOT / "deploy" / "shoal.service").read_text()
    assert "StateDirectory=shoal" in unit


def test_an_inherited_lock_is_kept_and_another_directorys_refused(tmp_path: Path) -> None:
    """A cluster's agent hands its held lock to the broker it starts
    (datadir.INHERITED_LOCK_ENV): the broker keeps that lock, so the
    directory is never free in between; a descriptor of another
    directory's lock is refused."""
    mine, other = str(tmp_path / "mine"), str(tmp_path / "other")
    held = datadir.lock(mine)
    os.environ[datadir.INHERITED_LOCK_ENV] = str(held)
    try:
        inherited = datadir.inherited_lock()
    finally:
        os.environ.pop(datadir.INHERITED_LOCK_ENV, None)
    assert inherited == held and datadir.INHERITED_LOCK_ENV not in os.environ
    assert datadir.lock(mine, inherited) == held  # kept, with this pid written
    assert (tmp_path / "mine" / datadir.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(datadir.DataDirInUse):
        datadir.lock(mine)  # a second taker: still refused
    theirs = datadir.lock(other)
    try:
        with pytest.raises(datadir.DataDirInUse):
            datadir.lock(mine, theirs)
    finally:
        os.close(theirs)
        os.close(held)
