/* A subscriber's read of PUBACKs in one C call (workers/mqtt_outbound.py
 * ack_read, issue 41's fan-in: the subscriber's side).
 *
 * A QoS 1 subscriber's reads are mostly PUBACKs, each read a few of them.
 * Python's path for one: MqttConnection.data_received's conditions,
 * Outbound.puback_run (pubacks in C), _end_batch, _settle_acks,
 * Channel.acks_from_bridge, DeliveryBook.settle and _ack_run around
 * ack_run's C, then _ack_tags and _credit_back: about 35 µs of CPU a read
 * with a thousand connections' objects out of the caches.
 *
 * Once a read of PUBACKs went whole through that path, data_received gives
 * the next reads to an AckRead first (its front.fast, as a device's
 * DeviceRead). read() takes a read only where that path would have taken
 * it the same way, and else takes nothing (0: Python's path reads it):
 *   - the read is nothing but short-form PUBACKs (3.1.1's, 5.0's success
 *     without properties) with non-zero packet ids;
 *   - the MQTT side as data_received's branch needs it (open, not closed,
 *     not busy, no settled acks, no partial packet, no plain publishes
 *     held, no batch); a SUBSCRIBE under way anywhere holds no read
 *     without a PUBLISH (workers/_barrier.h);
 *   - channel 1 takes acks at once (acks_from_bridge: not busy, not
 *     closing, no flow block or backlog, its publisher idle, no
 *     transaction), and is the one it was made with, on the same inner
 *     connection and Outbound; no consumer timeout has requeued a tag.
 * Then it pops the packet ids from Outbound.unacked as pubacks does. Tags
 * that are the channel's oldest deliveries, in order (what a subscriber's
 * PUBACKs are), are settled as DeliveryBook.settle settles a multiple ack:
 * ack_run deletes the first queue's run of them in C, its counts go where
 * _ack_run puts them (the queue's run_args and its uid and capacity words
 * kept for the next read of the same queue: no Python call for those), and
 * Python's _ack_tags settles any rest; the
 * consumers' credit comes back through _credit_back. Other tags go to
 * MqttConnection's acks and _end_batch, as the read's batch would.
 *
 * Included by _wire.c after ack_run; part of that module. */

#define ACK_NAMES(X)                                                                            \
    X(closed) X(busy) X(acks) X(buffer) X(plain) X(out) X(open) X(outbound) X(amqp) X(closing)  \
    X(flow_blocked) X(flow_backlog) X(state) X(tx) X(timed_out_tags) X(acked) X(unacked) X(a)      \
    X(unacked_bytes) X(gets) X(run_args) X(uid) X(drained) X(settle_many) X(_ack_tags)           \
    X(_credit_back) X(_end_batch) X(pop) X(records_settles)

#define ACK_NAME_FIELD(name) PyObject *name;
static struct {
    ACK_NAMES(ACK_NAME_FIELD)
} anames;

