/*
 * shm._atomic: sequentially consistent 64-bit atomics on a shared buffer.
 *
 * Why C: a compare-and-swap through the `atomics` PyPI package costs 15-18 us
 * from CPython 3.11; one METH_FASTCALL call into __atomic_* costs ~0.1 us.
 * This module knows nothing about Shoal's layout: offsets come from
 * shm/layout.py. Every call checks bounds and 8-byte alignment, so a bad
 * offset raises instead of corrupting memory.
 *
 * Loads, read-modify-writes and the stores of the Python-facing calls are
 * __ATOMIC_SEQ_CST: the store-then-load handshakes between publishers and
 * the scheduler (see shm/ARCHITECTURE.md, "no lost wake-ups") are
 * Dekker-style and need a total order, not just acquire/release. The few
 * stores inside append and ack that no such handshake reads are release
 * stores (STORE_RELEASE, below, says why each may be).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <limits.h>

#include "_queues_api.h"
#include "_record.h"

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int has_view;
} AtomicObject;

static int
Atomic_init(AtomicObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj))
        return -1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    self->has_view = 1;
    self->base = (char *)self->view.buf;
    self->len = self->view.len;
    if (((uintptr_t)self->base) % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "buffer is not 8-byte aligned");
        return -1;
    }
    return 0;
}

static void
Atomic_dealloc(AtomicObject *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Returns a pointer to the 64-bit word at `off`, or NULL with an exception set. */
static inline uint64_t *
word_at(AtomicObject *self, PyObject *off_obj)
{
    Py_ssize_t off = PyLong_AsSsize_t(off_obj);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "Atomic is not attached to a buffer");
        return NULL;
    }
    if (off < 0 || off > self->len - 8 || (off & 7) != 0) {
        PyErr_Format(PyExc_IndexError, "offset %zd out of range or unaligned", off);
        return NULL;
    }
    return (uint64_t *)(self->base + off);
}

static inline int
as_u64(PyObject *obj, uint64_t *out)
{
    /* Accept negative values as two's complement so counters can take deltas. */
    unsigned long long v = PyLong_AsUnsignedLongLongMask(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject *
Atomic_load(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "load(offset)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(p, __ATOMIC_SEQ_CST));
}

static PyObject *
Atomic_store(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(offset, value)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &v) < 0)
        return NULL;
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *
Atomic_cas(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t expected, desired;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cas(offset, expected, desired)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &expected) < 0 || as_u64(args[2], &desired) < 0)
        return NULL;
    if (__atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *
Atomic_fetch_add(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t delta;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fetch_add(offset, delta)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &delta) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_fetch_add(p, delta, __ATOMIC_SEQ_CST));
}

static PyObject *
Atomic_fetch_or(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t bits;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fetch_or(offset, bits)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &bits) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_fetch_or(p, bits, __ATOMIC_SEQ_CST));
}

/*
 * find_entry(ring_offset, mask, start, end) -> int
 *
 * Scans queue-log cells for sequence numbers start..end-1. A cell is 16 bytes
 * (state word, body reference); the state word keeps the sequence number in
 * bits 20..63 and the state in bits 0..3 (see shm/layout.py). Returns the
 * first sequence whose cell holds that sequence in state AVAILABLE (1);
 * -1 if none; or -(seq + 2) when cell `seq` is reserved but not yet published
 * (its word still carries an older sequence), because nothing past it may be
 * skipped by a FIFO consumer yet.
 */
static PyObject *
Atomic_find_entry(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "find_entry(ring_offset, mask, start, end)");
        return NULL;
    }
    Py_ssize_t ring = PyLong_AsSsize_t(args[0]);
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!self->has_view || ring < 0 || (ring & 7) != 0 ||
        ring + (Py_ssize_t)((mask + 1) * 16) > self->len) {
        PyErr_SetString(PyExc_IndexError, "ring out of range");
        return NULL;
    }
    const char *base = self->base + ring;
    for (unsigned long long seq = start; seq < end; seq++) {
        uint64_t w = __atomic_load_n((uint64_t *)(base + (seq & mask) * 16), __ATOMIC_SEQ_CST);
        uint64_t wseq = w >> 20;
        if (wseq < seq || (wseq == seq && (w & 15) == 0))
            return PyLong_FromLongLong(-(long long)seq - 2);
        if (wseq == seq && (w & 15) == 1)
            return PyLong_FromUnsignedLongLong(seq);
    }
    return PyLong_FromLong(-1);
}

/*
 * The queue-log transitions made once per message, done here in one call
 * each instead of 6-10 atomic calls from Python. Field offsets of the queue
 * record are module constants; shm/layout.py asserts they match its own.
 */
#define QUEUE_SIZE 1024
#define Q_STATE 0
#define Q_TAIL 8
#define Q_WATCH 32
#define WATCHER_BITS 12 /* a publish's seq << WATCHER_BITS | the watcher to wake */
#define Q_CAPACITY 424
#define Q_OVERFLOW 472
#define Q_CHANGES 24
#define Q_PUBLISHED 96
#define QS_ACTIVE 1ULL
#define P_INTENT_QUEUE 40
#define P_INTENT_SEQ 48
#define Q_HEAD 16
#define Q_READY 40
#define Q_UNACKED 48
#define Q_ACKED 112
#define Q_BYTES 416
#define Q_READY_BYTES 392
/* MSG_BODY_LEN, a block's body length word: shm/_record.h */
#define SEQ_SHIFT 20
#define ST_MASK 15ULL
#define ST_AVAILABLE 1ULL
#define ST_ACQUIRED 2ULL
#define ST_DELETED 3ULL
#define OWNER_BITS 0xFFF00ULL
#define REDELIVERED 16ULL
/* arena block header and arena header (shm/layout.py: B_SIZE, B_REFS, A_USED, A_LIVE) */
#define B_SIZE 0
#define B_REFS 8
#define A_USED 0
#define A_LIVE 8
#define ARENA_HEADER 64
#define BLOCK_MIN_SPLIT 64
#define HOLD (1ULL << 62)

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define CAS(p, e, d) \
    __atomic_compare_exchange_n((p), (e), (d), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
/*
 * A store no Dekker handshake reads while the writer runs: the append
 * intent and the P_DROPPING word (read by recovery: the intent only once
 * its writer is dead, P_DROPPING after a seq_cst load of the cell whose
 * CAS follows the store), and a cell's block word (read only after a load
 * of the cell word whose CAS publishes it). Release orders it after
 * everything before it and the seq_cst CAS after it orders it before what
 * follows; on x86 it is a plain mov where seq_cst is an xchg, a full
 * barrier, four of them per append before (shm/ARCHITECTURE.md 8).
 */
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* A run's tally (shm/_queues_api.h ShoalTally; shm/layout.py P_TALLY):
 * its process-slot words are the queue record's offset + 1 (0: no run),
 * the queue's Q_STATE when the run began, and the sums of the fields
 * below, in this order. */
#define P_DROPPING SHOAL_P_DROPPING
#define P_TALLY SHOAL_P_TALLY
#define T_QUEUE 0
#define T_STATE 1
#define T_SUMS 2
enum {
    TALLY_CHANGES,
    TALLY_READY,
    TALLY_UNACKED,
    TALLY_READY_BYTES,
    TALLY_BYTES,
    TALLY_ACKED,
    TALLY_PUBLISHED
};
static const int TALLY_OFFSETS[SHOAL_TALLY_FIELDS] = {
    Q_CHANGES, Q_READY, Q_UNACKED, Q_READY_BYTES, Q_BYTES, Q_ACKED, Q_PUBLISHED};

/* Whether a transition of queue q, whose Q_STATE is `state`, counts into
 * `tally`: a run of q, begun while q was this queue (a transition of one
 * declared since, in the same slot, counts at once as outside a run: the
 * settle drops the sums of a queue deleted meanwhile). */
static inline int
tallies(const ShoalTally *tally, const uint64_t *q, uint64_t state)
{
    return tally != NULL && tally->q == q && tally->state == state;
}

/* Add v to a sum of the tally; its slot word follows (relaxed: recovery
 * reads it only once this process is dead). A transition counts into its
 * tally right after its CAS, with nothing costly in between: a signal
 * finds a process at a costly instruction (a locked one waiting for its
 * cache line, a load that misses) far more often than elsewhere, and a
 * kill there leaves the CAS and its count both done or both not (the
 * random kills of tests/shm/test_tally.py: with the counts after the
 * ack's reference drop, 18 of 40 left a counter off by one; with them
 * before the CAS, 3-5 of 40; right after it, 5 of 300). */
static inline void
tally_add(ShoalTally *tally, int field, uint64_t v)
{
    tally->d[field] += v;
    __atomic_store_n(tally->words + T_SUMS + field, tally->d[field], __ATOMIC_RELAXED);
}

/* A message's body length from its (checked) block; 0 if out of range. */
static inline uint64_t
body_of(AtomicObject *self, uint64_t block)
{
    if ((block & 7) || block + MSG_BODY_LEN + 8 > (uint64_t)self->len)
        return 0;
    return *(uint64_t *)(self->base + block + MSG_BODY_LEN);
}

static int
queue_args(AtomicObject *self, PyObject *const *args, uint64_t **q, char **ring,
           unsigned long long *mask)
{
    Py_ssize_t qoff = PyLong_AsSsize_t(args[0]);
    Py_ssize_t roff = PyLong_AsSsize_t(args[1]);
    *mask = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred())
        return -1;
    if (!self->has_view || qoff < 0 || qoff + QUEUE_SIZE > self->len || (qoff & 7) || roff < 0 ||
        (roff & 7) || roff + (Py_ssize_t)((*mask + 1) * 16) > self->len) {
        PyErr_SetString(PyExc_IndexError, "queue or ring out of range");
        return -1;
    }
    *q = (uint64_t *)(self->base + qoff);
    *ring = self->base + roff;
    return 0;
}

