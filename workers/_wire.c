/* The message path's per-message work in C (workers/framing.py says why
 * the hot path is hand-written; Python's per-frame costs were most of an IO
 * worker's time):
 *
 * - properties_ok: a publish's content header checked (below);
 * - scan: a read's bytes split into frames, a publish's three frames
 *   recognised and decoded as one item;
 * - deliver_frames: a queue entry's Basic.Deliver, content header and body
 *   frames built in one bytes object straight from the message record in
 *   shared memory;
 *
 * A publish's content header checked before the broker takes the message:
 * the basic properties its flags announce, each of the right size, a
 * headers table (and the tables and arrays inside it) of known field types
 * whose lengths add up, and nothing after the last property. RabbitMQ 3.10
 * decodes every publish's properties and closes the connection (541
 * INTERNAL_ERROR) when they do not parse; Shoal keeps a message's header as
 * bytes, so this walk is what stops a malformed one from reaching a
 * consumer whose client would fail on it. C: it runs for every publish
 * (about 0.1 us, where the same walk in Python costs microseconds).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../shm/_record.h" /* the message record's format: one definition */
#include "../shm/_queues_api.h"
#include "_mqtt_publish.h" /* an MQTT device's plain PUBLISH (Lane.mqtt_run) */

static ShoalQueuesAPI *queues_api; /* shm/_atomic.c's C API, at import */

#define MAX_DEPTH 256 /* tables in tables: deeper is refused, not recursed */

static uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int table_ok(const unsigned char *p, Py_ssize_t n, int depth);
static int array_ok(const unsigned char *p, Py_ssize_t n, int depth);

/* The typed value at *at (its type letter first): 1 and *at past it, or 0.
 * The types and sizes of broker/amqp/field_table.py (RabbitMQ's, as in the
 * 0-9-1 errata). */
static int
value_ok(const unsigned char *p, Py_ssize_t n, Py_ssize_t *at, int depth)
{
    Py_ssize_t i = *at, size;
    if (i >= n)
        return 0;
    switch (p[i++]) {
    case 'V':
        size = 0;
        break;
    case 't': case 'b': case 'B':
        size = 1;
        break;
    case 's': case 'u': case 'U':
        size = 2;
        break;
    case 'I': case 'i': case 'f':
        size = 4;
        break;
    case 'D':
        size = 5;
        break;
    case 'l': case 'L': case 'd': case 'T':
        size = 8;
        break;
    case 'S': case 'x': case 'A': case 'F': {
        unsigned char kind = p[i - 1];
        if (n - i < 4)
            return 0;
        uint32_t len = be32(p + i);
        i += 4;
        if ((size_t)len > (size_t)(n - i)) /* unsigned: no wrap on 32-bit builds */
            return 0;
        if (kind == 'F' && !table_ok(p + i, (Py_ssize_t)len, depth + 1))
            return 0;
        if (kind == 'A' && !array_ok(p + i, (Py_ssize_t)len, depth + 1))
            return 0;
        *at = i + len;
        return 1;
    }
    default:
        return 0;
    }
    if (size > n - i)
        return 0;
    *at = i + size;
    return 1;
}

/* A table's entries (`named`: each a short-string name, then a value) or
 * an array's values, filling exactly n bytes. */
static int
items_ok(const unsigned char *p, Py_ssize_t n, int depth, int named)
{
    Py_ssize_t at = 0;
    if (depth > MAX_DEPTH)
        return 0;
    while (at < n) {
        if (named)
            at += 1 + p[at];
        if (!value_ok(p, n, &at, depth))
            return 0;
    }
    return 1;
}

static int
table_ok(const unsigned char *p, Py_ssize_t n, int depth)
{
    return items_ok(p, n, depth, 1);
}

static int
array_ok(const unsigned char *p, Py_ssize_t n, int depth)
{
    return items_ok(p, n, depth, 0);
}

/* Basic's properties in flag order: 's' short string, 't' table, 'o'
 * octet, 'T' timestamp. */
static const struct {
    uint16_t flag;
    char kind;
} PROPERTIES[] = {
    {0x8000, 's'}, {0x4000, 's'}, {0x2000, 't'}, {0x1000, 'o'}, {0x0800, 'o'},
    {0x0400, 's'}, {0x0200, 's'}, {0x0100, 's'}, {0x0080, 's'}, {0x0040, 'T'},
    {0x0020, 's'}, {0x0010, 's'}, {0x0008, 's'}, {0x0004, 's'},
};

static int
header_ok(const unsigned char *p, Py_ssize_t n)
{
    if (n < 14)
        return 0;
    unsigned flags = (unsigned)p[12] << 8 | p[13];
    Py_ssize_t at = 14;
    for (size_t k = 0; k < sizeof PROPERTIES / sizeof PROPERTIES[0]; k++) {
        if (!(flags & PROPERTIES[k].flag))
            continue;
        switch (PROPERTIES[k].kind) {
        case 's':
            if (at >= n)
                return 0;
            at += 1 + p[at];
            break;
        case 'o':
            at += 1;
            break;
        case 'T':
            at += 8;
            break;
        case 't': {
            if (n - at < 4)
                return 0;
            uint32_t len = be32(p + at);
            at += 4;
            if ((size_t)len > (size_t)(n - at) || !table_ok(p + at, (Py_ssize_t)len, 0))
                return 0;
            at += len;
            break;
        }
        }
        if (at > n)
            return 0;
    }
    return at == n; /* RabbitMQ refuses bytes after the last property too */
}

static PyObject *
properties_ok(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int ok = header_ok(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ------------------------------------------------------------ frames in */

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_HEARTBEAT 8
#define FRAME_END 0xCE
#define USER_ID_BIT 0x10 /* basic.properties user-id: the header's second flag byte */

static uint64_t
be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

/* A frame at `off`: 1 and its type, channel and payload size when it is
 * complete and well formed, 0 when incomplete, -1 when the Python splitter
 * must look at it (too large, a bad end byte, an unknown type: it raises
 * the error with RabbitMQ's text). */
static int
frame_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t off, Py_ssize_t frame_max,
         int *type, int *channel, Py_ssize_t *size)
{
    if (n - off < 7)
        return 0;
    *type = p[off];
    *channel = p[off + 1] << 8 | p[off + 2];
    uint32_t len = be32(p + off + 3);
    if ((Py_ssize_t)len > frame_max)
        return -1;
    if (n - off - 7 <= (Py_ssize_t)len)
        return 0; /* the end byte is not in yet */
    if (p[off + 7 + len] != FRAME_END)
        return -1;
    if (*type != FRAME_METHOD && *type != FRAME_HEADER && *type != FRAME_BODY &&
        *type != FRAME_HEARTBEAT)
        return -1;
    *size = (Py_ssize_t)len;
    return 1;
}

/* A bytes object for p[0:len], the one of the previous publish when equal:
 * a stream of publishes to one exchange and key shares two objects (and
 * their cached hashes, which the route cache's lookups reuse). */
static PyObject *
reuse_bytes(const unsigned char *p, Py_ssize_t len, PyObject **last)
{
    if (*last != NULL && PyBytes_GET_SIZE(*last) == len &&
        memcmp(PyBytes_AS_STRING(*last), p, len) == 0) {
        Py_INCREF(*last);
        return *last;
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, len);
    if (b == NULL)
        return NULL;
    Py_XDECREF(*last);
    Py_INCREF(b);
    *last = b;
    return b;
}

/* ------------------------------------------------ message records in shared memory */

/* A message record: shm/_record.h. */

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void
put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void
put_be(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * (bytes - 1 - i)));
}

/* The bytes of a delivery of the message record at `r` (`room` bytes may
 * follow its prefix): its Basic.Deliver, content header and body frames,
 * with a consumer tag of ctag_len bytes (its length byte included); -1 when
 * the record's lengths do not fit in `room`. */
static Py_ssize_t
delivery_size(const unsigned char *r, Py_ssize_t room, Py_ssize_t ctag_len, Py_ssize_t frame_max,
              uint64_t *body_len_out)
{
    Py_ssize_t ex_len = r[0], rk_len = r[1];
    Py_ssize_t props_len = le32(r + 4);
    uint64_t body_len = le64(r + 8);
    if (room < 0 || (uint64_t)ex_len + rk_len + props_len + body_len > (uint64_t)room)
        return -1;
    Py_ssize_t method_len = 4 + ctag_len + 8 + 1 + 1 + ex_len + 1 + rk_len;
    Py_ssize_t step = frame_max - 8;
    Py_ssize_t body_frames = (Py_ssize_t)((body_len + step - 1) / step);
    *body_len_out = body_len;
    return 8 + method_len + 8 + props_len + body_frames * 8 + (Py_ssize_t)body_len;
}

/* Write what delivery_size() measured at `o`; returns the end. */
static unsigned char *
write_delivery(unsigned char *o, const unsigned char *r, long channel, const char *ctag,
               Py_ssize_t ctag_len, unsigned long long tag, int redelivered, Py_ssize_t frame_max)
{
    Py_ssize_t ex_len = r[0], rk_len = r[1];
    Py_ssize_t props_len = le32(r + 4);
    uint64_t body_len = le64(r + 8);
    const unsigned char *ex = r + MSG_PREFIX_SIZE, *rk = ex + ex_len, *props = rk + rk_len;
    const unsigned char *body = props + props_len;
    Py_ssize_t method_len = 4 + ctag_len + 8 + 1 + 1 + ex_len + 1 + rk_len;
    Py_ssize_t step = frame_max - 8;
    o[0] = FRAME_METHOD;
    put_be(o + 1, (uint64_t)channel, 2);
    put_be(o + 3, (uint64_t)method_len, 4);
    o += 7;
    put_be(o, 0x003C003C, 4); /* basic.deliver */
    o += 4;
    memcpy(o, ctag, ctag_len);
    o += ctag_len;
    put_be(o, tag, 8);
    o += 8;
    *o++ = redelivered ? 1 : 0;
    *o++ = (unsigned char)ex_len;
    memcpy(o, ex, ex_len);
    o += ex_len;
    *o++ = (unsigned char)rk_len;
    memcpy(o, rk, rk_len);
    o += rk_len;
    *o++ = FRAME_END;
    o[0] = FRAME_HEADER;
    put_be(o + 1, (uint64_t)channel, 2);
    put_be(o + 3, (uint64_t)props_len, 4);
    o += 7;
    memcpy(o, props, props_len);
    o += props_len;
    *o++ = FRAME_END;
    for (uint64_t at = 0; at < body_len; at += step) {
        Py_ssize_t chunk = body_len - at < (uint64_t)step ? (Py_ssize_t)(body_len - at) : step;
        o[0] = FRAME_BODY;
        put_be(o + 1, (uint64_t)channel, 2);
        put_be(o + 3, (uint64_t)chunk, 4);
        o += 7;
        memcpy(o, body + at, chunk);
        o += chunk;
        *o++ = FRAME_END;
    }
    return o;
}

/*
 * deliver_frames(atomic, block, channel, consumer_tag, delivery_tag,
 *                redelivered, frame_max) -> (frames, body length)
 *
 * The Basic.Deliver method frame, the content header frame (the properties
 * as the publisher sent them) and the body in frames of at most frame_max
 * bytes, as one bytes object, from the message record in `block` of the
 * segment `atomic` (shm/_atomic.c's Atomic) maps (the caller holds the
 * entry: the record cannot change under us).
 * consumer_tag is a short string with its length byte.
 */
