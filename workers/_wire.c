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
 * - write_record: a whole message record written into its arena block.
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
 * the rest starts) or at a frame the Python splitter must decide on
 * (anomaly true).
 */
static PyObject *
scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan(view, frame_max)");
        return NULL;
    }
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
            if (bits_at < size &&
                frame_at(p, n, next, frame_max, &htype, &hchannel, &hsize) == 1 &&
                htype == FRAME_HEADER && hchannel == channel && hsize >= 14) {
                const unsigned char *h = p + next + 7;
                Py_ssize_t body_at = next + 7 + hsize + 1;
                uint64_t body_size = be64(h + 4);
                if ((h[0] << 8 | h[1]) == 60 && body_size > 0 &&
                    frame_at(p, n, body_at, frame_max, &btype, &bchannel, &bsize) == 1 &&
                    btype == FRAME_BODY && bchannel == channel && (uint64_t)bsize == body_size &&
                    !(h[13] & USER_ID_BIT) && header_ok(h, hsize)) {
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
    return Py_BuildValue("(NnO)", items, off, anomaly ? Py_True : Py_False);
fail:
    Py_XDECREF(items);
    Py_XDECREF(last_ex);
    Py_XDECREF(last_rk);
    PyBuffer_Release(&buf);
    return NULL;
}

/* ------------------------------------------------ message records in shared memory */

/* A message record (shm/layout.py): MSG_PREFIX "<BBHIQ" (exchange length,
 * routing key length, flags, properties length, body length), then the
 * exchange, the routing key, the properties, the body, and MSG_TIME "<qq"
 * when flags has MSG_TIMED. shm/layout.py asserts these match. */
#define MSG_PREFIX_SIZE 16
#define MSG_TIMED 2
#define MSG_TIME_SIZE 16

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

/*
 * deliver_frames(buf, record, channel, consumer_tag, delivery_tag,
 *                redelivered, frame_max) -> (frames, body length)
 *
 * The Basic.Deliver method frame, the content header frame (the properties
 * as the publisher sent them) and the body in frames of at most frame_max
 * bytes, as one bytes object, from the message record at `record` in `buf`
 * (the caller holds the entry: the record cannot change under us).
 * consumer_tag is a short string with its length byte.
 */
static PyObject *
deliver_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "deliver_frames(buf, record, channel, consumer_tag, "
                                         "delivery_tag, redelivered, frame_max)");
        return NULL;
    }
    Py_ssize_t record = PyLong_AsSsize_t(args[1]);
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
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *base = buf.buf;
    if (record < 0 || record > buf.len - MSG_PREFIX_SIZE) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_IndexError, "record out of range");
        return NULL;
    }
    const unsigned char *r = base + record;
    Py_ssize_t ex_len = r[0], rk_len = r[1];
    Py_ssize_t props_len = le32(r + 4);
    uint64_t body_len = le64(r + 8);
    Py_ssize_t room = buf.len - record - MSG_PREFIX_SIZE;
    if ((uint64_t)ex_len + rk_len + props_len + body_len > (uint64_t)room) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_IndexError, "record lengths out of range");
        return NULL;
    }
    const unsigned char *ex = r + MSG_PREFIX_SIZE, *rk = ex + ex_len, *props = rk + rk_len;
    const unsigned char *body = props + props_len;
    Py_ssize_t method_len = 4 + ctag_len + 8 + 1 + 1 + ex_len + 1 + rk_len;
    Py_ssize_t step = frame_max - 8;
    Py_ssize_t body_frames = (Py_ssize_t)((body_len + step - 1) / step);
    Py_ssize_t total = 8 + method_len + 8 + props_len + body_frames * 8 + (Py_ssize_t)body_len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
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
    PyBuffer_Release(&buf);
    PyObject *result = Py_BuildValue("(NK)", out, (unsigned long long)body_len);
    return result;
}

/*
 * write_record(buf, record, exchange, routing_key, properties, body,
 *              published, expires) -> int
 *
 * A whole message record at `record` in `buf` (a block just allocated for
 * it); published and expires (ms) are written as MSG_TIME, and the record
 * flagged MSG_TIMED, unless published is -1. Returns the record's size.
 */
static PyObject *
write_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "write_record(buf, record, exchange, routing_key, "
                                         "properties, body, published, expires)");
        return NULL;
    }
    Py_ssize_t record = PyLong_AsSsize_t(args[1]);
    long long published = PyLong_AsLongLong(args[6]);
    long long expires = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer buf, parts[4];
    int got = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(args[2 + got], &parts[got], PyBUF_SIMPLE) < 0)
            goto done;
    if (parts[0].len > 255 || parts[1].len > 255 || parts[2].len > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "exchange, routing key or properties too long");
        goto done;
    }
    Py_ssize_t size = MSG_PREFIX_SIZE + parts[0].len + parts[1].len + parts[2].len +
                      parts[3].len + (published >= 0 ? MSG_TIME_SIZE : 0);
    if (record < 0 || size > buf.len - record) {
        PyErr_SetString(PyExc_IndexError, "record out of range");
        goto done;
    }
    unsigned char *o = (unsigned char *)buf.buf + record;
    o[0] = (unsigned char)parts[0].len;
    o[1] = (unsigned char)parts[1].len;
    put_le(o + 2, published >= 0 ? MSG_TIMED : 0, 2);
    put_le(o + 4, (uint64_t)parts[2].len, 4);
    put_le(o + 8, (uint64_t)parts[3].len, 8);
    o += MSG_PREFIX_SIZE;
    for (int i = 0; i < 4; i++) {
        memcpy(o, parts[i].buf, parts[i].len);
        o += parts[i].len;
    }
    if (published >= 0) {
        put_le(o, (uint64_t)published, 8);
        put_le(o + 8, (uint64_t)expires, 8);
    }
    result = PyLong_FromSsize_t(size);
done:
    while (got-- > 0)
        PyBuffer_Release(&parts[got]);
    PyBuffer_Release(&buf);
    return result;
}


/* Message deduplication (workers/dedup.py): the key of a content header
 * whose properties are well formed (properties_ok). b"s" + the bytes of its
 * x-deduplication-header when that is a long string and no x-cache-ttl
 * header is there (broker/amqp/dedup.py message_key gives the same key);
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

static PyMethodDef methods[] = {
    {"properties_ok", properties_ok, METH_O,
     "Whether a content header payload's basic properties are well formed."},
    {"dedup_key", dedup_key, METH_O,
     "A content header's deduplication key: bytes, None (none) or False (parse it)."},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Split frames; a whole publish is one item."},
    {"deliver_frames", (PyCFunction)(void (*)(void))deliver_frames, METH_FASTCALL,
     "Basic.Deliver, content header and body frames of a message record."},
    {"write_record", (PyCFunction)(void (*)(void))write_record, METH_FASTCALL,
     "Write a whole message record."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire", "The message path's per-message work: frames in, deliveries out.", -1, methods,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MSG_PREFIX_SIZE", MSG_PREFIX_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIMED", MSG_TIMED) < 0 ||
        PyModule_AddIntConstant(m, "MSG_TIME_SIZE", MSG_TIME_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
