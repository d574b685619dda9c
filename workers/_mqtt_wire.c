/* An MQTT client's deliveries in C (workers/mqtt_outbound.py, Outbound.run).
 *
 * The MQTT bridge consumes through an inner AMQP connection, whose runs of
 * deliveries (workers/delivery.py deliver_run) are written as frames into
 * the bridge's buffer. Read back in Python, each cost a str per consumer
 * tag, exchange and routing key, a Delivered tuple, a properties lookup, a
 * plan lookup and a PUBLISH head: most of a fan-out's CPU per delivery.
 * Here a run of whole deliveries whose (queue, routing key, properties) the
 * bridge has planned before (`plans`) becomes PUBLISH packets in one call:
 * QoS 0 and 1, no 5.0 properties, no topic alias, not redelivered. Anything
 * else (another frame, a delivery not planned or planned as None, a body in
 * several frames or above BIG_BODY, a redelivery, no free packet id) ends the
 * run where it is, untouched: Python's path takes it, and teaches the plan
 * (`miss`); so does a run's size past RUN_BYTES (the caller calls again).
 *
 * The other way (workers/mqtt_inbound.py, Inbound.publish_run): a run of a
 * device's plain PUBLISHes in one read (QoS 0 or 1, not retained, no 5.0
 * properties, to a topic it published to before) becomes the inner AMQP
 * connection's basic.publish, content header and body frames in one call;
 * the packet ids come back for the confirms. It stops, untouched, at any
 * other packet, a packet not whole in the read, a malformed or oversized
 * one, or a body that does not fit one frame: Python's path takes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_mqtt_publish.h" /* a plain PUBLISH's parse: one definition */

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_END 0xCE
#define PUBLISH_TYPE 0x30
#define MAX_PACKET_ID 65535
/* A run's packets stop at about RUN_BYTES, and a body above BIG_BODY goes
 * through Python: the buffer below, kept for the process's life, stays
 * small whatever sizes messages have (a large body gains little here). */
#define RUN_BYTES (256 * 1024)
#define BIG_BODY (64 * 1024)

static unsigned char *out_buf; /* the run's packets, copied out once; one per process */
static Py_ssize_t out_cap;

static int
out_room(Py_ssize_t need)
{
    if (need <= out_cap)
        return 0;
    Py_ssize_t cap = out_cap ? out_cap : 65536;
    while (cap < need)
        cap *= 2;
    unsigned char *grown = PyMem_Realloc(out_buf, cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    out_buf = grown;
    out_cap = cap;
    return 0;
}

/* The run's first `used` bytes of out_buf as bytes, or None for none. */
static PyObject *
run_taken(Py_ssize_t used)
{
    if (!used)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)out_buf, used);
}

static uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* The buffer argument, with `at` inside it: 0, or -1 with an error set. */
static int
open_buffer(PyObject *obj, Py_ssize_t at, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (at < 0 || at > view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_IndexError, "at out of range");
        return -1;
    }
    return 0;
}

/* A run's buffer from `at` on, and the new list it fills: 0, or -1 with
 * nothing held and the exception set. */