static PyObject *
deliver_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames(atomic, block, channel, consumer_tag, "
                                         "delivery_tag, redelivered, frame_max)");
        return NULL;
    }
    Py_ssize_t block = PyLong_AsSsize_t(args[1]);
    long channel = PyLong_AsLong(args[2]);
    unsigned long long tag = PyLong_AsUnsignedLongLong(args[4]);
    int redelivered = PyObject_IsTrue(args[5]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred() || redelivered < 0)
        return NULL;
    if (frame_max < 9 || channel < 0 || channel > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "bad frame_max or channel");
        return NULL;
    }
    char *ctag;
    Py_ssize_t ctag_len;
    if (PyBytes_AsStringAndSize(args[3], &ctag, &ctag_len) < 0)
        return NULL;
    if (ctag_len < 1 || ctag_len != 1 + (unsigned char)ctag[0]) {
        PyErr_SetString(PyExc_ValueError, "consumer_tag is not a short string");
        return NULL;
    }
    Py_ssize_t len;
    const unsigned char *base = (const unsigned char *)queues_api->readable(args[0], &len);
    if (base == NULL)
        return NULL;
    Py_ssize_t record = block + BLOCK_HEADER;
    if (block < 0 || record > len - MSG_PREFIX_SIZE) {
        PyErr_SetString(PyExc_IndexError, "record out of range");
        return NULL;
    }
    Py_ssize_t room = len - record - MSG_PREFIX_SIZE;
    uint64_t body_len;
    Py_ssize_t total = delivery_size(base + record, room, ctag_len, frame_max, &body_len);
    if (total < 0) {
        PyErr_SetString(PyExc_IndexError, "record lengths out of range");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    write_delivery((unsigned char *)PyBytes_AS_STRING(out), base + record, channel, ctag, ctag_len,
                   tag, redelivered, frame_max);
    PyObject *result = Py_BuildValue("(NK)", out, (unsigned long long)body_len);
    return result;
}



/* Message deduplication (workers/dedup_filter.py): the key of a content header
 * whose properties are well formed (properties_ok). b"s" + the bytes of its
 * x-deduplication-header when that is a long string and no x-cache-ttl
 * header is there (broker/amqp/dedup_arguments.py message_key gives the same key);
 * None when it has no x-deduplication-header; False when the Python parse
 * must decide (another type, a per-message TTL, anything odd). */
static PyObject *
dedup_key(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len, at = 14;
    PyObject *result = Py_None;
    Py_ssize_t key_at = -1;
    uint32_t key_len = 0;
    unsigned flags = n >= 14 ? ((unsigned)p[12] << 8 | p[13]) : 0;
    if (!(flags & 0x2000))
        goto done; /* no headers: no key */
    for (unsigned bit = 0x8000; bit >= 0x4000; bit >>= 1) { /* content type, encoding */
        if (flags & bit) {
            if (at >= n)
                goto slow;
            at += 1 + p[at];
        }
    }
    if (n - at < 4)
        goto slow;
    uint32_t len = be32(p + at);
    at += 4;
    if ((size_t)len > (size_t)(n - at))
        goto slow;
    Py_ssize_t end = at + (Py_ssize_t)len;
    while (at < end) {
        Py_ssize_t name_len = p[at];
        const unsigned char *name = p + at + 1;
        at += 1 + name_len;
        if (at >= end)
            goto slow;
        if (name_len == 11 && memcmp(name, "x-cache-ttl", 11) == 0)
            goto slow;
        if (name_len == 22 && memcmp(name, "x-deduplication-header", 22) == 0) {
            if (p[at] != 'S' || end - at < 5)
                goto slow;
            key_len = be32(p + at + 1);
            key_at = at + 5;
        }
        if (!value_ok(p, end, &at, 0))
            goto slow;
    }
    if (key_at >= 0) {
        result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)key_len + 1);
        if (result != NULL) {
            char *out = PyBytes_AS_STRING(result);
            out[0] = 's';
            memcpy(out + 1, p + key_at, key_len);
        }
        PyBuffer_Release(&view);
        return result;
    }
    goto done;
slow:
    result = Py_False;
done:
    PyBuffer_Release(&view);
    Py_INCREF(result);
    return result;
}

/* ------------------------------------------------------ the publish lane
 *
 * A connection's publishes that need nothing but routing go into their queues
 * without a Python call per message. Python teaches the lane a route after
 * its own fast path has put one such message into its queue
 * (workers/lane.py says when that is, and what each read checks before it
 * arms the lane); from then on scan() itself takes each later whole publish
 * on the lane's channel to an exchange and routing key it knows: the block
 * allocated in the worker's arena, the record written, the entry appended
 * (shm/_atomic.c through its C API, shm/_queues_api.h), the HOLD dropped,
 * the message counted; a persistent message for a durable queue also tagged,
 * counted in the message store's open file and its PUBLISH record framed
 * (store_window, lane_take). Anything else on that channel (another frame, a
 * publish to a place it does not know or that needs more: an expiration, a
 * reply-to, CC/BCC, a queue with rules, no room, a persistent message with
 * no store window) is left to Python as an item, and the lane is off for the rest of
 * that read so that the channel's frames keep their order. A method on
 * channel 0 turns it off too (a connection.close must stop it).
 *
 * Routes: (exchange, routing key) -> one queue, in a small open-addressing
 * table (LANE_ROUTES at most: a publisher that rotates over many queues,
 * as 500 quiet connections over 250 queues do, keeps them all).
 */

#define BLOCK_ALIGN 16
#define SIZE_BUCKET_COUNT 9
#define EXPIRATION_BIT 0x01 /* the header's first flag byte: 0x0100 */
#define REPLY_TO_BIT 0x02   /* 0x0200 */
#define DELIVERY_MODE_BIT 0x10 /* 0x1000 */
#define HEADERS_BIT 0x20       /* 0x2000 */
#define LANE_ROUTES 1024       /* the most routes a lane keeps */
#define LANE_TOUCHED 64        /* queues one run may append to */
#define LANE_TOUCHED_INLINE 4  /* of them, held in the lane itself (a device's run: one) */

/* Bodies' size buckets (shm/stats.py SIZE_BOUNDS): the first bound a body
 * does not exceed; the last bucket is above all. */
static const uint64_t SIZE_BOUNDS[SIZE_BUCKET_COUNT - 1] = {
    100, 1000, 10000, 100000, 1000000, 10000000, 50000000, 100000000,
};

typedef struct {
    PyObject *exchange, *routing_key; /* bytes; NULL: a free slot */
    uint64_t hash;
    uint64_t *q;
    char *ring;
    unsigned long long mask;
    uint64_t qid;
    /* The queue's uid when the message store keeps its persistent
     * messages (a durable queue, a store): they go in with their PUBLISH
     * record while a store window is open, else they leave the lane. */
    uint64_t store_uid;
    int touched; /* its index in the run's touched list + 1 (0: none) */
} LaneRoute;

typedef struct {
    uint64_t qid;
    uint64_t *q; /* its queue record */
    LaneRoute *route; /* whose touched mark take() clears: routes move only between runs */
    PyObject *exchange; /* its route's exchange, a reference of its own (the route may go) */
    long long n;
    int watcher;   /* the Q_WATCH value a scan's end took (0: none) */
    int unwatched; /* appended to since a scan's end last took its watch */
} LaneTouch;

/* A lane's signature and a change wave's touches, word by word
 * (workers/route_touch.py SIGNATURE): a bloom of exchanges, then three sets
 * of at most SET_MAX exact values, each its count first (SET_ALL: more,
 * meets any set that is not empty). */
enum {
    SIG_EXCHANGES,
    SIG_KEYS,                        /* count, then an (exchange, key)'s 64-bit hash each */
    SIG_QUEUES = SIG_KEYS + 5,       /* count, then qid + 1 each */
    SIG_NAMES = SIG_QUEUES + 5,      /* count, then a queue name's 64-bit hash each */
    SIG_WORDS = SIG_NAMES + 5,
    SET_MAX = 4,
    SET_ALL = 255,
};

typedef struct {
    PyObject_HEAD
    PyObject *atomic;
    int configured, armed;
    int channel;
    LaneRoute *routes;
    Py_ssize_t nroutes, cap; /* cap: a power of two, or 0 */
    Py_ssize_t intent;
    uint64_t max_body;
    Py_ssize_t arena_base, arena_end, arena_first, hot_end, arenas, arena_bytes;
    uint64_t hot_live;
    /* set by arm() for each read */
    Py_ssize_t cursor;
    uint64_t used, high, page_out_high;
    /* what it did since take() */
    long long n;
    unsigned long long body_bytes;
    long long buckets[SIZE_BUCKET_COUNT];
    /* The run's queues: touched_inline until a run appends to more, then
     * an array of LANE_TOUCHED kept for the lane's life (an idle MQTT
     * connection's lane was 3 KiB of this list, a tenth of the connection). */
    LaneTouch *touched;
    LaneTouch touched_inline[LANE_TOUCHED_INLINE];
    int touched_cap;
    int ntouched, allocated;
    long long gone_seq;
    Py_ssize_t gone_block;
    uint64_t gone_qid;
    int gone_stored; /* the gone entry's message has a PUBLISH record in `records` */
    /* The message store's window, set by store_window() for each read: the
     * open message file (its slot, check and live-entry word) and where its
     * next record goes; its PUBLISH records are framed into `records`. */
    int store_on;
    uint64_t st_slot, st_check, st_epoch, st_reserved, st_limit, st_header;
    uint64_t *st_live;
    unsigned char *records;
    Py_ssize_t records_len, records_cap;
    long long st_count; /* records in `records` */
    long long st_first; /* the run's first stored message, 1-based in n (0: none) */
    /* The counters of the appends to the queue the last publish went to,
     * added to it when the next goes elsewhere or the scan ends
     * (lane_end_run; shm/ARCHITECTURE.md 2b). */
    ShoalTally tally;
    /* What its places depend on, as Python last checked them all (sign()),
     * in SIG_WORDS words (workers/route_touch.py): a bloom of their
     * exchanges, and their (exchange, key)s, queues and routes' queue names
     * as small exact sets. A device's read after a change of the
     * definitions or the queues goes on in C where the change touched none
     * of them (_lane_device.h, the waves). sig_ok: set by sign(), dropped by
     * whatever changes a place. */
    uint64_t sig[SIG_WORDS];
    int sig_ok;
} LaneObject;