static int
ack_names_init(void)
{
#define ACK_NAME_INIT(name)                                                                     \
    if ((anames.name = PyUnicode_InternFromString(#name)) == NULL)                               \
        return -1;
    ACK_NAMES(ACK_NAME_INIT)
    return 0;
}

typedef struct {
    PyObject_HEAD
    /* The MQTT side: MqttConnection, its Inbound, reader, Outbound and
     * Outbound.unacked (packet id -> delivery tag). */
    PyObject *conn, *inbound, *reader, *outbound, *ids;
    /* The inner connection, its channels, channel 1, its DeliveryBook and
     * its book of unacked deliveries, publisher and transactions. */
    PyObject *amqp, *channels, *channel, *delivery, *unacked, *publisher, *transactions;
    /* The worker's shared queues, its table, its persist (or None), the
     * statistics list. */
    PyObject *shared, *table, *persist, *stats;
    PyObject *number; /* channel 1's key */
    /* What ack_settle looked up of the queue a read settled, kept while
     * the next reads settle the same one (a subscriber's one session
     * queue): SharedQueues.run_args' tuple for args_qid (its last item,
     * whether its settles are recorded, checked again each time: the
     * worker's events say whether the store records any, the queue's uid
     * word whether it is durable) and the queue's uid and capacity words
     * (QueueTable.uid, SharedQueues._drained's first load). */
    PyObject *events, *args_qid, *args;
    uint64_t *uid_word, *capacity_word;
    Py_ssize_t q_uid, q_capacity; /* shm/layout.py's Q_UID, Q_CAPACITY */
    long long idle_state, nothing;
    Py_ssize_t stat_acknowledged;
} AckReadObject;

/* 1 when the conditions at the top hold, 0 when one does not, -1 with an
 * error set. */
static int
ack_may_read(AckReadObject *d)
{
    struct {
        PyObject *obj, *name;
    } falses[] = {
        {d->conn, anames.closed},        {d->conn, anames.busy},
        {d->conn, anames.acks},          {d->reader, anames.buffer},
        {d->inbound, anames.plain},      {d->channel, anames.busy},
        {d->channel, anames.closing},    {d->amqp, anames.flow_blocked},
        {d->channel, anames.flow_backlog}, {d->delivery, anames.timed_out_tags},
    };
    for (size_t i = 0; i < sizeof falses / sizeof falses[0]; i++) {
        int r = attr_true(falses[i].obj, falses[i].name);
        if (r != 0)
            return r < 0 ? -1 : 0;
    }
    int r = attr_true(d->conn, anames.open);
    if (r <= 0)
        return r;
    if ((r = attr_is(d->conn, anames.out, Py_None)) <= 0 ||
        (r = attr_is(d->conn, anames.outbound, d->outbound)) <= 0 ||
        (r = attr_is(d->conn, anames.amqp, d->amqp)) <= 0 ||
        (r = attr_is(d->transactions, anames.tx, Py_None)) <= 0)
        return r;
    PyObject *current = PyDict_GetItemWithError(d->channels, d->number); /* (borrowed) */
    if (current != d->channel)
        return PyErr_Occurred() ? -1 : 0;
    long long state;
    if (attr_ll(d->publisher, anames.state, &state) < 0)
        return -1;
    return state == d->idle_state;
}

/* The read's packet ids, where it is nothing but short-form PUBACKs with
 * non-zero ids: 1 (ids[0..*n)), 0 where it is something else. */
static int
ack_ids(const unsigned char *p, Py_ssize_t len, unsigned *ids, Py_ssize_t *n)
{
    if (len == 0 || len % 4 || len / 4 > 1024)
        return 0;
    for (Py_ssize_t at = 0; at < len; at += 4) {
        unsigned id = (unsigned)p[at + 2] << 8 | p[at + 3];
        if (p[at] != 0x40 || p[at + 1] != 2 || id == 0)
            return 0;
        ids[at / 4] = id;
    }
    *n = len / 4;
    return 1;
}

/* Whether `tags` are the first keys of the unacked book, in order. */
static int
ack_oldest(PyObject *unacked, PyObject *tags)
{
    Py_ssize_t pos = 0, i = 0, n = PyList_GET_SIZE(tags);
    PyObject *key, *value;
    while (i < n && PyDict_Next(unacked, &pos, &key, &value)) {
        int same = PyObject_RichCompareBool(key, PyList_GET_ITEM(tags, i), Py_EQ);
        if (same <= 0)
            return same;
        i++;
    }
    return i == n;
}

/* A method call's result dropped: 0, or -1 with an error set. */
static int
ack_call(PyObject *obj, PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *call[3] = {obj, nargs > 0 ? args[0] : NULL, nargs > 1 ? args[1] : NULL};
    PyObject *r = PyObject_VectorcallMethod(name, call, nargs + 1, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* SharedQueues.run_args(qid) (a new reference; None as it says), from
 * what an earlier settle of the same queue kept where its last item still
 * holds; else asked again, and its words found. NULL with an error set. */
static PyObject *
ack_run_args(AckReadObject *d, PyObject *qid)
{
    int same = d->args_qid == NULL ? 0 : PyObject_RichCompareBool(d->args_qid, qid, Py_EQ);
    if (same < 0)
        return NULL;
    if (same) {
        int records = attr_true(d->events, anames.records_settles);
        if (records < 0)
            return NULL;
        int durable = __atomic_load_n(d->uid_word, __ATOMIC_SEQ_CST) != 0;
        if ((PyTuple_GET_ITEM(d->args, 8) == Py_True) == (records && durable))
            return Py_NewRef(d->args);
    }
    PyObject *args = PyObject_CallMethodOneArg(d->shared, anames.run_args, qid);
    if (args == NULL || args == Py_None)
        return args; /* (None: the crash tests' atomics; nothing kept) */
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 9) {
        Py_DECREF(args);
        PyErr_SetString(PyExc_TypeError, "run_args: a tuple of 9");
        return NULL;
    }
    Py_ssize_t queue = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 1));
    uint64_t *uid = queue < 0 ? NULL : queues_api->word(PyTuple_GET_ITEM(args, 0), queue + d->q_uid);
    uint64_t *capacity =
        uid == NULL ? NULL : queues_api->word(PyTuple_GET_ITEM(args, 0), queue + d->q_capacity);
    if (capacity == NULL) {
        Py_DECREF(args);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a queue's words outside the segment");
        return NULL;
    }
    Py_XSETREF(d->args_qid, Py_NewRef(qid));
    Py_XSETREF(d->args, Py_NewRef(args));
    d->uid_word = uid;
    d->capacity_word = capacity;
    return args;
}

/* DeliveryBook.settle(tags[-1], multiple) of tags that are the book's
 * oldest: _ack_run's part in C, the rest and the credit by its Python.
 * 0, or -1 with an error set. */
static int
ack_settle(AckReadObject *d, PyObject *tags)
{
    PyObject *upto = PyList_GET_ITEM(tags, PyList_GET_SIZE(tags) - 1);
    PyObject *touched = PySet_New(NULL);
    if (touched == NULL)
        return -1;
    int r = -1;
    PyObject *args = NULL, *uid = NULL, *ran = NULL, *rest = NULL, *qid = NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *first;
    if (!PyDict_Next(d->unacked, &pos, &key, &first) || !PyTuple_Check(first) ||
        PyTuple_GET_SIZE(first) != 4) {
        PyErr_SetString(PyExc_RuntimeError, "an AckRead's book is not DeliveryBook's");
        goto done;
    }
    qid = Py_NewRef(PyTuple_GET_ITEM(first, 1)); /* (ack_run frees the tuple) */
    long long seq = PyLong_AsLongLong(PyTuple_GET_ITEM(first, 2));
    if (seq == -1 && PyErr_Occurred())
        goto done;
    if (seq >= 0) { /* (a browser's copy took nothing: Python's rest settles it) */
        args = ack_run_args(d, qid);
        if (args == NULL)
            goto done;
    }
    if (args != NULL && args != Py_None) {
        /* QueueTable.uid's load (words kept with args: the crash tests'
         * atomics take Python's, with no words) */
        uid = d->args == args ? PyLong_FromUnsignedLongLong(__atomic_load_n(d->uid_word, __ATOMIC_SEQ_CST))
                              : PyObject_CallMethodOneArg(d->table, anames.uid, qid);
        if (uid == NULL)
            goto done;
        PyObject *run[5] = {args, qid, d->unacked, upto, uid};
        if ((ran = ack_run(NULL, run, 5)) == NULL)
            goto done;
        /* (acked, body_bytes, [(consumer, count, bytes)], [(tag, uid)]) */
        long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(ran, 0));
        long long body_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(ran, 1));
        PyObject *consumers = PyTuple_GET_ITEM(ran, 2), *settled = PyTuple_GET_ITEM(ran, 3);
        if (PyErr_Occurred())
            goto done;
        if (PyList_GET_SIZE(settled) && ack_call(d->persist, anames.settle_many, &settled, 1) < 0)
            goto done;
        if (count) {
            if (item_add(d->stats, d->stat_acknowledged, count) < 0 ||
                attr_add(d->delivery, anames.acked, count) < 0 ||
                attr_add(d->delivery, anames.unacked_bytes, -body_bytes) < 0)
                goto done;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(consumers); i++) {
                PyObject *group = PyList_GET_ITEM(consumers, i);
                PyObject *consumer = PyTuple_GET_ITEM(group, 0);
                long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(group, 1));
                long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(group, 2));
                if (PyErr_Occurred())
                    goto done;
                if (consumer == Py_None) {
                    if (attr_add(d->delivery, anames.gets, -n) < 0)
                        goto done;
                } else if (attr_add(consumer, anames.unacked, -n) < 0 ||
                           attr_add(consumer, anames.unacked_bytes, -size) < 0 ||
                           PySet_Add(touched, consumer) < 0)
                    goto done;
            }
            /* SharedQueues.drained: nothing to release without a capacity */
            if ((d->args != args || __atomic_load_n(d->capacity_word, __ATOMIC_SEQ_CST)) &&
                ack_call(d->shared, anames.drained, &qid, 1) < 0)
                goto done;
        }
    }
    /* settle's rest: the tags up to `upto` ack_run left (another queue's). */
    if ((rest = PyList_New(0)) == NULL)
        goto done;
    pos = 0;
    while (PyDict_Next(d->unacked, &pos, &key, &first)) {
        int over = PyObject_RichCompareBool(key, upto, Py_GT);
        if (over < 0)
            goto done;
        if (over)
            break;
        if (PyList_Append(rest, key) < 0)
            goto done;
    }
    PyObject *calls[2] = {rest, touched};
    if (PyList_GET_SIZE(rest) && ack_call(d->delivery, anames._ack_tags, calls, 2) < 0)
        goto done;
    r = ack_call(d->delivery, anames._credit_back, &touched, 1);
done:
    Py_DECREF(touched);
    Py_XDECREF(qid);
    Py_XDECREF(args);
    Py_XDECREF(uid);
    Py_XDECREF(ran);
    Py_XDECREF(rest);
    return r;
}

/* read(data, long_read) -> int: bytes of data taken (0: none, Python's path
 * reads it; else all of it). */
static PyObject *
AckRead_read(AckReadObject *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(data, long_read)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    unsigned ids[1024];
    Py_ssize_t n = 0, len = view.len;
    int may = ack_ids(view.buf, len, ids, &n);
    PyBuffer_Release(&view);
    if (may)
        may = ack_may_read(d);
    if (may <= 0)
        return may < 0 ? NULL : PyLong_FromLong(0);
    int r = 0;
    PyObject *tags = PyList_New(0); /* (data_received stamped the read) */
    if (tags == NULL)
        return NULL;
    /* pubacks(): each id's tag popped from Outbound.unacked, `nothing`'s
     * (a retained message's PUBLISH) and unknown ids' left out. */
    for (Py_ssize_t i = 0; i < n && r == 0; i++) {
        PyObject *key = PyLong_FromUnsignedLong(ids[i]);
        PyObject *tag = key == NULL ? NULL : _PyDict_Pop(d->ids, key, Py_None);
        Py_XDECREF(key);
        if (tag == NULL) {
            r = -1;
            break;
        }
        if (tag != Py_None) {
            long long t = PyLong_AsLongLong(tag);
            if (t == -1 && PyErr_Occurred())
                r = -1;
            else if (t != d->nothing)
                r = PyList_Append(tags, tag);
        }
        Py_DECREF(tag);
    }
    if (r == 0 && PyList_GET_SIZE(tags)) {
        int oldest = ack_oldest(d->unacked, tags);
        if (oldest > 0)
            r = ack_settle(d, tags);
        else if (oldest == 0) {
            /* The read's batch settles them as Python's path would. */
            PyObject *acks = attr_get(d->conn, anames.acks);
            r = acks == NULL ? -1 : PyList_SetSlice(acks, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, tags);
            Py_XDECREF(acks);
            if (r == 0)
                r = ack_call(d->conn, anames._end_batch, NULL, 0);
        } else
            r = -1;
    }
    Py_DECREF(tags);
    return r < 0 ? NULL : PyLong_FromSsize_t(len);
}

