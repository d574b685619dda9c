"""Paging files' IO (store/paging_files.py): buffered writes read back, removal."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.store import paging_files


def test_buffered_writes_read_back_and_close_removes_the_file(tmp_path: Path) -> None:
    directory = paging_files.paging_directory(str(tmp_path))
    file = paging_files.PagingFile(os.path.join(directory, "0-5-1"))
    file.buffer += b"abc"
    assert file.read(10, 0) == b""  # buffered, not yet written
    file.flush()
    file.buffer += b"def"
    file.flush()
    assert file.flushed == 6 and file.read(4, 2) == b"cdef"
    file.close()
    assert os.listdir(directory) == []


def test_a_workers_leftover_files_are_removed(tmp_path: Path) -> None:
    directory = paging_files.paging_directory(str(tmp_path))
    for name in ("1-3-1", "1-4-2", "10-3-1"):
        Path(directory, name).write_bytes(b"x")
    paging_files.remove_files(directory, "1-")
    assert os.listdir(directory) == ["10-3-1"]
