"""The message store's files (store/messages.py): what recovery returns
after publishes and settles from several writers, deleted queues, torn
tails and a crash in the middle of a message file's deletion."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal.store import messages as M
from shoal.store import records

Q1, Q2, GONE = 11, 22, 33


def publish(writer: M.MessageFileWriter, body: bytes, *entries: M.Entry) -> int:
    [offset] = writer.append([M.encode_publish(entries, body)])
    return offset


def bodies(recovered: M.Recovered, uid: int, level: int = 0) -> list[bytes]:
    return [bytes(m[M.MESSAGE]) for m in recovered.queues.get((uid, level), [])]


def test_live_messages_come_back_per_queue_in_queue_order(tmp_path: Path) -> None:
    d = str(tmp_path)
    a = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    b = M.MessageFileWriter(d, M.message_file_name(1, 1, 0))
    # Two workers append to Q1 concurrently: the file order is not the queue's.
    a0 = publish(a, b"a0", M.Entry(Q1, 0, 1, 0), M.Entry(Q2, 0, 1, 0))
    publish(b, b"b1", M.Entry(Q1, 0, 1, 1))
    a1 = publish(a, b"a2", M.Entry(Q1, 0, 1, 3))
    publish(b, b"b2", M.Entry(Q1, 0, 1, 2))
    publish(a, b"hi", M.Entry(Q1, 5, 1, 0))  # priority level 5 of Q1
    # Settled by a worker other than the publisher: its own ack file.
    M.AckWriter(d, a.message_file, 1).settle([(a1, Q1), (a0, Q2)])
    recovered = M.recover(d, {Q1, Q2})
    assert bodies(recovered, Q1) == [b"a0", b"b1", b"b2"]
    assert bodies(recovered, Q1, 5) == [b"hi"]
    assert bodies(recovered, Q2) == []
    assert recovered.skipped == [] and recovered.removed == []


def test_a_later_broker_start_orders_after_an_earlier_one(tmp_path: Path) -> None:
    d = str(tmp_path)
    first = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    publish(first, b"old", M.Entry(Q1, 0, 1, 900))
    second = M.MessageFileWriter(d, M.message_file_name(2, 0, 0))
    publish(second, b"new", M.Entry(Q1, 0, 2, 0))
    assert bodies(M.recover(d, {Q1}), Q1) == [b"old", b"new"]


def test_messages_of_deleted_queues_and_dead_segments_go(tmp_path: Path) -> None:
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    offset = publish(w, b"acked", M.Entry(Q1, 0, 1, 0))
    publish(w, b"of a deleted queue", M.Entry(GONE, 0, 1, 0))
    M.AckWriter(d, w.message_file, 0).settle([(offset, Q1)])
    recovered = M.recover(d, {Q1})
    assert recovered.queues == {}
    assert sorted(recovered.removed) == [w.message_file + ".seg"]
    assert os.listdir(d) == []  # the message file, then its ack file


def test_acks_left_by_a_crash_in_a_deletion_are_removed(tmp_path: Path) -> None:
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    offset = publish(w, b"x", M.Entry(Q1, 0, 1, 0))
    M.AckWriter(d, w.message_file, 3).settle([(offset, Q1)])
    os.unlink(M.message_file_path(d, w.message_file))  # killed here, before the acks
    recovered = M.recover(d, {Q1})
    assert recovered.removed == [f"{w.message_file}.acks.3"]
    assert os.listdir(d) == []


@pytest.mark.parametrize("which", ["segment", "acks"])
def test_a_torn_tail_costs_only_the_record_cut_short(tmp_path: Path, which: str) -> None:
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    first = publish(w, b"whole", M.Entry(Q1, 0, 1, 0))
    last = publish(w, b"cut short" * 100, M.Entry(Q1, 0, 1, 1))
    M.AckWriter(d, w.message_file, 0).settle([(first, Q1)])
    M.AckWriter(d, w.message_file, 0).settle([(last, Q1)])
    path = (
        M.message_file_path(d, w.message_file)
        if which == "segment"
        else M.acks_path(d, w.message_file, 0)
    )
    # (A message file has zeros written past its last record: w.size is where they begin.)
    os.truncate(path, (w.size if which == "segment" else os.path.getsize(path)) - 5)
    recovered = M.recover(d, {Q1})
    [(name, cut)] = recovered.skipped
    assert name == os.path.basename(path) and cut.reason == "truncated record"
    if which == "segment":  # the torn publish was never confirmed; the other was acked
        assert recovered.queues == {}
    else:  # the torn ack was never durable: its message comes back
        assert bodies(recovered, Q1) == [b"cut short" * 100]


def test_a_segment_is_written_once(tmp_path: Path) -> None:
    d = str(tmp_path)
    w = M.MessageFileWriter(d, "s")
    publish(w, b"x", M.Entry(Q1, 0, 1, 0))
    with pytest.raises(FileExistsError):
        M.MessageFileWriter(d, "s")


def test_records_round_trip() -> None:
    entries = [M.Entry(2**63 - 1, 255, 2**32 - 1, 2**64 - 1), M.Entry(1, 0, 0, 0)]
    got, message = M.decode_publish(M.encode_publish(entries, b"payload"))
    assert got == entries and bytes(message) == b"payload"
    assert M.decode_settle(M.encode_settle(1234, 5)) == (1234, 5)
    assert records.RECORD_OVERHEAD == 8


def test_records_of_another_kind_are_refused_as_such() -> None:
    with pytest.raises(ValueError):
        M.decode_settle(M.encode_publish([], b"x"))
    with pytest.raises(ValueError):
        M.decode_publish(M.encode_settle(1, 2))
    with pytest.raises(ValueError):
        M.decode_publish(b"P\x05\x00")  # says 5 entries, has none


def test_pending_entries_live_only_with_their_amend_record(tmp_path: Path) -> None:
    """A PUBLISH written while one of its queues was full leaves that entry
    PENDING; an AMEND record later in the message file gives its seq. Entries
    failed (UNAPPENDED) or never amended are not messages."""
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    first = publish(w, b"x", M.Entry(Q1, 0, 1, 4), M.Entry(Q2, 0, 1, M.PENDING))
    publish(w, b"y", M.Entry(Q2, 0, 1, 0))
    never = publish(w, b"z", M.Entry(Q1, 0, 1, M.UNAPPENDED), M.Entry(Q2, 0, 1, M.PENDING))
    w.append([M.encode_amend(first, [M.Entry(Q2, 0, 1, 7)])])
    recovered = M.recover(d, {Q1, Q2})
    assert bodies(recovered, Q1) == [b"x"]
    assert bodies(recovered, Q2) == [b"y", b"x"]  # by the amended seq
    M.AckWriter(d, w.message_file, 0).settle([(first, Q2), (never, Q1)])
    assert bodies(M.recover(d, {Q1, Q2}), Q2) == [b"y"]
    with pytest.raises(ValueError):
        M.decode_amend(M.encode_settle(first, Q1))


def test_a_lone_pending_entry_lives_by_its_amend_record(tmp_path: Path) -> None:
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    lone = publish(w, b"x", M.Entry(Q1, 0, 1, M.PENDING))
    publish(w, b"y", M.Entry(Q1, 0, 1, 3))
    publish(w, b"z", M.Entry(Q1, 0, 1, M.PENDING))  # never amended
    w.append([M.encode_amend(lone, [M.Entry(Q1, 0, 1, 9)])])
    assert bodies(M.recover(d, {Q1}), Q1) == [b"y", b"x"]


def test_settles_records_hold_many_pairs_and_settle_records_still_read() -> None:
    pairs = [(64, 7), (1 << 40, 9), (128, 7)]
    assert M.decode_settles(M.encode_settles(pairs)) == pairs
    assert M.decode_settles(M.encode_settle(1234, 5)) == [(1234, 5)]
    with pytest.raises(ValueError):
        M.decode_settles(M.encode_publish([], b"x"))
    with pytest.raises(ValueError):
        M.decode_settles(b"T" + b"\0" * 15)  # a pair cut short


def test_a_message_file_keeps_zeros_ahead_unless_a_cluster_mirrors_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zeros past the last record (records.RecordFile.zeros_ahead) make a
    sync after an append an overwrite; a follower copies what a file's size
    says was appended, so a cluster's message files have none."""
    d = str(tmp_path)
    w = M.MessageFileWriter(d, M.message_file_name(1, 0, 0))
    publish(w, b"x", M.Entry(Q1, 0, 1, 0))
    path = M.message_file_path(d, w.message_file)
    assert os.path.getsize(path) == w.size + M.ZEROS_AHEAD
    assert M.recover(d, {Q1}).skipped == [], "the zeros are no damage"

    class Followers:  # a cluster's replica link that confirms every mirror
        def mirror(self, path: str, whole: bool = False) -> None:
            pass

    monkeypatch.setattr(M.replica, "link", Followers())
    mirrored = M.MessageFileWriter(d, M.message_file_name(1, 0, 1))
    publish(mirrored, b"x", M.Entry(Q1, 0, 1, 1))
    assert os.path.getsize(M.message_file_path(d, mirrored.message_file)) == mirrored.size
