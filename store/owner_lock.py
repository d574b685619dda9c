"""An exclusive flock held for as long as one process's part owns a file's
contents (an MQTT session's connection: workers/mqtt_session.py): another
that wants them tries for it without blocking and waits on its own event
loop. The lock file is its own (`<file>.owner`), not the `.lock` a write's
rename takes for a moment (records.py replace_unless_newer): a holder's own
writes take that one. A killed process's locks go with its descriptors."""

from __future__ import annotations

import fcntl
import os


class OwnerLock:
    __slots__ = ("fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def try_take(self) -> bool:
        """Taken now (True), or held by another (False, nothing kept open)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # (the flock goes with it)
            self.fd = -1