static inline uint64_t *
cell_of(char *ring, unsigned long long mask, uint64_t seq)
{
    return (uint64_t *)(ring + (seq & mask) * 16);
}

/* Move the head past DELETED cells; every step is a CAS from the value read. */
static void
advance_head(uint64_t *q, char *ring, unsigned long long mask)
{
    uint64_t h = LOAD(q + Q_HEAD / 8);
    while (h < LOAD(q + Q_TAIL / 8)) {
        uint64_t w = LOAD(cell_of(ring, mask, h));
        if ((w >> SEQ_SHIFT) != h || (w & ST_MASK) != ST_DELETED)
            return;
        uint64_t expected = h;
        if (!CAS(q + Q_HEAD / 8, &expected, h + 1)) {
            h = expected;
            continue;
        }
        h++;
    }
}

/*
 * acquire(queue, ring, mask, start, owner_bits) -> (seq, block, redelivered) | int
 * First AVAILABLE entry at or after max(start, head), CAS'd to ACQUIRED(owner);
 * else the pointer to resume from (the tail, or a cell still being published).
 */
/* acquire's steps: 1 with the entry's seq, block and redelivered flag, or
 * 0 with the pointer to resume from in *seq. */
static int
acquire_core(AtomicObject *self, uint64_t *q, char *ring, unsigned long long mask,
             uint64_t start, uint64_t owner, uint64_t *seq_out, uint64_t *block_out,
             int *redelivered, ShoalTally *tally)
{
    uint64_t head = LOAD(q + Q_HEAD / 8);
    uint64_t seq = start > head ? start : head;
    for (;;) {
        uint64_t tail = LOAD(q + Q_TAIL / 8);
        if (seq >= tail) {
            *seq_out = tail;
            return 0;
        }
        uint64_t *cell = cell_of(ring, mask, seq);
        uint64_t w = LOAD(cell);
        uint64_t wseq = w >> SEQ_SHIFT;
        if (wseq < seq || (wseq == seq && (w & ST_MASK) == 0)) {
            *seq_out = seq; /* not yet published: stop */
            return 0;
        }
        if (wseq == seq && (w & ST_MASK) == ST_AVAILABLE) {
            uint64_t acquired = (seq << SEQ_SHIFT) | owner | (w & REDELIVERED) | ST_ACQUIRED;
            int tallied = tally != NULL && tallies(tally, q, LOAD(q + Q_STATE / 8));
            /* Read before the CAS, so that no load that may miss lies
             * between it and the count (see tally_add): if the CAS succeeds
             * the cell was this entry's all along, and so were its block
             * and body read here; if it fails they go unused. */
            uint64_t body = tallied ? body_of(self, LOAD(cell + 1)) : 0;
            if (CAS(cell, &w, acquired)) {
                if (tallied) {
                    tally_add(tally, TALLY_READY, (uint64_t)-1);
                    tally_add(tally, TALLY_UNACKED, 1);
                    tally_add(tally, TALLY_READY_BYTES, (uint64_t)0 - body);
                }
                uint64_t block = LOAD(cell + 1);
                if (!tallied) {
                    ADD(q + Q_READY / 8, (uint64_t)-1);
                    ADD(q + Q_UNACKED / 8, 1);
                    /* Ours now: the body cannot be freed under us. */
                    ADD(q + Q_READY_BYTES / 8, (uint64_t)0 - body_of(self, block));
                }
                *seq_out = seq;
                *block_out = block;
                *redelivered = (w & REDELIVERED) != 0;
                return 1;
            }
            continue; /* lost the race for this cell: look at it again */
        }
        seq++;
    }
}

static PyObject *
Atomic_acquire(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "acquire(queue, ring, mask, start, owner_bits)");
        return NULL;
    }
    if (queue_args(self, args, &q, &ring, &mask) < 0)
        return NULL;
    uint64_t start = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t owner = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    uint64_t seq, block;
    int redelivered;
    if (!acquire_core(self, q, ring, mask, start, owner, &seq, &block, &redelivered, NULL))
        return PyLong_FromUnsignedLongLong(seq);
    return Py_BuildValue("(KKO)", (unsigned long long)seq, (unsigned long long)block,
                         redelivered ? Py_True : Py_False);
}

/* Drop one reference to the (checked) block at `block`, `size` its size
 * read while the reference was held; the last one accounts it free in its
 * arena (shm/arena.py body_refs_drop). */
static inline void
drop_reference(AtomicObject *self, uint64_t block, uint64_t size, Py_ssize_t arenas,
               Py_ssize_t arena_bytes)
{
    uint64_t *b = (uint64_t *)(self->base + block);
    if (ADD(b + B_REFS / 8, (uint64_t)-1) == 1) {
        uint64_t *arena = (uint64_t *)(self->base + arenas +
                                       (block - arenas) / arena_bytes * arena_bytes);
        ADD(arena + A_USED / 8, (uint64_t)0 - size);
        ADD(arena + A_LIVE / 8, (uint64_t)-1);
    }
}

/*
 * ack(queue, ring, mask, seq, owner_bits, arenas, arena_bytes, dropping) -> int
 * ACQUIRED(owner) -> DELETED, then drop the entry's reference to its body
 * block (accounting the block as free in its arena if that was the last),
 * then advance the head. All in one call, so a worker killed between the
 * CAS and the reference drop (a leaked body) is a window of a few
 * instructions, not of Python code. Returns 1, or 0 if the entry is no
 * longer this owner's (its queue was deleted, or it was released).
 */
/* ack's steps (the comment above) for entry `seq`: 1, 0 (not ours), or -1
 * with an exception set. */
static int
ack_entry(AtomicObject *self, uint64_t *q, char *ring, unsigned long long mask, uint64_t seq,
          uint64_t owner, Py_ssize_t arenas, Py_ssize_t arena_bytes, uint64_t *dropping,
          ShoalTally *tally)
{
    uint64_t *cell = cell_of(ring, mask, seq);
    uint64_t w = LOAD(cell);
    if ((w >> SEQ_SHIFT) != seq || (w & ST_MASK) != ST_ACQUIRED || (w & OWNER_BITS) != owner)
        return 0;
    uint64_t block = LOAD(cell + 1);
    if (block < (uint64_t)arenas || (block & 7) || block + 16 > (uint64_t)self->len) {
        PyErr_Format(PyExc_IndexError, "cell %llu refers to a block out of range",
                     (unsigned long long)seq);
        return -1;
    }
    /* Read the size while our entry still holds a reference (see
     * shm/arena.py), before the CAS, so that only the reference drop lies
     * between the CAS and the drop: a kill in that window leaks the body. */
    uint64_t *b = (uint64_t *)(self->base + block);
    uint64_t size = LOAD(b + B_SIZE / 8);
    uint64_t body = block + MSG_BODY_LEN + 8 <= (uint64_t)self->len ? b[MSG_BODY_LEN / 8] : 0;
    int tallied = tally != NULL && tallies(tally, q, LOAD(q + Q_STATE / 8));
    STORE_RELEASE(dropping, block);
    if (!CAS(cell, &w, (seq << SEQ_SHIFT) | ST_DELETED)) {
        STORE_RELEASE(dropping, 0);
        return 0;
    }
    if (tallied) { /* right after the CAS, before the costly drop (tally_add) */
        tally_add(tally, TALLY_UNACKED, (uint64_t)-1);
        tally_add(tally, TALLY_BYTES, (uint64_t)0 - body);
        tally_add(tally, TALLY_ACKED, 1);
    }
    drop_reference(self, block, size, arenas, arena_bytes);
    STORE_RELEASE(dropping, 0);
    if (!tallied) {
        ADD(q + Q_UNACKED / 8, (uint64_t)-1);
        ADD(q + Q_BYTES / 8, (uint64_t)0 - body);
        ADD(q + Q_ACKED / 8, 1);
    }
    if (LOAD(q + Q_HEAD / 8) == seq)
        advance_head(q, ring, mask);
    return 1;
}

/* ack's and ack_many's arguments after (queue, ring, mask). */
static int
ack_args(AtomicObject *self, PyObject *const *args, uint64_t *owner, Py_ssize_t *arenas,
         Py_ssize_t *arena_bytes, uint64_t **dropping)
{
    *owner = PyLong_AsUnsignedLongLong(args[0]);
    *arenas = PyLong_AsSsize_t(args[1]);
    *arena_bytes = PyLong_AsSsize_t(args[2]);
    /* The caller's P_DROPPING word: names the block from before the CAS
     * until after the drop, so a recovery recount sees the drop in flight. */
    *dropping = word_at(self, args[3]);
    if (PyErr_Occurred() || *dropping == NULL)
        return -1;
    if (*arenas < 0 || *arena_bytes <= 0 || (*arenas & 7) || (*arena_bytes & 7)) {
        PyErr_SetString(PyExc_ValueError, "bad arena geometry");
        return -1;
    }
    return 0;
}

static PyObject *
Atomic_ack(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "ack(queue, ring, mask, seq, owner_bits, arenas, arena_bytes, dropping)");
        return NULL;
    }
    if (queue_args(self, args, &q, &ring, &mask) < 0)
        return NULL;
    uint64_t seq = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t owner, *dropping;
    Py_ssize_t arenas, arena_bytes;
    if ((seq == (uint64_t)-1 && PyErr_Occurred()) ||
        ack_args(self, args + 4, &owner, &arenas, &arena_bytes, &dropping) < 0)
        return NULL;
    int done = ack_entry(self, q, ring, mask, seq, owner, arenas, arena_bytes, dropping, NULL);
    return done < 0 ? NULL : PyLong_FromLong(done);
}

/*
 * ack_many(queue, ring, mask, seqs, owner_bits, arenas, arena_bytes, dropping) -> int
 * ack() for each seq of the list `seqs`, in its order; returns how many
 * were this owner's.
 */
static PyObject *
Atomic_ack_many(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "ack_many(queue, ring, mask, seqs, owner_bits, "
                                         "arenas, arena_bytes, dropping)");
        return NULL;
    }
    if (queue_args(self, args, &q, &ring, &mask) < 0)
        return NULL;
    if (!PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "seqs must be a list");
        return NULL;
    }
    uint64_t owner, *dropping;
    Py_ssize_t arenas, arena_bytes;
    if (ack_args(self, args + 4, &owner, &arenas, &arena_bytes, &dropping) < 0)
        return NULL;
    long done = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[3]); i++) {
        uint64_t seq = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(args[3], i));
        if (seq == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
        int got = ack_entry(self, q, ring, mask, seq, owner, arenas, arena_bytes, dropping, NULL);
        if (got < 0)
            return NULL;
        done += got;
    }
    return PyLong_FromLong(done);
}

/*
 * drop_entries(queue, ring, mask, start, end, purge, arenas, arena_bytes, dropping, tags)
 *   -> (count, tags list | None)
 * The scheduler's loops over a queue's log (shm/queues.py purge and remove),
 * in one call: a Python loop took ~6 us an entry, and the scheduler served
 * nothing else meanwhile (a queue of a million messages deleted: 6 s).
 *   purge 1: each AVAILABLE entry of [start, end) CAS'd to DELETED once (one
 *     an acquirer took first is skipped), Q_READY, Q_BYTES and Q_READY_BYTES
 *     moved for it; count: the entries deleted.
 *   purge 0: each cell of [start, end) not yet DELETED for its seq
 *     tombstoned, retried until its CAS holds: a live entry (AVAILABLE or
 *     ACQUIRED of that seq) counted and its reference dropped, a cell still
 *     holding an older seq (a publish under way) tombstoned too (that
 *     publisher's CAS then fails and it drops its own reference).
 * A reference is dropped after its CAS, the block named in *dropping from
 * before the CAS until after (as ack), the arena accounted where that was
 * the last. With `tags` true, each dropped tagged message's (slot, check,
 * offset), read before its CAS, in order.
 */
static PyObject *tag_of(AtomicObject *self, Py_ssize_t block);

static PyObject *
Atomic_drop_entries(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "drop_entries(queue, ring, mask, start, end, purge, "
                                         "arenas, arena_bytes, dropping, tags)");
        return NULL;
    }
    if (queue_args(self, args, &q, &ring, &mask) < 0)
        return NULL;
    uint64_t start = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t end = PyLong_AsUnsignedLongLong(args[4]);
    int purge = PyObject_IsTrue(args[5]);
    int want_tags = PyObject_IsTrue(args[9]);
    if (PyErr_Occurred() || purge < 0 || want_tags < 0)
        return NULL;
    uint64_t owner_unused, *dropping;
    Py_ssize_t arenas, arena_bytes;
    /* (ack_args reads an owner first: none here, any integer will do) */
    PyObject *geometry[4] = {args[6], args[6], args[7], args[8]};
    if (ack_args(self, geometry, &owner_unused, &arenas, &arena_bytes, &dropping) < 0)
        return NULL;
    PyObject *tags = want_tags ? PyList_New(0) : NULL;
    if (want_tags && tags == NULL)
        return NULL;
    long count = 0;
    for (uint64_t seq = start; seq < end; seq++) {
        uint64_t *cell = cell_of(ring, mask, seq);
        for (;;) {
            uint64_t w = LOAD(cell);
            uint64_t wseq = w >> SEQ_SHIFT, st = w & ST_MASK;
            int live;
            if (purge) {
                if (wseq != seq || st != ST_AVAILABLE)
                    break;
                live = 1;
            } else {
                if (wseq > seq || (wseq == seq && st == ST_DELETED))
                    break;
                live = wseq == seq && (st == ST_AVAILABLE || st == ST_ACQUIRED);
            }
            uint64_t block = live ? LOAD(cell + 1) : 0, body = 0;
            if (block && (block < (uint64_t)arenas || (block & 7) ||
                          block + MSG_BODY_LEN + 8 > (uint64_t)self->len)) {
                PyErr_Format(PyExc_IndexError, "cell %llu refers to a block out of range",
                             (unsigned long long)seq);
                Py_XDECREF(tags);
                return NULL;
            }
            PyObject *tag = NULL; /* (a new reference, or NULL: untagged or not asked) */
            if (block) {
                body = ((uint64_t *)(self->base + block))[MSG_BODY_LEN / 8];
                if (want_tags) {
                    tag = tag_of(self, (Py_ssize_t)block);
                    if (tag == NULL) {
                        Py_XDECREF(tags);
                        return NULL;
                    }
                    if (tag == Py_None)
                        Py_CLEAR(tag);
                }
                STORE_RELEASE(dropping, block);
            }
            uint64_t size = block ? LOAD((uint64_t *)(self->base + block) + B_SIZE / 8) : 0;
            int done = CAS(cell, &w, (seq << SEQ_SHIFT) | ST_DELETED);
            if (done && block)
                drop_reference(self, block, size, arenas, arena_bytes);
            if (block)
                STORE_RELEASE(dropping, 0);
            if (done) {
                count += live;
                if (purge) {
                    ADD(q + Q_READY / 8, (uint64_t)-1);
                    ADD(q + Q_BYTES / 8, (uint64_t)0 - body);
                    ADD(q + Q_READY_BYTES / 8, (uint64_t)0 - body);
                }
                if (tag != NULL) {
                    int failed = PyList_Append(tags, tag);
                    Py_DECREF(tag);
                    if (failed < 0) {
                        Py_DECREF(tags);
                        return NULL;
                    }
                }
                break;
            }
            Py_XDECREF(tag);
            if (purge)
                break; /* an acquirer took it: not ours to purge */
        }
    }
    if (!want_tags) {
        tags = Py_None;
        Py_INCREF(tags);
    }
    return Py_BuildValue("(lN)", count, tags);
}

/* release_hold's steps for a checked block: 1 if that freed it. */
static int
release_hold_core(AtomicObject *self, Py_ssize_t block, Py_ssize_t arenas, Py_ssize_t arena_bytes)
{
    uint64_t *b = (uint64_t *)(self->base + block);
    uint64_t size = LOAD(b + B_SIZE / 8);
    if (ADD(b + B_REFS / 8, (uint64_t)0 - HOLD) != HOLD)
        return 0;
    uint64_t *arena = (uint64_t *)(self->base + arenas + (block - arenas) / arena_bytes * arena_bytes);
    ADD(arena + A_USED / 8, (uint64_t)0 - size);
    ADD(arena + A_LIVE / 8, (uint64_t)-1);
    return 1;
}

/*
 * release_hold(block, arenas, arena_bytes) -> bool
 * The owner is done routing a block: drop its HOLD bit, and account the
 * block free in its arena if that was the last reference (shm/arena.py
 * release_hold, in one call). True if that freed it.
 */
static PyObject *
Atomic_release_hold(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "release_hold(block, arenas, arena_bytes)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[0]);
    Py_ssize_t arenas = PyLong_AsSsize_t(args[1]);
    Py_ssize_t arena_bytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (!self->has_view || block < arenas || (block & 7) || block + 16 > self->len ||
        arenas < 0 || arena_bytes <= 0 || (arenas & 7) || (arena_bytes & 7)) {
        PyErr_SetString(PyExc_IndexError, "block out of range");
        return NULL;
    }
    return PyBool_FromLong(release_hold_core(self, block, arenas, arena_bytes));
}

static PyObject *
Atomic_advance_head(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "advance_head(queue, ring, mask)");
        return NULL;
    }
    if (queue_args(self, args, &q, &ring, &mask) < 0)
        return NULL;
    advance_head(q, ring, mask);
    Py_RETURN_NONE;
}

