"""Ending the agent's background tasks for sure.

One `task.cancel()` does not always end a task on Python 3.11: when the
cancellation reaches an `asyncio.wait_for` whose inner await has just
completed, wait_for returns the inner result and the cancellation is lost
(CPython gh-86296; 3.12's wait_for no longer does this). A loop with a
wait_for in its body (the lease's keep-alives, the follower's reads) then
runs on, and whoever awaits it after cancelling waits forever: a node that
did not stop on SIGTERM, seen in CI."""

from __future__ import annotations

import asyncio
from typing import Any

# How long one cancellation is given before it is repeated.
RETRY = 0.1


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again
    each RETRY seconds a task that is still running. Their results and
    exceptions are consumed (a task ended by an error is not reported)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _ended, pending = await asyncio.wait(pending, timeout=RETRY)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning
