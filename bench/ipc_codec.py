"""What one control message costs between an IO worker and the scheduler:
build it as the sender does, encode the datagram, decode it, and dispatch it
through the receiver's real dispatch code (handlers that would touch shared
memory are stubbed; DONE, INTEREST and NOTIFY run their real handler, which
finds no such consumer and returns).

    python bench/ipc_codec.py [--repeat 15] [--number 10000]

Prints ns per operation (the best of --repeat runs, each --number operations;
the batch row is per datagram of 100 DONEs). No sockets: system calls are the
same before and after a codec change and would only add noise.
"""

from __future__ import annotations

import argparse
import platform
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shoal.broker import ipc  # noqa: E402
from shoal.broker.scheduler import scheduler as sched  # noqa: E402
from shoal.broker.scheduler.notify import Notification  # noqa: E402
from shoal.broker.scheduler.scheduler import Scheduler  # noqa: E402
from shoal.workers.worker import Worker  # noqa: E402

ARGUMENTS = {"x-max-length": 1000, "x-queue-type": "classic", "x-dead-letter-exchange": "dlx"}


class _Sink:
    """A Link or stats stand-in: accepts anything, keeps nothing."""

    def send(self, message: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def _scheduler() -> Scheduler:
    """The real dispatch over parts that own nothing: the Notification
    (DONE, INTEREST) over an empty shared state, a stubbed declare."""
    s = object.__new__(Scheduler)
    sink = _Sink()
    s.all_links = s.links = {0: sink}  # type: ignore[dict-item]
    state = SimpleNamespace(
        queues={}, level_of={}, consumers={}, links=s.links, shared=None, stats=sink
    )
    state.ready = state.changes = lambda q: 0
    s.state = state  # type: ignore[assignment]
    s.notification = Notification(state, lambda q: None, lambda q: None)  # type: ignore[arg-type]
    # The handler's work is not the codec's.
    s.lifecycle = SimpleNamespace(declare=lambda *a: [1, b"q", 0, 0])  # type: ignore[assignment]
    s.connections = SimpleNamespace(connection_opened=None)  # type: ignore[assignment]
    s._notices = {cls: bind(s) for cls, bind in sched._NOTICES.items()}
    s._requests = {cls: bind(s) for cls, bind in sched._REQUESTS.items()}
    s._needs_compaction = lambda: False
    s._flush_settles = sink.flush
    return s


def _worker() -> Worker:
    w = object.__new__(Worker)

    class Ctx:
        consumers: dict[int, Any] = {}

    w.ctx = Ctx()
    return w


def cases() -> dict[str, Any]:
    # What Link.flush and Link._readable do with a datagram.
    encode = ipc._encode
    to_scheduler_decode = ipc.SCHEDULER_INBOUND.batch.decode
    to_worker_decode = ipc.WORKER_INBOUND.batch.decode
    on_scheduler = _scheduler()._on_message
    on_worker = _worker()._on_scheduler_message

    def to_scheduler(message: ipc.Message) -> None:
        for m in to_scheduler_decode(encode([message])):
            on_scheduler(0, m)

    def to_worker(message: ipc.Message) -> None:
        for m in to_worker_decode(encode([message])):
            on_worker(m)

    def declare() -> None:
        m = ipc.Declare("/", b"orders", False, True, False, False, 0, 1 << 40 | 5, ARGUMENTS)
        m.req = 42  # as WorkerContext.request does
        to_scheduler(m)

    def batch() -> None:
        for m in to_scheduler_decode(encode([ipc.Done(cid, 12345) for cid in range(100)])):
            on_scheduler(0, m)

    return {
        "DONE": lambda: to_scheduler(ipc.Done(7, 12345)),
        "NOTIFY": lambda: to_worker(ipc.Notify(7)),
        "INTEREST": lambda: to_scheduler(ipc.Interest(7, True)),
        "DECLARE (3 arguments)": declare,
        "100 DONEs, one datagram": batch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=10000)
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, {platform.machine()}")
    print("| message | ns per op |\n|---|---:|")
    for name, fn in cases().items():
        number = args.number // 100 if name.startswith("100") else args.number
        best = min(timeit.repeat(fn, number=number, repeat=args.repeat))
        print(f"| {name} | {best / number * 1e9:,.0f} |")


if __name__ == "__main__":
    main()
