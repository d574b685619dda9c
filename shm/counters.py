"""A queue's counters and settings, read from its record(s) in one place.

For observers (metrics, `shoal status`, the scheduler's introspection): what
a queue holds and how it is limited, summed over the logs of a priority
queue. Each word is read once, without a lock: the figures are a moment's
view, each exact on its own, not a consistent snapshot of all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.shm import layout
from shoal.shm.queue_table import counted
from shoal.shm.queues import SharedQueues
from shoal.shm.stream_words import StreamBounds, StreamWords

FLOW_NAMES = {
    layout.FLOW_OPEN: "open",
    layout.FLOW_BLOCKED: "blocked",
    layout.FLOW_RELEASE: "releasing",
}
OVERFLOW_NAMES = {
    layout.OVERFLOW_DROP_HEAD: "drop-head",
    layout.OVERFLOW_REJECT_PUBLISH: "reject-publish",
    layout.OVERFLOW_REJECT_PUBLISH_DLX: "reject-publish-dlx",
}
# x-overflow as the queue record holds it (what the scheduler writes).
OVERFLOW_CODES = {name: code for code, name in OVERFLOW_NAMES.items()}


@dataclass(slots=True)
class QueueCounters:
    ready: int
    unacked: int
    published: int
    bytes: int  # body bytes of its entries, ready and unacked
    ready_bytes: int
    consumers: int
    head: int
    tail: int
    changes: int
    capacity: int  # x-capacity (0: none)
    resume: int  # x-flow-resume-capacity
    flow: int  # layout.FLOW_*: the declared queue's flow word
    flow_blocked: bool  # any of its logs not FLOW_OPEN
    blocked_publishers: int
    max_length: int  # 0: no limit
    max_bytes: int  # 0: no limit
    overflow: int  # layout.OVERFLOW_* (0: no length limit)
    paged_out: int = 0  # in paging files (workers/pager.py), counted in `ready` too
    # A stream queue's durable offsets (shm/stream_words.py); `ready` is then the
    # messages it keeps (next - first), as queue.declare-ok counts them.
    stream: StreamBounds | None = None
    kind: str = "classic"  # the queue type: classic, quorum or stream
    acked: int = 0  # deliveries acknowledged, since the queue was created
    redelivered: int = 0  # entries released back (requeued), since then


def published(shared: SharedQueues, qid: int) -> int:
    """Declared queue `qid`'s messages published, summed over its logs (what
    read() counts, without its other counters: a moving MQTT device asks at
    its first PUBLISHes, workers/mqtt_move.py)."""
    word = shared.table.word
    return sum(counted(word(log, layout.Q_PUBLISHED)) for log in shared.catalog.logs(qid))


def read(shared: SharedQueues, qid: int) -> QueueCounters:
    """The counters of declared queue `qid`, summed over its logs."""
    logs = shared.catalog.logs(qid)
    word = shared.table.word

    def total(field: int) -> int:
        return sum(counted(word(log, field)) for log in logs)

    paged_out = word(qid, layout.Q_PAGED_OUT)
    stream = None
    ready = total(layout.Q_READY) + paged_out
    if word(qid, layout.Q_FLAGS) & layout.QF_STREAM:
        stream = StreamWords(shared.seg).bounds(qid)
        ready = stream.next - stream.first
    return QueueCounters(
        ready=ready,
        unacked=total(layout.Q_UNACKED),
        published=total(layout.Q_PUBLISHED),
        acked=total(layout.Q_ACKED),
        redelivered=total(layout.Q_REDELIVERED),
        bytes=total(layout.Q_BYTES),
        ready_bytes=total(layout.Q_READY_BYTES),
        consumers=word(qid, layout.Q_CONSUMERS),
        head=word(qid, layout.Q_HEAD),
        tail=word(qid, layout.Q_TAIL),
        changes=total(layout.Q_CHANGES),
        capacity=word(qid, layout.Q_CAPACITY),
        resume=word(qid, layout.Q_RESUME),
        flow=word(qid, layout.Q_FLOW),
        flow_blocked=any(word(log, layout.Q_FLOW) != layout.FLOW_OPEN for log in logs),
        blocked_publishers=total(layout.Q_BLOCKED_PUBLISHERS),
        max_length=word(qid, layout.Q_MAX_LENGTH),
        max_bytes=word(qid, layout.Q_MAX_BYTES),
        overflow=word(qid, layout.Q_OVERFLOW),
        paged_out=paged_out,
        stream=stream,
        kind=_kind(word(qid, layout.Q_FLAGS)),
    )


def _kind(flags: int) -> str:
    if flags & layout.QF_STREAM:
        return "stream"
    return "quorum" if flags & layout.QF_QUORUM else "classic"