static int
open_run(PyObject *obj, Py_ssize_t at, Py_buffer *view, PyObject **list)
{
    if (open_buffer(obj, at, view) < 0)
        return -1;
    *list = PyList_New(0);
    if (*list == NULL) {
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The frame at `off`: 1 and its type and payload (start, size) when it is
 * whole in the buffer and ends with its end octet, else 0. */
static int
frame_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t off, int *type, Py_ssize_t *payload,
         Py_ssize_t *size)
{
    if (n - off < 8)
        return 0;
    Py_ssize_t s = be32(p + off + 3);
    if (n - off - 8 < s || p[off + 7 + s] != FRAME_END)
        return 0;
    *type = p[off];
    *payload = off + 7;
    *size = s;
    return 1;
}

/* A delivery's parts, parsed from a basic.deliver frame at `at` and the
 * header and body frames behind it. */
typedef struct {
    const unsigned char *ctag, *rk, *props, *body;
    Py_ssize_t ctag_len, rk_len, props_len, body_len;
    uint64_t tag;
    int redelivered;
    Py_ssize_t next; /* where the frame after its body starts */
} Delivery;

/* 1 when a whole delivery (its body in one frame, or none) starts at `at`. */
static int
delivery_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t at, Delivery *d)
{
    int type;
    Py_ssize_t m, size;
    if (!frame_at(p, n, at, &type, &m, &size) || type != FRAME_METHOD || size < 4 + 1 + 9 + 2)
        return 0;
    if (memcmp(p + m, "\x00\x3c\x00\x3c", 4) != 0)
        return 0;
    Py_ssize_t end = m + size, i = m + 4;
    d->ctag_len = p[i];
    d->ctag = p + i + 1;
    i += 1 + d->ctag_len;
    if (i + 9 + 1 > end)
        return 0;
    d->tag = be64(p + i);
    d->redelivered = p[i + 8] & 1;
    i += 9;
    i += 1 + p[i]; /* the exchange: not part of a plan */
    if (i + 1 > end)
        return 0;
    d->rk_len = p[i];
    d->rk = p + i + 1;
    if (i + 1 + d->rk_len > end)
        return 0;
    Py_ssize_t h, hsize;
    Py_ssize_t at2 = end + 1;
    if (!frame_at(p, n, at2, &type, &h, &hsize) || type != FRAME_HEADER || hsize < 14)
        return 0;
    uint64_t body_size = be64(p + h + 4);
    d->props = p + h + 12;
    d->props_len = hsize - 12;
    Py_ssize_t at3 = h + hsize + 1;
    if (!body_size) {
        d->body = p + at3;
        d->body_len = 0;
        d->next = at3;
        return 1;
    }
    Py_ssize_t b, bsize;
    if (!frame_at(p, n, at3, &type, &b, &bsize) || type != FRAME_BODY ||
        (uint64_t)bsize != body_size)
        return 0;
    d->body = p + b;
    d->body_len = bsize;
    d->next = b + bsize + 1;
    return 1;
}

/* A plan's key: the queue (consumer tag), the routing key and the
 * properties as they were published, each after its length. */
static PyObject *
plan_key(const Delivery *d)
{
    Py_ssize_t size = 1 + d->ctag_len + 1 + d->rk_len + d->props_len;
    PyObject *key = PyBytes_FromStringAndSize(NULL, size);
    if (key == NULL)
        return NULL;
    unsigned char *k = (unsigned char *)PyBytes_AS_STRING(key);
    *k++ = (unsigned char)d->ctag_len;
    memcpy(k, d->ctag, d->ctag_len);
    k += d->ctag_len;
    *k++ = (unsigned char)d->rk_len;
    memcpy(k, d->rk, d->rk_len);
    k += d->rk_len;
    memcpy(k, d->props, d->props_len);
    return key;
}

/* A free packet id from *next on (not a key of `unacked`), recorded there
 * with the delivery's tag: the id, 0 where none is free, -1 on error. */
static long
take_packet_id(PyObject *unacked, long *next, uint64_t tag)
{
    for (int tries = 0; tries < MAX_PACKET_ID; tries++) {
        long id = *next;
        *next = id % MAX_PACKET_ID + 1;
        PyObject *key = PyLong_FromLong(id);
        if (key == NULL)
            return -1;
        int taken = PyDict_Contains(unacked, key);
        if (taken == 0) {
            PyObject *value = PyLong_FromUnsignedLongLong(tag);
            int failed = value == NULL || PyDict_SetItem(unacked, key, value) < 0;
            Py_XDECREF(value);
            Py_DECREF(key);
            return failed ? -1 : id;
        }
        Py_DECREF(key);
        if (taken < 0)
            return -1;
    }
    return 0;
}

