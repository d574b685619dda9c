"""SETTLE records of one process (store/settles.py): grouped per message file,
written at flush, counted down only after the write; queue deletions
(uid 0) counted but not written; ack files of deleted message files closed."""

from __future__ import annotations

from pathlib import Path

from shoal.store import messages as M
from shoal.store.settles import SettleWriter

Q1 = 11


class Table:
    """shm/message_files.py as SettleWriter sees it."""

    def __init__(self) -> None:
        self.names: dict[tuple[int, int], tuple[int, int, int]] = {(3, 7): (1, 0, 7)}
        self.live: dict[int, int] = {3: 10}

    def name(self, slot: int, check: int) -> tuple[int, int, int] | None:
        return self.names.get((slot, check))

    def add(self, slot: int, count: int) -> None:
        self.live[slot] += count


def test_settles_are_written_per_segment_then_counted_down(tmp_path: Path) -> None:
    d = str(tmp_path)
    message_file = M.message_file_name(1, 0, 7)
    w = M.MessageFileWriter(d, message_file)
    [a, b] = w.append(
        [M.encode_publish([M.Entry(Q1, 0, 1, i)], x) for i, x in enumerate((b"a", b"b"))]
    )
    table = Table()
    settles = SettleWriter(d, 5, table)
    settles.settle((3, 7, a), Q1)
    settles.settle((3, 7, b), 0)  # its queue was deleted: counted, not recorded
    assert table.live[3] == 10  # nothing before the flush
    settles.flush()
    assert table.live[3] == 8
    assert (tmp_path / f"{message_file}.acks.5").exists()
    assert [bytes(m[M.MESSAGE]) for m in M.recover(d, {Q1}).queues[(Q1, 0)]] == [b"b"]
    # `a` is settled; `b`'s entry is still live in the file: its queue's
    # uid is what recovery drops it by.
    del table.names[(3, 7)]
    settles.sweep()  # the message file is gone: its ack file is closed
    assert settles._files == {}
    settles.close()
