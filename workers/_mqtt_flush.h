/* An MQTT subscriber's deliveries from its inner connection's flush to its
 * socket in one C call (issue 41's fan-in: the subscriber's side).
 *
 * The inner AMQP connection's deliveries are frames (workers/_wire.c
 * deliver_run) that it writes at the end of a watch's wake-up in its
 * scheduled flush. For an MQTT client that flush was Python's chain:
 * AmqpSide.flush_then_read, Connection.flush, AmqpSide.write, from_amqp,
 * read_amqp, Outbound.run, `deliveries`, send, _end_batch, _flush and the
 * transport's write: about 30 µs of interpreter a wake-up with a thousand
 * connections' objects out of the caches, for a C run of 2.
 *
 * DeliveryFlush is that scheduled flush. Where the chain would only have
 * joined the inner connection's output, counted it, run `deliveries` over
 * it from its start and written the PUBLISHes, it does that itself:
 *   - the bridge reads nothing already (amqp_reading false, amqp_out
 *     empty, no delivery gathered frame by frame), is open and not closed,
 *     in no batch of its own (out is None) and has an Outbound;
 *   - Outbound.run's conditions: no topic alias maximum, no maximum packet
 *     size, no QoS 2 message under way (line, the session's sent and
 *     released), plans made for the subscriptions' version;
 *   - Connection.flush's: output to write, a transport, not closed, no EOF.
 * A run that stops before the output's end (a frame that is not a planned
 * delivery: a first delivery of a topic, a confirm, a consume-ok) leaves
 * the rest to the bridge's read_amqp, after the run's packets, in one
 * batch (_end_batch), as read_amqp's own batch would have been. Where a
 * condition does not hold, the Python chain (`fallback`) runs instead. A
 * failure of either is `failed`'s: the client disconnected (flush_failure).
 *
 * Included by _mqtt_wire.c after `deliveries`; part of that module. */

typedef struct {
    PyObject_HEAD
    PyObject *conn;     /* the bridge: MqttConnection */
    PyObject *amqp;     /* its inner Connection */
    PyObject *fallback; /* AmqpSide.flush_then_read's closure */
    PyObject *failed;   /* failed(exc): what a failure of either costs its client */
} DeliveryFlushObject;

#define FLUSH_NAMES(X)                                                                          \
    X(alias_max) X(amqp_out) X(amqp_reading) X(closed) X(delivery) X(_end_batch)                  \
    X(eof_sent) X(flush_scheduled) X(is_closing) X(level) X(line) X(max_packet) X(miss)           \
    X(next_packet_id) X(open) X(out) X(outbound) X(planned) X(planned_for) X(read_amqp)           \
    X(released) X(send_cnt) X(send_oct) X(sent) X(sent_since_tick) X(session) X(state)            \
    X(subscriptions) X(transport) X(unacked) X(version) X(write)

#define FLUSH_NAME_FIELD(name) PyObject *name;
static struct {
    FLUSH_NAMES(FLUSH_NAME_FIELD)
} fnames;