/*
 * deliveries(buffer, at, plans, unacked, next_id, level5)
 *     -> (at, next_id, packets, miss)
 *
 * plans: key (plan_key) -> (topic bytes, QoS 0 or 1, retain) or None;
 * unacked: the QoS 1 PUBLISHes' packet id -> delivery tag (Outbound's);
 * packets: the run's PUBLISHes as one bytes object, or None; miss: the key
 * of the whole delivery at `at` that no plan knows (Python delivers it and
 * learns it), or None.
 */
static PyObject *
deliveries(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "deliveries(buffer, at, plans, unacked, next_id, level5)");
        return NULL;
    }
    PyObject *plans = args[2], *unacked = args[3];
    if (!PyDict_Check(plans) || !PyDict_Check(unacked)) {
        PyErr_SetString(PyExc_TypeError, "plans and unacked must be dicts");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    long next_id = PyLong_AsLong(args[4]);
    int level5 = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || level5 < 0)
        return NULL;
    if (next_id < 1 || next_id > MAX_PACKET_ID) {
        PyErr_SetString(PyExc_ValueError, "next_id out of range");
        return NULL;
    }
    Py_buffer view;
    if (open_buffer(args[0], at, &view) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len;
    Py_ssize_t used = 0;
    PyObject *miss = NULL;
    Delivery d;
    while (used < RUN_BYTES && delivery_at(p, n, at, &d) && !d.redelivered &&
           d.body_len <= BIG_BODY) {
        PyObject *key = plan_key(&d);
        if (key == NULL)
            goto error;
        PyObject *plan = PyDict_GetItemWithError(plans, key); /* borrowed */
        if (plan == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                goto error;
            }
            miss = key;
            break;
        }
        Py_DECREF(key);
        if (plan == Py_None || !PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 3)
            break;
        PyObject *topic = PyTuple_GET_ITEM(plan, 0);
        long qos = PyLong_AsLong(PyTuple_GET_ITEM(plan, 1));
        int retain = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 2));
        if (PyErr_Occurred() || retain < 0)
            goto error;
        if (!PyBytes_Check(topic) || PyBytes_GET_SIZE(topic) > 0xFFFF || qos < 0 || qos > 1)
            break;
        Py_ssize_t tlen = PyBytes_GET_SIZE(topic);
        Py_ssize_t remaining = 2 + tlen + (qos ? 2 : 0) + (level5 ? 1 : 0) + d.body_len;
        if (remaining > 268435455)
            break;
        if (out_room(used + 1 + 4 + remaining) < 0)
            goto error;
        long id = 0;
        if (qos) {
            id = take_packet_id(unacked, &next_id, d.tag);
            if (id < 0)
                goto error;
            if (id == 0)
                break; /* none free: Python's path says so */
        }
        unsigned char *o = out_buf + used;
        *o++ = PUBLISH_TYPE | (unsigned char)(qos << 1) | (retain ? 1 : 0);
        Py_ssize_t r = remaining;
        do {
            unsigned char b = r & 0x7F;
            r >>= 7;
            *o++ = r ? (b | 0x80) : b;
        } while (r);
        *o++ = (unsigned char)(tlen >> 8);
        *o++ = (unsigned char)tlen;
        memcpy(o, PyBytes_AS_STRING(topic), tlen);
        o += tlen;
        if (qos) {
            *o++ = (unsigned char)(id >> 8);
            *o++ = (unsigned char)id;
        }
        if (level5)
            *o++ = 0; /* no properties */
        memcpy(o, d.body, d.body_len);
        o += d.body_len;
        used = o - out_buf;
        at = d.next;
    }
    PyBuffer_Release(&view);
    PyObject *packets = run_taken(used);
    if (packets == NULL) {
        Py_XDECREF(miss);
        return NULL;
    }
    if (miss == NULL) {
        miss = Py_None;
        Py_INCREF(miss);
    }
    return Py_BuildValue("(nlNN)", at, next_id, packets, miss);