static uint64_t
route_hash(const unsigned char *ex, Py_ssize_t ex_len, const unsigned char *rk, Py_ssize_t rk_len)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)ex_len;
    for (Py_ssize_t i = 0; i < ex_len; i++)
        h = (h ^ ex[i]) * 1099511628211ULL;
    h = (h ^ 0xFF) * 1099511628211ULL;
    for (Py_ssize_t i = 0; i < rk_len; i++)
        h = (h ^ rk[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static int
route_is(const LaneRoute *r, uint64_t hash, const unsigned char *ex, Py_ssize_t ex_len,
         const unsigned char *rk, Py_ssize_t rk_len)
{
    return r->hash == hash && PyBytes_GET_SIZE(r->exchange) == ex_len &&
           PyBytes_GET_SIZE(r->routing_key) == rk_len &&
           memcmp(PyBytes_AS_STRING(r->exchange), ex, ex_len) == 0 &&
           memcmp(PyBytes_AS_STRING(r->routing_key), rk, rk_len) == 0;
}

/* The route of (exchange, routing key), or the free slot where it goes. */
static LaneRoute *
route_slot(LaneObject *lane, uint64_t hash, const unsigned char *ex, Py_ssize_t ex_len,
           const unsigned char *rk, Py_ssize_t rk_len)
{
    Py_ssize_t mask = lane->cap - 1;
    for (Py_ssize_t i = (Py_ssize_t)hash & mask;; i = (i + 1) & mask) {
        LaneRoute *r = &lane->routes[i];
        if (r->exchange == NULL || route_is(r, hash, ex, ex_len, rk, rk_len))
            return r;
    }
}

/* The run's list of queues moved from the lane's inline few to an array
 * of LANE_TOUCHED: 0, or -1 (no error set) where it is that already or
 * the memory is not there (the run then stops as at a full list). */
static int
lane_touched_grow(LaneObject *lane)
{
    if (lane->touched_cap >= LANE_TOUCHED || lane->touched != lane->touched_inline)
        return -1;
    LaneTouch *touched = PyMem_Malloc(LANE_TOUCHED * sizeof(LaneTouch));
    if (touched == NULL)
        return -1;
    memcpy(touched, lane->touched_inline, sizeof lane->touched_inline);
    lane->touched = touched;
    lane->touched_cap = LANE_TOUCHED;
    return 0;
}

/* The touches' own references, dropped (take() has reported them). */
static void
lane_untouch(LaneObject *lane)
{
    for (int i = 0; i < lane->ntouched; i++)
        Py_CLEAR(lane->touched[i].exchange);
}

/* A scan's appends are over: the last queue's counters added (the others'
 * were as the publishes moved on), then each queue appended to has its
 * watch taken, after its counters (the publisher's side of the
 * no-lost-wake-up handshake, shm/ARCHITECTURE.md 7); take() reports the
 * watchers to wake. */
static void
lane_end_run(LaneObject *lane)
{
    queues_api->tally_settle(&lane->tally);
    for (int i = 0; i < lane->ntouched; i++) {
        LaneTouch *t = &lane->touched[i];
        if (!t->unwatched)
            continue;
        t->unwatched = 0;
        uint64_t watcher = queues_api->take_watch(t->q);
        if (watcher)
            t->watcher = (int)watcher;
    }
}

static void
lane_forget(LaneObject *lane)
{
    for (Py_ssize_t i = 0; i < lane->cap; i++) {
        Py_CLEAR(lane->routes[i].exchange);
        Py_CLEAR(lane->routes[i].routing_key);
    }
    PyMem_Free(lane->routes);
    lane->routes = NULL;
    for (int i = 0; i < lane->ntouched; i++) /* take() still reports their counts */
        lane->touched[i].route = NULL;
    lane->nroutes = lane->cap = 0;
    lane->sig_ok = 0;
}

static int
Lane_init(LaneObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *atomic;
    if (!PyArg_ParseTuple(args, "O", &atomic))
        return -1;
    if (!queues_api->is_atomic(atomic)) {
        PyErr_SetString(PyExc_TypeError, "Lane(atomic): a shm._atomic.Atomic with a buffer");
        return -1;
    }
    Py_XSETREF(self->atomic, Py_NewRef(atomic));
    lane_forget(self);
    if (self->touched == NULL) {
        self->touched = self->touched_inline;
        self->touched_cap = LANE_TOUCHED_INLINE;
    }
    self->configured = self->armed = 0;
    self->gone_seq = -1;
    return 0;
}

static void
Lane_dealloc(LaneObject *self)
{
    lane_untouch(self);
    lane_forget(self);
    if (self->touched != self->touched_inline)
        PyMem_Free(self->touched);
    PyMem_Free(self->records);
    Py_XDECREF(self->atomic);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* configure(channel, intent, max_body, arena_base, arena_end, hot_end,
 *           hot_live, arenas, arena_bytes): the lane's channel and what its
 * appends need; its routes are forgotten. */
static PyObject *
Lane_configure(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(channel, intent, max_body, arena_base, arena_end, hot_end, "
                        "hot_live, arenas, arena_bytes)");
        return NULL;
    }
    self->configured = self->armed = 0;
    lane_forget(self);
    long channel = PyLong_AsLong(args[0]);
    Py_ssize_t intent = PyLong_AsSsize_t(args[1]);
    unsigned long long max_body = PyLong_AsUnsignedLongLong(args[2]);
    Py_ssize_t abase = PyLong_AsSsize_t(args[3]), aend = PyLong_AsSsize_t(args[4]);
    Py_ssize_t hot_end = PyLong_AsSsize_t(args[5]);
    unsigned long long hot_live = PyLong_AsUnsignedLongLong(args[6]);
    Py_ssize_t arenas = PyLong_AsSsize_t(args[7]), arena_bytes = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t len;
    queues_api->base(self->atomic, &len);
    if (channel < 1 || channel > 0xFFFF || arena_bytes <= 0 || arenas < 0 || (arenas & 7) ||
        (arena_bytes & 7) || abase < arenas || aend > len || intent < 0 || (intent & 7) ||
        intent + 64 > len || !queues_api->arena_ok(self->atomic, abase, aend, abase + 64)) {
        PyErr_SetString(PyExc_ValueError, "lane out of range");
        return NULL;
    }
    self->channel = (int)channel;
    self->intent = intent;
    self->max_body = max_body;
    self->arena_base = abase;
    self->arena_end = aend;
    self->arena_first = abase + 64; /* ARENA_HEADER, checked by arena_ok */
    self->hot_end = hot_end;
    self->hot_live = hot_live;
    self->arenas = arenas;
    self->arena_bytes = arena_bytes;
    self->configured = 1;
    Py_RETURN_NONE;
}

static int
lane_grow(LaneObject *lane)
{
    Py_ssize_t old_cap = lane->cap, cap = old_cap ? old_cap * 2 : 16;
    LaneRoute *old = lane->routes, *routes = PyMem_Calloc(cap, sizeof(LaneRoute));
    if (routes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    lane->routes = routes;
    lane->cap = cap;
    for (Py_ssize_t i = 0; i < old_cap; i++) {
        if (old[i].exchange == NULL)
            continue;
        LaneRoute *r = &routes[(Py_ssize_t)old[i].hash & (cap - 1)];
        while (r->exchange != NULL)
            r = r == &routes[cap - 1] ? routes : r + 1;
        *r = old[i];
    }
    PyMem_Free(old);
    return 0;
}

/* add(exchange, routing_key, queue, ring, mask, qid, store_uid)
 *   -> bool: a route taught (True), or False when the lane keeps
 *   LANE_ROUTES already. Between runs only (touched counts are per run).
 *   store_uid: the queue's uid when the message store keeps its persistent
 *   messages, else 0. */
static PyObject *
Lane_add(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add(exchange, routing_key, queue, ring, mask, qid, "
                                         "store_uid)");
        return NULL;
    }
    if (!self->configured || self->ntouched) {
        PyErr_SetString(PyExc_ValueError, "lane not configured, or in a run");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[0]) > 255 ||
        PyBytes_GET_SIZE(args[1]) > 255) {
        PyErr_SetString(PyExc_ValueError, "exchange and routing key: bytes of at most 255");
        return NULL;
    }
    Py_ssize_t qoff = PyLong_AsSsize_t(args[2]), roff = PyLong_AsSsize_t(args[3]);
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long qid = PyLong_AsUnsignedLongLong(args[5]);
    unsigned long long store_uid = PyLong_AsUnsignedLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    uint64_t *q;
    char *ring;
    if (queues_api->queue(self->atomic, qoff, roff, mask, &q, &ring) < 0)
        return NULL;
    const unsigned char *ex = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const unsigned char *rk = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    Py_ssize_t ex_len = PyBytes_GET_SIZE(args[0]), rk_len = PyBytes_GET_SIZE(args[1]);
    uint64_t hash = route_hash(ex, ex_len, rk, rk_len);
    self->sig_ok = 0; /* (a place added or changed: Python signs it again) */
    if (self->cap && self->routes) {
        LaneRoute *r = route_slot(self, hash, ex, ex_len, rk, rk_len);
        if (r->exchange != NULL) { /* known: the queue may have changed */
            r->q = q;
            r->ring = ring;
            r->mask = mask;
            r->qid = qid;
            r->store_uid = store_uid;
            Py_RETURN_TRUE;
        }
    }
    if (self->nroutes >= LANE_ROUTES)
        Py_RETURN_FALSE;
    if ((self->nroutes + 1) * 2 > self->cap && lane_grow(self) < 0)
        return NULL;
    LaneRoute *r = route_slot(self, hash, ex, ex_len, rk, rk_len);
    r->exchange = Py_NewRef(args[0]);
    r->routing_key = Py_NewRef(args[1]);
    r->hash = hash;
    r->q = q;
    r->ring = ring;
    r->mask = mask;
    r->qid = qid;
    r->store_uid = store_uid;
    r->touched = 0;
    self->nroutes++;
    Py_RETURN_TRUE;
}

/* arm(cursor, used, high, page_out_high): the lane takes publishes in the
 * next scan; the arena's cursor and fill as the worker's Arena has them. */
/* Arm the lane for a read from the arena's cursor and fill: 1, or 0 (not
 * configured, no route, the cursor out of the arena) with nothing changed. */
static int
lane_arm_at(LaneObject *self, Py_ssize_t cursor, uint64_t used, uint64_t high,
            uint64_t page_out_high)
{
    if (!self->configured || !self->nroutes ||
        !queues_api->arena_ok(self->atomic, self->arena_base, self->arena_end, cursor))
        return 0;
    self->cursor = cursor;
    self->used = used;
    self->high = high;
    self->page_out_high = page_out_high;
    self->armed = 1;
    self->store_on = 0; /* until store_window() opens it for this read */
    return 1;
}

static PyObject *
Lane_arm(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "arm(cursor, used, high, page_out_high)");
        return NULL;
    }
    Py_ssize_t cursor = PyLong_AsSsize_t(args[0]);
    unsigned long long used = PyLong_AsUnsignedLongLongMask(args[1]);
    unsigned long long high = PyLong_AsUnsignedLongLongMask(args[2]);
    unsigned long long page_out_high = PyLong_AsUnsignedLongLongMask(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!lane_arm_at(self, cursor, used, high, page_out_high)) {
        PyErr_SetString(PyExc_ValueError, "lane not configured, or cursor out of range");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* store_window(slot, check, epoch, reserved, limit, header_size, live_word):
 * persistent messages to a route with a store uid go in with their PUBLISH
 * records in the next scan: the open message file's slot and check (their
 * tags), the broker's epoch (their records), where its next record goes and
 * how large it may grow (workers/persist.py reserve's rule), and the offset
 * of its live-entry count (shm/message_files.py). limit 0: no window (they
 * leave the lane). */
static PyObject *
Lane_store_window(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "store_window(slot, check, epoch, reserved, limit, "
                                         "header_size, live_word)");
        return NULL;
    }
    self->store_on = 0;
    unsigned long long v[6];
    for (int i = 0; i < 6; i++)
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
    Py_ssize_t live = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (!v[4])
        Py_RETURN_NONE;
    if (v[0] > 0xFFFFFFFFULL || v[1] > 0xFFFFFFFFULL || v[2] > 0xFFFFFFFFULL) {
        PyErr_SetString(PyExc_ValueError, "store window out of range");
        return NULL;
    }
    uint64_t *word = queues_api->word(self->atomic, live);
    if (word == NULL)
        return NULL;
    self->st_slot = v[0];
    self->st_check = v[1];
    self->st_epoch = v[2];
    self->st_reserved = v[3];
    self->st_limit = v[4];
    self->st_header = v[5];
    self->st_live = word;
    self->store_on = 1;
    Py_RETURN_NONE;
}