#define FLUSH_NAME_INTERN(name)                                                                 \
    if ((fnames.name = PyUnicode_InternFromString(#name)) == NULL)                               \
        return -1;

static int
flush_names_init(void)
{
    FLUSH_NAMES(FLUSH_NAME_INTERN)
    return 0;
}

/* What the run needs of the bridge, read once its conditions held. */
typedef struct {
    PyObject *outbound, *planned, *unacked, *next_id, *transport, *out;
    int level5;
} FlushParts;

static void
flush_parts_clear(FlushParts *f)
{
    Py_CLEAR(f->outbound);
    Py_CLEAR(f->planned);
    Py_CLEAR(f->unacked);
    Py_CLEAR(f->next_id);
    Py_CLEAR(f->transport);
    Py_CLEAR(f->out);
}

/* 1 when every condition at the top holds (f filled), 0 when one does not,
 * -1 with an error set. */
static int
flush_may_run(DeliveryFlushObject *self, FlushParts *f)
{
    PyObject *conn = self->conn, *amqp = self->amqp;
    int r;
    /* The bridge: each false required, then open, no batch, no gathering. */
    PyObject *falses[][2] = {
        {conn, fnames.amqp_reading}, {conn, fnames.closed},  {conn, fnames.amqp_out},
        {amqp, fnames.closed},       {amqp, fnames.eof_sent},
    };
    for (size_t i = 0; i < sizeof falses / sizeof falses[0]; i++)
        if ((r = attr_true(falses[i][0], falses[i][1])) != 0)
            return r < 0 ? -1 : 0;
    if ((r = attr_true(conn, fnames.open)) <= 0 ||
        (r = attr_is(conn, fnames.out, Py_None)) <= 0 ||
        (r = attr_is(conn, fnames.delivery, Py_None)) <= 0 ||
        (r = attr_is(amqp, fnames.transport, Py_None)) != 0)
        return r < 0 ? -1 : 0;
    if ((f->out = attr_get(amqp, fnames.out)) == NULL)
        return -1;
    if (!PyList_CheckExact(f->out) || PyList_GET_SIZE(f->out) == 0)
        return 0;
    if ((f->outbound = attr_get(conn, fnames.outbound)) == NULL)
        return -1;
    if (f->outbound == Py_None)
        return 0;
    /* Outbound.run's conditions. */
    PyObject *outbound = f->outbound;
    if ((r = attr_true(outbound, fnames.alias_max)) != 0 ||
        (r = attr_true(outbound, fnames.line)) != 0)
        return r < 0 ? -1 : 0;
    if ((r = attr_is(outbound, fnames.max_packet, Py_None)) <= 0)
        return r;
    PyObject *session = attr_get(conn, fnames.session);
    PyObject *state = session == NULL ? NULL : attr_get(session, fnames.state);
    Py_XDECREF(session);
    if (state == NULL)
        return -1;
    r = attr_true(state, fnames.sent);
    if (r == 0)
        r = attr_true(state, fnames.released);
    Py_DECREF(state);
    if (r != 0)
        return r < 0 ? -1 : 0;
    PyObject *subscriptions = attr_get(outbound, fnames.subscriptions);
    PyObject *version = subscriptions == NULL ? NULL : attr_get(subscriptions, fnames.version);
    Py_XDECREF(subscriptions);
    PyObject *planned_for = version == NULL ? NULL : attr_get(outbound, fnames.planned_for);
    r = planned_for == NULL ? -1 : PyObject_RichCompareBool(version, planned_for, Py_EQ);
    Py_XDECREF(version);
    Py_XDECREF(planned_for);
    if (r <= 0)
        return r; /* (plans of another version: Outbound.run clears them) */
    if ((f->planned = attr_get(outbound, fnames.planned)) == NULL ||
        (f->unacked = attr_get(outbound, fnames.unacked)) == NULL ||
        (f->next_id = attr_get(outbound, fnames.next_packet_id)) == NULL)
        return -1;
    PyObject *level = attr_get(conn, fnames.level);
    if (level == NULL)
        return -1;
    long lv = PyLong_AsLong(level);
    Py_DECREF(level);
    if (lv == -1 && PyErr_Occurred())
        return -1;
    f->level5 = lv == 5;
    /* _flush's: the client's socket, not closing. */
    if ((f->transport = attr_get(conn, fnames.transport)) == NULL)
        return -1;
    if (f->transport == Py_None)
        return 0;
    PyObject *closing = PyObject_CallMethodNoArgs(f->transport, fnames.is_closing);
    if (closing == NULL)
        return -1;
    r = PyObject_IsTrue(closing);
    Py_DECREF(closing);
    return r < 0 ? -1 : !r;
}

/* Connection.flush's part: the output as one bytes object, the inner
 * connection's counters, its output emptied. New reference, or NULL. */
static PyObject *
flush_take_output(DeliveryFlushObject *self, PyObject *out)
{
    PyObject *buffer;
    if (PyList_GET_SIZE(out) == 1 && PyBytes_CheckExact(PyList_GET_ITEM(out, 0)))
        buffer = Py_NewRef(PyList_GET_ITEM(out, 0));
    else {
        PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
        buffer = empty == NULL ? NULL : _PyBytes_Join(empty, out);
        Py_XDECREF(empty);
    }
    if (buffer == NULL)
        return NULL;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL || attr_set(self->amqp, fnames.out, fresh) < 0 ||
        attr_set(self->amqp, fnames.flush_scheduled, Py_False) < 0 ||
        attr_add(self->amqp, fnames.send_oct, PyBytes_GET_SIZE(buffer)) < 0 ||
        attr_add(self->amqp, fnames.send_cnt, 1) < 0 ||
        attr_set(self->amqp, fnames.sent_since_tick, Py_True) < 0) {
        Py_XDECREF(fresh);
        Py_DECREF(buffer);
        return NULL;
    }
    Py_DECREF(fresh);
    return buffer;
}

/* The run over `buffer` and what follows it. 0, or -1 with an error set. */
static int
flush_run(DeliveryFlushObject *self, FlushParts *f, PyObject *buffer)
{
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return -1;
    PyObject *args[6] = {buffer, zero, f->planned, f->unacked, f->next_id,
                         f->level5 ? Py_True : Py_False};
    PyObject *ran = deliveries(NULL, args, 6);
    Py_DECREF(zero);
    if (ran == NULL)
        return -1;
    /* (at, next_id, packets, miss); the miss is Python's to find again. */
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(ran, 0));
    PyObject *packets = PyTuple_GET_ITEM(ran, 2);
    int handed = packets == Py_None; /* the run's packets written or in a batch */
    int r = at < 0 ? -1 : 0;
    if (r == 0)
        r = attr_set(f->outbound, fnames.next_packet_id, PyTuple_GET_ITEM(ran, 1));
    if (r == 0)
        r = attr_set(f->outbound, fnames.miss, Py_None);
    if (r == 0 && at == PyBytes_GET_SIZE(buffer)) {
        /* The whole output: its PUBLISHes in one write (_flush). */
        if (packets != Py_None) {
            handed = 1;
            PyObject *w = PyObject_CallMethodOneArg(f->transport, fnames.write, packets);
            r = w == NULL ? -1 : 0;
            Py_XDECREF(w);
        }
    } else if (r == 0) {
        /* The rest is read_amqp's, after the run's packets, in one batch. */
        PyObject *batch = PyList_New(0);
        if (batch != NULL && packets != Py_None && PyList_Append(batch, packets) < 0)
            Py_CLEAR(batch);
        PyObject *amqp_out = attr_get(self->conn, fnames.amqp_out);
        PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(buffer) + at,
                                                   PyBytes_GET_SIZE(buffer) - at);
        r = batch == NULL || amqp_out == NULL || rest == NULL ? -1 : 0;
        if (r == 0 && !PyByteArray_Check(amqp_out)) {
            PyErr_SetString(PyExc_TypeError, "amqp_out must be a bytearray");
            r = -1;
        }
        if (r == 0) {
            PyObject *grown = PySequence_InPlaceConcat(amqp_out, rest);
            r = grown == NULL ? -1 : 0;
            Py_XDECREF(grown);
        }
        /* The batch opens last: a failure before leaves no batch that no
         * _end_batch would close (the rest waits in amqp_out for the next
         * read). */
        if (r == 0) {
            r = attr_set(self->conn, fnames.out, batch);
            handed = r == 0;
        }
        Py_XDECREF(batch);
        Py_XDECREF(amqp_out);
        Py_XDECREF(rest);
        if (r == 0) {
            PyObject *read = PyObject_CallMethodNoArgs(self->conn, fnames.read_amqp);
            r = read == NULL ? -1 : 0;
            Py_XDECREF(read);
            /* (the batch ends even where the read failed: _end_batch) */
            PyObject *exc_type, *exc_value, *exc_tb;
            PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
            PyObject *end = PyObject_CallMethodNoArgs(self->conn, fnames._end_batch);
            if (end == NULL)
                r = -1;
            Py_XDECREF(end);
            if (exc_type != NULL) {
                if (end == NULL)
                    PyErr_Clear();
                PyErr_Restore(exc_type, exc_value, exc_tb);
            }
        }
    }
    if (!handed) {
        /* The run booked its packets' ids (unacked, next_packet_id): they
         * go out before the failure is raised, else the client would never
         * see the ids the session waits on. */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        PyObject *w = PyObject_CallMethodOneArg(f->transport, fnames.write, packets);
        Py_XDECREF(w);
        if (w == NULL)
            PyErr_Clear(); /* (the first failure is the one to raise) */
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    Py_DECREF(ran);
    return r;
}

/* The flush (this C path or the chain) raised: where it is an Exception,
 * failed(exc) answers it (mqtt_transport.py flush_failed: logged, the
 * client disconnected), so that a fault costs that client only and leaves
 * no connection whose inner output was partly lost (the rest of a run
 * that stopped, taken from the inner connection before the failure) open
 * with deliveries it will never see. Else (KeyboardInterrupt...) raised
 * on. Returns failed's result, or NULL with an error set. */
static PyObject *
flush_failure(DeliveryFlushObject *self)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyObject *r = PyObject_CallOneArg(self->failed, value);
    Py_DECREF(value);
    return r;
}