/*
 * append(queue, ring, mask, block, intent, qid) -> int
 * Reserve the tail (recording the intent in the process slot at `intent`),
 * write the body reference, publish the cell AVAILABLE, count it. Returns
 * the seq; -1 if the queue is full, not active, or was deleted before the
 * cell was published (remove() tombstoned it: nothing to undo); -2 - seq if
 * the queue was deleted after the cell was published (the caller takes the
 * entry back). The Python original is SharedQueues.append's docstring.
 */
/* append's steps (the comment above); returns what append returns. */
static long long
append_entry(AtomicObject *self, uint64_t *q, char *ring, unsigned long long mask,
             uint64_t block, Py_ssize_t ioff, uint64_t qid, ShoalTally *tally, int *tallied)
{
    *tallied = 0;
    /* The publisher wrote the record before appending: its body length is
     * what the queue's byte count (Q_BYTES) adds. */
    uint64_t body = *(uint64_t *)(self->base + block + MSG_BODY_LEN);
    uint64_t *intent_queue = (uint64_t *)(self->base + ioff + P_INTENT_QUEUE);
    uint64_t *intent_seq = (uint64_t *)(self->base + ioff + P_INTENT_SEQ);
    uint64_t state = LOAD(q + Q_STATE / 8);
    if ((state & 0xFF) != QS_ACTIVE)
        return -1;
    uint64_t t;
    for (;;) {
        t = LOAD(q + Q_TAIL / 8);
        if (t - LOAD(q + Q_HEAD / 8) >= mask + 1)
            return -1;
        STORE_RELEASE(intent_seq, t);
        STORE_RELEASE(intent_queue, qid + 1);
        uint64_t expected = t;
        if (CAS(q + Q_TAIL / 8, &expected, t + 1))
            break;
    }
    uint64_t *cell = cell_of(ring, mask, t);
    uint64_t old = LOAD(cell);
    STORE_RELEASE(cell + 1, block);
    uint64_t wseq = old >> SEQ_SHIFT;
    int published = 0;
    if (wseq < t || (wseq == t && (old & ST_MASK) == 0))
        published = CAS(cell, &old, (t << SEQ_SHIFT) | ST_AVAILABLE);
    STORE_RELEASE(intent_queue, 0);
    if (!published)
        return -1;
    if (LOAD(q + Q_STATE / 8) != state)
        return -2 - (long long)t;
    if (tallies(tally, q, state)) { /* the settle adds them, CHANGES first */
        *tallied = 1;
        tally_add(tally, TALLY_CHANGES, 1);
        tally_add(tally, TALLY_READY, 1);
        tally_add(tally, TALLY_BYTES, body);
        tally_add(tally, TALLY_READY_BYTES, body);
        tally_add(tally, TALLY_PUBLISHED, 1);
        return (long long)t;
    }
    /* CHANGES before READY: the scheduler reads READY then CHANGES, so a
     * READY it sees counting this entry comes with a CHANGES that does too
     * (shm/ARCHITECTURE.md 7, "several consumers"). */
    ADD(q + Q_CHANGES / 8, 1);
    ADD(q + Q_READY / 8, 1);
    ADD(q + Q_BYTES / 8, body);
    ADD(q + Q_READY_BYTES / 8, body);
    ADD(q + Q_PUBLISHED / 8, 1);
    return (long long)t;
}

/* append's and publish's arguments, (queue, ring, mask, block, intent,
 * qid), parsed and checked: 0, or -1 with an exception set. */
static int
append_call(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs, const char *usage,
            uint64_t **q, char **ring, unsigned long long *mask, uint64_t *block,
            Py_ssize_t *ioff, uint64_t *qid)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (queue_args(self, args, q, ring, mask) < 0)
        return -1;
    *block = PyLong_AsUnsignedLongLong(args[3]);
    *ioff = PyLong_AsSsize_t(args[4]);
    *qid = PyLong_AsUnsignedLongLong(args[5]);
    if (PyErr_Occurred())
        return -1;
    if (*ioff < 0 || (*ioff & 7) || *ioff + P_INTENT_SEQ + 8 > self->len) {
        PyErr_SetString(PyExc_IndexError, "intent slot out of range");
        return -1;
    }
    if ((*block & 7) || *block + MSG_BODY_LEN + 8 > (uint64_t)self->len) {
        PyErr_SetString(PyExc_IndexError, "block out of range");
        return -1;
    }
    return 0;
}

static PyObject *
Atomic_append(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q, block, qid;
    char *ring;
    unsigned long long mask;
    Py_ssize_t ioff;
    if (append_call(self, args, nargs, "append(queue, ring, mask, block, intent, qid)", &q, &ring,
                    &mask, &block, &ioff, &qid) < 0)
        return NULL;
    int tallied;
    return PyLong_FromLongLong(append_entry(self, q, ring, mask, block, ioff, qid, NULL, &tallied));
}

/* publish's steps for checked arguments: PUBLISH_RULES (nothing done),
 * -1, -2 - seq, or seq << WATCHER_BITS | watcher, as publish() returns
 * them. */
#define PUBLISH_RULES SHOAL_PUBLISH_RULES
/* The scheduler's watch word taken if it waits (shm/wake.py work_added),
 * after the counters that announce the work: the watcher to wake, or 0. */
static uint64_t
take_watch(uint64_t *q)
{
    uint64_t watcher = LOAD(q + Q_WATCH / 8);
    if (watcher && !CAS(q + Q_WATCH / 8, &watcher, 0))
        watcher = 0; /* someone else took the wake-up first */
    return watcher;
}

static long long
publish_core(AtomicObject *self, uint64_t *q, char *ring, unsigned long long mask, uint64_t block,
             Py_ssize_t ioff, uint64_t qid, ShoalTally *tally)
{
    if (LOAD(q + Q_OVERFLOW / 8) || LOAD(q + Q_CAPACITY / 8))
        return PUBLISH_RULES;
    uint64_t *refs = (uint64_t *)(self->base + block + B_REFS);
    ADD(refs, 1);
    int tallied;
    long long t = append_entry(self, q, ring, mask, block, ioff, qid, tally, &tallied);
    if (t == -1) {
        ADD(refs, (uint64_t)-1);
        return -1;
    }
    if (t < 0 || tallied)
        return t < 0 ? t : t << WATCHER_BITS; /* (a run's watch: after its settle) */
    return t << WATCHER_BITS | (long long)take_watch(q);
}

/*
 * publish(queue, ring, mask, block, intent, qid) -> int
 * SharedQueues.enqueue for a queue with no rules, in one call: None if the
 * queue has a length limit or a capacity (nothing done: the Python path
 * applies them); else one more reference to the block, append (the
 * reference taken back if append returns -1: full, or gone), and the
 * scheduler's watch word taken if it waits (shm/wake.py work_added).
 * Returns append's result; a seq comes back as seq << WATCHER_BITS |
 * watcher: the Q_WATCH value the caller took (CAS to 0) and must wake
 * (shm/wake.py Waker.wake), 0 for none.
 */
static PyObject *
Atomic_publish(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t *q, block, qid;
    char *ring;
    unsigned long long mask;
    Py_ssize_t ioff;
    if (append_call(self, args, nargs, "publish(queue, ring, mask, block, intent, qid)", &q,
                    &ring, &mask, &block, &ioff, &qid) < 0)
        return NULL;
    long long got = publish_core(self, q, ring, mask, block, ioff, qid, NULL);
    if (got == PUBLISH_RULES)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(got);
}

/*
 * publish_many(queues, logs, log_bytes, mask, block, intent, qids)
 *   -> (done, wakes, gone, last_seq)
 * publish() of one block into each queue of the list `qids` in turn (the
 * queue record at queues + qid * QUEUE_SIZE, its log at logs + qid *
 * log_bytes), until one is not appended: a fanning-out message's appends
 * (workers/ingest.py put_now) in one call instead of a Python call and a C
 * call per queue. `done`: how many were appended; `wakes`: [(qid, watcher)]
 * for the wake-ups it took (the caller wakes them), or None; `gone`: -1, or
 * the seq of the entry qids[done] got though its queue was deleted after
 * the append (the caller takes it back); `last_seq`: the last appended
 * entry's seq. qids[done] is left to the caller otherwise: a queue with
 * rules, full, or gone before its append (nothing done to it).
 */
