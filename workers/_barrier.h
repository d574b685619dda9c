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
 * Each worker's word of its SUBSCRIBEs' topics (P_SUBSCRIBE_TOPICS, the
 * word before its P_SUBSCRIBING) says which publishes they could match:
 * a read whose PUBLISHes' topics share no bit with it goes on (a device
 * whose topic no SUBSCRIBE under way can match is not held by it).
 *
 * Included by _wire.c (DeviceRead). */

/* Topic bits (shm/subscribe_barrier.py): a topic sets the bit of its first
 * level (0-15) and, with two levels or more, the bit of its first two
 * (16-63: more of them, as a fleet's topics differ in their second level),
 * by FNV-1a; a filter whose first two levels are plain sets the
 * second kind, one whose first level alone is plain the first kind, one
 * that starts with a wildcard every bit. So a filter that matches a topic
 * shares a bit with it (more bits than needed hold more than needed: a
 * hash's collision, never a miss). */
#define ALL_TOPICS (~0ULL)
#define LEVEL1_BIT(h) (1ULL << ((h) & 15))
#define LEVEL2_BIT(h) (1ULL << (16 + (h) % 48))

static uint64_t
fnv1a(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* The bits of topic name `t` (n bytes). */
static uint64_t
topic_name_bits(const unsigned char *t, Py_ssize_t n)
{
    const unsigned char *slash = memchr(t, '/', (size_t)n);
    if (slash == NULL)
        return LEVEL1_BIT(fnv1a(t, n));
    Py_ssize_t first = slash - t;
    const unsigned char *second = memchr(slash + 1, '/', (size_t)(n - first - 1));
    Py_ssize_t two = second == NULL ? n : second - t;
    return LEVEL1_BIT(fnv1a(t, first)) | LEVEL2_BIT(fnv1a(t, two));
}

/* The bits of topic filter `f` (n bytes, not a shared one's $share/group/). */
static uint64_t
topic_filter_bits(const unsigned char *f, Py_ssize_t n)
{
    const unsigned char *slash = memchr(f, '/', (size_t)n);
    Py_ssize_t first = slash == NULL ? n : slash - f;
    if (first == 1 && (f[0] == '+' || f[0] == '#'))
        return ALL_TOPICS;
    if (slash == NULL)
        return LEVEL1_BIT(fnv1a(f, n));
    const unsigned char *second = memchr(slash + 1, '/', (size_t)(n - first - 1));
    Py_ssize_t two = second == NULL ? n : second - f;
    Py_ssize_t level2 = two - first - 1;
    if (level2 == 1 && (f[first + 1] == '+' || f[first + 1] == '#'))
        return LEVEL1_BIT(fnv1a(f, first));
    return LEVEL2_BIT(fnv1a(f, two));
}

/* The bits of the PUBLISHes in a read that starts at a packet's start (0:
 * none; other packets hold nothing: only a publish can race a SUBSCRIBE):
 * every bit where a PUBLISH's topic is not in the read whole (or is empty:
 * 5.0's topic alias) or a packet's length is not. */
static uint64_t
read_topic_bits(const unsigned char *p, Py_ssize_t len)
{
    uint64_t bits = 0;
    Py_ssize_t at = 0;
    while (at < len) {
        Py_ssize_t size = 0, i = at + 1;
        int shift = 0;
        for (;;) {
            if (i >= len || i > at + 4)
                return ALL_TOPICS;
            unsigned char byte = p[i++];
            size |= (Py_ssize_t)(byte & 0x7F) << shift;
            if (!(byte & 0x80))
                break;
            shift += 7;
        }
        if ((p[at] >> 4) == 3) { /* PUBLISH */
            if (i + 2 > len || size < 2)
                return ALL_TOPICS;
            Py_ssize_t topic = (Py_ssize_t)p[i] << 8 | p[i + 1];
            if (topic == 0 || topic + 2 > size || i + 2 + topic > len)
                return ALL_TOPICS;
            bits |= topic_name_bits(p + i + 2, topic);
        }
        at = i + size;
    }
    return bits;
}

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
    /* (the last worker's word in the segment too: every one between is; and
     * the first one's topics word, the word before it) */
    if (first == NULL || queues_api->word(atomic, (Py_ssize_t)subscribing - 8) == NULL ||
        queues_api->word(atomic, (Py_ssize_t)(subscribing + (max_workers - 1) * stride)) == NULL)
        return -1;
    b->subscribing = (char *)first;
    b->stride = stride;
    b->max_workers = max_workers;
    b->barrier_ns = barrier_ns;
    return 0;
}

/* Whether a read at `now` (monotonic ns) waits for a SUBSCRIBE under way:
 * `data` (len bytes, from a packet's start) its bytes, or NULL: every
 * topic (a read that is not looked at). */
static int
barrier_holds(const BarrierWords *b, long long now, const unsigned char *data, Py_ssize_t len)
{
    uint64_t bits = 0;
    int looked = 0; /* (the read's bits: looked at once a word says so) */
    if (now - (long long)__atomic_load_n(b->at, __ATOMIC_SEQ_CST) >= b->barrier_ns)
        return 0;
    uint64_t workers = __atomic_load_n(b->workers, __ATOMIC_SEQ_CST);
    if (workers > b->max_workers)
        workers = b->max_workers;
    for (uint64_t i = 0; i < workers; i++) {
        const uint64_t *word = (const uint64_t *)(b->subscribing + (Py_ssize_t)i * b->stride);
        long long start = (long long)__atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (!(start && start <= now && now - start < b->barrier_ns))
            continue;
        if (!looked) {
            bits = data == NULL ? ALL_TOPICS : read_topic_bits(data, len);
            looked = 1;
        }
        /* (the topics' word is stored before the start: shm/subscribe_barrier.py) */
        if (__atomic_load_n(word - 1, __ATOMIC_SEQ_CST) & bits)
            return 1;
    }
    return 0;
}