error:
    PyBuffer_Release(&view);
    return NULL;
}

/* The content header frame's start (type, channel 1, size, class 60,
 * weight 0, body size) and, behind its properties, its end octet. */
static unsigned char *
put_header(unsigned char *o, PyObject *props, Py_ssize_t body_len)
{
    Py_ssize_t plen = PyBytes_GET_SIZE(props);
    uint32_t size = (uint32_t)(12 + plen);
    uint64_t b = (uint64_t)body_len;
    *o++ = FRAME_HEADER;
    *o++ = 0;
    *o++ = 1;
    for (int i = 3; i >= 0; i--)
        *o++ = (unsigned char)(size >> (8 * i));
    *o++ = 0;
    *o++ = 60;
    *o++ = 0;
    *o++ = 0;
    for (int i = 7; i >= 0; i--)
        *o++ = (unsigned char)(b >> (8 * i));
    memcpy(o, PyBytes_AS_STRING(props), plen);
    o += plen;
    *o++ = FRAME_END;
    return o;
}

/*
 * publishes(data, at, topics, props0, props1, level5, max_packet, frame_max)
 *     -> (at, frames, ids)
 *
 * topics: topic bytes -> (routing key, basic.publish method frame) (Inbound's
 * plain_topics); props0, props1: the content header properties of a QoS 0
 * and a QoS 1 publish, or None (such a publish ends the run); frames: the
 * run's AMQP frames as one bytes object, or None; ids: each publish's
 * packet id, 0 for QoS 0, in order.
 */
static PyObject *
publishes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "publishes(data, at, topics, props0, props1, level5, max_packet, frame_max)");
        return NULL;
    }
    PyObject *topics = args[2], *props0 = args[3], *props1 = args[4];
    if (!PyDict_Check(topics) || (props0 != Py_None && !PyBytes_Check(props0)) ||
        (props1 != Py_None && !PyBytes_Check(props1))) {
        PyErr_SetString(PyExc_TypeError, "topics must be a dict, props0 and props1 bytes or None");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_packet = PyLong_AsSsize_t(args[6]);
    Py_ssize_t frame_max = PyLong_AsSsize_t(args[7]);
    int level5 = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || level5 < 0)
        return NULL;
    Py_buffer view;
    PyObject *ids;
    if (open_run(args[0], at, &view, &ids) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len;
    Py_ssize_t used = 0;
    PlainPublish pub;
    while (used < RUN_BYTES && plain_publish_at(p, n, at, level5, max_packet, &pub)) {
        int qos = pub.qos;
        long id = pub.id;
        Py_ssize_t body_len = pub.body_len;
        PyObject *props = qos ? props1 : props0;
        if (props == Py_None || body_len > BIG_BODY || body_len > frame_max - 8)
            break;
        int lookup_failed;
        PyObject *method = plain_publish_known(topics, &pub, 1, &lookup_failed); /* its frame */
        if (method == NULL) {
            if (lookup_failed)
                goto error;
            break;
        }
        Py_ssize_t mlen = PyBytes_GET_SIZE(method);
        Py_ssize_t size = mlen + 8 + 12 + PyBytes_GET_SIZE(props) + (body_len ? 8 + body_len : 0);
        PyObject *pid = PyLong_FromLong(id);
        Py_INCREF(method); /* (held while the id is appended: the dict is the caller's) */
        int failed = pid == NULL || out_room(used + size) < 0 || PyList_Append(ids, pid) < 0;
        Py_XDECREF(pid);
        if (failed) {
            Py_DECREF(method);
            goto error;
        }
        unsigned char *o = out_buf + used;
        memcpy(o, PyBytes_AS_STRING(method), mlen);
        Py_DECREF(method);
        o = put_header(o + mlen, props, body_len);
        if (body_len) {
            *o++ = FRAME_BODY;
            *o++ = 0;
            *o++ = 1;
            for (int b = 3; b >= 0; b--)
                *o++ = (unsigned char)((uint32_t)body_len >> (8 * b));
            memcpy(o, pub.body, body_len);
            o += body_len;
            *o++ = FRAME_END;
        }
        used = o - out_buf;
        at = pub.next;
    }
    PyBuffer_Release(&view);
    PyObject *frames = run_taken(used);
    if (frames == NULL) {
        Py_DECREF(ids);
        return NULL;
    }
    return Py_BuildValue("(nNN)", at, frames, ids);

error:
    PyBuffer_Release(&view);
    Py_DECREF(ids);
    return NULL;
}