static PyObject *
Atomic_publish_many(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "publish_many(queues, logs, log_bytes, mask, block, intent, qids: list)");
        return NULL;
    }
    Py_ssize_t queues = PyLong_AsSsize_t(args[0]), logs = PyLong_AsSsize_t(args[1]);
    Py_ssize_t log_bytes = PyLong_AsSsize_t(args[2]);
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t block = PyLong_AsUnsignedLongLong(args[4]);
    Py_ssize_t ioff = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (!self->has_view || ioff < 0 || (ioff & 7) || ioff + P_INTENT_SEQ + 8 > self->len ||
        (block & 7) || block + MSG_BODY_LEN + 8 > (uint64_t)self->len || log_bytes < 0 ||
        (uint64_t)log_bytes < (mask + 1) * 16) {
        PyErr_SetString(PyExc_IndexError, "intent, block or log size out of range");
        return NULL;
    }
    PyObject *qids = args[6], *wakes = NULL;
    Py_ssize_t done = 0, count = PyList_GET_SIZE(qids);
    long long gone = -1;
    unsigned long long last_seq = 0;
    for (; done < count; done++) {
        uint64_t qid = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(qids, done));
        if (PyErr_Occurred())
            goto fail;
        Py_ssize_t qoff = queues + (Py_ssize_t)qid * QUEUE_SIZE;
        Py_ssize_t roff = logs + (Py_ssize_t)qid * log_bytes;
        if (qid > (uint64_t)self->len || qoff < 0 || (qoff & 7) || qoff + QUEUE_SIZE > self->len ||
            roff < 0 || (roff & 7) || roff + (Py_ssize_t)((mask + 1) * 16) > self->len) {
            PyErr_SetString(PyExc_IndexError, "queue or ring out of range");
            goto fail;
        }
        long long got = publish_core(self, (uint64_t *)(self->base + qoff), self->base + roff,
                                     mask, block, ioff, qid, NULL);
        if (got == PUBLISH_RULES || got == -1)
            break;
        if (got < -1) {
            gone = -2 - got;
            break;
        }
        last_seq = (unsigned long long)got >> WATCHER_BITS;
        long long watcher = got & ((1LL << WATCHER_BITS) - 1);
        if (watcher) {
            PyObject *wake = Py_BuildValue("(KL)", (unsigned long long)qid, watcher);
            if (wake == NULL || (wakes == NULL && (wakes = PyList_New(0)) == NULL) ||
                PyList_Append(wakes, wake) < 0) {
                Py_XDECREF(wake);
                goto fail;
            }
            Py_DECREF(wake);
        }
    }
    if (wakes == NULL) {
        wakes = Py_None;
        Py_INCREF(wakes);
    }
    return Py_BuildValue("(nNLK)", done, wakes, gone, last_seq);
fail:
    /* The wake-ups it took are lost with the exception: the scheduler's
     * sweep finds such queues (shm/ARCHITECTURE.md 7); only a corrupt qid
     * list gets here. */
    Py_XDECREF(wakes);
    return NULL;
}

/* An arena's bounds and an allocation cursor in it, as alloc checks them. */
static int
arena_ok(AtomicObject *self, Py_ssize_t base, Py_ssize_t end, Py_ssize_t cursor)
{
    Py_ssize_t first = base + ARENA_HEADER;
    return self->has_view && base >= 0 && !(base & 7) && end <= self->len && end > first &&
           cursor >= first && cursor < end && !(cursor & 7);
}

/* alloc's steps for checked arguments: 1 with the block, the next cursor
 * in *cursor and the arena's used bytes, or 0 (no room). */
static int
alloc_core(AtomicObject *self, Py_ssize_t base, Py_ssize_t end, Py_ssize_t *cursor,
           Py_ssize_t need, Py_ssize_t *block_out, uint64_t *used_out)
{
    Py_ssize_t first = base + ARENA_HEADER, off = *cursor;
    char *m = self->base;
#define W(at) ((uint64_t *)(m + (at)))
    Py_ssize_t total = end - first, scanned = 0;
    while (scanned < total + need) {
        uint64_t size = LOAD(W(off + B_SIZE));
        if (size < 16 || (size & 7) || size > (uint64_t)(end - off))
            break; /* not a block boundary: never so in a consistent arena */
        if (LOAD(W(off + B_REFS)) == 0) {
            Py_ssize_t nxt = off + (Py_ssize_t)size;
            while (size < (uint64_t)need && nxt < end && LOAD(W(nxt + B_REFS)) == 0) {
                uint64_t more = LOAD(W(nxt + B_SIZE));
                if (more < 16 || more > (uint64_t)(end - nxt))
                    break;
                size += more;
                nxt = off + (Py_ssize_t)size;
                __atomic_store_n(W(off + B_SIZE), size, __ATOMIC_SEQ_CST);
            }
            if (size >= (uint64_t)need) {
                if (size - need >= BLOCK_MIN_SPLIT) {
                    __atomic_store_n(W(off + need + B_REFS), 0, __ATOMIC_SEQ_CST);
                    __atomic_store_n(W(off + need + B_SIZE), size - need, __ATOMIC_SEQ_CST);
                    __atomic_store_n(W(off + B_SIZE), (uint64_t)need, __ATOMIC_SEQ_CST);
                    size = need;
                }
                uint64_t used = ADD(W(base + A_USED), size) + size;
                ADD(W(base + A_LIVE), 1);
                __atomic_store_n(W(off + B_REFS), HOLD, __ATOMIC_SEQ_CST);
                nxt = off + (Py_ssize_t)size;
                *block_out = off;
                *cursor = nxt < end ? nxt : first;
                *used_out = used;
                return 1;
            }
        }
        scanned += (Py_ssize_t)size;
        off += (Py_ssize_t)size;
        if (off >= end)
            off = first;
    }
#undef W
    return 0;
}

/*
 * alloc(base, end, cursor, need) -> (block, next cursor, arena used) | None
 *
 * The owner's next-fit allocation in its arena (shm/arena.py Arena.alloc,
 * whose docstring and comments give the order of the writes and why; the
 * Python original, Arena.alloc_steps, is what the crash tests interpose
 * on). `need` is the whole block, header included, already aligned. The
 * block comes back held (HOLD). None: no room.
 */
static PyObject *
Atomic_alloc(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "alloc(base, end, cursor, need)");
        return NULL;
    }
    Py_ssize_t base = PyLong_AsSsize_t(args[0]);
    Py_ssize_t end = PyLong_AsSsize_t(args[1]);
    Py_ssize_t off = PyLong_AsSsize_t(args[2]);
    Py_ssize_t need = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!arena_ok(self, base, end, off) || need < 16 || (need & 7)) {
        PyErr_SetString(PyExc_IndexError, "arena out of range");
        return NULL;
    }
    Py_ssize_t block;
    uint64_t used;
    if (!alloc_core(self, base, end, &off, need, &block, &used))
        Py_RETURN_NONE;
    return Py_BuildValue("(nnK)", block, off, (unsigned long long)used);
}

/*
 * A persistent message's tag (shm/arena.py read_tag, write_tag): MSG_TAG
 * "<IIQ" (segment slot, check, record offset) after the body and, for a
 * TIMED message, after its MSG_TIME; the message's flags say TAGGED.
 */
/* MSG_PREFIX_SIZE, MSG_TAGGED, MSG_TIMED, MSG_TIME_SIZE, MSG_TAG_SIZE:
 * shm/_record.h */

/* Offset of the tag of the message in `block`, from its prefix; -1 if the
 * lengths point past the buffer (a reused block, for an unpinned reader). */
static Py_ssize_t
tag_at(AtomicObject *self, Py_ssize_t block, unsigned *flags)
{
    Py_ssize_t p = block + BLOCK_HEADER;
    if (!self->has_view || block < 0 || (block & 7) || p + MSG_PREFIX_SIZE > self->len)
        return -1;
    const unsigned char *r = (const unsigned char *)self->base + p;
    *flags = r[2] | r[3] << 8;
    uint64_t props = (uint64_t)r[4] | (uint64_t)r[5] << 8 | (uint64_t)r[6] << 16 |
                     (uint64_t)r[7] << 24;
    uint64_t body = *(const uint64_t *)(r + 8);
    uint64_t at = (uint64_t)p + MSG_PREFIX_SIZE + r[0] + r[1] + props + body;
    if (*flags & MSG_TIMED)
        at += MSG_TIME_SIZE;
    if (at + MSG_TAG_SIZE > (uint64_t)self->len || at < (uint64_t)p)
        return -1;
    return (Py_ssize_t)at;
}

/* The tag of the message in `block` as (slot, check, offset), or None
 * (untagged, or lengths that point outside the block: a reused block, for
 * an unpinned reader); NULL with an exception set. */
static PyObject *
tag_of(AtomicObject *self, Py_ssize_t block)
{
    unsigned flags;
    Py_ssize_t at = tag_at(self, block, &flags);
    if (at < 0 || !(flags & MSG_TAGGED) ||
        (uint64_t)at + MSG_TAG_SIZE > (uint64_t)block + LOAD((uint64_t *)(self->base + block)))
        Py_RETURN_NONE;
    const unsigned char *t = (const unsigned char *)self->base + at;
    uint32_t slot, check;
    uint64_t offset;
    memcpy(&slot, t, 4);
    memcpy(&check, t + 4, 4);
    memcpy(&offset, t + 8, 8);
    return Py_BuildValue("(IIK)", slot, check, (unsigned long long)offset);
}

/* read_tag(block) -> (slot, check, offset) | None */
static PyObject *
Atomic_read_tag(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "read_tag(block)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[0]);
    if (block == -1 && PyErr_Occurred())
        return NULL;
    return tag_of(self, block);
}

/* write_tag(block, slot, check, offset): the block was allocated with
 * MSG_TAG_SIZE bytes to spare. */
static PyObject *
Atomic_write_tag(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "write_tag(block, slot, check, offset)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[0]);
    unsigned long slot = PyLong_AsUnsignedLong(args[1]);
    unsigned long check = PyLong_AsUnsignedLong(args[2]);
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    unsigned flags;
    Py_ssize_t at = tag_at(self, block, &flags);
    if (at < 0 || slot > 0xFFFFFFFFUL || check > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_IndexError, "tag out of range");
        return NULL;
    }
    unsigned char *t = (unsigned char *)self->base + at;
    uint32_t s32 = (uint32_t)slot, c32 = (uint32_t)check;
    uint64_t o64 = offset;
    memcpy(t, &s32, 4);
    memcpy(t + 4, &c32, 4);
    memcpy(t + 8, &o64, 8);
    flags |= MSG_TAGGED;
    unsigned char *f = (unsigned char *)self->base + block + BLOCK_HEADER + 2;
    f[0] = flags & 0xFF;
    f[1] = flags >> 8;
    Py_RETURN_NONE;
}


