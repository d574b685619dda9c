/* A device's PUBACKs held to the end of the loop's turn, behind the
 * deliveries its read made (workers/mqtt_front.py, issue 41's fan-in).
 *
 * A worker woken by several devices reads them one after another, and each
 * read wrote its PUBACK at once: a system call of 5-8 µs (the loopback's TCP,
 * the client's wake-up) before the next device's read. The deliveries those
 * reads made go out after all of them (one write to the subscriber, in the
 * loop's ready queue), so the first device's message waited for every other
 * device's PUBACK: with two to four reads a wake-up, tens of microseconds of
 * fan-in's latency (`perf trace` of a worker: read, write 4 B, read, write 4
 * B, ..., then the delivery's one write).
 *
 * So a DeviceRead called through a plain TCP socket's front appends its
 * PUBACKs to the front's AckHold instead, and the worker's AckBatch writes
 * every front's held PUBACKs in one ready-queue callback: scheduled by the
 * turn's first, it comes after the delivery a watched queue's wake-up
 * scheduled before it (Waker.on_local, workers/worker.py), so that the
 * delivery goes first; the PUBACKs follow in the same turn. Nothing else is
 * written to that socket before them: MqttConnection's writes (send,
 * _flush: every Python write to an MQTT client) write the held PUBACKs
 * first (MqttFront.flush_acks), and a device with a DeviceRead has no
 * deliveries of its own (DeviceRead's conditions). A connection lost drops
 * what it held: its client never reads it.
 *
 * Included by _wire.c before _lane_device.h; AckBatch_flush and the front's
 * side are in _mqtt_front.h. */

typedef struct {
    PyObject_HEAD
    PyObject *pending;   /* fronts holding PUBACKs (a list: one reference each) */
    PyObject *call_soon; /* the loop's call_soon */
    PyObject *flush;     /* this batch's flush, bound once */
    char scheduled;      /* a flush is in the ready queue */
    unsigned long long held, flushes; /* PUBACK runs held, flushes run (tests) */
} AckBatchObject;

/* A front's PUBACKs held for the batch's flush: on the heap, from the
 * first (a front that never holds any costs nothing). */
typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} AckHold;

static PyTypeObject AckBatchType;

static void
ack_hold_free(AckHold *h)
{
    PyMem_Free(h->p);
    h->p = NULL;
    h->len = h->cap = 0;
}

/* `n` bytes of PUBACKs held by `owner` (a front whose hold `h` is), the
 * batch's flush scheduled at the turn's first. 0, or -1 with an error set
 * (nothing more held then). */
static int
ack_hold_add(AckBatchObject *batch, AckHold *h, PyObject *owner, const unsigned char *p,
             Py_ssize_t n)
{
    if (h->len + n > h->cap) {
        Py_ssize_t cap = h->cap ? h->cap : 16;
        while (cap < h->len + n)
            cap *= 2;
        unsigned char *grown = PyMem_Realloc(h->p, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        h->p = grown;
        h->cap = cap;
    }
    if (h->len == 0 && PyList_Append(batch->pending, owner) < 0)
        return -1;
    if (!batch->scheduled) {
        PyObject *handle = PyObject_CallOneArg(batch->call_soon, batch->flush);
        if (handle == NULL)
            return -1; /* (a front listed and holding nothing: the flush skips it) */
        Py_DECREF(handle);
        batch->scheduled = 1;
    }
    memcpy(h->p + h->len, p, n);
    h->len += n;
    batch->held++;
    return 0;
}

static PyObject *AckBatch_flush(AckBatchObject *b, PyObject *unused); /* (_mqtt_front.h) */

/* AckBatch(call_soon): the worker's, its loop's call_soon. */
static int
AckBatch_init(AckBatchObject *b, PyObject *args, PyObject *kwds)
{
    PyObject *call_soon;
    if (!PyArg_ParseTuple(args, "O:AckBatch", &call_soon))
        return -1;
    PyObject *pending = PyList_New(0);
    PyObject *flush = pending == NULL ? NULL : PyObject_GetAttrString((PyObject *)b, "flush");
    if (flush == NULL) {
        Py_XDECREF(pending);
        return -1;
    }
    Py_XSETREF(b->pending, pending);
    Py_XSETREF(b->call_soon, Py_NewRef(call_soon));
    Py_XSETREF(b->flush, flush); /* (a cycle through the bound method: the GC's) */
    b->scheduled = 0;
    return 0;
}

static int
AckBatch_traverse(AckBatchObject *b, visitproc visit, void *arg)
{
    Py_VISIT(b->pending);
    Py_VISIT(b->call_soon);
    Py_VISIT(b->flush);
    return 0;
}

static int
AckBatch_clear(AckBatchObject *b)
{
    Py_CLEAR(b->pending);
    Py_CLEAR(b->call_soon);
    Py_CLEAR(b->flush);
    return 0;
}

static void
AckBatch_dealloc(AckBatchObject *b)
{
    PyObject_GC_UnTrack(b);
    AckBatch_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *
AckBatch_get_held(AckBatchObject *b, void *closure)
{
    return PyLong_FromUnsignedLongLong(b->held);
}

static PyObject *
AckBatch_get_flushes(AckBatchObject *b, void *closure)
{
    return PyLong_FromUnsignedLongLong(b->flushes);
}

static PyMethodDef AckBatch_methods[] = {
    {"flush", (PyCFunction)AckBatch_flush, METH_NOARGS,
     "Every front's held PUBACKs written (the ready queue's callback)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef AckBatch_getset[] = {
    {"held", (getter)AckBatch_get_held, NULL, "A read's PUBACKs held, times.", NULL},
    {"flushes", (getter)AckBatch_get_flushes, NULL, "Flushes run.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AckBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.workers._wire.AckBatch",
    .tp_basicsize = sizeof(AckBatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A worker's devices' PUBACKs, written at the turn's end (workers/_ack_defer.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)AckBatch_init,
    .tp_traverse = (traverseproc)AckBatch_traverse,
    .tp_clear = (inquiry)AckBatch_clear,
    .tp_dealloc = (destructor)AckBatch_dealloc,
    .tp_methods = AckBatch_methods,
    .tp_getset = AckBatch_getset,
};