/* sign(signature): what its places depend on, as Python checked them just
 * now: SIG_WORDS native words (see LaneObject). */
static PyObject *
Lane_sign(LaneObject *self, PyObject *signature)
{
    if (!PyBytes_Check(signature) || PyBytes_GET_SIZE(signature) != sizeof self->sig) {
        PyErr_SetString(PyExc_ValueError, "sign(signature): SIG_WORDS words as bytes");
        return NULL;
    }
    memcpy(self->sig, PyBytes_AS_STRING(signature), sizeof self->sig);
    self->sig_ok = 1;
    Py_RETURN_NONE;
}

static PyObject *
Lane_get_signed(LaneObject *self, void *closure)
{
    return PyBool_FromLong(self->sig_ok);
}

static PyObject *
Lane_clear(LaneObject *self, PyObject *unused)
{
    self->configured = self->armed = 0;
    lane_forget(self);
    Py_RETURN_NONE;
}

/* What the lane did since the last take(), forgotten (reported). */
static void
lane_reset_taken(LaneObject *self)
{
    for (int i = 0; i < SIZE_BUCKET_COUNT; i++)
        self->buckets[i] = 0;
    for (int i = 0; i < self->ntouched; i++) /* not the whole table: a read touches few */
        if (self->touched[i].route != NULL)
            self->touched[i].route->touched = 0;
    lane_untouch(self);
    self->n = 0;
    self->body_bytes = 0;
    self->ntouched = self->allocated = 0;
    self->gone_seq = -1;
    self->gone_stored = 0;
    self->records_len = 0;
    self->st_count = self->st_first = 0;
}

/* take() -> (n, body bytes, buckets, cursor, used, touched, gone, records,
 * record count, first stored) and resets the counts; buckets: the bodies per size bucket, or None when all
 * were in the first (at most 100 bytes); touched: [(qid, messages, watcher, exchange)] of the
 * routes the run appended through (one per exchange and routing key: the exchange's message
 * counts are one addition per route and run), the watcher the Q_WATCH value a scan's end took
 * after its appends' counters (0: none; shm/wake.py Waker.wake; lane_end_run); gone: (qid, seq, block) of an entry
 * whose queue was deleted under the append (the caller takes it back, then
 * drops the block's HOLD), or None, and whether its message was stored
 * (its PUBLISH record says UNAPPENDED; the caller counts its entry down if
 * it took it back, as Queue.publish_durable does); records: the run's
 * PUBLISH records, framed (store/records.py), for the message file the
 * store window named, or None; first stored: the 1-based place in the run
 * of its first message with a record (its confirm waits for their sync). */
static PyObject *
Lane_take(LaneObject *self, PyObject *unused)
{
    /* The buckets as a tuple only when a body was above the first bound. */
    PyObject *buckets = Py_None;
    Py_INCREF(buckets);
    if (self->buckets[0] != self->n) {
        Py_DECREF(buckets);
        buckets = PyTuple_New(SIZE_BUCKET_COUNT);
        if (buckets == NULL)
            return NULL;
        for (int i = 0; i < SIZE_BUCKET_COUNT; i++)
            PyTuple_SET_ITEM(buckets, i, PyLong_FromLongLong(self->buckets[i]));
    }
    PyObject *touched = PyList_New(self->ntouched);
    if (touched == NULL) {
        Py_DECREF(buckets);
        return NULL;
    }
    for (int i = 0; i < self->ntouched; i++) {
        LaneTouch *t = &self->touched[i];
        PyObject *item =
            Py_BuildValue("(KLiO)", (unsigned long long)t->qid, t->n, t->watcher, t->exchange);
        if (item == NULL) {
            Py_DECREF(buckets);
            Py_DECREF(touched);
            return NULL;
        }
        PyList_SET_ITEM(touched, i, item);
    }
    PyObject *gone = Py_None;
    Py_INCREF(gone);
    if (self->gone_seq >= 0) {
        Py_DECREF(gone);
        gone = Py_BuildValue("(KLnO)", (unsigned long long)self->gone_qid, self->gone_seq,
                             self->gone_block, self->gone_stored ? Py_True : Py_False);
        if (gone == NULL) {
            Py_DECREF(buckets);
            Py_DECREF(touched);
            return NULL;
        }
    }
    PyObject *records = Py_None;
    Py_INCREF(records);
    if (self->st_count) {
        Py_DECREF(records);
        records = PyBytes_FromStringAndSize((const char *)self->records, self->records_len);
        if (records == NULL) {
            Py_DECREF(buckets);
            Py_DECREF(touched);
            Py_DECREF(gone);
            return NULL;
        }
    }
    PyObject *result = Py_BuildValue("(LKNnKNNNLL)", self->n, self->body_bytes, buckets,
                                     self->cursor, (unsigned long long)self->used, touched, gone,
                                     records, self->st_count, self->st_first);
    lane_reset_taken(self);
    return result;
}

static PyObject *
Lane_get_n(LaneObject *self, void *closure)
{
    return PyLong_FromLongLong(self->n);
}

static PyObject *
Lane_get_armed(LaneObject *self, void *closure)
{
    return PyBool_FromLong(self->armed);
}

static PyObject *
Lane_get_configured(LaneObject *self, void *closure)
{
    return PyBool_FromLong(self->configured);
}

static PyObject *
Lane_get_channel(LaneObject *self, void *closure)
{
    return PyLong_FromLong(self->configured ? self->channel : 0);
}

static PyObject *
Lane_get_routes(LaneObject *self, void *closure)
{
    return PyLong_FromSsize_t(self->nroutes);
}

/* The delivery mode a content header's properties carry (0: none), its
 * flags' DELIVERY_MODE_BIT set; the properties are well formed
 * (header_ok). */
static int
delivery_mode(const unsigned char *h, Py_ssize_t n)
{
    Py_ssize_t at = 14;
    if (h[12] & 0x80) /* content type */
        at += 1 + h[at];
    if (h[12] & 0x40) /* content encoding */
        at += 1 + h[at];
    if (h[12] & HEADERS_BIT)
        at += 4 + be32(h + at);
    return at < n ? h[at] : 0;
}

static int
contains(const unsigned char *p, Py_ssize_t n, const char *needle, Py_ssize_t k)
{
    for (Py_ssize_t i = 0; i + k <= n; i++)
        if (p[i] == (unsigned char)needle[0] && memcmp(p + i, needle, k) == 0)
            return 1;
    return 0;
}

/* ---- a PUBLISH record of one entry, as the message store writes it
 * (store/messages.py encode_publish_one, framed as store/records.py encode:
 * "<II" length and CRC-32 of the length's 4 bytes and the payload, then the
 * payload "<cHQBIQ" b"P", 1 entry, uid, level 0, epoch, seq, then the
 * message record as its block holds it, tag excluded).
 * tests/unit/test_wire_fast.py checks it against store/ byte for byte. */
#define STORE_RECORD_OVERHEAD 8
#define PUBLISH_ONE_HEAD 24
#define UNAPPENDED_SEQ UINT64_MAX

