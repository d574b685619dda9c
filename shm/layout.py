"""The shared-memory segment's layout: the single source of truth for offsets.

One segment file (created by the supervisor under the runtime directory, mapped
before fork so every child inherits the mapping) holds, in order:

    +-------------------------------+ 0
    | header        (HEADER_SIZE)   |  magic, version, limits, catalog generation
    +-------------------------------+
    | process table (PROC_SLOTS x   |  one slot per child: pid, heartbeat,
    |                PROC_SIZE)     |  connection count, append intent
    +-------------------------------+
    | wake bitmap   (max_queues/8)  |  one bit per queue: "scheduler, look here"
    +-------------------------------+
    | worker wake   (max_workers x  |  the same for each IO worker whose queue's
    | bitmaps        max_queues/8)  |  only consumer watches it itself (Q_WATCH)
    +-------------------------------+
    | queue table   (max_queues x   |  per queue: state, tail, head, counters, name
    |                QUEUE_SIZE)    |
    +-------------------------------+
    | definitions   (catalog_bytes) |  exchanges and bindings: a journal written
    |                               |  by the scheduler (shm/catalog.py)
    +-------------------------------+
    | queue logs    (max_queues x   |  per queue: a ring of 16-byte cells
    |                capacity x 16) |  (state word, body reference)
    +-------------------------------+
    | delivery      (max_queues x   |  per cell: (seq << 16 | deliveries - 1),
    | counts         capacity x 8)  |  used by counted queues only (sparse)
    +-------------------------------+
    | arenas        (max_workers x  |  per IO worker: message bodies, allocated
    |                arena_bytes)   |  only by that worker, freed by anyone
    +-------------------------------+

Every word is 8-byte aligned and accessed through shm._atomic.Atomic.
See shm/ARCHITECTURE.md for the states, transitions and owners.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from shoal.shm import _atomic

MAGIC = int.from_bytes(b"SHOALSHM", "little")
VERSION = 14

HEADER_SIZE = 4096
# header words
H_MAGIC = 0
H_VERSION = 8
H_SUPERVISOR_PID = 16
H_CATALOG_GEN = 24  # bumped by the scheduler on every queue create/delete
H_LIMITS_LEN = 32
# Memory guard (shm/memory.py): per-arena high and low watermarks in bytes,
# and the free space the runtime directory's file system must keep; written
# once by the supervisor.
H_MEM_HIGH = 40
H_MEM_LOW = 48
H_DISK_FREE_LIMIT = 56
H_LIMITS = 64  # msgspec-encoded Limits, up to 512 bytes
H_LIMITS_MAX = 512
# 1 once the scheduler has restored the durable definitions from the data
# directory (broker/scheduler/durable.py): the acceptor accepts no
# connection before, and a scheduler restarted after it does not restore.
H_RESTORED = H_LIMITS + H_LIMITS_MAX
# This broker start's number (broker/supervisor/datadir.py next_epoch),
# written once by the supervisor before it forks.
H_EPOCH = H_RESTORED + 8
# The message store's recovery (workers/recovery.py), run by IO worker 0
# once per broker start: LOAD_* below. The acceptor waits for LOAD_DONE.
H_LOADED = H_EPOCH + 8
LOAD_NOT_BEGUN, LOAD_RUNNING, LOAD_DONE = 0, 1, 2
# The worker count at runtime (shm/ownership.py, broker/supervisor/scaling.py):
# the IO workers the acceptor hands connections to (slots below it), the
# count asked for (SIGTTIN / SIGTTOU, `shoal ctl set_worker_count`), and who
# owns each queue's background work: (generation << 32) | (current << 16) | next.
H_WORKERS = H_LOADED + 8
H_WORKERS_WANTED = H_LOADED + 16
H_OWNERSHIP = H_LOADED + 24
# The first 8 bytes of the sha256 of the --load-definitions file last
# imported (the scheduler's; 0: none): SIGHUP imports it again only if it
# changed, also after a scheduler restart.
H_DEFINITIONS_DIGEST = H_LOADED + 32
# When an IO worker last began an MQTT SUBSCRIBE (monotonic ns; 0: never): any
# worker may store it, a hint that sends publishers to the workers'
# P_SUBSCRIBING words (shm/subscribe_barrier.py).
H_SUBSCRIBED_AT = H_LOADED + 40
# One past the highest queue slot ever made active in this segment (the
# scheduler's, SharedQueues.create: raised before the slot's Q_STATE is
# stored, never lowered). Whatever looks at every slot (the catalog's scans,
# recovery, the wake bitmaps' drains) stops there: a slot never used is never
# touched, so a large --max-queues costs its memory only as queues use it.
H_QUEUES_USED = H_LOADED + 48
# How many times a queue's Q_TIMED went from 0 to 1 (whoever stores it adds 1
# after the store, QueueTable.mark_timed): the expirers' look at which of
# their logs are timed is taken again only when this or the catalog moved.
H_TIMED_MARKS = H_LOADED + 56
# How many MQTT retained messages the scheduler keeps, all vhosts (its
# RetainedMessages, stored at every change and at its start; a message past
# its expiry counts until dropped). A new subscription asks the scheduler for
# the retained messages its filter matches only while this is not 0: a
# fleet's devices that subscribe where nothing is retained save that round
# trip. Stored before a Retain is answered: a client told of its retained
# message (PUBACK) is never followed by a subscriber that reads 0 here.
H_RETAINED = H_LOADED + 64
# The catalog's change ring (shm/queue_catalog.py): the change that moved
# H_CATALOG_GEN from g to g + 1 leaves (g mod 2**40) << 24 | qid in word
# g % CATALOG_RING, so that a reader catches up by re-reading the queues
# that changed rather than every slot. A word whose tag is not g (not yet
# written, or overwritten a lap later) or whose qid is CATALOG_RESCAN sends
# the reader to a full rescan.
H_CATALOG_RING = 1024
CATALOG_RING = 256
CATALOG_QID_BITS = 24
CATALOG_RESCAN = (1 << CATALOG_QID_BITS) - 1
assert H_TIMED_MARKS + 8 <= H_CATALOG_RING <= HEADER_SIZE - CATALOG_RING * 8

# process table
PROC_SLOTS_EXTRA = 5  # supervisor, acceptor, scheduler, metrics, management
PROC_SIZE = 1024
P_PID = 0
P_INCARNATION = 8
P_HEARTBEAT_NS = 16
P_CONNECTIONS = 24
P_READY = 32  # 1 once the process is serving
P_INTENT_QUEUE = 40  # qid + 1 of an append in progress (0: none)
P_INTENT_SEQ = 48  # the sequence number that append reserved
P_CHANNELS = 56
P_CONSUMERS = 64
P_ALARMS = 72  # IO worker: ALARM_* bits it raises (shm/memory.py); one writer
P_DISK_FREE = 80  # IO worker: 1 + free bytes its last poll saw (shm/memory.py); one writer
P_RESCUES = 88  # scheduler: lost wake-ups rescued by its sweep (should stay 0)
P_ROLE = 96  # ROLE_* of the process in this slot
# The body block whose reference this process is dropping after deleting a
# cell (set before the cell's CAS, cleared after the drop; 0: none): lets a
# recovery recount see drops in flight (shm/recovery.py).
P_DROPPING = 104
# IO worker: the ownership generation it has acted on (shm/ownership.py).
P_OWNERSHIP_SEEN = 112
# IO worker: 1 when the supervisor retires it (fewer workers): its SIGTERM
# then drains its paging files before it exits, and it is not replaced.
P_RETIRING = 120
# IO worker: when its oldest MQTT SUBSCRIBE still under way began (monotonic
# ns; 0: none); one writer, the worker (shm/subscribe_barrier.py).
P_SUBSCRIBING = 912
# IO worker: the topic bits its SUBSCRIBEs under way could match (0: none;
# every bit: not yet decoded); one writer, the worker. The word just before
# P_SUBSCRIBING: the C reads find it there (workers/_barrier.h, _mqtt_front.h).
P_SUBSCRIBE_TOPICS = P_SUBSCRIBING - 8
P_STATS = 128  # shm/stats.py: the process's counters, flushed by itself
# IO worker: the tally of a C run in progress (shm/_queues_api.h ShoalTally;
# shm/ARCHITECTURE.md 2b): the queue record's offset + 1 (0: none), its
# Q_STATE when the run began, then the run's sums, not yet added to the
# queue, of CHANGES, READY, UNACKED, READY_BYTES, BYTES, ACKED and PUBLISHED
# (mod 2**64). The supervisor adds them for a worker killed mid-run
# (shm/recovery.py).
P_TALLY = PROC_SIZE - 32 - 72
P_TALLY_QUEUE = P_TALLY
P_TALLY_STATE = P_TALLY + 8
P_TALLY_SUMS = P_TALLY + 16
# IO worker: the move of an old unacked entry to its log's tail in progress
# (shm/entry_moves.py): log qid + 1 (0: none), the entry's block, the seq it
# moves from, and 1 + the seq it reserved (0: none yet). The supervisor
# finishes it after a kill.
P_MOVE_QUEUE = PROC_SIZE - 32
P_MOVE_BLOCK = PROC_SIZE - 24
P_MOVE_FROM = PROC_SIZE - 16
P_MOVE_TO = PROC_SIZE - 8
ROLE_WORKER, ROLE_ACCEPTOR, ROLE_SCHEDULER, ROLE_SUPERVISOR, ROLE_METRICS = 1, 2, 3, 4, 5
ROLE_MANAGEMENT = 6
ROLE_NAMES = {
    ROLE_WORKER: "io-worker",
    ROLE_ACCEPTOR: "acceptor",
    ROLE_SCHEDULER: "scheduler",
    ROLE_SUPERVISOR: "supervisor",
    ROLE_METRICS: "metrics",
    ROLE_MANAGEMENT: "management",
}

# queue table
QUEUE_SIZE = 1024
Q_STATE = 0  # (generation << 8) | QS_*
Q_TAIL = 8  # next sequence number to reserve
Q_HEAD = 16  # lowest sequence number that may still be live
Q_CHANGES = 24  # state-change counter (as Qpid's delivery design): bumped by append, release
# Who waits for work and must be woken by whoever makes it (CAS it to 0,
# then wake that one): 0 nobody, WATCH_SCHEDULER the scheduler, WATCH_WORKER +
# w IO worker w, for the queue's only consumer (shm/ARCHITECTURE.md 7b).
Q_WATCH = 32
WATCH_SCHEDULER = 1
WATCH_WORKER = 2
Q_READY = 40  # entries AVAILABLE
Q_UNACKED = 48  # entries ACQUIRED
Q_RELEASE_GEN = 56  # bumped on every release: consumers rewind their pointers
Q_VHOST = 64  # id of the virtual host the queue belongs to (broker/amqp/definitions.py)
Q_FLAGS = 72  # QF_* bits
Q_OWNER = 80  # exclusive owner: (worker << 40) | connection id
Q_CONSUMERS = 88  # written by the scheduler
Q_PUBLISHED = 96
Q_DELIVERED = 104
Q_ACKED = 112
Q_REDELIVERED = 120
Q_NAME_LEN = 128
Q_NAME = 136
Q_NAME_MAX = 255
# Strict priority queues (x-max-priority): the declared queue's own log is
# level 0; each other level that gets a message has a slot of its own, made
# by the scheduler on first use (shm/ARCHITECTURE.md, section 2a).
Q_MAX_PRIORITY = 448  # declared queue: its x-max-priority (0: not a priority queue)
# Length limits (x-max-length, x-max-length-bytes, x-overflow): as RabbitMQ,
# they count ready entries only, so the bodies of the AVAILABLE entries are
# kept apart from Q_BYTES (append +, acquire -, release +, purge -). On
# Q_BYTES's cache line: the publisher and the consumer write both, and a word
# of its own line would add a line bouncing between them per message.
Q_READY_BYTES = 392
Q_PARENT = 400  # level slot: qid + 1 of its declared queue (0: a declared queue)
Q_LEVEL = 408  # level slot: its priority
Q_BYTES = 416  # body bytes of the entries AVAILABLE or ACQUIRED (append +, delete -)
# Producer flow control (Qpid's, shm/flow.py): x-capacity and x-flow-resume-capacity in
# bytes (0: none), and the release handshake word (shm/flow.py).
Q_CAPACITY = 424
Q_RESUME = 432
Q_FLOW = 440  # FLOW_* below
FLOW_OPEN, FLOW_BLOCKED, FLOW_RELEASE = 0, 1, 2
# The limits themselves (read-only once created, a line apart from the
# counters above, so reading them per publish costs no cache-line transfer).
Q_MAX_LENGTH = 456  # limit + 1 (0: none; a limit of 0 is allowed)
Q_MAX_BYTES = 464  # limit + 1 (0: none)
Q_OVERFLOW = 472  # OVERFLOW_* below; 0 while the queue has no length limit (one load)
OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX = 1, 2, 3
# Connections blocked on this queue (over its capacity), all workers together:
# +1 when one blocks, -1 when it is released or closes (for the metrics).
Q_BLOCKED_PUBLISHERS = 480
# A durable queue's uid (broker/scheduler/durable.py; 0: not durable, or
# exclusive), written by the scheduler: the message store names it so.
Q_UID = 488
# Backlogs larger than the log (workers/pager.py): messages of this queue
# held in the IO workers' paging files, all workers together (+1 when one
# pages out, -1 when it pages it back in or drops it), and the count of purges,
# which tells a paging worker which of its paged out messages a purge took.
Q_PAGED_OUT = 496
Q_PURGES = 504
# Stream queues (x-queue-type stream, QF_STREAM; shm/stream_words.py, workers/stream_io.py):
# the log above only stages their messages until the stream's writer (one IO
# worker) has appended them to the stream's segment files. Settings first,
# written by the scheduler at create:
Q_STREAM_ID = 512  # names the stream's directory in the data directory
Q_STREAM_MAX_BYTES = 520  # x-max-length-bytes (0: none)
Q_STREAM_MAX_AGE = 528  # x-max-age in ms (0: none)
Q_STREAM_SEGMENT_BYTES = 536  # x-stream-max-segment-size-bytes
# ...then the writer's words (one writer: the owning worker), a line apart:
Q_STREAM_OPEN = 576  # the writer's stamp once it has opened the files (0: not yet)
Q_STREAM_FIRST = 584  # the first offset retention kept
Q_STREAM_NEXT = 592  # offsets below it are durable: readers read up to it
Q_STREAM_SYNCED = 600  # log seqs below it are durable (publisher confirms)
Q_STREAM_LAST_CHUNK = 608  # first offset of the last durable chunk ("last")
Q_STREAM_BYTES = 616  # bytes of the segment files kept
Q_STREAM_SEGMENTS = 624  # segment files kept
# basic.get calls on the queue (any worker, fetch_add): the scheduler sees a
# queue with x-expires used when it moves (broker/scheduler/queue_expiry.py).
Q_GETS = 640
# Message TTL (x-message-ttl, broker/amqp/lifecycle.py): the queue's TTL in ms
# + 1 (0: none), written by the scheduler at create (a level slot copies its
# queue's). Q_TIMED: 1 once a message with an expiry time (shm/arena.py
# MSG_TIMED) was appended, so the owning worker's expirer (workers/message_ttl.py)
# looks at the queue's head; set by publishers (a load first: one store per
# queue's life).
Q_MESSAGE_TTL = 648
Q_TIMED = 656
# Delivery counts (quorum queues, x-delivery-limit; broker/amqp/quorum.py):
# 0 not counted, 1 counted with no limit, limit + 2. Written by the
# scheduler at create. A counted log's entries have a count word each in
# the delivery-count table (Layout.count_word), bumped by every release.
Q_DELIVERY_LIMIT = 664
# Consumers that take turns at the queue, written by the scheduler beside
# Q_CONSUMERS: its acquiring consumers, or 1 for a single-active-consumer
# queue that has any (the others wait, they take no turns); browsers never.
# A notified consumer's turn is shared with them (workers/consumer.py,
# turn_quota).
Q_TAKERS = 672
# Written by the scheduler beside Q_TAKERS: while more than this many entries
# are ready, a consumer whose credit came back may pull at once, without
# waiting for its turn (workers/pull.py update_interest); 0: never. Non-zero
# only where its turn would come anyway: acquiring consumers of one priority,
# no single active consumer, not a stream nor a priority queue, and a backlog
# the scheduler would spread over all of them (notify.py SPREAD).
Q_EAGER_ABOVE = 680

QS_FREE = 0
QS_ACTIVE = 1

QF_DURABLE = 1
QF_EXCLUSIVE = 2
QF_AUTO_DELETE = 4
QF_STREAM = 8
QF_QUORUM = 16
QF_DELAYED = 32  # a delayed message exchange's delay queue (workers/delays.py)
QF_DEDUP = 64  # x-message-deduplication: publishes check its cache (workers/dedup_filter.py)

# queue log cells: word = seq << 20 | owner << 8 | flags << 4 | state
CELL_SIZE = 16
SEQ_SHIFT = 20
OWNER_SHIFT = 8
OWNER_MASK = 0xFFF
STATE_MASK = 0xF
FLAG_REDELIVERED = 1 << 4

S_EMPTY = 0  # reserved (or never used): not yet readable
S_AVAILABLE = 1
S_ACQUIRED = 2
S_DELETED = 3

# arenas: block = [u64 size][u64 refcount word][payload]
ARENA_HEADER = 64
A_USED = 0  # bytes in live blocks
A_LIVE = 8  # live blocks
BLOCK_HEADER = 16
B_SIZE = 0
B_REFS = 8
HOLD = 1 << 62  # set in the refcount word while the publishing worker still fills or routes
BLOCK_ALIGN = 16
BLOCK_MIN_SPLIT = 64

# message record inside a block's payload
MSG_PREFIX = struct.Struct("<BBHIQ")  # exchange len, routing key len, flags, props len, body len
# Message flags (MSG_PREFIX's third field). TAGGED: a persistent message of a
# durable queue; MSG_TAG follows the body: where its PUBLISH record is
# (message file table slot, the low 32 bits of that message file's name, record offset).
MSG_TAGGED = 1
MSG_TAG = struct.Struct("<IIQ")
# TIMED: MSG_TIME follows the body (before a tag): when the message was
# published and its own expiry (the `expiration` property; 0: none), both in
# ms since the epoch (wall clock: persistent messages keep them across
# restarts). Stamped only on messages routed to a queue with a TTL or
# carrying an expiration (workers/message_ttl.py).
MSG_TIMED = 2
MSG_TIME = struct.Struct("<qq")

# The message store's message file table (shm/message_files.py): per IO worker,
# MESSAGE_FILE_SLOTS slots of the message files it owns (wrote, or recovered).
MESSAGE_FILE_SLOTS = 1024
MESSAGE_FILE_SLOT_SIZE = 32
SG_NAME = 0  # epoch << 32 | counter (0: a free slot); written by the owner
SG_WRITER = 8  # the writer in the message file's name, + 1; SEALED_BIT once sealed
SG_LIVE = 16  # durable queue entries still pointing at it; anyone decrements
SEALED_BIT = 1 << 32


assert Q_NAME + Q_NAME_MAX < Q_READY_BYTES and Q_EAGER_ABOVE + 8 <= QUEUE_SIZE
assert Q_READY_BYTES // 64 == Q_BYTES // 64 != Q_OVERFLOW // 64  # cache lines, see above

# The C transitions (acquire, ack, advance_head) hard-code these offsets.
assert (_atomic.Q_TAIL, _atomic.Q_HEAD, _atomic.Q_READY, _atomic.Q_UNACKED, _atomic.Q_ACKED) == (
    Q_TAIL,
    Q_HEAD,
    Q_READY,
    Q_UNACKED,
    Q_ACKED,
), "shm/_atomic.c and shm/layout.py disagree on the queue record"
assert (
    _atomic.Q_STATE,
    _atomic.Q_CHANGES,
    _atomic.Q_PUBLISHED,
    _atomic.P_INTENT_QUEUE,
    _atomic.P_INTENT_SEQ,
) == (Q_STATE, Q_CHANGES, Q_PUBLISHED, P_INTENT_QUEUE, P_INTENT_SEQ), "append offsets"
# A run's tally words (shm/_atomic.c count, api_tally_begin): found from the
# P_DROPPING word's address.
assert (_atomic.P_DROPPING, _atomic.P_TALLY) == (P_DROPPING, P_TALLY), "tally offsets"
# The body length C reads from a message record (append, ack).
assert _atomic.Q_BYTES == Q_BYTES and _atomic.Q_READY_BYTES == Q_READY_BYTES
assert _atomic.MSG_BODY_LEN == BLOCK_HEADER + 8 == BLOCK_HEADER + MSG_PREFIX.size - 8
# publish() in C: the words it reads to decide a queue has no rules, and the wake-up.
assert (_atomic.Q_WATCH, _atomic.Q_CAPACITY, _atomic.Q_OVERFLOW, _atomic.QUEUE_SIZE) == (
    Q_WATCH,
    Q_CAPACITY,
    Q_OVERFLOW,
    QUEUE_SIZE,
), "shm/_atomic.c and shm/layout.py disagree on the queue record"
# A block's message record in C: shm/_record.h, the one definition for
# shm/_atomic.c and workers/_wire.c (write_record, write_body, timed,
# read_tag, write_tag, the lane's writer, deliver_frames).
_RECORD = (BLOCK_HEADER, MSG_PREFIX.size, MSG_TAGGED, MSG_TIMED, MSG_TIME.size, MSG_TAG.size)
_C_RECORD = (
    _atomic.BLOCK_HEADER,
    _atomic.MSG_PREFIX_SIZE,
    _atomic.MSG_TAGGED,
    _atomic.MSG_TIMED,
    _atomic.MSG_TIME_SIZE,
    _atomic.MSG_TAG_SIZE,
)
assert _RECORD == _C_RECORD, "shm/_atomic.c and shm/layout.py disagree on the message record"
# The arena allocator in C (alloc).
assert (_atomic.ARENA_HEADER, _atomic.BLOCK_MIN_SPLIT, _atomic.HOLD_BIT) == (
    ARENA_HEADER,
    BLOCK_MIN_SPLIT,
    HOLD,
), "shm/_atomic.c and shm/layout.py disagree on the arena"
assert (_atomic.SEQ_SHIFT, _atomic.B_SIZE, _atomic.B_REFS, _atomic.A_USED, _atomic.A_LIVE) == (
    SEQ_SHIFT,
    B_SIZE,
    B_REFS,
    A_USED,
    A_LIVE,
)


class Limits(msgspec.Struct, frozen=True):
    """Sizes fixed when the segment is created."""

    max_workers: int = 64
    max_queues: int = 1024
    queue_capacity: int = 1 << 18  # entries per queue log; a power of two
    arena_bytes: int = 256 << 20  # per IO worker
    catalog_bytes: int = 16 << 20  # exchanges and bindings journal (two halves)

    def __post_init__(self) -> None:
        cap = self.queue_capacity
        if cap < 16 or cap & (cap - 1):
            raise ValueError("queue_capacity must be a power of two >= 16")
        if not 1 <= self.max_workers <= OWNER_MASK - 1:
            raise ValueError(f"max_workers must be 1..{OWNER_MASK - 1}")
        if not 1 <= self.max_queues < CATALOG_RESCAN or self.max_queues % 64:
            raise ValueError(f"max_queues must be a multiple of 64, 64..{CATALOG_RESCAN - 63}")
        if self.arena_bytes < 1 << 16 or self.arena_bytes % 4096:
            raise ValueError("arena_bytes must be a multiple of 4096 and at least 64 KiB")
        if self.catalog_bytes < 1 << 16 or self.catalog_bytes % 4096:
            raise ValueError("catalog_bytes must be a multiple of 4096 and at least 64 KiB")


def _align(n: int, to: int = 4096) -> int:
    return (n + to - 1) // to * to


class Layout:
    """Offsets derived from Limits; identical in every process."""

    __slots__ = (
        "arenas",
        "bitmap",
        "catalog",
        "counts",
        "limits",
        "logs",
        "message_files",
        "proc_slots",
        "procs",
        "queues",
        "size",
        "worker_bitmaps",
    )

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.proc_slots = limits.max_workers + PROC_SLOTS_EXTRA
        off = HEADER_SIZE
        self.procs = off
        off = _align(off + self.proc_slots * PROC_SIZE)
        self.bitmap = off
        off = _align(off + limits.max_queues // 8)
        self.worker_bitmaps = off
        off = _align(off + limits.max_workers * limits.max_queues // 8)
        self.queues = off
        off = _align(off + limits.max_queues * QUEUE_SIZE)
        self.catalog = off
        off = _align(off + limits.catalog_bytes)
        self.message_files = off
        off = _align(off + limits.max_workers * MESSAGE_FILE_SLOTS * MESSAGE_FILE_SLOT_SIZE)
        self.logs = off
        off = _align(off + limits.max_queues * limits.queue_capacity * CELL_SIZE)
        self.counts = off
        off = _align(off + limits.max_queues * limits.queue_capacity * 8)
        self.arenas = off
        off += limits.max_workers * limits.arena_bytes
        self.size = off

    def worker_bitmap(self, worker: int) -> int:
        """IO worker `worker`'s wake bitmap: one bit per queue."""
        return self.worker_bitmaps + worker * (self.limits.max_queues // 8)

    def slots_used(self, a: Any) -> int:
        """How many slots, from 0, a look at every queue slot must cover
        (H_QUEUES_USED, at most max_queues)."""
        return min(a.load(H_QUEUES_USED), self.limits.max_queues)

    def pull_geometry(self, worker: int) -> tuple[int, ...]:
        """Where a watched queue's wake-up pull in C (workers/_watched_pull.h)
        finds a queue's words and log: (queues, logs, a log's bytes,
        QUEUE_SIZE, max queues, Q_RELEASE_GEN, Q_UID, Q_WATCH, Q_CHANGES,
        arenas, arena bytes, the watch value of IO worker `worker`,
        H_QUEUES_USED)."""
        limits = self.limits
        return (
            self.queues,
            self.logs,
            limits.queue_capacity * CELL_SIZE,
            QUEUE_SIZE,
            limits.max_queues,
            Q_RELEASE_GEN,
            Q_UID,
            Q_WATCH,
            Q_CHANGES,
            self.arenas,
            limits.arena_bytes,
            WATCH_WORKER + worker,
            H_QUEUES_USED,
        )

    def ack_geometry(self) -> tuple[int, int]:
        """Where a subscriber's reads of PUBACKs in C (workers/_ack_read.h)
        find a settled queue's words from its queue's offset: (Q_UID,
        Q_CAPACITY)."""
        return Q_UID, Q_CAPACITY

    def proc(self, slot: int) -> int:
        return self.procs + slot * PROC_SIZE

    def queue(self, qid: int) -> int:
        return self.queues + qid * QUEUE_SIZE

    def log(self, qid: int) -> int:
        return self.logs + qid * self.limits.queue_capacity * CELL_SIZE

    def count_word(self, qid: int, seq: int) -> int:
        """The delivery-count word of log `qid`'s cell for `seq`."""
        cap = self.limits.queue_capacity
        return self.counts + (qid * cap + (seq & (cap - 1))) * 8

    def arena(self, worker: int) -> int:
        return self.arenas + worker * self.limits.arena_bytes

    def message_file_slot(self, slot: int) -> int:
        """A message-file-table slot by its global index (worker * MESSAGE_FILE_SLOTS + i)."""
        return self.message_files + slot * MESSAGE_FILE_SLOT_SIZE


# Process-table slots for the roles that are not IO workers.
def supervisor_slot(layout: Layout) -> int:
    return layout.limits.max_workers


def acceptor_slot(layout: Layout) -> int:
    return layout.limits.max_workers + 1


def scheduler_slot(layout: Layout) -> int:
    return layout.limits.max_workers + 2


def metrics_slot(layout: Layout) -> int:
    return layout.limits.max_workers + 3


def management_slot(layout: Layout) -> int:
    return layout.limits.max_workers + 4
