/* An MQTT client's socket reads handed to its DeviceRead or AckRead
 * without a Python frame (workers/mqtt_front.py, issue 41's fan-in).
 *
 * A device's read went: uvloop -> MqttConnection.data_received (Python) ->
 * device_run (Python) -> DeviceRead.read (C). Both frames did little (the
 * read's time, the fast path's hand-over, the result's test) but ran the
 * interpreter on every read of a thousand connections, cold each time.
 * MqttFront is the socket's protocol instead (plain TCP; TLS and WebSocket
 * transports call MqttConnection.data_received, which calls the front):
 * data_received runs the fast read in C, and calls Python only for what
 * the fast read leaves (`rest`: MqttConnection._read, Python's path), for
 * a run Python must count (`counted`) and for a failure (`failed`). Its
 * other protocol methods are the connection's.
 *
 * Included by _wire.c after _lane_device.h and _ack_read.h; part of that
 * module. */

#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *conn;    /* the MqttConnection */
    PyObject *fast;    /* its DeviceRead or AckRead, or NULL: Python's path */
    PyObject *rest;    /* rest(conn, data): Python's path for a read */
    PyObject *counted; /* counted(conn, run) -> int: a run Python counts */
    PyObject *failed;  /* failed(conn, exc): the fast read raised exc */
    Py_ssize_t long_read; /* a read this long is a long one (LONG_READ) */
    unsigned long sets;   /* `fast` set from Python (a close sets None): counted */
    /* When the last fast read came (time.monotonic's clock): the keep-alive's
     * (MqttConnection._connect_timeout), here and not in the connection's
     * last_recv, so that a fast read leaves that cold object alone. */
    double last_fast;
    /* This worker's P_SUBSCRIBING and H_SUBSCRIBED_AT (or NULL): a read that
     * starts with a SUBSCRIBE's first byte raises the word here, before any
     * Python runs (SubscribeBarrier.begin takes it over, or `unclaimed`
     * drops it), so that no other worker finds this socket read and the
     * word still down (shm/subscribe_barrier.py). */
    uint64_t *subscribing;
    uint64_t *subscribed_at;
    /* The worker's AckBatch and the socket's transport (a plain TCP one:
     * batch_with()), and the PUBACKs its DeviceRead's reads hold for the
     * batch's flush (workers/_ack_defer.h). */
    AckBatchObject *batch;
    PyObject *transport;
    AckHold hold;
} FrontObject;

/* The PUBACKs the front holds, written (nothing held: nothing). A write
 * that fails is the transport's to report (its connection ends): the
 * PUBACKs are moot then. */
static void
front_flush_acks(FrontObject *f)
{
    if (f->hold.len == 0)
        return;
    PyObject *packets = PyBytes_FromStringAndSize((const char *)f->hold.p, f->hold.len);
    f->hold.len = 0;
    PyObject *w = packets == NULL ? NULL : PyObject_CallMethodOneArg(f->transport, names.write, packets);
    Py_XDECREF(packets);
    if (w == NULL)
        PyErr_Clear();
    Py_XDECREF(w);
}

/* flush() (AckBatch's, the ready queue's callback): every front's held
 * PUBACKs written. */
static PyObject *
AckBatch_flush(AckBatchObject *b, PyObject *unused)
{
    b->scheduled = 0;
    b->flushes++;
    PyObject *fronts = b->pending, *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    b->pending = fresh;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fronts); i++)
        front_flush_acks((FrontObject *)PyList_GET_ITEM(fronts, i));
    Py_DECREF(fronts);
    Py_RETURN_NONE;
}

static void
front_subscribe_read(FrontObject *f)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, none = 0;
    /* Its filters unknown yet: every topic, before the start (the word
     * before P_SUBSCRIBING: P_SUBSCRIBE_TOPICS; narrowed once the read that
     * brought it is decoded, SubscribeBarrier.narrow). */
    __atomic_store_n(f->subscribing - 1, ~0ULL, __ATOMIC_SEQ_CST);
    __atomic_compare_exchange_n(f->subscribing, &none, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    __atomic_store_n(f->subscribed_at, now, __ATOMIC_SEQ_CST);
}

/* The fast read of `data` (non-empty): bytes taken, or -1 with an error. */
static Py_ssize_t
front_fast_read(FrontObject *f, PyObject *fast, PyObject *data)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* (time.monotonic's clock) */
    f->last_fast = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    PyObject *args[2] = {data, PyBytes_GET_SIZE(data) >= f->long_read ? Py_True : Py_False};
    PyObject *r;
    if (Py_IS_TYPE(fast, &DeviceReadType)) {
        DeviceReadObject *d = (DeviceReadObject *)fast;
        if (f->batch != NULL) { /* its PUBACKs held behind the turn's deliveries */
            d->defer_batch = f->batch;
            d->defer_hold = &f->hold;
            d->defer_owner = (PyObject *)f;
        }
        r = DeviceRead_read(d, args, 2);
        d->defer_batch = NULL;
        d->defer_hold = NULL;
        d->defer_owner = NULL;
    } else
        r = AckRead_read((AckReadObject *)fast, args, 2);
    if (r != NULL && !PyLong_CheckExact(r)) { /* a run its Python counts */
        PyObject *c = PyObject_CallFunctionObjArgs(f->counted, f->conn, r, NULL);
        Py_DECREF(r);
        r = c;
    }
    if (r == NULL)
        return -1;
    Py_ssize_t taken = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (taken < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "a fast read took less than nothing");
    return taken;
}