/* AckRead(conn, inbound, reader, outbound, amqp, channels, channel,
 *         delivery, publisher, transactions, shared, table, persist, stats,
 *         number, idle_state, nothing, stat_acknowledged):
 * made by workers/mqtt_acks.py ack_read after a read of PUBACKs went whole
 * through Python's path. */
static int
AckRead_init(AckReadObject *d, PyObject *args, PyObject *kwds)
{
    PyObject *o[15];
    PyObject *events;
    long long idle_state, nothing;
    Py_ssize_t stat_acknowledged, q_uid, q_capacity;
    if (!PyArg_ParseTuple(args, "OOOOOO!OOOOOOOO!OLLnOnn:AckRead", &o[0], &o[1], &o[2], &o[3],
                          &o[4], &PyDict_Type, &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11],
                          &o[12], &PyList_Type, &o[13], &o[14], &idle_state, &nothing,
                          &stat_acknowledged, &events, &q_uid, &q_capacity))
        return -1;
    PyObject *ids = attr_get(o[3], anames.unacked);
    PyObject *unacked = ids == NULL ? NULL : attr_get(o[7], anames.unacked);
    int bad = unacked == NULL || !PyDict_CheckExact(ids) || !PyDict_CheckExact(unacked);
    if (bad || stat_acknowledged < 0 ||
        stat_acknowledged >= PyList_GET_SIZE(o[13])) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "AckRead: not an Outbound's and a book's dicts");
        Py_XDECREF(ids);
        Py_XDECREF(unacked);
        return -1;
    }
    PyObject **fields[] = {
        &d->conn,    &d->inbound,      &d->reader, &d->outbound, &d->amqp,
        &d->channels, &d->channel,     &d->delivery, &d->publisher, &d->transactions,
        &d->shared,  &d->table,        &d->persist, &d->stats,    &d->number,
    };
    for (int i = 0; i < 15; i++)
        Py_XSETREF(*fields[i], Py_NewRef(o[i]));
    Py_XSETREF(d->ids, ids);
    Py_XSETREF(d->unacked, unacked);
    d->idle_state = idle_state;
    d->nothing = nothing;
    d->stat_acknowledged = stat_acknowledged;
    Py_XSETREF(d->events, Py_NewRef(events));
    Py_CLEAR(d->args_qid);
    Py_CLEAR(d->args);
    d->uid_word = d->capacity_word = NULL;
    d->q_uid = q_uid;
    d->q_capacity = q_capacity;
    return 0;
}