/*
 * write_record(block, exchange, routing_key, properties, body, published,
 *              expires) -> int
 *
 * A whole message record in `block` (a block the owner just allocated for
 * it): published and expires (ms) are written as MSG_TIME, and the record
 * flagged MSG_TIMED, unless published is -1. Returns the record's size.
 */
static PyObject *
Atomic_write_record(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "write_record(block, exchange, routing_key, "
                                         "properties, body, published, expires)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[0]);
    long long published = PyLong_AsLongLong(args[5]);
    long long expires = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer parts[4];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(args[1 + got], &parts[got], PyBUF_SIMPLE) < 0)
            goto done;
    if (parts[0].len > 255 || parts[1].len > 255 || parts[2].len > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "exchange, routing key or properties too long");
        goto done;
    }
    int timed = published >= 0;
    Py_ssize_t size = record_size(parts[0].len, parts[1].len, parts[2].len, parts[3].len, timed);
    Py_ssize_t record = block + BLOCK_HEADER;
    if (!self->has_view || block < 0 || size > self->len - record) {
        PyErr_SetString(PyExc_IndexError, "record out of range");
        goto done;
    }
    unsigned char *body = record_write_head(
        (unsigned char *)self->base + record, parts[0].buf, parts[0].len, parts[1].buf,
        parts[1].len, parts[2].buf, parts[2].len, parts[3].len, timed, published, expires);
    memcpy(body, parts[3].buf, parts[3].len);
    result = PyLong_FromSsize_t(size);
done:
    while (got-- > 0)
        PyBuffer_Release(&parts[got]);
    return result;
}

/* write_body(block, at, data): `data` into the body of the record in
 * `block` from its byte `at` on (a publish's body frames, as they come). */
static PyObject *
Atomic_write_body(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "write_body(block, at, data)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[0]);
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer data;
    if (PyObject_GetBuffer(args[2], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t body_len = 0;
    Py_ssize_t body = -1;
    if (self->has_view && block >= 0 && block <= self->len - BLOCK_HEADER)
        body = record_body_at((const unsigned char *)self->base, self->len, block + BLOCK_HEADER,
                              &body_len);
    if (body < 0 || at < 0 || (uint64_t)at + (uint64_t)data.len > body_len) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_IndexError, "body out of range");
        return NULL;
    }
    memcpy(self->base + body + at, data.buf, data.len);
    PyBuffer_Release(&data);
    Py_RETURN_NONE;
}

/* timed(block) -> bool: whether the record in `block` carries times (an
 * expiration, a TTL to apply): a consumer checks before it delivers. */
static PyObject *
Atomic_timed(AtomicObject *self, PyObject *arg)
{
    Py_ssize_t block = PyLong_AsSsize_t(arg);
    if (block == -1 && PyErr_Occurred())
        return NULL;
    if (!self->has_view || block < 0 || block > self->len - BLOCK_HEADER - MSG_PREFIX_SIZE) {
        PyErr_SetString(PyExc_IndexError, "block out of range");
        return NULL;
    }
    if (((const unsigned char *)self->base)[block + BLOCK_HEADER + 2] & MSG_TIMED)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/*
 * The deduplication cache (shm/dedup_cache.py): check-and-add of one key, the
 * steps of DedupCache._find, _remove, _insert and _index, in the same
 * order with the same writes. The caller passes the layout (ring, index,
 * mask, size); the header words and record fields are fixed here and
 * checked by shm/dedup_cache.py at import. Returns 1: a duplicate; 0: added;
 * -1: the lock is held by another process (nothing done: Python waits,
 * and takes it over from a dead holder). `held`: the caller holds the
 * lock already. The lock is released before returning either way.
 */
#define DD_LOCK 24
#define DD_HEAD 32
#define DD_HITS 40
#define DD_ADDED 48
#define DD_RECORD 128
#define DD_R_STATE 0
#define DD_R_EXPIRES 8
#define DD_R_LENGTH 16
#define DD_R_KEY 24

static inline uint64_t *
dd_word(char *base, Py_ssize_t off)
{
    return (uint64_t *)(base + off);
}

static inline uint64_t
dd_load(char *base, Py_ssize_t off)
{
    return __atomic_load_n(dd_word(base, off), __ATOMIC_SEQ_CST);
}

static inline void
dd_store(char *base, Py_ssize_t off, uint64_t v)
{
    __atomic_store_n(dd_word(base, off), v, __ATOMIC_SEQ_CST);
}

static void
dd_unindex(char *base, Py_ssize_t ring, Py_ssize_t index, uint64_t mask, uint64_t slot)
{
    uint64_t hole = slot, i = slot;
    for (;;) {
        i = (i + 1) & mask;
        uint64_t word = dd_load(base, index + (Py_ssize_t)i * 8);
        if (!word)
            break;
        uint64_t h = dd_load(base, ring + (Py_ssize_t)((word & 0xFFFFFFFFu) - 1) * DD_RECORD +
                                           DD_R_STATE);
        uint64_t home = h & mask;
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            dd_store(base, index + (Py_ssize_t)hole * 8, word);
            hole = i;
        }
    }
    dd_store(base, index + (Py_ssize_t)hole * 8, 0);
}

/* A key's hash for the cache: FNV-1a over its bytes, then MurmurHash3's
 * 64-bit finalizer (FNV alone clusters similar keys), forced odd so that a
 * record's state is never 0. Any hash would do for exactness (keys are
 * compared byte for byte); this one is the same in every process. */
static uint64_t
dd_hash(const char *key, Py_ssize_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)key[i];
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h | 1;
}

static PyObject *
Atomic_dedup_hash(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    char *key;
    Py_ssize_t n;
    if (nargs != 1 || PyBytes_AsStringAndSize(args[0], &key, &n) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "dedup_hash(key)");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(dd_hash(key, n));
}