static PyObject *
Front_data_received(FrontObject *f, PyObject *data)
{
    PyObject *fast = f->fast;
    if (f->subscribing != NULL && PyBytes_CheckExact(data) && PyBytes_GET_SIZE(data) > 0 &&
        (unsigned char)PyBytes_AS_STRING(data)[0] == 0x82)
        front_subscribe_read(f);
    if (fast == NULL || !PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) == 0)
        return PyObject_CallFunctionObjArgs(f->rest, f->conn, data, NULL);
    f->fast = NULL; /* (until a read it takes whole again; its reference is ours) */
    unsigned long sets = f->sets;
    Py_ssize_t taken = front_fast_read(f, fast, data);
    if (taken < 0) {
        Py_DECREF(fast);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        if (value == NULL)
            return NULL;
        PyObject *r = PyObject_CallFunctionObjArgs(f->failed, f->conn, value, NULL);
        Py_DECREF(value);
        return r;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    if (taken >= len) {
        if (f->fast == NULL && f->sets == sets)
            f->fast = fast; /* the next read goes the same way */
        else
            Py_DECREF(fast); /* (Python set `fast` during the read: a close's None stands) */
        Py_RETURN_NONE;
    }
    Py_DECREF(fast);
    if (taken == 0)
        return PyObject_CallFunctionObjArgs(f->rest, f->conn, data, NULL);
    PyObject *left = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + taken, len - taken);
    if (left == NULL)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(f->rest, f->conn, left, NULL);
    Py_DECREF(left);
    return r;
}