static uint32_t crc_table[256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* zlib.crc32(p, crc): the CRC-32 of what `crc` covered followed by p. */
static uint32_t
crc32_more(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    crc = ~crc;
    while (n-- > 0)
        crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* Room for `more` bytes of records: 0, or -1 (no memory; nothing changed). */
static int
records_room(LaneObject *lane, Py_ssize_t more)
{
    if (lane->records_len + more <= lane->records_cap)
        return 0;
    Py_ssize_t cap = lane->records_cap ? lane->records_cap : 1 << 16;
    while (cap < lane->records_len + more)
        cap *= 2;
    unsigned char *grown = PyMem_Realloc(lane->records, cap);
    if (grown == NULL)
        return -1;
    lane->records = grown;
    lane->records_cap = cap;
    return 0;
}

/* Append the framed PUBLISH record of the message record at `record`
 * (`size` bytes, tag excluded) for queue `uid`'s entry `seq` (room made). */
static void
records_put(LaneObject *lane, const unsigned char *record, Py_ssize_t size, uint64_t uid,
            uint64_t seq)
{
    unsigned char *o = lane->records + lane->records_len;
    Py_ssize_t length = PUBLISH_ONE_HEAD + size;
    record_put_le(o, (uint64_t)length, 4);
    unsigned char *p = o + STORE_RECORD_OVERHEAD;
    p[0] = 'P';
    record_put_le(p + 1, 1, 2);
    record_put_le(p + 3, uid, 8);
    p[11] = 0; /* level: a lane's queue has no priorities */
    record_put_le(p + 12, lane->st_epoch, 4);
    record_put_le(p + 16, seq, 8);
    memcpy(p + PUBLISH_ONE_HEAD, record, size);
    uint32_t crc = crc32_more(crc32_more(0, o, 4), p, length);
    record_put_le(o + 4, crc, 4);
    lane->records_len += STORE_RECORD_OVERHEAD + length;
}

/* Take one whole publish (scan() recognised it: its properties are well
 * formed, its body is one frame of the header's size) into its route's
 * queue: 1 when taken (counted), 0 when Python must. A persistent message
 * for a queue whose messages the store keeps is tagged with its PUBLISH
 * record's place before its append and its record framed after it, in the
 * order of Queue.publish_durable (workers/ingest.py): the message file's
 * live count first, then the entry. */
static int
lane_take(LaneObject *lane, const unsigned char *ex, Py_ssize_t ex_len, const unsigned char *rk,
          Py_ssize_t rk_len, int bits, const unsigned char *h, Py_ssize_t hsize,
          const unsigned char *body, Py_ssize_t bsize)
{
    if (bits & 2)
        return 0;
    LaneRoute *route = route_slot(lane, route_hash(ex, ex_len, rk, rk_len), ex, ex_len, rk, rk_len);
    if (route->exchange == NULL)
        return 0; /* a place Python has not taught it */
    unsigned char f = h[12];
    if (f & (EXPIRATION_BIT | REPLY_TO_BIT))
        return 0;
    if ((f & HEADERS_BIT) && (contains(h, hsize, "\x02" "CC", 3) ||
                              contains(h, hsize, "\x03" "BCC", 4)))
        return 0;
    int stored = (f & DELIVERY_MODE_BIT) && route->store_uid && delivery_mode(h, hsize) == 2;
    if (stored && !lane->store_on)
        return 0;
    if ((uint64_t)bsize > lane->max_body || lane->used > lane->page_out_high)
        return 0;
    if (!route->touched && lane->ntouched == lane->touched_cap && lane_touched_grow(lane) < 0)
        return 0; /* the run's list of queues is full: the rest next read */
    Py_ssize_t payload = MSG_PREFIX_SIZE + ex_len + rk_len + hsize + bsize;
    Py_ssize_t record_bytes = 0;
    if (stored) {
        record_bytes = STORE_RECORD_OVERHEAD + PUBLISH_ONE_HEAD + payload;
        if (lane->st_reserved + (uint64_t)record_bytes > lane->st_limit &&
            lane->st_reserved > lane->st_header)
            return 0; /* the message file is full: Python's path opens the next */
        if (records_room(lane, record_bytes) < 0)
            return 0;
    }
    Py_ssize_t need = (BLOCK_HEADER + payload + (stored ? MSG_TAG_SIZE : 0) + BLOCK_ALIGN - 1) &
                      ~(Py_ssize_t)(BLOCK_ALIGN - 1);
    Py_ssize_t block;
    uint64_t used;
    if (!queues_api->alloc(lane->atomic, lane->arena_base, lane->arena_end, &lane->cursor, need,
                          &block, &used)) {
        lane->cursor = lane->arena_first; /* as Arena.alloc: the scan may have coalesced */
        return 0;
    }
    if (lane->cursor > lane->hot_end && used < lane->hot_live)
        lane->cursor = lane->arena_first; /* back to the hot window (shm/arena.py) */
    lane->used = used;
    lane->allocated = 1;
    Py_ssize_t len;
    unsigned char *o = (unsigned char *)queues_api->base(lane->atomic, &len) + block + BLOCK_HEADER;
    unsigned char *record = o;
    o = record_write_head(o, ex, ex_len, rk, rk_len, h, hsize, bsize, 0, -1, 0);
    memcpy(o, body, bsize);
    if (stored) {
        record_write_tag(record, payload, (uint32_t)lane->st_slot, (uint32_t)lane->st_check,
                         lane->st_reserved);
        __atomic_fetch_add(lane->st_live, 1, __ATOMIC_SEQ_CST);
    }
    if (lane->tally.q != route->q) { /* another queue: the last one's counters go in */
        queues_api->tally_settle(&lane->tally);
        if (queues_api->tally_begin(lane->atomic, route->q, lane->intent, &lane->tally) < 0) {
            PyErr_Clear(); /* (out of range: never, the route was checked) Python's path */
            if (stored)
                __atomic_fetch_sub(lane->st_live, 1, __ATOMIC_SEQ_CST);
            queues_api->release_hold(lane->atomic, block, lane->arenas, lane->arena_bytes);
            return 0;
        }
    }
    long long got = queues_api->publish(lane->atomic, route->q, route->ring, route->mask,
                                       (uint64_t)block, lane->intent, route->qid, &lane->tally);
    if (got == SHOAL_PUBLISH_RULES || got == -1) {
        /* A length limit or a capacity, or no room, or gone: Python's path
         * (the block, never appended, goes with its HOLD). */
        if (stored)
            __atomic_fetch_sub(lane->st_live, 1, __ATOMIC_SEQ_CST);
        queues_api->release_hold(lane->atomic, block, lane->arenas, lane->arena_bytes);
        return 0;
    }
    if (stored) {
        /* Deleted under the append: the record says so (its entry goes with
         * take()'s gone), as Queue.publish_durable's. */
        uint64_t seq = got < -1 ? UNAPPENDED_SEQ : (uint64_t)got >> SHOAL_WATCHER_BITS;
        records_put(lane, record, payload, route->store_uid, seq);
        lane->st_reserved += (uint64_t)record_bytes;
        lane->st_count++;
        if (!lane->st_first)
            lane->st_first = lane->n + 1;
        lane->gone_stored = got < -1;
    }
    if (!route->touched) {
        LaneTouch *t = &lane->touched[lane->ntouched++];
        t->qid = route->qid;
        t->route = route;
        t->exchange = route->exchange; /* counted per exchange by its caller (workers/lane.py) */
        Py_INCREF(t->exchange);
        t->q = route->q;
        t->n = 0;
        t->watcher = t->unwatched = 0;
        route->touched = lane->ntouched;
    }
    LaneTouch *touch = &lane->touched[route->touched - 1];
    touch->n++;
    if (got < -1) {
        /* Deleted after the append: Python takes the entry back and drops
         * the HOLD (take()'s gone); the lane stops here. */
        lane->gone_seq = -2 - got;
        lane->gone_block = block;
        lane->gone_qid = route->qid;
        lane->armed = 0;
    } else {
        /* Its watch: at the scan's end (lane_end_run); an append counted at
         * once (its queue declared again since the run began) took it. */
        long long watcher = got & ((1LL << SHOAL_WATCHER_BITS) - 1);
        if (watcher)
            touch->watcher = (int)watcher;
        touch->unwatched = 1;
        queues_api->release_hold(lane->atomic, block, lane->arenas, lane->arena_bytes);
    }
    int bucket = 0;
    while (bucket < SIZE_BUCKET_COUNT - 1 && (uint64_t)bsize > SIZE_BOUNDS[bucket])
        bucket++;
    lane->buckets[bucket]++;
    lane->n++;
    lane->body_bytes += (unsigned long long)bsize;
    return 1;
}

/* A growing output buffer that starts on the stack: 0, or -1 with an error set. */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
    unsigned char stack[512];
} SmallBuf;

static void
small_init(SmallBuf *b)
{
    b->p = b->stack;
    b->len = 0;
    b->cap = sizeof b->stack;
}

static int
small_room(SmallBuf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    unsigned char *grown = PyMem_Malloc(cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(grown, b->p, b->len);
    if (b->p != b->stack)
        PyMem_Free(b->p);
    b->p = grown;
    b->cap = cap;
    return 0;
}

static void
small_free(SmallBuf *b)
{
    if (b->p != b->stack)
        PyMem_Free(b->p);
}

/* mqtt_run(data, exchange, topics, props0, props1, level5, max_packet)
 *     -> (at, n, acks, ids)
 *
 * An MQTT device's read (workers/mqtt_lane.py): its leading plain PUBLISHes
 * (workers/_mqtt_publish.h) to topics it published to before, straight into
 * their queues through the armed lane, as scan() takes the same messages
 * from the inner AMQP connection's frames, without the frames. topics:
 * topic bytes -> (routing key, ...) (Inbound's plain_topics); props0,
 * props1: the content header properties of a QoS 0 and a QoS 1 message, or
 * None (such a publish ends the run). It stops, untouched, at the first
 * PUBLISH the lane does not take and at any other packet: Python's path
 * takes the rest. at: where that is; n: the messages taken; acks: the
 * PUBACKs of its QoS 1 ones (whether they may go now is the caller's to
 * decide: a persistent message may wait for its sync); ids: each message's
 * packet id, two bytes big-endian, 0 for QoS 0, in order. */
#define HEADER_ROOM 512

/* The run itself, for mqtt_run and mqtt_read (args: theirs from data to
 * max_packet): 0 with *at, *n, acks and ids set, or -1 with an error set.
 * The lane's run is ended (lane_end_run) either way, if it was armed. */
static int
mqtt_run_core(LaneObject *self, PyObject *const *args, Py_ssize_t *at_out, long long *n_out,
              SmallBuf *acks, SmallBuf *ids)
{
    PyObject *exchange = args[1], *topics = args[2], *props0 = args[3], *props1 = args[4];
    if (!PyBytes_Check(exchange) || !PyDict_Check(topics) ||
        (props0 != Py_None && !PyBytes_Check(props0)) ||
        (props1 != Py_None && !PyBytes_Check(props1))) {
        PyErr_SetString(PyExc_TypeError, "exchange must be bytes, topics a dict, props0 and "
                                         "props1 bytes or None");
        return -1;
    }
    int level5 = PyObject_IsTrue(args[5]);
    Py_ssize_t max_packet = PyLong_AsSsize_t(args[6]);
    if (level5 < 0 || (max_packet == -1 && PyErr_Occurred()))
        return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return -1;
    const unsigned char *p = view.buf;
    const unsigned char *ex = (const unsigned char *)PyBytes_AS_STRING(exchange);
    Py_ssize_t ex_len = PyBytes_GET_SIZE(exchange), at = 0;
    unsigned char header[HEADER_ROOM];
    long long n = 0;
    int armed = self->armed, result = -1;
    PlainPublish pub;
    while (self->armed && plain_publish_at(p, view.len, at, level5, max_packet, &pub)) {
        PyObject *props = pub.qos ? props1 : props0;
        if (props == Py_None || !pub.body_len)
            break; /* (an empty body: no body frame, scan's whole publish has one) */
        Py_ssize_t plen = PyBytes_GET_SIZE(props);
        if (12 + plen > HEADER_ROOM)
            break;
        int error;
        PyObject *rk = plain_publish_known(topics, &pub, 0, &error); /* (its routing key) */
        if (rk == NULL) {
            if (error)
                goto done;
            break;
        }
        if (small_room(acks, 4) < 0 || small_room(ids, 2) < 0)
            goto done;
        /* The content header's payload: class 60, weight 0, body size, properties. */
        header[0] = 0;
        header[1] = 60;
        header[2] = header[3] = 0;
        for (int i = 0; i < 8; i++)
            header[4 + i] = (unsigned char)((uint64_t)pub.body_len >> (8 * (7 - i)));
        memcpy(header + 12, PyBytes_AS_STRING(props), plen);
        if (!lane_take(self, ex, ex_len, (const unsigned char *)PyBytes_AS_STRING(rk),
                       PyBytes_GET_SIZE(rk), 0, header, 12 + plen, pub.body, pub.body_len))
            break;
        n++;
        ids->p[ids->len++] = (unsigned char)(pub.id >> 8);
        ids->p[ids->len++] = (unsigned char)pub.id;
        if (pub.qos) { /* a PUBACK with success, 3.1.1's and 5.0's short form alike */
            acks->p[acks->len++] = 0x40;
            acks->p[acks->len++] = 2;
            acks->p[acks->len++] = (unsigned char)(pub.id >> 8);
            acks->p[acks->len++] = (unsigned char)pub.id;
        }
        at = pub.next;
    }
    *at_out = at;
    *n_out = n;
    result = 0;
done:
    if (armed)
        lane_end_run(self);
    PyBuffer_Release(&view);
    return result;
}

/* mqtt_run(data, exchange, topics, props0, props1, level5, max_packet)
 *     -> (at, n, acks, ids)
 *
 * An MQTT device's read (workers/mqtt_lane.py): its leading plain PUBLISHes
 * (workers/_mqtt_publish.h) to topics it published to before, straight into
 * their queues through the armed lane, as scan() takes the same messages
 * from the inner AMQP connection's frames, without the frames. topics:
 * topic bytes -> (routing key, ...) (Inbound's plain_topics); props0,
 * props1: the content header properties of a QoS 0 and a QoS 1 message, or
 * None (such a publish ends the run). It stops, untouched, at the first
 * PUBLISH the lane does not take and at any other packet: Python's path
 * takes the rest. at: where that is; n: the messages taken; acks: the
 * PUBACKs of its QoS 1 ones (whether they may go now is the caller's to
 * decide: a persistent message may wait for its sync); ids: each message's
 * packet id, two bytes big-endian, 0 for QoS 0, in order. */
static PyObject *
Lane_mqtt_run(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "mqtt_run(data, exchange, topics, props0, props1, level5, max_packet)");
        return NULL;
    }
    SmallBuf acks, ids;
    small_init(&acks);
    small_init(&ids);
    Py_ssize_t at;
    long long n;
    PyObject *out = NULL;
    if (mqtt_run_core(self, args, &at, &n, &acks, &ids) == 0)
        out = Py_BuildValue("(nLy#y#)", at, n, (const char *)acks.p, acks.len,
                            (const char *)ids.p, ids.len);
    small_free(&acks);
    small_free(&ids);
    return out;
}

