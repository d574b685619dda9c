/*
 * The shared queues' C API (shm/_atomic.c), for the IO worker's per-read
 * loops in workers/_wire.c: the same transitions as the Atomic methods of
 * the same names (alloc, publish, release_hold, acquire, ack), without a
 * Python call per message. shm/ owns the steps and their order
 * (shm/ARCHITECTURE.md); a caller only strings them together.
 *
 * Exported as the capsule shoal.shm._atomic._C_API. `atomic` is a
 * shm._atomic.Atomic (exactly that type: check with `is_atomic` first);
 * every offset is checked by `queue` and `arena_ok` once per run, the
 * per-message calls take what those returned.
 */
#ifndef SHOAL_QUEUES_API_H
#define SHOAL_QUEUES_API_H

#include <Python.h>
#include <stdint.h>

#define SHOAL_QUEUES_API_CAPSULE "shoal.shm._atomic._C_API"
#define SHOAL_QUEUES_API_VERSION 2

/* publish() for a queue with a length limit or a capacity: nothing done. */
#define SHOAL_WATCHER_BITS 12
#define SHOAL_PUBLISH_RULES LLONG_MIN

/*
 * A run's counter changes for one queue (shm/ARCHITECTURE.md 2b): a
 * consumer's run of acquires and acks, or a publish lane's run of appends,
 * adds its counters to the queue record once, at its end (tally_settle),
 * instead of three to five contended atomic additions per entry. Meanwhile
 * the sums are mirrored in the running process's slot (P_TALLY) so that
 * the supervisor's recovery adds them for a worker killed mid-run.
 */
#define SHOAL_TALLY_FIELDS 7
/* A process slot's words (shm/layout.py P_DROPPING, P_TALLY). */
#define SHOAL_P_DROPPING 104
#define SHOAL_P_TALLY 920
typedef struct {
    uint64_t *q;     /* the queue record; NULL: no run */
    uint64_t *words; /* the process slot's P_TALLY words */
    uint64_t state;  /* the queue's Q_STATE when the run began */
    /* CHANGES, READY, UNACKED, READY_BYTES, BYTES, ACKED, PUBLISHED (mod
     * 2^64), added in this order: CHANGES before READY (ARCHITECTURE 7). */
    uint64_t d[SHOAL_TALLY_FIELDS];
} ShoalTally;

typedef struct {
    unsigned version;
    /* 1 if `obj` is an Atomic with a buffer (a subclass, the crash tests'
     * interposer, is not: its steps must stay in Python). */
    int (*is_atomic)(PyObject *obj);
    /* The buffer's base address and length. */
    char *(*base)(PyObject *atomic, Py_ssize_t *len);
    /* A queue record and its log checked: 0, or -1 with an exception set. */
    int (*queue)(PyObject *atomic, Py_ssize_t queue, Py_ssize_t ring, unsigned long long mask,
                 uint64_t **q, char **ring_out);
    /* An arena's bounds and a cursor checked (as Atomic.alloc): 1 or 0. */
    int (*arena_ok)(PyObject *atomic, Py_ssize_t base, Py_ssize_t end, Py_ssize_t cursor);
    /* Atomic.alloc: 1 with the held block, the next cursor and the arena's
     * used bytes, or 0 (no room; the cursor unchanged). */
    int (*alloc)(PyObject *atomic, Py_ssize_t base, Py_ssize_t end, Py_ssize_t *cursor,
                 Py_ssize_t need, Py_ssize_t *block, uint64_t *used);
    /* Atomic.publish: SHOAL_PUBLISH_RULES, -1, -2 - seq, or
     * seq << SHOAL_WATCHER_BITS | the watcher it took (0: none). In a run
     * of queue `q` (`tally`), its counters go to the tally and the watch
     * is left to tally_settle (the watcher part is 0). */
    long long (*publish)(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask,
                         uint64_t block, Py_ssize_t intent, uint64_t qid, ShoalTally *tally);
    /* Atomic.release_hold: 1 if that freed the block. */
    int (*release_hold)(PyObject *atomic, Py_ssize_t block, Py_ssize_t arenas,
                        Py_ssize_t arena_bytes);
    /* Atomic.acquire: 1 with (seq, block, redelivered), or 0 with the
     * pointer to resume from in *seq. Its counters go to `tally` if it is
     * a run of queue `q` (else at once). */
    int (*acquire)(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask,
                   uint64_t start, uint64_t owner, uint64_t *seq, uint64_t *block,
                   int *redelivered, ShoalTally *tally);
    /* Atomic.ack for one entry: 1, 0 (not this owner's), or -1 with an
     * exception set. Its counters as acquire's. */
    int (*ack)(PyObject *atomic, uint64_t *q, char *ring, unsigned long long mask, uint64_t seq,
               uint64_t owner, Py_ssize_t arenas, Py_ssize_t arena_bytes, uint64_t *dropping,
               ShoalTally *tally);
    /* A run of queue `q` begins: `tally` set up, its words in the process
     * slot at offset `slot`. 0, or -1 with an exception set. Every begin
     * needs its settle, on every path. */
    int (*tally_begin)(PyObject *atomic, uint64_t *q, Py_ssize_t slot, ShoalTally *tally);
    /* The run's sums added to its queue (unless the queue was deleted
     * since it began) and its slot words cleared; nothing for a run never
     * begun or already settled. */
    void (*tally_settle)(ShoalTally *tally);
    /* A queue's watch taken as publish() takes it, for appends whose
     * counters are in (settled): the watcher to wake, or 0. */
    uint64_t (*take_watch)(uint64_t *q);
    /* The block of entry `seq` while this owner holds it (ACQUIRED), else
     * 0. */
    uint64_t (*held_block)(PyObject *atomic, char *ring, unsigned long long mask, uint64_t seq,
                           uint64_t owner);
    /* The queue's state-change counter (Q_CHANGES), as the scheduler
     * compares it: read before the scan that finds the queue empty. */
    uint64_t (*changes)(uint64_t *q);
    /* A word of the buffer (bounds and alignment checked), or NULL with an
     * exception set. */
    uint64_t *(*word)(PyObject *atomic, Py_ssize_t off);
    /* The buffer of any Atomic, a subclass too (reading a message record
     * is no transition a crash test interposes on), or NULL with a
     * TypeError set. */
    const char *(*readable)(PyObject *obj, Py_ssize_t *len);
} ShoalQueuesAPI;

#endif
