"""Record files (store/records.py): what comes back after a clean close, a
torn tail, a corrupt record, and a replacement cut short."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shoal.store import records

MAGIC = b"TESTRC"


def reopen(path: Path) -> tuple[list[bytes], records.Skipped | None, int]:
    f, got, skipped = records.open_records(str(path), MAGIC, 1)
    size = f.size
    f.close()
    return got, skipped, size


def test_appended_records_come_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    f, got, skipped = records.open_records(str(path), MAGIC, 1)
    assert (got, skipped) == ([], None)
    payloads = [os.urandom(n) for n in (0, 1, 100, 70_000)]
    f.append(payloads[:2])
    f.append(payloads[2:])
    f.sync()
    f.close()
    got, skipped, size = reopen(path)
    assert got == payloads and skipped is None
    assert size == path.stat().st_size


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 50])
def test_a_torn_tail_is_skipped_and_cut_off(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.append([b"first", b"second", b"x" * 100])
    f.close()
    whole = path.stat().st_size
    os.truncate(path, whole - cut)
    got, skipped, size = reopen(path)
    assert got == [b"first", b"second"]
    assert skipped is not None and skipped.size == 108 - cut
    assert path.stat().st_size == size == whole - 108
    # What is appended next follows the last good record.
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.append([b"third"])
    f.close()
    assert reopen(path)[:2] == ([b"first", b"second", b"third"], None)


def test_a_corrupt_record_ends_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.append([b"good", b"flipped", b"after"])
    f.close()
    data = bytearray(path.read_bytes())
    at = records.HEADER_SIZE + records.RECORD_OVERHEAD + 4 + records.RECORD_OVERHEAD
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    got, skipped, _ = reopen(path)
    assert got == [b"good"]
    assert skipped is not None and skipped.reason == "checksum mismatch"


def test_another_kind_of_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"SOMETHING ELSE ENTIRELY")
    with pytest.raises(records.FormatError):
        records.open_records(str(path), MAGIC, 1)
    assert path.read_bytes() == b"SOMETHING ELSE ENTIRELY"
    f, _, _ = records.open_records(str(tmp_path / "v.log"), MAGIC, 1)
    f.close()
    with pytest.raises(records.FormatError):
        records.open_records(str(tmp_path / "v.log"), MAGIC, 2)


def test_replace_puts_a_whole_new_file_in_place(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.append([b"old"] * 10)
    f.close()
    g = records.replace_records(str(path), MAGIC, 1, [b"new"])
    g.append([b"appended"])
    g.close()
    assert reopen(path)[:2] == ([b"new", b"appended"], None)
    # A replacement cut short before its rename leaves the old file whole.
    (tmp_path / "r.log.new").write_bytes(b"half a")
    assert reopen(path)[0] == [b"new", b"appended"]


def test_zeros_at_the_tail_are_not_records(tmp_path: Path) -> None:
    """A power cut can leave an appended, unsynced tail as zeros: they fail
    the checksum (it covers the length), and are cut off."""
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.append([b"good"])
    f.close()
    with open(path, "ab") as out:
        out.write(bytes(4096))
    got, skipped, _ = reopen(path)
    assert got == [b"good"]
    assert skipped is not None and skipped.size == 4096


@pytest.mark.parametrize("size", [1, 7])
def test_a_header_cut_short_is_written_again_at_the_start(tmp_path: Path, size: int) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(MAGIC[:size])
    f, got, skipped = records.open_records(str(path), MAGIC, 1)
    f.append([b"after"])
    f.close()
    assert got == [] and skipped is not None and skipped.reason == "truncated header"
    assert reopen(path)[:2] == ([b"after"], None)


def test_a_write_that_cannot_be_undone_breaks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    os.close(f.fd)
    f.fd = os.open(path, os.O_RDONLY)  # writes and truncates fail from here
    with pytest.raises(OSError):
        f.append([b"x"])
    with pytest.raises(records.BrokenFile):
        f.append([b"y"])
    f.close()


def test_a_small_file_is_replaced_whole(tmp_path: Path) -> None:
    """The epoch file's way (broker/supervisor/datadir.py): a new file,
    synced, renamed over the old one; no temporary left behind."""
    path = tmp_path / "epoch"
    records.replace_file(str(path), b"1\n")
    records.replace_file(str(path), b"2\n")
    assert path.read_bytes() == b"2\n"
    assert sorted(os.listdir(tmp_path)) == ["epoch"]


def test_a_late_older_write_does_not_replace_a_newer_file(tmp_path: Path) -> None:
    """replace_unless_newer: writes that finish out of order leave the
    newest; one that loses leaves no temporary file behind."""
    path = str(tmp_path / "session")

    def older_than(mine: int) -> object:
        return lambda there: int(there) > mine

    for version in (1, 3):
        assert records.replace_unless_newer(path, b"%d" % version, ".w", older_than(version))
    assert not records.replace_unless_newer(path, b"2", ".late", older_than(2), durable=False)
    assert Path(path).read_bytes() == b"3"
    assert records.replace_unless_newer(path, b"3", ".tie", older_than(3))  # (a tie replaces)
    assert sorted(os.listdir(tmp_path)) == ["session", "session.lock"]


def test_a_durable_write_that_loses_makes_the_newer_file_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newer file in place may have been written without `durable` (an
    MQTT session's state shown at its connection's end): a durable write
    dropped for it syncs that file and mirrors the directory in its stead,
    or what its caller waits for (a SUBACK's subscription) would be on no
    disk and on no follower."""
    path = str(tmp_path / "session")
    synced: list[bytes] = []
    mirrored: list[str] = []

    def fdatasync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).read_bytes())

    class Link:
        def mirror(self, mirrored_path: str, whole: bool = False) -> None:
            mirrored.append(mirrored_path)

    monkeypatch.setattr(records.disk, "fdatasync", fdatasync)
    monkeypatch.setattr(records.replica, "link", Link())
    assert records.replace_unless_newer(path, b"3", ".shown", lambda _: False, durable=False)
    assert (synced, mirrored) == ([], [])
    assert not records.replace_unless_newer(path, b"2", ".late", lambda there: int(there) > 2)
    assert Path(path).read_bytes() == b"3"
    assert synced == [b"2", b"3"]  # its own temporary file, then the newer one in place
    assert mirrored == [str(tmp_path)]


