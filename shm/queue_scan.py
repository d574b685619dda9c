"""One word of every watched queue in one C call (shm/_scan.h), for the
once-a-second sweeps: a worker's look for lost wake-ups of the queues it
watches itself, the scheduler's sweep. They asked each queue in Python, two
to five calls a queue; 10,000 idle MQTT subscribers (a queue each) cost an
idle broker 1.5 % of a core in those walks alone."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from shoal.shm import layout
from shoal.shm.queue_table import QueueTable


def ready_among(table: QueueTable, qids: Collection[int]) -> set[int]:
    """The queues of `qids` with messages ready (table.ready(q) > 0): their
    own logs' READY words in one C call, and each priority queue's other
    levels summed in Python (few: a level slot is made by a message that
    needs it)."""
    found = set(table.a.counted_among(qids, table.queues, layout.QUEUE_SIZE, layout.Q_READY))
    for qid in table.catalog.priority_levels():
        if qid in qids and table.ready(qid):
            found.add(qid)
    return found


def flow_closed_among(table: QueueTable, qids: Iterable[int]) -> list[int]:
    """The queues of `qids` whose flow word is not FLOW_OPEN (shm/flow.py)."""
    return table.a.differ_among(
        qids, table.queues, layout.QUEUE_SIZE, layout.Q_FLOW, layout.FLOW_OPEN
    )