static PyTypeObject LaneType;
#include "_attrs.h" /* attribute reads and adds: one definition */
#include "_barrier.h" /* the subscribe barrier, as DeviceRead and AckRead look */
#include "_waker.h"   /* Waker.wake and Pacer.published where plain */
#include "_lane_account.h"
#include "_ack_defer.h" /* AckBatch: devices' PUBACKs behind the deliveries */
#include "_lane_device.h"

static PyMethodDef Lane_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))Lane_configure, METH_FASTCALL,
     "The lane's channel and arena; its routes forgotten."},
    {"add", (PyCFunction)(void (*)(void))Lane_add, METH_FASTCALL,
     "Teach it a route: (exchange, routing key) into one queue."},
    {"arm", (PyCFunction)(void (*)(void))Lane_arm, METH_FASTCALL,
     "Let the next scan take publishes; the arena's cursor and fill."},
    {"store_window", (PyCFunction)(void (*)(void))Lane_store_window, METH_FASTCALL,
     "Let the next scan take persistent messages with their PUBLISH records."},
    {"clear", (PyCFunction)Lane_clear, METH_NOARGS, "Take nothing until configured again."},
    {"sign", (PyCFunction)Lane_sign, METH_O,
     "What its places depend on, as Python just checked them."},
    {"take", (PyCFunction)Lane_take, METH_NOARGS, "What the lane did since the last take."},
    {"mqtt_run", (PyCFunction)(void (*)(void))Lane_mqtt_run, METH_FASTCALL,
     "An MQTT device's plain PUBLISHes straight into their queues."},
    {"mqtt_read", (PyCFunction)(void (*)(void))Lane_mqtt_read, METH_FASTCALL,
     "mqtt_run, and what the run took counted as PublishLane.account counts it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Lane_getset[] = {
    {"n", (getter)Lane_get_n, NULL, "Publishes taken since the last take().", NULL},
    {"armed", (getter)Lane_get_armed, NULL, "Whether scan may take publishes.", NULL},
    {"configured", (getter)Lane_get_configured, NULL, "Whether configured.", NULL},
    {"channel", (getter)Lane_get_channel, NULL, "The lane's channel (0: none).", NULL},
    {"routes", (getter)Lane_get_routes, NULL, "How many routes it knows.", NULL},
    {"signed", (getter)Lane_get_signed, NULL, "Whether sign() stands for its places.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.workers._wire.Lane",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Lane(atomic): a connection's publish lane (workers/lane.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
};

/* ----------------------------------------------------- a run of deliveries */

/* The frames of a run, built here and copied out once. One per process:
 * the GIL serialises its users. */
static unsigned char *run_buf;
static Py_ssize_t run_cap;

static int
run_room(Py_ssize_t need)
{
    if (need <= run_cap)
        return 0;
    Py_ssize_t cap = run_cap ? run_cap : 1 << 16;
    while (cap < need)
        cap *= 2;
    unsigned char *grown = PyMem_Realloc(run_buf, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    run_buf = grown;
    run_cap = cap;
    return 0;
}

#define RUN_FULL 0  /* `limit` deliveries made */
#define RUN_EMPTY 1 /* the queue gave nothing: DONE with the changes value read before */
#define RUN_ENTRY 2 /* an entry acquired that Python delivers: (seq, block, redelivered) */

/* A shared-queues tuple (SharedQueues.run_args) parsed: 0, or -1 with an exception. */

/* An unacked delivery's (consumer, qid, seq, body length), the delivery
 * book's value: built directly, not with Py_BuildValue, whose format
 * parsing was 2 % of a broker's samples at 250k acked messages/s. */
static PyObject *
unacked_entry(PyObject *consumer, PyObject *qid, uint64_t seq, uint64_t body_len)
{
    PyObject *t = PyTuple_New(4);
    if (t == NULL)
        return NULL;
    PyObject *s = PyLong_FromUnsignedLongLong(seq);
    PyObject *b = s ? PyLong_FromUnsignedLongLong(body_len) : NULL;
    if (b == NULL) {
        Py_XDECREF(s);
        Py_DECREF(t);
        return NULL;
    }
    Py_INCREF(consumer);
    Py_INCREF(qid);
    PyTuple_SET_ITEM(t, 0, consumer);
    PyTuple_SET_ITEM(t, 1, qid);
    PyTuple_SET_ITEM(t, 2, s);
    PyTuple_SET_ITEM(t, 3, b);
    return t;
}
static int
store_args(PyObject *tuple, PyObject **atomic, Py_ssize_t *qoff, Py_ssize_t *roff,
           unsigned long long *mask, unsigned long long *owner, Py_ssize_t *arenas,
           Py_ssize_t *arena_bytes, Py_ssize_t *dropping, int *settle_hook)
{
    if (!PyTuple_Check(tuple) ||
        !PyArg_ParseTuple(tuple, "OnnKKnnnp", atomic, qoff, roff, mask, owner, arenas,
                          arena_bytes, dropping, settle_hook))
        return -1;
    if (!queues_api->is_atomic(*atomic)) {
        PyErr_SetString(PyExc_TypeError, "shared: a shm._atomic.Atomic with a buffer");
        return -1;
    }
    if (*arenas < 0 || *arena_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "shared: bad arena geometry");
        return -1;
    }
    return 0;
}

/*
 * deliver_run(shared, pointer, limit, channel, consumer_tag, next_tag,
 *             frame_max, no_ack, unacked, consumer, qid)
 *   -> (frames | None, delivered, pointer, next_tag, body_bytes, status,
 *       a, b, c)
 *
 * A plain consumer's run (workers/consumer.py pull): acquire entries from
 * `pointer` on and build each one's Basic.Deliver, content header and body
 * frames into one bytes object, until `limit` are delivered (RUN_FULL),
 * the queue gives nothing twice, the second scan after reading its changes
 * counter (RUN_EMPTY, a: that value), or an entry needs Python: a
 * redelivery, a message that may have expired (MSG_TIMED), or, without
 * acks, a persistent message whose queue's settles the message store records
 * (RUN_ENTRY, (a, b, c) = (seq, block, redelivered), the entry acquired and
 * not counted). With no_ack each entry is deleted once its frames are built
 * (shm's ack); otherwise it goes into `unacked` as {tag: (consumer, qid,
 * seq, body size)}, workers/delivery.py's book. `shared` is the queue's
 * SharedQueues.run_args: (atomic, queue, ring, mask, owner bits, arenas,
 * arena bytes, dropping word, whether the message store records settles).
 */
/* What a run needs (deliver_run's arguments, parsed) and what it gives. */
typedef struct {
    PyObject *atomic;
    Py_ssize_t qoff, roff, arenas, arena_bytes, dropping_off;
    unsigned long long mask, owner;
    int settle_hook;
    uint64_t pointer;
    Py_ssize_t limit;
    long channel;
    unsigned long long tag;
    Py_ssize_t frame_max;
    int no_ack;
    PyObject *unacked, *consumer, *qid;
    const char *ctag;
    Py_ssize_t ctag_len;
} RunIn;

typedef struct {
    Py_ssize_t used; /* bytes of frames in run_buf */
    Py_ssize_t delivered;
    uint64_t pointer;
    unsigned long long tag, body_bytes;
    int status;
    unsigned long long a, b, c;
} RunOut;

/* The run itself (deliver_run's, below): 0 with its frames in run_buf,
 * or -1 with an error set. */
static int
run_core(const RunIn *in, RunOut *o)
{
    if (in->frame_max < 9 || in->channel < 0 || in->channel > 0xFFFF || in->arenas < 0 ||
        in->arena_bytes <= 0 || (!in->no_ack && !PyDict_Check(in->unacked))) {
        PyErr_SetString(PyExc_ValueError, "deliver_run: bad frame_max, channel, arena or book");
        return -1;
    }
    if (in->ctag_len < 1 || in->ctag_len != 1 + (unsigned char)in->ctag[0]) {
        PyErr_SetString(PyExc_ValueError, "consumer_tag is not a short string");
        return -1;
    }
    PyObject *atomic = in->atomic;
    unsigned long long mask = in->mask, owner = in->owner;
    uint64_t *q, *dropping;
    char *ring;
    if (queues_api->queue(atomic, in->qoff, in->roff, mask, &q, &ring) < 0 ||
        (dropping = queues_api->word(atomic, in->dropping_off)) == NULL)
        return -1;
    /* The run's counters go to the queue once, at its end (every return
     * below settles it). */
    ShoalTally tally;
    if (queues_api->tally_begin(atomic, q, in->dropping_off - SHOAL_P_DROPPING, &tally) < 0)
        return -1;
    Py_ssize_t len;
    const unsigned char *base = (const unsigned char *)queues_api->base(atomic, &len);
    uint64_t pointer = in->pointer;
    unsigned long long tag = in->tag;
    Py_ssize_t used = 0, delivered = 0;
    unsigned long long body_bytes = 0;
    int status = RUN_FULL;
    unsigned long long a = 0, b = 0, c = 0;
    while (delivered < in->limit) {
        uint64_t seq, block;
        int redelivered;
        if (!queues_api->acquire(atomic, q, ring, mask, pointer, owner, &seq, &block,
                                &redelivered, &tally)) {
            pointer = seq;
            /* Read the counter before the scan that decides DONE: anything
             * published after it bumps it, and the scheduler compares. */
            uint64_t changes = queues_api->changes(q);
            if (!queues_api->acquire(atomic, q, ring, mask, pointer, owner, &seq, &block,
                                    &redelivered, &tally)) {
                pointer = seq;
                status = RUN_EMPTY;
                a = changes;
                break;
            }
        }
        pointer = seq + 1;
        Py_ssize_t record = (Py_ssize_t)block + BLOCK_HEADER;
        unsigned flags = 0;
        uint64_t body_len = 0;
        Py_ssize_t size = -1;
        if (record >= 0 && record <= len - MSG_PREFIX_SIZE) {
            const unsigned char *r = base + record;
            flags = r[2] | r[3] << 8;
            size = delivery_size(r, len - record - MSG_PREFIX_SIZE, in->ctag_len, in->frame_max,
                                 &body_len);
        }
        if (redelivered || (flags & MSG_TIMED) ||
            (in->no_ack && in->settle_hook && (flags & MSG_TAGGED)) || size < 0) {
            status = RUN_ENTRY;
            a = seq;
            b = block;
            c = (unsigned long long)redelivered;
            break;
        }
        /* (A failure below leaves the entry acquired, undelivered: Python's
         * error path requeues what the channel holds; this one is lost to
         * it only in memory errors, after which the worker is in trouble
         * anyway.) */
        if (run_room(used + size) < 0)
            goto fail;
        write_delivery(run_buf + used, base + record, in->channel, in->ctag, in->ctag_len, tag, 0,
                       in->frame_max);
        used += size;
        if (in->no_ack) {
            /* After the copy: this may free the block. */
            if (queues_api->ack(atomic, q, ring, mask, seq, owner, in->arenas, in->arena_bytes,
                                dropping, &tally) < 0)
                goto fail;
        } else {
            PyObject *key = PyLong_FromUnsignedLongLong(tag);
            PyObject *value = key ? unacked_entry(in->consumer, in->qid, seq, body_len) : NULL;
            int bad = value == NULL || PyDict_SetItem(in->unacked, key, value) < 0;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (bad)
                goto fail;
        }
        tag++;
        delivered++;
        body_bytes += body_len;
    }
    queues_api->tally_settle(&tally);
    *o = (RunOut){used, delivered, pointer, tag, body_bytes, status, a, b, c};
    return 0;
fail:
    queues_api->tally_settle(&tally);
    return -1;
}

static PyObject *
deliver_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "deliver_run(shared, pointer, limit, channel, consumer_tag, next_tag, "
                        "frame_max, no_ack, unacked, consumer, qid)");
        return NULL;
    }
    RunIn in;
    if (store_args(args[0], &in.atomic, &in.qoff, &in.roff, &in.mask, &in.owner, &in.arenas,
                   &in.arena_bytes, &in.dropping_off, &in.settle_hook) < 0)
        return NULL;
    in.pointer = PyLong_AsUnsignedLongLong(args[1]);
    in.limit = PyLong_AsSsize_t(args[2]);
    in.channel = PyLong_AsLong(args[3]);
    in.tag = PyLong_AsUnsignedLongLong(args[5]);
    in.frame_max = PyLong_AsSsize_t(args[6]);
    in.no_ack = PyObject_IsTrue(args[7]);
    in.unacked = args[8];
    in.consumer = args[9];
    in.qid = args[10];
    if (PyErr_Occurred() || in.no_ack < 0)
        return NULL;
    char *ctag;
    if (PyBytes_AsStringAndSize(args[4], &ctag, &in.ctag_len) < 0)
        return NULL;
    in.ctag = ctag;
    RunOut o;
    if (run_core(&in, &o) < 0)
        return NULL;
    PyObject *frames = Py_None;
    if (o.used) {
        frames = PyBytes_FromStringAndSize((const char *)run_buf, o.used);
        if (frames == NULL)
            return NULL;
    } else {
        Py_INCREF(frames);
    }
    return Py_BuildValue("(NnKKKiKKK)", frames, o.delivered, (unsigned long long)o.pointer, o.tag,
                         o.body_bytes, o.status, o.a, o.b, o.c);
}

