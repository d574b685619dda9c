"""A message on its way into its queues: assembled from a client's publish,
header and body frames (workers/publish.py), or made by the worker itself
(workers/ingest.py put_new), then put into its queues (workers/ingest.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.workers.dedup_filter import DedupMark


class Pending:
    """A message being assembled from its publish, header and body frames."""

    __slots__ = (
        "block",
        "body",
        "body_size",
        "dedup",
        "deduped",
        "durable",
        "entries",
        "exchange",
        "header",
        "incarnations",
        "late",
        "levelled",
        "mandatory",
        "qids",
        "received",
        "record",
        "rejected",
        "routing_key",
        "streams",
        "tag",
        "times",
        "trace",
    )

    def __init__(self, exchange: bytes, routing_key: bytes, mandatory: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.header = b""
        self.body_size = 0
        self.received = 0
        self.qids: list[int] = []
        self.block = 0
        self.body: bytearray | None = None  # only for unroutable messages
        # Logs the scheduler chose for a priority level (LEVEL replies): final.
        self.levelled: set[int] | None = None
        self.rejected = False  # a queue refused it (x-overflow reject-publish)
        # The message store (workers/persist.py): `durable`, persistent and
        # routed to a durable queue (its block has room for a tag); then
        # its record's index, and per durable queue (uid, level), its entry.
        self.durable = False
        self.record = -1
        self.entries: dict[int, tuple[int, int, int]] | None = None  # qid -> (uid, level, seq)
        self.tag = (0, 0, 0)  # (segment slot, check, record offset): shm/arena.py write_tag
        # (published, expires at) in ms when it may expire (workers/message_ttl.py)
        self.times: tuple[int, int] | None = None
        # Durable queues still to append to when its record was written (a
        # queue was full): their seqs go in an AMEND record (workers/persist.py).
        self.late: list[int] | None = None
        # Stream queues it was appended to: (qid, seq); its confirm waits
        # until each stream's writer has synced that seq (workers/stream_io.py).
        self.streams: list[tuple[int, int]] | None = None
        # Deduplication (workers/dedup_filter.py): None until checked, then the
        # keys the check added; `deduped`: a queue or the exchange had it
        # (accepted, not returned).
        self.dedup: DedupMark | None = None
        self.deduped = False
        # In a transaction: each queue's incarnation (shm/queue_table.py)
        # when it was routed; the commit appends only to those still there.
        self.incarnations: list[int] | None = None
        # Its routing keys (its own, CC, BCC) while the vhost's firehose is on
        # (workers/firehose.py): traced once its body is in, then None.
        self.trace: list[bytes] | None = None
