"""broker/cluster/tasks.py: a background task whose cancellation Python
3.11's wait_for drops still ends (a node that did not stop on SIGTERM)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shoal.broker.cluster.tasks import cancel_and_wait


async def _loop_with_wait_for(waits: list[asyncio.Future[int]]) -> None:
    """The shape of the lease's keep-alive loop: wait_for in a loop."""
    loop = asyncio.get_running_loop()
    while True:
        inner: asyncio.Future[int] = loop.create_future()
        waits.append(inner)
        await asyncio.wait_for(inner, 10)


async def _started(waits: list[asyncio.Future[int]]) -> asyncio.Task[None]:
    task = asyncio.ensure_future(_loop_with_wait_for(waits))
    while not waits:
        await asyncio.sleep(0)
    return task


async def _cancel_as_the_inner_await_completes(how: str) -> bool:
    """True if the task ended within 2 s of being cancelled at the moment
    its wait_for's inner future got its result."""
    waits: list[asyncio.Future[int]] = []
    task = await _started(waits)
    waits[-1].set_result(1)  # the keep-alive's answer arrives...
    task.cancel()  # ...in the loop iteration the stop comes in
    try:
        if how == "await":
            await asyncio.wait_for(asyncio.shield(task), 2)
        else:
            await asyncio.wait_for(cancel_and_wait(task), 2)
    except asyncio.CancelledError:
        pass
    except TimeoutError:
        task.cancel()
        return False
    return task.done()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps the cancellation")
def test_one_cancel_can_be_lost_in_wait_for_on_3_11() -> None:
    # Why cancel_and_wait exists: a plain cancel-then-await does not end it.
    assert asyncio.run(_cancel_as_the_inner_await_completes("await")) is False


def test_cancel_and_wait_ends_the_task_even_so() -> None:
    assert asyncio.run(_cancel_as_the_inner_await_completes("cancel_and_wait")) is True


def test_cancel_and_wait_consumes_errors_and_takes_ended_tasks() -> None:
    async def main() -> None:
        async def fails() -> None:
            raise RuntimeError("boom")

        failed = asyncio.ensure_future(fails())
        await asyncio.wait({failed})
        sleeper = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.wait_for(cancel_and_wait(failed, sleeper), 2)
        assert sleeper.cancelled()

    asyncio.run(main())