#include "_watched_pull.h" /* WatchedPull: a watched queue's wake-up pull */


/* A persistent message's tag (shm/arena.py read_tag: "<IIQ" after the body
 * and a TIMED message's times) as (slot, check, offset); NULL without an
 * exception when the lengths point past the block. */
static PyObject *
read_tag(const unsigned char *base, Py_ssize_t len, Py_ssize_t block)
{
    Py_ssize_t record = block + BLOCK_HEADER;
    if (block < 0 || record + MSG_PREFIX_SIZE > len)
        return NULL;
    const unsigned char *r = base + record;
    unsigned flags = r[2] | r[3] << 8;
    uint64_t at = (uint64_t)record + MSG_PREFIX_SIZE + r[0] + r[1] + le32(r + 4) + le64(r + 8);
    if (flags & MSG_TIMED)
        at += MSG_TIME_SIZE;
    uint64_t block_size = le64(base + block);
    if (at + 16 > (uint64_t)len || at + 16 > (uint64_t)block + block_size)
        return NULL;
    const unsigned char *t = base + at;
    return Py_BuildValue("(IIK)", (unsigned)le32(t), (unsigned)le32(t + 4),
                         (unsigned long long)le64(t + 8));
}

#define ACK_GROUPS 8

/*
 * ack_run(shared, qid, unacked, upto, uid)
 *   -> (acked, body_bytes, [(consumer, count, bytes)], [(tag, uid)])
 *
 * A multiple ack's run (workers/delivery.py settle): the entries of a
 * channel's unacked book {tag: (consumer, qid, seq, body size)}, in tag
 * order up to tag `upto`, while they are entries of log `qid` (`shared` is
 * its SharedQueues.run_args): each deleted (shm's ack) and taken out of the
 * book. It stops at the first entry Python must settle (another queue, a
 * browser's copy, a ninth consumer); what it did is returned per consumer,
 * for their credit, and, where the message store records the queue's
 * settles (`shared`'s flag), the tags of the persistent messages it deleted
 * (shm/arena.py read_tag, each read before its ack) with the queue's `uid`,
 * for its SETTLE records.
 */
static PyObject *
ack_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "ack_run(shared, qid, unacked, upto, uid)");
        return NULL;
    }
    PyObject *atomic;
    Py_ssize_t qoff, roff, arenas, arena_bytes, dropping_off;
    unsigned long long mask, owner;
    int settle_hook;
    if (store_args(args[0], &atomic, &qoff, &roff, &mask, &owner, &arenas, &arena_bytes,
                   &dropping_off, &settle_hook) < 0)
        return NULL;
    unsigned long long qid = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long upto = PyLong_AsUnsignedLongLong(args[3]);
    PyObject *unacked = args[2], *uid = args[4];
    if (PyErr_Occurred())
        return NULL;
    if (!PyDict_Check(unacked)) {
        PyErr_SetString(PyExc_TypeError, "ack_run: the book must be a dict");
        return NULL;
    }
    Py_ssize_t len;
    const unsigned char *base = (const unsigned char *)queues_api->base(atomic, &len);
    uint64_t *q, *dropping;
    char *ring;
    if (queues_api->queue(atomic, qoff, roff, mask, &q, &ring) < 0 ||
        (dropping = queues_api->word(atomic, dropping_off)) == NULL)
        return NULL;
    Py_ssize_t room = PyDict_GET_SIZE(unacked), n = 0;
    PyObject *settled = PyList_New(0);
    if (settled == NULL)
        return NULL;
    PyObject **keys = PyMem_Malloc((room ? room : 1) * sizeof(PyObject *));
    if (keys == NULL) {
        Py_DECREF(settled);
        return PyErr_NoMemory();
    }
    /* The acks' counters go to the queue once, after the walk. */
    ShoalTally tally;
    if (queues_api->tally_begin(atomic, q, dropping_off - SHOAL_P_DROPPING, &tally) < 0) {
        PyMem_Free(keys);
        Py_DECREF(settled);
        return NULL;
    }
    PyObject *group_consumer[ACK_GROUPS];
    long long group_count[ACK_GROUPS];
    unsigned long long group_bytes[ACK_GROUPS], body_bytes = 0;
    int groups = 0, failed = 0;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(unacked, &pos, &key, &value)) {
        unsigned long long tag = PyLong_AsUnsignedLongLong(key);
        if (PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (tag > upto || !PyTuple_Check(value) || PyTuple_GET_SIZE(value) != 4)
            break;
        PyObject *consumer = PyTuple_GET_ITEM(value, 0);
        long long vqid = PyLong_AsLongLong(PyTuple_GET_ITEM(value, 1));
        long long seq = PyLong_AsLongLong(PyTuple_GET_ITEM(value, 2));
        unsigned long long size = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(value, 3));
        if (PyErr_Occurred()) {
            failed = 1;
            break;
        }
        if (vqid < 0 || (unsigned long long)vqid != qid || seq < 0)
            break;
        PyObject *store_tag = NULL; /* a persistent message's, for the message store's SETTLE */
        if (settle_hook) {
            uint64_t block = queues_api->held_block(atomic, ring, mask, (uint64_t)seq, owner);
            if (block && (base[block + BLOCK_HEADER + 2] & MSG_TAGGED)) {
                store_tag = read_tag(base, len, (Py_ssize_t)block);
                if (store_tag == NULL) {
                    if (PyErr_Occurred()) {
                        failed = 1;
                        break;
                    }
                    break; /* lengths out of range: Python's path decides */
                }
            }
        }
        int g = 0;
        while (g < groups && group_consumer[g] != consumer)
            g++;
        if (g == groups) {
            if (groups == ACK_GROUPS) {
                Py_XDECREF(store_tag);
                break;
            }
            group_consumer[g] = consumer;
            group_count[g] = 0;
            group_bytes[g] = 0;
            groups++;
        }
        int done = queues_api->ack(atomic, q, ring, mask, (uint64_t)seq, owner, arenas,
                                  arena_bytes, dropping, &tally);
        if (done < 0) {
            Py_XDECREF(store_tag);
            failed = 1;
            break;
        }
        if (store_tag != NULL) {
            /* Told after the ack (SharedQueues.ack's order), if it was ours. */
            PyObject *item = done ? PyTuple_Pack(2, store_tag, uid) : NULL;
            Py_DECREF(store_tag);
            if (done && (item == NULL || PyList_Append(settled, item) < 0)) {
                Py_XDECREF(item);
                failed = 1;
                break;
            }
            Py_XDECREF(item);
        }
        Py_INCREF(key);
        keys[n++] = key;
        group_count[g]++;
        group_bytes[g] += size;
        body_bytes += size;
    }
    queues_api->tally_settle(&tally);
    /* Out of the book once the walk is over (a dict may not change under
     * PyDict_Next). */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!failed && PyDict_DelItem(unacked, keys[i]) < 0)
            failed = 1;
        Py_DECREF(keys[i]);
    }
    PyMem_Free(keys);
    if (failed) {
        Py_DECREF(settled);
        return NULL;
    }
    PyObject *list = PyList_New(groups);
    if (list == NULL) {
        Py_DECREF(settled);
        return NULL;
    }
    for (int g = 0; g < groups; g++) {
        PyObject *item = Py_BuildValue("(OLK)", group_consumer[g], group_count[g], group_bytes[g]);
        if (item == NULL) {
            Py_DECREF(list);
            Py_DECREF(settled);
            return NULL;
        }
        PyList_SET_ITEM(list, g, item);
    }
    return Py_BuildValue("(nKNN)", n, body_bytes, list, settled);
}

/* ------------------------------------------------------------ frames in */

/* Whether an item left to Python ends the lane for the rest of a read:
 * anything on its channel (their order), a method on channel 0 (a close),
 * and a method on another channel but publish, ack, nack and reject (which
 * cannot see the lane's publishes out of order: a purge, a get, a delete
 * could). The first frame's payload is given (a whole publish's method). */
static int
lane_stops(LaneObject *lane, int type, int channel, const unsigned char *payload,
           Py_ssize_t size)
{
    int stop = channel == lane->channel;
    if (!stop && type == FRAME_METHOD) {
        uint32_t id = size >= 4 ? be32(payload) : 0;
        stop = channel == 0 || !(id == 0x003C0028 || id == 0x003C0050 || id == 0x003C005A ||
                                 id == 0x003C0078);
    }
    if (stop)
        lane->armed = 0;
    return stop;
}

/*
 * scan(view, frame_max) -> (items, end, anomaly)
 *
 * Splits view's complete frames from the start. An ordinary frame is
 * (type, channel, payload memoryview). A publish whose method, content
 * header and single body frame are all here, on one channel, with a body of
 * the header's size, well-formed properties and no user-id (which needs a
 * check against the login), is one item:
 *
 *     (0, channel, view, start, exchange, routing key, bits, header, body)
 *
 * start: the method frame's offset in view (the three frames are split
 * again from there when the channel cannot take the message whole); bits:
 * mandatory 1, immediate 2; header: the content header payload as bytes;
 * body: a memoryview. It stops at the first incomplete frame (end: where
 * the rest starts; a publish whose header, or whose body of one frame, is
 * still incomplete counts as incomplete from its method frame on) or at a frame the Python splitter must decide on
 * (anomaly true).
 *
 * With a lane (an armed Lane, above), a whole publish the lane takes is no
 * item: it is in its queue when scan returns (Lane.take counts it).
 */