static PyObject *
DeliveryFlush_call(DeliveryFlushObject *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "DeliveryFlush() takes no arguments");
        return NULL;
    }
    FlushParts f = {0};
    int may = flush_may_run(self, &f);
    if (may <= 0) {
        flush_parts_clear(&f);
        PyObject *chain = may < 0 ? NULL : PyObject_CallNoArgs(self->fallback);
        return chain == NULL ? flush_failure(self) : chain;
    }
    PyObject *buffer = flush_take_output(self, f.out);
    int r = buffer == NULL ? -1 : flush_run(self, &f, buffer);
    Py_XDECREF(buffer);
    flush_parts_clear(&f);
    return r < 0 ? flush_failure(self) : Py_NewRef(Py_None);
}

/* DeliveryFlush(conn, amqp, fallback, failed): made by MqttConnection once its
 * inner connection exists (workers/mqtt_connection.py). */
static int
DeliveryFlush_init(DeliveryFlushObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *conn, *amqp, *fallback, *failed;
    if (!PyArg_ParseTuple(args, "OOOO:DeliveryFlush", &conn, &amqp, &fallback, &failed))
        return -1;
    if (!PyCallable_Check(fallback) || !PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError, "fallback and failed must be callable");
        return -1;
    }
    Py_XSETREF(self->conn, Py_NewRef(conn));
    Py_XSETREF(self->amqp, Py_NewRef(amqp));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    Py_XSETREF(self->failed, Py_NewRef(failed));
    return 0;
}

static int
DeliveryFlush_traverse(DeliveryFlushObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->conn);
    Py_VISIT(self->amqp);
    Py_VISIT(self->fallback);
    Py_VISIT(self->failed);
    return 0;
}

static int
DeliveryFlush_clear(DeliveryFlushObject *self)
{
    Py_CLEAR(self->conn);
    Py_CLEAR(self->amqp);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->failed);
    return 0;
}

static void
DeliveryFlush_dealloc(DeliveryFlushObject *self)
{
    PyObject_GC_UnTrack(self);
    DeliveryFlush_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject DeliveryFlushType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shoal.workers._mqtt_wire.DeliveryFlush",
    .tp_basicsize = sizeof(DeliveryFlushObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An MQTT subscriber's scheduled flush: planned deliveries to its socket in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)DeliveryFlush_init,
    .tp_call = (ternaryfunc)DeliveryFlush_call,
    .tp_traverse = (traverseproc)DeliveryFlush_traverse,
    .tp_clear = (inquiry)DeliveryFlush_clear,
    .tp_dealloc = (destructor)DeliveryFlush_dealloc,
};
