"""A follower's copy of its leader's data directory: the durable writes a
follower makes (issue 29), and the listing both sides compare.

The leader (broker/cluster/shipper.py) sends a follower what changed in its
data directory as operations on paths relative to it:

    append   bytes at an offset of a file (made if missing)
    truncate cut a file to a size (the leader cut a torn tail or a failed write)
    reset    start a new copy of a file: later appends go to `<path>.mirror`
    commit   put that new copy in place of the file (rename), at once
    delete   remove a file (or a directory and what is in it)
    mark     the end of a batch: make everything above durable

`Mirror` applies them and, at each mark, fdatasyncs every file it wrote
and fsyncs every directory whose entries it changed, before the follower
acknowledges the mark. A file replaced whole (a catch-up of a file that
differs, a small file renamed into place on the leader) is written aside
and renamed in only when whole, so a follower never holds half of such a
file at a mark.

What is never copied: the data directory's lock, the node's own cluster
files and the paging directory (bodies paged out of memory; a restart does
not read them).
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
import zlib
from collections.abc import Iterator

from shoal.store import disk, records

NOT_MIRRORED = frozenset({"shoal.lock", "cluster", "paging"})
ASIDE = ".mirror"
MAX_OPEN = 256  # descriptors a follower keeps open between marks
_CHUNK = 1 << 20


def node_id(data_dir: str) -> str:
    """This node's id, made once and kept in `<data dir>/cluster/node-id`
    (never mirrored: each node keeps its own)."""
    directory = os.path.join(data_dir, "cluster")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "node-id")
    try:
        with open(path) as f:
            existing = f.read().strip()
        if existing:
            return existing
    except FileNotFoundError:
        pass
    made = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    records.replace_file(path, f"{made}\n".encode())
    return made


IN_SYNC = "in-sync"  # in <data dir>/cluster: this copy was whole at a mark


def set_in_sync(data_dir: str, whole: bool) -> None:
    """Record (durably) whether this node's copy of the data directory is a
    whole one: set once a follower's catch-up was acknowledged, cleared
    before a catch-up starts changing it. A node whose copy is not whole
    never campaigns (broker/cluster/node.py), even if etcd's in-sync set
    still names it (a follower that came back with its disk wiped)."""
    directory = os.path.join(data_dir, "cluster")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, IN_SYNC)
    if whole:
        if not os.path.exists(path):
            records.replace_file(path, b"whole\n")
    elif os.path.exists(path):
        os.unlink(path)
        records.sync_directory(directory)


def is_in_sync(data_dir: str) -> bool:
    return os.path.exists(os.path.join(data_dir, "cluster", IN_SYNC))


def mirrored(relative: str) -> bool:
    """Whether a path (relative to the data directory) is copied."""
    top = relative.split(os.sep, 1)[0]
    return top not in NOT_MIRRORED and not relative.endswith(ASIDE)


def files(root: str) -> Iterator[str]:
    """Every copied file under `root`, relative to it."""
    for directory, subdirs, names in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        if rel_dir != "." and not mirrored(rel_dir):
            subdirs[:] = []
            continue
        for name in names:
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if mirrored(rel) and os.path.isfile(os.path.join(directory, name)):
                yield rel


def prefix_crc(path: str, length: int) -> int | None:
    """crc32 of a file's first `length` bytes; None if it is shorter."""
    crc = 0
    try:
        with open(path, "rb") as f:
            left = length
            while left:
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    return None
                crc = zlib.crc32(chunk, crc)
                left -= len(chunk)
    except FileNotFoundError:
        return None
    return crc


def listing(root: str) -> dict[str, tuple[int, int]]:
    """path -> (size, crc32) of every copied file: what a follower tells
    the leader it has when it connects."""
    out = {}
    for rel in files(root):
        path = os.path.join(root, rel)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        crc = prefix_crc(path, size)
        if crc is not None:
            out[rel] = (size, crc)
    return out


class Mirror:
    """Applies the leader's operations to `root` (the follower's data
    directory). Not thread-safe: one connection to the leader at a time."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)
        self._fds: dict[str, int] = {}  # open files (kept across marks: appends go on)
        self._dirty: set[int] = set()  # descriptors written since the last mark
        self._dirs: set[str] = set()  # directories whose entries changed
        self._aside: set[str] = set()  # files being replaced whole
        self.bytes_written = 0

    def _full(self, relative: str) -> str:
        if os.path.isabs(relative) or ".." in relative.split(os.sep) or not mirrored(relative):
            raise ValueError(f"not a mirrored path: {relative!r}")
        return os.path.join(self.root, relative)

    def _fd(self, full: str, sync: bool = True) -> int:
        """The open descriptor of `full`; `sync`: fdatasync it at the next mark."""
        fd = self._fds.get(full)
        if fd is None:
            directory = os.path.dirname(full)
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=0o700, exist_ok=True)
                self._dirs.add(os.path.dirname(directory))
            if not os.path.exists(full):
                self._dirs.add(directory)
            if len(self._fds) >= MAX_OPEN:
                self._close(next(iter(self._fds)))
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640)
            self._fds[full] = fd
        if sync:
            self._dirty.add(fd)
        return fd

    def append(self, relative: str, offset: int, data: bytes, sync: bool = True) -> None:
        """Write `data` at `offset`; `sync` False: the leader did not sync it
        either (acks), so the next mark need not (a later synced append to
        the same file syncs it all)."""
        full = self._full(relative)
        if relative in self._aside:
            full += ASIDE
        view = memoryview(data)
        fd = self._fd(full, sync or relative in self._aside)
        while view:
            written = disk.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
        self.bytes_written += len(data)

    def truncate(self, relative: str, size: int) -> None:
        """Cut the file to `size`, durably at the next mark: the leader cut
        its own (store/records.py `cut`), and what it appends next goes
        where the cut bytes were."""
        full = self._full(relative)
        if relative in self._aside:
            full += ASIDE
        os.ftruncate(self._fd(full), size)

    def reset(self, relative: str) -> None:
        full = self._full(relative) + ASIDE
        self._close(full)
        fd = self._fd(full)
        os.ftruncate(fd, 0)
        self._aside.add(relative)

    def commit(self, relative: str) -> None:
        full = self._full(relative)
        self._aside.discard(relative)
        aside = full + ASIDE
        fd = self._fds.pop(aside, None)
        if fd is not None:
            disk.fdatasync(fd)  # whole before it takes the name
            self._dirty.discard(fd)
            os.close(fd)
        self._close(full)
        os.rename(aside, full)
        self._dirs.add(os.path.dirname(full))

    def delete(self, relative: str) -> None:
        full = self._full(relative)
        self._close(full)
        if os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except FileNotFoundError:
                return
        parent = os.path.dirname(full)
        # A directory below the top level (a stream's) left empty went with
        # its files on the leader: the leader names files, not directories.
        while os.path.dirname(parent) != self.root and parent != self.root:
            try:
                os.rmdir(parent)
            except OSError:
                break  # not empty, or gone
            parent = os.path.dirname(parent)
        self._dirs.add(parent)

    def mark(self) -> None:
        """Everything applied so far is durable when this returns."""
        for fd in self._dirty:
            disk.fdatasync(fd)
        self._dirty.clear()
        for directory in sorted(self._dirs, key=len, reverse=True):
            if os.path.isdir(directory):
                records.sync_directory(directory)
        self._dirs.clear()

    def _close(self, full: str) -> None:
        fd = self._fds.pop(full, None)
        if fd is not None:
            if fd in self._dirty:
                disk.fdatasync(fd)  # a mark covers it, whether open or not
                self._dirty.discard(fd)
            os.close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