static PyObject *
scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(view, frame_max, lane=None)");
        return NULL;
    }
    LaneObject *lane = NULL;
    if (nargs == 3 && args[2] != Py_None) {
        if (!PyObject_TypeCheck(args[2], &LaneType)) {
            PyErr_SetString(PyExc_TypeError, "scan: lane must be a Lane or None");
            return NULL;
        }
        lane = (LaneObject *)args[2];
        if (!lane->armed)
            lane = NULL;
    }
    LaneObject *run_lane = lane; /* `lane` goes NULL when it stops; its run ends below */
    PyObject *view = args[0];
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[1]);
    if (frame_max == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len, off = 0;
    int anomaly = 0;
    PyObject *items = PyList_New(0), *last_ex = NULL, *last_rk = NULL;
    if (items == NULL)
        goto fail;
    for (;;) {
        int type, channel;
        Py_ssize_t size;
        int got = frame_at(p, n, off, frame_max, &type, &channel, &size);
        if (got <= 0) {
            anomaly = got < 0;
            break;
        }
        Py_ssize_t payload = off + 7, next = payload + size + 1;
        PyObject *item = NULL;
        if (type == FRAME_METHOD && size >= 9 && be32(p + payload) == 0x003C0028) {
            /* Basic.Publish: ticket, exchange, routing key, bits. */
            const unsigned char *m = p + payload;
            Py_ssize_t ex_at = 6, ex_len = m[ex_at];
            Py_ssize_t rk_at = ex_at + 1 + ex_len;
            Py_ssize_t rk_len = rk_at < size ? m[rk_at] : 0;
            Py_ssize_t bits_at = rk_at + 1 + rk_len;
            int htype, hchannel, btype, bchannel;
            Py_ssize_t hsize, bsize;
            int header_in = bits_at < size ? frame_at(p, n, next, frame_max, &htype, &hchannel,
                                                      &hsize)
                                           : -1;
            if (header_in == 0)
                break; /* the rest of a publish is on its way: wait for it (below) */
            if (header_in == 1 && htype == FRAME_HEADER && hchannel == channel && hsize >= 14) {
                const unsigned char *h = p + next + 7;
                Py_ssize_t body_at = next + 7 + hsize + 1;
                uint64_t body_size = be64(h + 4);
                int body_in = frame_at(p, n, body_at, frame_max, &btype, &bchannel, &bsize);
                /* A read that ends inside a publish whose body fits one frame
                 * leaves the whole publish for the next read, so that it
                 * comes whole (the fast path, the lane) rather than as
                 * frames for the general path: what waits is bounded by
                 * frame_max. A larger body's frames go one by one. */
                if (body_in == 0 && body_size > 0 && body_size <= (uint64_t)(frame_max - 8) &&
                    (h[0] << 8 | h[1]) == 60 && header_ok(h, hsize))
                    break; /* (a header Python refuses goes to it at once) */
                if ((h[0] << 8 | h[1]) == 60 && body_size > 0 && body_in == 1 &&
                    btype == FRAME_BODY && bchannel == channel && (uint64_t)bsize == body_size &&
                    !(h[13] & USER_ID_BIT) && header_ok(h, hsize)) {
                    if (lane != NULL && channel == lane->channel &&
                        lane_take(lane, m + ex_at + 1, ex_len, m + rk_at + 1, rk_len,
                                  m[bits_at], h, hsize, p + body_at + 7, bsize)) {
                        off = body_at + 7 + bsize + 1;
                        if (!lane->armed)
                            lane = NULL;
                        continue;
                    }
                    PyObject *ex = reuse_bytes(m + ex_at + 1, ex_len, &last_ex);
                    PyObject *rk = ex ? reuse_bytes(m + rk_at + 1, rk_len, &last_rk) : NULL;
                    PyObject *header = rk ? PyBytes_FromStringAndSize((const char *)h, hsize)
                                          : NULL;
                    PyObject *body = header ? PySequence_GetSlice(view, body_at + 7,
                                                                  body_at + 7 + bsize)
                                            : NULL;
                    if (body == NULL) {
                        Py_XDECREF(ex);
                        Py_XDECREF(rk);
                        Py_XDECREF(header);
                        goto fail;
                    }
                    item = Py_BuildValue("(iiOnNNiNN)", 0, channel, view, off, ex, rk,
                                         (int)m[bits_at], header, body);
                    if (item == NULL)
                        goto fail;
                    next = body_at + 7 + bsize + 1;
                }
            }
        }
        if (item == NULL) {
            PyObject *pv = PySequence_GetSlice(view, payload, payload + size);
            if (pv == NULL)
                goto fail;
            item = Py_BuildValue("(iiN)", type, channel, pv);
            if (item == NULL)
                goto fail;
        }
        if (lane != NULL && lane_stops(lane, type, channel, p + off + 7, next - off - 8))
            lane = NULL;
        if (PyList_Append(items, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        off = next;
    }
    Py_XDECREF(last_ex);
    Py_XDECREF(last_rk);
    PyBuffer_Release(&buf);
    if (run_lane != NULL)
        lane_end_run(run_lane);
    return Py_BuildValue("(NnO)", items, off, anomaly ? Py_True : Py_False);
fail:
    if (run_lane != NULL)
        lane_end_run(run_lane);
    Py_XDECREF(items);
    Py_XDECREF(last_ex);
    Py_XDECREF(last_rk);
    PyBuffer_Release(&buf);
    return NULL;
}

#include "_ack_read.h"    /* AckRead: a subscriber's reads of PUBACKs */
#include "_mqtt_front.h"  /* MqttFront: a client's reads to those without Python */

/* attr_get and attr_set (workers/_attrs.h) from Python: tests/unit/test_attr_places.py. */
static PyObject *
slot_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_get(obj, name: str)");
        return NULL;
    }
    return attr_get(args[0], args[1]);
}

static PyObject *
slot_set(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_set(obj, name: str, value)");
        return NULL;
    }
    return attr_set(args[0], args[1], args[2]) < 0 ? NULL : Py_NewRef(Py_None);
}

/* The subscribe barrier's topic bits (workers/_barrier.h) from Python. */
static PyObject *
read_topics(PyObject *self, PyObject *data)
{
    if (!PyBytes_Check(data)) /* (a read not looked at: every topic) */
        return PyLong_FromUnsignedLongLong(ALL_TOPICS);
    return PyLong_FromUnsignedLongLong(read_topic_bits(
        (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)));
}

static PyObject *
filter_topics(PyObject *self, PyObject *topic_filter)
{
    if (!PyBytes_Check(topic_filter) || PyBytes_GET_SIZE(topic_filter) == 0) {
        PyErr_SetString(PyExc_TypeError, "filter_topics(topic_filter: bytes, not empty)");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(topic_filter_bits(
        (const unsigned char *)PyBytes_AS_STRING(topic_filter), PyBytes_GET_SIZE(topic_filter)));
}

static PyMethodDef methods[] = {
    {"read_topics", read_topics, METH_O,
     "The subscribe barrier's bits of a read's PUBLISH topics (every bit: not bytes, not only PUBLISHes)."},
    {"filter_topics", filter_topics, METH_O,
     "The subscribe barrier's bits of a topic filter (not a shared one's $share/group/)."},
    {"properties_ok", properties_ok, METH_O,
     "Whether a content header payload's basic properties are well formed."},
    {"dedup_key", dedup_key, METH_O,
     "A content header's deduplication key: bytes, None (none) or False (parse it)."},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Split frames; a whole publish is one item."},
    {"deliver_frames", (PyCFunction)(void (*)(void))deliver_frames, METH_FASTCALL,
     "Basic.Deliver, content header and body frames of a message record."},
    {"deliver_run", (PyCFunction)(void (*)(void))deliver_run, METH_FASTCALL,
     "A plain consumer's run of deliveries, frames built from shared memory."},
    {"stat_places", (PyCFunction)(void (*)(void))stat_places, METH_FASTCALL,
     "The statistics' counter places mqtt_read counts in (shm/stats.py)."},
    {"ack_run", (PyCFunction)(void (*)(void))ack_run, METH_FASTCALL,
     "A multiple ack's run of one queue's entries, out of a channel's book."},
    {"slot_get", (PyCFunction)(void (*)(void))slot_get, METH_FASTCALL,
     "obj.name as the C paths read it (workers/_attrs.h): for tests."},
    {"slot_set", (PyCFunction)(void (*)(void))slot_set, METH_FASTCALL,
     "obj.name = value as the C paths write it (workers/_attrs.h): for tests."},
    {"device_gate_audit", device_gate_audit, METH_O,
     "Where true, a DeviceRead's open gate reads its conditions anyway and raises where one fails."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire", "The message path's per-message work: frames in, deliveries out.", -1, methods,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    /* PyCapsule_Import walks attributes from "shoal", a namespace package
     * that has no `shm` attribute until the module is imported: import it. */
    PyObject *atomic_module = PyImport_ImportModule("shoal.shm._atomic");
    if (atomic_module == NULL)
        return NULL;
    PyObject *capsule = PyObject_GetAttrString(atomic_module, "_C_API");
    Py_DECREF(atomic_module);
    if (capsule == NULL)
        return NULL;
    queues_api = (ShoalQueuesAPI *)PyCapsule_GetPointer(capsule, SHOAL_QUEUES_API_CAPSULE);
    Py_DECREF(capsule); /* the module keeps it, and the table is static */
    if (queues_api == NULL)
        return NULL;
    if (queues_api->version != SHOAL_QUEUES_API_VERSION) {
        PyErr_SetString(PyExc_ImportError, "shoal.shm._atomic: another C API version");
        return NULL;
    }
    if (PyType_Ready(&LaneType) < 0)
        return NULL;
    crc_init();
    if (lane_names_init() < 0 || waker_names_init() < 0 || PyType_Ready(&DeviceReadType) < 0 ||
        ack_names_init() < 0 || PyType_Ready(&AckReadType) < 0 || PyType_Ready(&FrontType) < 0 ||
        PyType_Ready(&AckBatchType) < 0 ||
        wp_names_init() < 0 || PyType_Ready(&WatchedPullType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject(m, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DeviceReadType);
    if (PyModule_AddObject(m, "DeviceRead", (PyObject *)&DeviceReadType) < 0) {
        Py_DECREF(&DeviceReadType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "AckRead", (PyObject *)&AckReadType) < 0 ||
        PyModule_AddObjectRef(m, "MqttFront", (PyObject *)&FrontType) < 0 ||
        PyModule_AddObjectRef(m, "AckBatch", (PyObject *)&AckBatchType) < 0 ||
        PyModule_AddObjectRef(m, "WatchedPull", (PyObject *)&WatchedPullType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "RUN_FULL", RUN_FULL) < 0 ||
        PyModule_AddIntConstant(m, "RUN_EMPTY", RUN_EMPTY) < 0 ||
        PyModule_AddIntConstant(m, "RUN_ENTRY", RUN_ENTRY) < 0 ||
        PyModule_AddIntConstant(m, "PULL_IN_PYTHON", PULL_IN_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "PULL_YIELD", PULL_YIELD) < 0 ||
        PyModule_AddIntConstant(m, "PULL_WATCH_LOST", PULL_WATCH_LOST) < 0 ||
        PyModule_AddIntConstant(m, "PULL_ENTRY", PULL_ENTRY) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MSG_PREFIX_SIZE", MSG_PREFIX_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIMED", MSG_TIMED) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIME_SIZE", MSG_TIME_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