#define ACK_FIELDS(X)                                                                           \
    X(conn) X(inbound) X(reader) X(outbound) X(ids) X(amqp) X(channels) X(channel) X(delivery)  \
    X(unacked) X(publisher) X(transactions) X(shared) X(table) X(persist) X(stats) X(number)  \
    X(events) X(args_qid) X(args)

static int
AckRead_traverse(AckReadObject *d, visitproc visit, void *arg)
{
#define ACK_VISIT(f) Py_VISIT(d->f);
    ACK_FIELDS(ACK_VISIT)
    return 0;
}

static int
AckRead_clear(AckReadObject *d)
{
#define ACK_CLEAR(f) Py_CLEAR(d->f);
    ACK_FIELDS(ACK_CLEAR)
    return 0;
}

static void
AckRead_dealloc(AckReadObject *d)
{
    PyObject_GC_UnTrack(d);
    AckRead_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMethodDef AckRead_methods[] = {
    {"read", (PyCFunction)(void (*)(void))AckRead_read, METH_FASTCALL,
     "A read of PUBACKs: its bytes taken, all or none."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AckReadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shoal.workers._wire.AckRead",
    .tp_basicsize = sizeof(AckReadObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A subscriber's reads of PUBACKs in one C call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)AckRead_init,
    .tp_traverse = (traverseproc)AckRead_traverse,
    .tp_clear = (inquiry)AckRead_clear,
    .tp_dealloc = (destructor)AckRead_dealloc,
    .tp_methods = AckRead_methods,
};
