"""A process the supervisor forked, and what it knows of its restarts."""

from __future__ import annotations


class Child:
    __slots__ = (
        "failures",
        "incarnation",
        "index",
        "pid",
        "restart_at",
        "retire_at",
        "retiring",
        "role",
        "started",
    )

    def __init__(self, role: str, index: int = 0) -> None:
        self.role = role
        self.index = index
        self.pid = 0
        self.incarnation = 0
        self.started = 0.0
        self.failures = 0
        self.restart_at = 0.0
        self.retiring = False  # an IO worker leaving (fewer workers): not replaced
        self.retire_at = 0.0  # when it gets its SIGTERM (scaling.py)

    def __repr__(self) -> str:
        name = f"{self.role} {self.index}" if self.role == "io-worker" else self.role
        return f"{name} (pid {self.pid})"