def test_zeros_written_ahead_are_overwritten_in_place_and_read_as_the_end(
    tmp_path: Path,
) -> None:
    """With zeros_ahead the file keeps zeros past its last record, so that
    appends overwrite blocks the file has (a cheaper fdatasync); more are
    written once half of them are used. A crash leaves them: they read as
    ZERO_TAIL, and the records before come back. A close cuts them off."""
    path = tmp_path / "r.log"
    step = 64 << 10
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.zeros_ahead(step)
    f.append([b"first"])
    first_end = f.size
    assert path.stat().st_size == first_end + step, "zeros past the first record"
    f.append([os.urandom(1000) for _ in range(20)])
    assert path.stat().st_size == first_end + step, "appends stay inside the zeros"
    payloads = [os.urandom(1000) for _ in range(20)]
    f.append(payloads)  # past half of them: the next step
    assert path.stat().st_size == first_end + 2 * step
    f.sync()
    crashed = path.read_bytes()  # what a kill -9 leaves: the file as it is now
    f.close()
    assert path.stat().st_size == f.size, "a close cuts the zeros off"
    path.write_bytes(crashed)
    got, skipped, size = reopen(path)
    assert got[0] == b"first" and got[-20:] == payloads and len(got) == 41
    assert skipped is not None and skipped.reason == records.ZERO_TAIL
    assert size == f.size == path.stat().st_size, "cut where the records end"


def test_no_room_for_zeros_ahead_leaves_appends_as_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.log"
    f, _, _ = records.open_records(str(path), MAGIC, 1)
    f.zeros_ahead(64 << 10)
    real_pwrite = records.disk.pwrite

    def no_room_for_zeros(fd: int, data: bytes, offset: int) -> int:
        if not any(data):
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(records.disk, "pwrite", no_room_for_zeros)
    f.append([b"kept"])
    assert path.stat().st_size == f.size, "no zeros, no error"
    f.append([b"and this"])
    f.close()
    assert reopen(path)[:2] == ([b"kept", b"and this"], None)
