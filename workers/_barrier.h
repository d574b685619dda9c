/* MQTT's subscribe barrier as the C reads see it (shm/subscribe_barrier.py):
 * a PUBLISH read while another client's SUBSCRIBE is under way waits for
 * its bindings, so a C read stands aside then and data_received's barrier
 * holds the read. Like SubscribeBarrier.holds: the hint word first (one
 * load when nobody subscribed for BARRIER_NS), then each IO worker's word
 * of its oldest SUBSCRIBE under way. Looking at the hint alone stood aside
 * for BARRIER_NS after any SUBSCRIBE had begun, finished or not: a fleet
 * whose devices subscribe more often than that (reconnects) never took
 * the C reads.
 *
 * Included by _wire.c (DeviceRead, AckRead). */

typedef struct {
    uint64_t *at;      /* H_SUBSCRIBED_AT: when one last began */
    uint64_t *workers; /* H_WORKERS: the IO workers now */
    char *subscribing; /* IO worker 0's P_SUBSCRIBING, the next `stride` bytes on */
    Py_ssize_t stride;
    uint64_t max_workers;
    long long barrier_ns;
} BarrierWords;

/* From SubscribeBarrier.words: (subscribed_at_word, workers_word,
 * subscribing_word, stride, max_workers, barrier_ns), offsets into the
 * segment of `atomic`. 0, or -1 with an error set. */
static int
barrier_words(BarrierWords *b, PyObject *atomic, PyObject *words)
{
    unsigned long long at, workers, subscribing, max_workers;
    Py_ssize_t stride;
    long long barrier_ns;
    if (!PyArg_ParseTuple(words, "KKKnKL:barrier words", &at, &workers, &subscribing, &stride,
                          &max_workers, &barrier_ns))
        return -1;
    if (max_workers < 1 || stride < 8 || stride % 8) {
        PyErr_SetString(PyExc_ValueError, "barrier words: bad stride or worker count");
        return -1;
    }
    b->at = queues_api->word(atomic, (Py_ssize_t)at);
    b->workers = b->at == NULL ? NULL : queues_api->word(atomic, (Py_ssize_t)workers);
    uint64_t *first = b->workers == NULL ? NULL : queues_api->word(atomic, (Py_ssize_t)subscribing);
    /* (the last worker's word in the segment too: every one between is) */
    if (first == NULL ||
        queues_api->word(atomic, (Py_ssize_t)(subscribing + (max_workers - 1) * stride)) == NULL)
        return -1;
    b->subscribing = (char *)first;
    b->stride = stride;
    b->max_workers = max_workers;
    b->barrier_ns = barrier_ns;
    return 0;
}

/* Whether a read at `now` (monotonic ns) waits for a SUBSCRIBE under way. */
static int
barrier_holds(const BarrierWords *b, long long now)
{
    if (now - (long long)__atomic_load_n(b->at, __ATOMIC_SEQ_CST) >= b->barrier_ns)
        return 0;
    uint64_t workers = __atomic_load_n(b->workers, __ATOMIC_SEQ_CST);
    if (workers > b->max_workers)
        workers = b->max_workers;
    for (uint64_t i = 0; i < workers; i++) {
        const uint64_t *word = (const uint64_t *)(b->subscribing + (Py_ssize_t)i * b->stride);
        long long start = (long long)__atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (start && start <= now && now - start < b->barrier_ns)
            return 1;
    }
    return 0;
}
