"""Paging files: the file IO of a queue's messages kept on disk while its
log or its worker's arena is full (workers/pager.py decides what goes there
and when, and the records' format; docs/durability.md, "Backlogs larger
than memory").

    <data>/paging/<worker>-<qid>-<n>   one worker's messages of one queue

Not durable, and never synced: a persistent message in a paging file is in
the message store too (its record says where in the queue it goes), and a
transient one does not outlive its broker anyway. So a file is removed when
it is empty, when its worker stops, and at every start of that worker.
Writes are buffered (`buffer`, appended to by the caller) and go out with
one pwrite per `flush`.
"""

from __future__ import annotations

import os


def paging_directory(data_dir: str) -> str:
    """The paging files' directory in a data directory (made if missing)."""
    path = os.path.join(data_dir, "paging")
    os.makedirs(path, exist_ok=True)
    return path


def remove_files(directory: str, prefix: str) -> None:
    """Remove the paging files whose names start with `prefix` (a worker's
    predecessor's: not kept across a restart)."""
    for name in os.listdir(directory):
        if name.startswith(prefix):
            os.unlink(os.path.join(directory, name))


class PagingFile:
    """One paging file, created empty: bytes [0, flushed) are in the file,
    the rest in `buffer`."""

    __slots__ = ("buffer", "fd", "flushed", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.buffer = bytearray()
        self.flushed = 0

    def flush(self) -> None:
        """Write what is buffered at the end of the file."""
        if self.buffer:
            os.pwrite(self.fd, self.buffer, self.flushed)
            self.flushed += len(self.buffer)
            self.buffer.clear()

    def read(self, size: int, at: int) -> bytes:
        """Up to `size` bytes from offset `at` of what was flushed."""
        return os.pread(self.fd, size, at)

    def close(self) -> None:
        """Close and remove the file."""
        os.close(self.fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
