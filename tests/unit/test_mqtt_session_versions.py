"""An MQTT session's file when two connections of one client write it (a
reconnect on another worker while the older connection's write is under
way): the newer connection's state is never replaced by the older's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from shoal.broker.mqtt.mapping import UNAVAILABLE
from shoal.workers import mqtt_session
from shoal.workers.mqtt_session import (
    Session,
    SessionState,
    Subscribed,
    open_owned,
    session_path,
)
from shoal.workers.unmade import made_set


def on_disk(data: Path) -> SessionState:
    path = session_path(str(data), "/", "device-1")
    return msgspec.msgpack.decode(Path(path).read_bytes(), type=SessionState)


def saved(session: Session) -> None:
    """session.save(), waited for."""

    async def wait() -> None:
        done = asyncio.get_running_loop().create_future()
        session.save(lambda: done.set_result(None))
        await asyncio.wait_for(done, 5)

    asyncio.run(wait())


def test_an_older_connection_s_late_write_loses(tmp_path: Path) -> None:
    older, present = Session.open(str(tmp_path), "/", "device-1", persistent=True, clean=False)
    assert not present
    older.state.subscriptions["a/#"] = Subscribed(1, "q-a")
    saved(older)
    newer, present = Session.open(str(tmp_path), "/", "device-1", persistent=True, clean=False)
    assert present and "a/#" in newer.state.subscriptions
    made_set(newer, "received").add(7)  # a QoS 2 id the newer connection took
    saved(newer)
    older.state.subscriptions["b/#"] = Subscribed(1, "q-b")  # late: its write was under way
    saved(older)
    older.show()
    state = on_disk(tmp_path)
    assert state.received == [7] and "b/#" not in state.subscriptions
    assert (state.generation, state.writes) == (2, 1)


def test_a_clean_start_leaves_a_tombstone_an_older_write_cannot_revive(tmp_path: Path) -> None:
    older, _ = Session.open(str(tmp_path), "/", "device-1", persistent=True, clean=False)
    older.state.subscriptions["a/#"] = Subscribed(1, "q-a")
    saved(older)
    clean, present = Session.open(str(tmp_path), "/", "device-1", persistent=False, clean=True)
    assert not present and clean.path is None
    saved(older)  # the older connection's write, finishing after the clean start
    assert on_disk(tmp_path).cleared
    again, present = Session.open(str(tmp_path), "/", "device-1", persistent=True, clean=False)
    assert not present and again.state.subscriptions == {}


def _open_owned(
    data: Path, closed: bool = False
) -> tuple[list[tuple[Session, bool]], list[tuple[int, int]]]:
    """open_owned of device-1's persistent session, run until it opened,
    refused or gave up (bounded)."""
    opened: list[tuple[Session, bool]] = []
    refused: list[tuple[int, int]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        where = (str(data), "/", "device-1")
        open_owned(
            loop, where, (True, False), lambda: closed, lambda *a: opened.append(a), refused.append
        )
        deadline = loop.time() + 5
        while not (opened or refused or closed) and loop.time() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    return opened, refused


def test_a_session_is_opened_once_its_older_connection_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's flock: the next connection waits for it, and is refused
    (server unavailable) if it is still held after OWNER_WAIT."""
    monkeypatch.setattr(mqtt_session, "OWNER_WAIT", 0.2)
    ((first, present),) = _open_owned(tmp_path)[0]
    assert not present and first.owner is not None
    opened, refused = _open_owned(tmp_path)
    assert opened == [] and refused == [UNAVAILABLE]
    assert _open_owned(tmp_path, closed=True) == ([], [])  # gone meanwhile: nothing
    first.let_go()
    ((second, _),) = _open_owned(tmp_path)[0]
    assert second.owner is not None and second.owner.fd >= 0
    second.release_owner()
    assert second.owner is None
