"""An IO worker of a cluster leader's broker stops serving when its node's
lease may have run out (shm/lease_cell.py): a paused agent must
not leave the old leader serving its directly connected clients while a new
leader serves the same queues (issue 38, 7)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from shoal.shm.lease_cell import LeaseCell

log = logging.getLogger("shoal.worker")

POLL = 0.1  # s between looks at the lease cell


class LeaseWatch:
    def __init__(self, cell: LeaseCell, close_clients: Callable[[], None]) -> None:
        self.cell = cell
        self.close_clients = close_clients
        self.lost = False  # past the deadline: no client is served

    def check(self) -> None:
        """Look at the deadline (every POLL): past it, close every client
        connection once, and refuse new ones (serving()) until it moves on."""
        lost = time.monotonic() >= self.cell.until()
        if lost and not self.lost:
            log.error("this node's lease may have run out: closing its client connections")
            self.lost = True
            self.close_clients()
        elif not lost and self.lost:
            log.info("the lease was renewed: serving clients again")
            self.lost = False

    def serving(self) -> bool:
        return not self.lost
