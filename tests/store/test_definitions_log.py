"""definitions.log's file (store/definitions_log.py) without a broker: changes
appended and read back by the scheduler's replay (broker/scheduler/durable.py),
a snapshot in place of the log, and the queue uids workers read from it
without the scheduler's types."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.broker.amqp import definitions as D
from shoal.broker.scheduler import durable
from shoal.store import definitions_log, records


def test_changes_come_back_in_order_and_a_snapshot_replaces_them(tmp_path: Path) -> None:
    log, payloads, skipped = definitions_log.DefinitionsLog.open(str(tmp_path))
    assert payloads == [] and skipped is None
    log.write(D.VHostAdded("v", 1), definitions_log.QueueDeclared("v", "q", False, {}, 7))
    log.write(definitions_log.QueueDeclared("v", "r", True, {"x-max-length": 3}, 8))
    log.write(definitions_log.QueueDeleted("v", "q"))
    log.close()
    log, restored = durable.open_log(str(tmp_path))
    assert list(restored.queues) == [("v", "r")]
    assert restored.queues[("v", "r")].arguments == {"x-max-length": 3}
    size = log.file.size
    log.rewrite(
        [definitions_log.UsersSeeded("v"), definitions_log.QueueDeclared("v", "r", True, {}, 8)]
    )
    assert log.file.size < size and not log.dirty and not log.needs_compaction()
    log.close()
    log, restored = durable.open_log(str(tmp_path))
    log.close()
    assert restored.seeded and list(restored.queues) == [("v", "r")]


def test_workers_read_the_durable_queue_uids_without_the_schedulers_types(
    tmp_path: Path,
) -> None:
    assert definitions_log.logged_queue_uids(str(tmp_path)) == set()
    log, _payloads, _skipped = definitions_log.DefinitionsLog.open(str(tmp_path))
    log.write(
        D.VHostAdded("v", 1),
        D.VHostAdded("w", 2),
        definitions_log.QueueDeclared("v", "a", False, {}, 1),
        definitions_log.QueueDeclared("v", "b", False, {}, 2),
        definitions_log.QueueDeclared("w", "c", False, {}, 3),
        D.ExchangeDeclared("v", "x", "direct", True, False, False, {}),
        definitions_log.QueueDeleted("v", "a"),
        definitions_log.QueueDeclared("v", "a", False, {}, 4),  # declared again: another uid
        D.VHostDeleted("w"),  # takes its queues with it
    )
    log.close()
    assert definitions_log.logged_queue_uids(str(tmp_path)) == {2, 4}


def test_a_file_of_another_kind_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / definitions_log.FILENAME
    path.write_bytes(b"SHOALX\x01\x00")
    with pytest.raises(durable.UnreadableDefinitions):
        durable.open_log(str(tmp_path))
    with pytest.raises(records.FormatError):
        definitions_log.DefinitionsLog.open(str(tmp_path))
    assert path.read_bytes() == b"SHOALX\x01\x00"