/* pubacks(data, at, unacked, nothing) -> (at, tags)
 *
 * A subscriber's read's leading run of PUBACKs with success in their short
 * form (3.1.1's, and 5.0's without a reason code: 0x40 0x02 id): each id's
 * delivery tag popped from `unacked` (packet id -> tag, the Outbound's), the
 * tags that are not `nothing` (a retained message's: no delivery to ack) in
 * order. An unknown id is nothing, as Outbound.puback has it. It stops at any
 * other packet, a PUBACK with id 0 (malformed: the decoder says so) or one
 * not whole here: the packet loop takes the rest. */
static PyObject *
pubacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pubacks(data, at, unacked, nothing)");
        return NULL;
    }
    PyObject *unacked = args[2], *nothing = args[3];
    if (!PyDict_Check(unacked)) {
        PyErr_SetString(PyExc_TypeError, "unacked must be a dict");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    PyObject *tags;
    if (open_run(args[0], at, &view, &tags) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len;
    while (n - at >= 4 && p[at] == 0x40 && p[at + 1] == 2) {
        long id = ((long)p[at + 2] << 8) | p[at + 3];
        if (!id)
            break;
        PyObject *key = PyLong_FromLong(id);
        if (key == NULL)
            goto error;
        PyObject *tag = PyDict_GetItemWithError(unacked, key); /* borrowed */
        if (tag != NULL) {
            Py_INCREF(tag);
            int failed = PyDict_DelItem(unacked, key) < 0;
            int wanted = !failed ? PyObject_RichCompareBool(tag, nothing, Py_NE) : 0;
            failed = failed || wanted < 0 || (wanted && PyList_Append(tags, tag) < 0);
            Py_DECREF(tag);
            if (failed) {
                Py_DECREF(key);
                goto error;
            }
        }
        Py_DECREF(key);
        if (tag == NULL && PyErr_Occurred())
            goto error;
        at += 4;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nN)", at, tags);

error:
    PyBuffer_Release(&view);
    Py_DECREF(tags);
    return NULL;
}

#include "_attrs.h"     /* attribute reads and adds: one definition */
#include "_mqtt_flush.h" /* DeliveryFlush: deliveries from the inner connection's flush */

static PyMethodDef methods[] = {
    {"deliveries", (PyCFunction)(void (*)(void))deliveries, METH_FASTCALL,
     "A run of planned deliveries of the inner AMQP connection as PUBLISH packets."},
    {"publishes", (PyCFunction)(void (*)(void))publishes, METH_FASTCALL,
     "A run of a device's plain PUBLISHes as the inner AMQP connection's frames."},
    {"pubacks", (PyCFunction)(void (*)(void))pubacks, METH_FASTCALL,
     "A subscriber's run of PUBACKs: the delivery tags they settle."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mqtt_wire", "An MQTT client's deliveries and plain publishes between AMQP frames and MQTT packets.", -1, methods,
};

PyMODINIT_FUNC
PyInit__mqtt_wire(void)
{
    if (flush_names_init() < 0 || PyType_Ready(&DeliveryFlushType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "DeliveryFlush", (PyObject *)&DeliveryFlushType) < 0)
        Py_CLEAR(m);
    return m;
}