/* The connection's own method `name`, with the arguments given. */
static PyObject *
front_forward(FrontObject *f, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *method = PyObject_GetAttrString(f->conn, name);
    if (method == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(method, args, (size_t)nargs, NULL);
    Py_DECREF(method);
    return r;
}

/* The protocol methods that are the connection's own. */
#define FRONT_FORWARD_ONE(name)                                                                \
    static PyObject *Front_##name(FrontObject *f, PyObject *arg)                               \
    {                                                                                          \
        return front_forward(f, #name, &arg, 1);                                               \
    }
#define FRONT_FORWARD_NONE(name)                                                               \
    static PyObject *Front_##name(FrontObject *f, PyObject *unused)                            \
    {                                                                                          \
        return front_forward(f, #name, NULL, 0);                                               \
    }
FRONT_FORWARD_ONE(connection_made)

static PyObject *
Front_connection_lost(FrontObject *f, PyObject *exc)
{
    f->hold.len = 0; /* (its client reads nothing more) */
    return front_forward(f, "connection_lost", &exc, 1);
}
FRONT_FORWARD_NONE(eof_received)
FRONT_FORWARD_NONE(pause_writing)
FRONT_FORWARD_NONE(resume_writing)

static PyObject *
Front_get_fast(FrontObject *f, void *closure)
{
    return Py_NewRef(f->fast != NULL ? f->fast : Py_None);
}

static int
Front_set_fast(FrontObject *f, PyObject *v, void *closure)
{
    f->sets++;
    if (v == NULL || v == Py_None) {
        Py_CLEAR(f->fast);
        return 0;
    }
    if (!Py_IS_TYPE(v, &DeviceReadType) && !Py_IS_TYPE(v, &AckReadType)) {
        PyErr_SetString(PyExc_TypeError, "fast: a DeviceRead, an AckRead or None");
        return -1;
    }
    Py_XSETREF(f->fast, Py_NewRef(v));
    return 0;
}

/* batch_with(batch, transport): the worker's AckBatch its DeviceRead's
 * PUBACKs are held for, and the transport they go to (a plain TCP one:
 * workers/mqtt_front.py install). */
static PyObject *
Front_batch_with(FrontObject *f, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !Py_IS_TYPE(args[0], &AckBatchType)) {
        PyErr_SetString(PyExc_TypeError, "batch_with(batch: AckBatch, transport)");
        return NULL;
    }
    front_flush_acks(f);
    Py_XSETREF(f->batch, (AckBatchObject *)Py_NewRef(args[0]));
    Py_XSETREF(f->transport, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* flush_acks(): the PUBACKs held, written now (before any other write to
 * the client: MqttConnection.send and _flush). */
static PyObject *
Front_flush_acks(FrontObject *f, PyObject *unused)
{
    front_flush_acks(f);
    Py_RETURN_NONE;
}

static PyObject *
Front_get_acks_held(FrontObject *f, void *closure)
{
    return PyLong_FromSsize_t(f->hold.len);
}

/* MqttFront(conn, rest, counted, failed, long_read[, atomic, subscribing, subscribed_at]):
 * the last three SubscribeBarrier.front_words (the word before `subscribing`
 * is the worker's P_SUBSCRIBE_TOPICS). */
static int
Front_init(FrontObject *f, PyObject *args, PyObject *kwds)
{
    PyObject *conn, *rest, *counted, *failed, *atomic = NULL;
    Py_ssize_t long_read, subscribing = 0, subscribed_at = 0;
    if (!PyArg_ParseTuple(args, "OOOOn|Onn:MqttFront", &conn, &rest, &counted, &failed, &long_read,
                          &atomic, &subscribing, &subscribed_at))
        return -1;
    f->subscribing = f->subscribed_at = NULL;
    if (atomic != NULL && atomic != Py_None) {
        /* (the word before it too: its SUBSCRIBEs' topics, P_SUBSCRIBE_TOPICS) */
        f->subscribing = queues_api->word(atomic, subscribing - 8) == NULL
                             ? NULL
                             : queues_api->word(atomic, subscribing);
        f->subscribed_at = f->subscribing == NULL ? NULL : queues_api->word(atomic, subscribed_at);
        if (f->subscribed_at == NULL)
            return -1;
    }
    Py_XSETREF(f->conn, Py_NewRef(conn));
    Py_XSETREF(f->rest, Py_NewRef(rest));
    Py_XSETREF(f->counted, Py_NewRef(counted));
    Py_XSETREF(f->failed, Py_NewRef(failed));
    Py_CLEAR(f->fast);
    ack_hold_free(&f->hold);
    f->long_read = long_read;
    f->last_fast = 0.0;
    return 0;
}

#define FRONT_OBJECTS(X) X(conn) X(fast) X(rest) X(counted) X(failed) X(batch) X(transport)

static int
Front_traverse(FrontObject *f, visitproc visit, void *arg)
{
#define FRONT_VISIT(name) Py_VISIT(f->name);
    FRONT_OBJECTS(FRONT_VISIT)
    return 0;
}

static int
Front_clear(FrontObject *f)
{
#define FRONT_CLEAR(name) Py_CLEAR(f->name);
    FRONT_OBJECTS(FRONT_CLEAR)
    return 0;
}

static void
Front_dealloc(FrontObject *f)
{
    PyObject_GC_UnTrack(f);
    Front_clear(f);
    ack_hold_free(&f->hold);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyMethodDef Front_methods[] = {
    {"data_received", (PyCFunction)Front_data_received, METH_O,
     "A read: the fast read's first, then Python's path for what it leaves."},
    {"connection_made", (PyCFunction)Front_connection_made, METH_O, "The connection's."},
    {"connection_lost", (PyCFunction)Front_connection_lost, METH_O, "The connection's."},
    {"eof_received", (PyCFunction)Front_eof_received, METH_NOARGS, "The connection's."},
    {"pause_writing", (PyCFunction)Front_pause_writing, METH_NOARGS, "The connection's."},
    {"batch_with", (PyCFunction)(void (*)(void))Front_batch_with, METH_FASTCALL,
     "The worker's AckBatch and this socket's transport: its PUBACKs held to the turn's end."},
    {"flush_acks", (PyCFunction)Front_flush_acks, METH_NOARGS,
     "The PUBACKs held, written now (before another write to the client)."},
    {"resume_writing", (PyCFunction)Front_resume_writing, METH_NOARGS, "The connection's."},
    {NULL, NULL, 0, NULL},
};

static PyObject *
Front_get_last_fast_read(FrontObject *f, void *closure)
{
    return PyFloat_FromDouble(f->last_fast);
}

static PyGetSetDef Front_getset[] = {
    {"fast", (getter)Front_get_fast, (setter)Front_set_fast,
     "The DeviceRead or AckRead the next read goes to first (None: Python's path).", NULL},
    {"acks_held", (getter)Front_get_acks_held, NULL,
     "Bytes of PUBACKs held for the AckBatch's flush.", NULL},
    {"last_fast_read", (getter)Front_get_last_fast_read, NULL,
     "When the last fast read came, time.monotonic()'s clock (0.0: none yet).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.workers._wire.MqttFront",
    .tp_basicsize = sizeof(FrontObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An MQTT client's socket protocol: its reads in C first (workers/_mqtt_front.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Front_init,
    .tp_traverse = (traverseproc)Front_traverse,
    .tp_clear = (inquiry)Front_clear,
    .tp_dealloc = (destructor)Front_dealloc,
    .tp_methods = Front_methods,
    .tp_getset = Front_getset,
};