static PyObject *
Atomic_dedup_add(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "dedup_add(ring, index, mask, size, key, length, ttl_ms, now, pid, "
                        "held)");
        return NULL;
    }
    Py_ssize_t ring = PyLong_AsSsize_t(args[0]);
    Py_ssize_t index = PyLong_AsSsize_t(args[1]);
    uint64_t mask, size, length, ttl, now, pid;
    if ((ring == -1 || index == -1) && PyErr_Occurred())
        return NULL;
    if (as_u64(args[2], &mask) < 0 || as_u64(args[3], &size) < 0 ||
        as_u64(args[5], &length) < 0 || as_u64(args[6], &ttl) < 0 ||
        as_u64(args[7], &now) < 0 || as_u64(args[8], &pid) < 0)
        return NULL;
    int held = PyObject_IsTrue(args[9]);
    if (held < 0)
        return NULL;
    char *key;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(args[4], &key, &n) < 0)
        return NULL;
    if (!self->has_view || ring < 64 || index < ring || size == 0 || (mask & (mask + 1)) != 0 ||
        ring + (Py_ssize_t)size * DD_RECORD > index ||
        index + (Py_ssize_t)(mask + 1) * 8 > self->len || n > DD_RECORD - DD_R_KEY ||
        (ring & 7) || (index & 7)) {
        PyErr_SetString(PyExc_ValueError, "dedup_add: layout out of range");
        return NULL;
    }
    if (!now) { /* ms on CLOCK_REALTIME, as shm/dedup_cache.py now_ms() */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    }
    uint64_t expires = ttl ? now + ttl : 0;
    uint64_t h = dd_hash(key, n);
    char *base = self->base;
    if (!held) {
        uint64_t free_ = 0;
        if (!__atomic_compare_exchange_n(dd_word(base, DD_LOCK), &free_, pid, 0,
                                         __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return PyLong_FromLong(-1);
    }
    uint64_t tag = h >> 32;
    uint64_t i = h & mask;
    int result = 0;
    for (;;) {
        uint64_t word = dd_load(base, index + (Py_ssize_t)i * 8);
        if (!word)
            break;
        if ((word >> 32) == tag) {
            uint64_t pos = (word & 0xFFFFFFFFu) - 1;
            Py_ssize_t rec = ring + (Py_ssize_t)pos * DD_RECORD;
            if (dd_load(base, rec + DD_R_STATE) == h &&
                dd_load(base, rec + DD_R_LENGTH) == length &&
                memcmp(base + rec + DD_R_KEY, key, (size_t)n) == 0) {
                uint64_t until = dd_load(base, rec + DD_R_EXPIRES);
                if (!until || until > now) {
                    __atomic_fetch_add(dd_word(base, DD_HITS), 1, __ATOMIC_SEQ_CST);
                    result = 1;
                    goto out;
                }
                dd_unindex(base, ring, index, mask, i); /* expired: written again as new */
                dd_store(base, rec + DD_R_STATE, 0);
                break;
            }
        }
        i = (i + 1) & mask;
    }
    {
        uint64_t head = dd_load(base, DD_HEAD);
        uint64_t pos = head % size;
        Py_ssize_t rec = ring + (Py_ssize_t)pos * DD_RECORD;
        uint64_t old = dd_load(base, rec + DD_R_STATE);
        if (old) { /* the ring came round: the oldest key goes */
            uint64_t want = ((old >> 32) << 32) | (pos + 1);
            uint64_t j = old & mask;
            for (;;) {
                uint64_t word = dd_load(base, index + (Py_ssize_t)j * 8);
                if (!word)
                    break;
                if (word == want) {
                    dd_unindex(base, ring, index, mask, j);
                    break;
                }
                j = (j + 1) & mask;
            }
        }
        dd_store(base, rec + DD_R_STATE, 0);
        dd_store(base, rec + DD_R_EXPIRES, expires);
        dd_store(base, rec + DD_R_LENGTH, length);
        memcpy(base + rec + DD_R_KEY, key, (size_t)n);
        dd_store(base, rec + DD_R_STATE, h);
        dd_store(base, DD_HEAD, head + 1);
        uint64_t k = h & mask;
        while (dd_load(base, index + (Py_ssize_t)k * 8))
            k = (k + 1) & mask;
        dd_store(base, index + (Py_ssize_t)k * 8, ((h >> 32) << 32) | (pos + 1));
        __atomic_fetch_add(dd_word(base, DD_ADDED), 1, __ATOMIC_SEQ_CST);
    }
out:
    dd_store(base, DD_LOCK, 0);
    return PyLong_FromLong(result);
}

/* ------------------------------------------------ the C API (_queues_api.h) */

static PyTypeObject AtomicType;

static int
api_is_atomic(PyObject *obj)
{
    return Py_IS_TYPE(obj, &AtomicType) && ((AtomicObject *)obj)->has_view;
}

static const char *
api_readable(PyObject *obj, Py_ssize_t *len)
{
    if (!PyObject_TypeCheck(obj, &AtomicType) || !((AtomicObject *)obj)->has_view) {
        PyErr_SetString(PyExc_TypeError, "not an Atomic over a buffer");
        return NULL;
    }
    *len = ((AtomicObject *)obj)->len;
    return ((AtomicObject *)obj)->base;
}

static char *
api_base(PyObject *atomic, Py_ssize_t *len)
{
    *len = ((AtomicObject *)atomic)->len;
    return ((AtomicObject *)atomic)->base;
}

static int
api_queue(PyObject *atomic, Py_ssize_t qoff, Py_ssize_t roff, unsigned long long mask,
          uint64_t **q, char **ring)
{
    AtomicObject *self = (AtomicObject *)atomic;
    if (!self->has_view || qoff < 0 || qoff + QUEUE_SIZE > self->len || (qoff & 7) || roff < 0 ||
        (roff & 7) || roff + (Py_ssize_t)((mask + 1) * 16) > self->len) {
        PyErr_SetString(PyExc_IndexError, "queue or ring out of range");
        return -1;
    }
    *q = (uint64_t *)(self->base + qoff);
    *ring = self->base + roff;
    return 0;
}

static int
api_arena_ok(PyObject *atomic, Py_ssize_t base, Py_ssize_t end, Py_ssize_t cursor)
{
    return arena_ok((AtomicObject *)atomic, base, end, cursor);
}

static int
api_alloc(PyObject *atomic, Py_ssize_t base, Py_ssize_t end, Py_ssize_t *cursor, Py_ssize_t need,
          Py_ssize_t *block, uint64_t *used)
{
    return alloc_core((AtomicObject *)atomic, base, end, cursor, need, block, used);
}

static long long
api_publish(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask, uint64_t block,
            Py_ssize_t intent, uint64_t qid, ShoalTally *tally)
{
    return publish_core((AtomicObject *)atomic, q, ring, mask, block, intent, qid, tally);
}

static int
api_release_hold(PyObject *atomic, Py_ssize_t block, Py_ssize_t arenas, Py_ssize_t arena_bytes)
{
    return release_hold_core((AtomicObject *)atomic, block, arenas, arena_bytes);
}

static int
api_acquire(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask, uint64_t start,
            uint64_t owner, uint64_t *seq, uint64_t *block, int *redelivered, ShoalTally *tally)
{
    return acquire_core((AtomicObject *)atomic, q, ring, mask, start, owner, seq, block,
                        redelivered, tally);
}

static int
api_ack(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask, uint64_t seq,
        uint64_t owner, Py_ssize_t arenas, Py_ssize_t arena_bytes, uint64_t *dropping,
        ShoalTally *tally)
{
    return ack_entry((AtomicObject *)atomic, q, ring, mask, seq, owner, arenas, arena_bytes,
                     dropping, tally);
}

static int
api_tally_begin(PyObject *atomic, uint64_t *q, Py_ssize_t slot, ShoalTally *tally)
{
    AtomicObject *self = (AtomicObject *)atomic;
    char *words = self->base + slot + P_TALLY;
    if (!self->has_view || slot < 0 || (slot & 7) ||
        slot + P_TALLY + (T_SUMS + SHOAL_TALLY_FIELDS) * 8 > self->len ||
        (char *)q < self->base || (char *)q + QUEUE_SIZE > self->base + self->len) {
        PyErr_SetString(PyExc_IndexError, "tally words or queue out of range");
        return -1;
    }
    tally->q = q;
    tally->words = (uint64_t *)words;
    tally->state = LOAD(q + Q_STATE / 8);
    for (int i = 0; i < SHOAL_TALLY_FIELDS; i++) {
        tally->d[i] = 0;
        __atomic_store_n(tally->words + T_SUMS + i, 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(tally->words + T_STATE, tally->state, __ATOMIC_RELAXED);
    STORE_RELEASE(tally->words + T_QUEUE, (uint64_t)((char *)q - self->base) + 1);
    return 0;
}

/* Each sum added, then its slot word cleared: a kill between the two has
 * recovery add that sum twice, but the window is one plain store, and a
 * kill at the addition (where a signal finds a process far more often, see
 * tally_add) leaves the word for recovery to add. The other order lost a
 * run's sum in 1 of 40 random kills. */
static void
api_tally_settle(ShoalTally *tally)
{
    uint64_t *q = tally->q;
    if (q == NULL)
        return;
    /* Deleted (and maybe declared again) since the run began: remove() and
     * create() stored the counters, the sums belong to nobody. */
    int same = LOAD(q + Q_STATE / 8) == tally->state;
    for (int i = 0; i < SHOAL_TALLY_FIELDS; i++) {
        if (!tally->d[i])
            continue;
        if (same)
            ADD(q + TALLY_OFFSETS[i] / 8, tally->d[i]);
        STORE_RELEASE(tally->words + T_SUMS + i, 0);
        tally->d[i] = 0;
    }
    STORE_RELEASE(tally->words + T_QUEUE, 0);
    tally->q = NULL;
}

static uint64_t *
api_word(PyObject *atomic, Py_ssize_t off)
{
    AtomicObject *self = (AtomicObject *)atomic;
    if (!self->has_view || off < 0 || off > self->len - 8 || (off & 7)) {
        PyErr_Format(PyExc_IndexError, "offset %zd out of range or unaligned", off);
        return NULL;
    }
    return (uint64_t *)(self->base + off);
}

static uint64_t
api_held_block(PyObject *atomic, char *ring, unsigned long long mask, uint64_t seq,
               uint64_t owner)
{
    AtomicObject *self = (AtomicObject *)atomic;
    uint64_t *cell = cell_of(ring, mask, seq);
    uint64_t w = LOAD(cell);
    if ((w >> SEQ_SHIFT) != seq || (w & ST_MASK) != ST_ACQUIRED || (w & OWNER_BITS) != owner)
        return 0;
    uint64_t block = LOAD(cell + 1);
    if ((block & 7) || block + 64 > (uint64_t)self->len || LOAD(cell) != w)
        return 0;
    return block;
}

static uint64_t
api_changes(uint64_t *q)
{
    return LOAD(q + Q_CHANGES / 8);
}

static ShoalQueuesAPI queues_api = {
    .version = SHOAL_QUEUES_API_VERSION,
    .is_atomic = api_is_atomic,
    .base = api_base,
    .readable = api_readable,
    .queue = api_queue,
    .arena_ok = api_arena_ok,
    .alloc = api_alloc,
    .publish = api_publish,
    .release_hold = api_release_hold,
    .acquire = api_acquire,
    .ack = api_ack,
    .tally_begin = api_tally_begin,
    .tally_settle = api_tally_settle,
    .take_watch = take_watch,
    .held_block = api_held_block,
    .changes = api_changes,
    .word = api_word,
};

/*
 * take_bits(offset, words) -> list[int]
 * A wake bitmap's set bits, each word swapped for 0 (shm/wake.py drain:
 * the same as its load-and-CAS loop), as indexes from the bitmap's start.
 */
static PyObject *
Atomic_take_bits(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take_bits(offset, words)");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[0]), words = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (!self->has_view || off < 0 || (off & 7) || words < 0 || words > (self->len - off) / 8) {
        PyErr_SetString(PyExc_IndexError, "bitmap out of range");
        return NULL;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL)
        return NULL;
    uint64_t *w = (uint64_t *)(self->base + off);
    for (Py_ssize_t i = 0; i < words; i++) {
        if (!LOAD(w + i))
            continue;
        uint64_t bits = __atomic_exchange_n(w + i, 0, __ATOMIC_SEQ_CST);
        while (bits) {
            int low = __builtin_ctzll(bits);
            PyObject *qid = PyLong_FromSsize_t(i * 64 + low);
            if (qid == NULL || PyList_Append(found, qid) < 0) {
                Py_XDECREF(qid);
                Py_DECREF(found);
                return NULL;
            }
            Py_DECREF(qid);
            bits &= bits - 1;
        }
    }
    return found;
}

#include "_scan.h"

static PyMethodDef Atomic_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))Atomic_alloc, METH_FASTCALL,
     "Allocate a held block in the owner's arena."},
    {"publish", (PyCFunction)(void (*)(void))Atomic_publish, METH_FASTCALL,
     "Publish a body reference to a queue with no rules."},
    {"publish_many", (PyCFunction)(void (*)(void))Atomic_publish_many, METH_FASTCALL,
     "publish() of one block into each of a list of queues, until one needs more."},
    {"append", (PyCFunction)(void (*)(void))Atomic_append, METH_FASTCALL,
     "Publish a body reference at a queue's tail."},
    {"acquire", (PyCFunction)(void (*)(void))Atomic_acquire, METH_FASTCALL,
     "Acquire the first AVAILABLE entry of a queue log."},
    {"ack", (PyCFunction)(void (*)(void))Atomic_ack, METH_FASTCALL,
     "Delete an entry this owner acquired."},
    {"ack_many", (PyCFunction)(void (*)(void))Atomic_ack_many, METH_FASTCALL,
     "Delete entries this owner acquired, in order."},
    {"drop_entries", (PyCFunction)(void (*)(void))Atomic_drop_entries, METH_FASTCALL,
     "Delete a range of a queue's log entries, their references dropped."},
    {"release_hold", (PyCFunction)(void (*)(void))Atomic_release_hold, METH_FASTCALL,
     "Drop the HOLD bit of a block the owner routed."},
    {"read_tag", (PyCFunction)(void (*)(void))Atomic_read_tag, METH_FASTCALL,
     "The tag of a persistent message, or None."},
    {"write_tag", (PyCFunction)(void (*)(void))Atomic_write_tag, METH_FASTCALL,
     "Tag a persistent message with its record's place."},
    {"write_record", (PyCFunction)(void (*)(void))Atomic_write_record, METH_FASTCALL,
     "Write a whole message record into a block."},
    {"write_body", (PyCFunction)(void (*)(void))Atomic_write_body, METH_FASTCALL,
     "Write part of a record's body into its block."},
    {"timed", (PyCFunction)Atomic_timed, METH_O,
     "Whether the record in a block carries times."},
    {"take_bits", (PyCFunction)(void (*)(void))Atomic_take_bits, METH_FASTCALL,
     "A wake bitmap's set bits, the words swapped for 0."},
    {"advance_head", (PyCFunction)(void (*)(void))Atomic_advance_head, METH_FASTCALL,
     "Move a queue's head past deleted cells."},
    {"dedup_hash", (PyCFunction)(void (*)(void))Atomic_dedup_hash, METH_FASTCALL,
     "A key's hash in a deduplication cache."},
    {"dedup_add", (PyCFunction)(void (*)(void))Atomic_dedup_add, METH_FASTCALL,
     "Check-and-add a key in a deduplication cache (shm/dedup_cache.py)."},
    {"counted_among", (PyCFunction)(void (*)(void))Atomic_counted_among, METH_FASTCALL,
     "The qids whose counter word is above 0 (shm/_scan.h)."},
    {"differ_among", (PyCFunction)(void (*)(void))Atomic_differ_among, METH_FASTCALL,
     "The qids whose word is not `value` (shm/_scan.h)."},
    {"span_among", (PyCFunction)(void (*)(void))Atomic_span_among, METH_FASTCALL,
     "(qid, low word) of the records whose two words are `least` apart (shm/_scan.h)."},
    {"load", (PyCFunction)(void (*)(void))Atomic_load, METH_FASTCALL, "Atomic 64-bit load."},
    {"store", (PyCFunction)(void (*)(void))Atomic_store, METH_FASTCALL, "Atomic 64-bit store."},
    {"cas", (PyCFunction)(void (*)(void))Atomic_cas, METH_FASTCALL,
     "Compare-and-swap; True if the word held `expected` and now holds `desired`."},
    {"fetch_add", (PyCFunction)(void (*)(void))Atomic_fetch_add, METH_FASTCALL,
     "Atomic add (mod 2**64); returns the old value."},
    {"fetch_or", (PyCFunction)(void (*)(void))Atomic_fetch_or, METH_FASTCALL,
     "Atomic or; returns the old value."},
    {"find_entry", (PyCFunction)(void (*)(void))Atomic_find_entry, METH_FASTCALL,
     "Scan a queue log for the first AVAILABLE entry."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AtomicType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shm._atomic.Atomic",
    .tp_basicsize = sizeof(AtomicObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Atomic(buffer): 64-bit seq_cst atomics on a writable, 8-byte aligned buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Atomic_init,
    .tp_dealloc = (destructor)Atomic_dealloc,
    .tp_methods = Atomic_methods,
};

static struct PyModuleDef atomicmodule = {PyModuleDef_HEAD_INIT, "_atomic",
                                          "64-bit atomics on shared buffers.", -1, NULL};

PyMODINIT_FUNC
PyInit__atomic(void)
{
    if (PyType_Ready(&AtomicType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&atomicmodule);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "Q_STATE", Q_STATE) < 0 ||
        PyModule_AddIntConstant(m, "Q_CHANGES", Q_CHANGES) < 0 ||
        PyModule_AddIntConstant(m, "Q_PUBLISHED", Q_PUBLISHED) < 0 ||
        PyModule_AddIntConstant(m, "P_INTENT_QUEUE", P_INTENT_QUEUE) < 0 ||
        PyModule_AddIntConstant(m, "P_INTENT_SEQ", P_INTENT_SEQ) < 0 ||
        PyModule_AddIntConstant(m, "P_DROPPING", P_DROPPING) < 0 ||
        PyModule_AddIntConstant(m, "P_TALLY", P_TALLY) < 0 ||
        PyModule_AddIntConstant(m, "Q_TAIL", Q_TAIL) < 0 ||
        PyModule_AddIntConstant(m, "Q_HEAD", Q_HEAD) < 0 ||
        PyModule_AddIntConstant(m, "Q_READY", Q_READY) < 0 ||
        PyModule_AddIntConstant(m, "Q_UNACKED", Q_UNACKED) < 0 ||
        PyModule_AddIntConstant(m, "Q_ACKED", Q_ACKED) < 0 ||
        PyModule_AddIntConstant(m, "Q_BYTES", Q_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "Q_READY_BYTES", Q_READY_BYTES) < 0 ||
        PyModule_AddIntConstant(m, "MSG_BODY_LEN", MSG_BODY_LEN) < 0 ||
        PyModule_AddIntConstant(m, "SEQ_SHIFT", SEQ_SHIFT) < 0 ||
        PyModule_AddIntConstant(m, "B_SIZE", B_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "B_REFS", B_REFS) < 0 ||
        PyModule_AddIntConstant(m, "A_USED", A_USED) < 0 ||
        PyModule_AddIntConstant(m, "A_LIVE", A_LIVE) < 0 ||
        PyModule_AddIntConstant(m, "ARENA_HEADER", ARENA_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "Q_WATCH", Q_WATCH) < 0 ||
        PyModule_AddIntConstant(m, "WATCHER_BITS", WATCHER_BITS) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_HEADER", BLOCK_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "MSG_PREFIX_SIZE", MSG_PREFIX_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TAGGED", MSG_TAGGED) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIMED", MSG_TIMED) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIME_SIZE", MSG_TIME_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TAG_SIZE", MSG_TAG_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "Q_CAPACITY", Q_CAPACITY) < 0 ||
        PyModule_AddIntConstant(m, "Q_OVERFLOW", Q_OVERFLOW) < 0 ||
        PyModule_AddIntConstant(m, "QUEUE_SIZE", QUEUE_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "DD_LOCK", DD_LOCK) < 0 ||
        PyModule_AddIntConstant(m, "DD_HEAD", DD_HEAD) < 0 ||
        PyModule_AddIntConstant(m, "DD_HITS", DD_HITS) < 0 ||
        PyModule_AddIntConstant(m, "DD_ADDED", DD_ADDED) < 0 ||
        PyModule_AddIntConstant(m, "DD_RECORD", DD_RECORD) < 0 ||
        PyModule_AddIntConstant(m, "DD_R_KEY", DD_R_KEY) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_MIN_SPLIT", BLOCK_MIN_SPLIT) < 0 ||
        PyModule_AddObject(m, "HOLD_BIT", PyLong_FromUnsignedLongLong(HOLD)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "_C_API",
                           PyCapsule_New(&queues_api, SHOAL_QUEUES_API_CAPSULE, NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&AtomicType);
    if (PyModule_AddObject(m, "Atomic", (PyObject *)&AtomicType) < 0) {
        Py_DECREF(&AtomicType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
