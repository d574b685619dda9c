"""What a watch's wake-up costs the consumer's worker: Python's pull() against
the C pull (WatchedPull.pull_each, workers/_watched_pull.h), in one process.

A real segment, WorkerContext, Connection (fake transport), channel and
DeliveryBook, and a Consumer that watches its queue (tests/unit/
test_watched_pull.py's set-up); each wake-up finds one message ready (published
outside the timing), delivers it and arms the watch again, as fan-in's
subscriber does for every device message. The connection's flush is held to the
wake-up's end as Worker._on_watch_wake holds it, and run after the timing (the
same for both). Rounds alternate between the paths.

    python bench/watch_wake.py --wakes 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shoal.shm import layout as L  # noqa: E402
from shoal.workers.pull import go_on_watched, pull  # noqa: E402
from shoal.workers.worker import watched_pull  # noqa: E402
from tests.unit.test_connection import worker_context  # noqa: E402
from tests.unit.test_watched_pull import QID, fill, watching_consumer  # noqa: E402


def one_round(path: str, wakes: int) -> float:
    """µs per wake-up by `path` ("python" or "c")."""
    limits = L.Limits(max_workers=2, max_queues=64, queue_capacity=1 << 15, arena_bytes=1 << 24)
    with tempfile.TemporaryDirectory() as tmp:
        contexts = worker_context(Path(tmp), limits)
        ctx = next(contexts)
        try:
            client = watching_consumer(ctx)
            consumer = client.consumer  # type: ignore[attr-defined]
            watched = watched_pull(ctx)
            assert watched is not None
            go_on = lambda taken, answer: go_on_watched(ctx, taken, answer)  # noqa: E731
            qids = [QID]
            assert ctx.waker.watch(QID, ctx.index)  # armed, as take_watch leaves it
            spent = 0
            for _ in range(wakes):
                fill(ctx, 1)
                # The publisher takes the watch (its CAS to 0) and wakes us.
                assert ctx.waker.unwatch(QID, ctx.index)
                held: list[Callable[[], None]] = []
                start = time.perf_counter_ns()
                ctx.flushes_now = held  # as Worker._on_watch_wake
                if path == "python":
                    pull(ctx, consumer)
                else:
                    watched.pull_each(qids, ctx.watching, go_on)
                ctx.flushes_now = None
                spent += time.perf_counter_ns() - start
                for flush in held:  # (the wake-up's end)
                    flush()
                client.transport.data = b""
            assert consumer.unacked == wakes and consumer.direct
            return spent / wakes / 1000
        finally:
            contexts.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wakes", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    opts = p.parse_args()
    results: dict[str, list[float]] = {"python": [], "c": []}
    for i in range(opts.rounds):
        for path in ("python", "c") if i % 2 == 0 else ("c", "python"):
            results[path].append(one_round(path, opts.wakes))
            print(f"round {i + 1} {path:6} {results[path][-1]:.2f} us a wake-up", flush=True)
    for path, values in results.items():
        print(f"{path:6} median {statistics.median(values):.2f} us (min {min(values):.2f})")


if __name__ == "__main__":
    main()
