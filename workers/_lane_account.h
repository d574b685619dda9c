/* A device's read counted in C (workers/mqtt_lane.py, issue 41's fan-in).
 *
 * Lane.mqtt_run leaves what its run took to PublishLane.account
 * (workers/lane.py), about 40 lines of Python, and the pacer's count after
 * it: for a device publishing one message a read, that was a third of the
 * read's Python. mqtt_read does the same counting here, for the run that
 * needs nothing else: no PUBLISH records (a durable queue's persistent
 * messages) and no entry whose queue was deleted under the append. Those
 * it leaves untaken (lane.n stays): the caller's PublishLane.account takes
 * them, as after mqtt_run.
 *
 * Included by _wire.c (LaneObject, mqtt_run_core); part of that module. */

/* The statistics' counter places (shm/stats.py), set by stat_places(). */
static Py_ssize_t stat_routed = -1, stat_size_sum, stat_size_buckets, stat_received_confirm,
                  stat_confirmed;

static PyObject *
stat_places(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "stat_places(routed, size_sum, size_buckets, received_confirm, confirmed)");
        return NULL;
    }
    Py_ssize_t v[5];
    for (int i = 0; i < 5; i++) {
        v[i] = PyLong_AsSsize_t(args[i]);
        if (v[i] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a counter's place is not negative");
            return NULL;
        }
    }
    stat_routed = v[0];
    stat_size_sum = v[1];
    stat_size_buckets = v[2];
    stat_received_confirm = v[3];
    stat_confirmed = v[4];
    Py_RETURN_NONE;
}

/* The attribute names this and _lane_device.h read and write, interned. */
#define LANE_NAMES(X)                                                                          \
    X(cursor) X(used) X(dirty) X(high) X(on_high) X(wake) X(published) X(exchange_counts)     \
    X(publish_count) X(census) X(first_publish) X(stats) X(confirm) X(publish_seq) X(confirm_high)       \
    X(at_once) X(closed) X(open) X(busy) X(acks) X(buffer) X(plain) X(state) X(flow_blocked)  \
    X(closing) X(flow_backlog) X(pending) X(tx) X(consumers) X(confirm_held) X(publisher)      \
    X(config) X(max_message_size) X(confirms) X(out) X(amqp_out) X(unsynced) X(stream_waits)  \
    X(pager) X(files) X(arena_high) X(recv_oct) X(recv_cnt) X(confirm_seq) X(confirm_sent)    \
    X(write) X(binding) X(subscriptions) X(flush_scheduled)
#define LANE_NAME_FIELD(name) PyObject *name;
static struct {
    LANE_NAMES(LANE_NAME_FIELD)
} names;

static int
lane_names_init(void)
{
#define LANE_NAME_INIT(name)                                                                   \
    if ((names.name = PyUnicode_InternFromString(#name)) == NULL)                              \
        return -1;
    LANE_NAMES(LANE_NAME_INIT)
    return 0;
}

/* list[i] += n: 0, or -1 with an error set. */
static int
item_add(PyObject *list, Py_ssize_t i, long long n)
{
    if (!PyList_Check(list) || i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_TypeError, "a counter list too short");
        return -1;
    }
    PyObject *add = PyLong_FromLongLong(n);
    PyObject *sum = add == NULL ? NULL : PyNumber_Add(PyList_GET_ITEM(list, i), add);
    Py_XDECREF(add);
    if (sum == NULL)
        return -1;
    PyList_SetItem(list, i, sum); /* (steals sum, drops the old) */
    return 0;
}

/* A run's touched route, copied out before the counting calls Python. */
typedef struct {
    unsigned long long qid;
    long long n;
    int watcher;
    PyObject *exchange; /* a reference of its own */
} TakenRoute;

/* PublishLane.account and the pacer's count for a run with no records and
 * nothing gone; the lane's counts reset first (a failure below leaves
 * nothing to count twice). 0, or -1 with an error set. */
/* A channel's first publish: ctx.census.first_publish(publisher)
 * (workers/census.py; once a channel, so through Python). */
static int
first_publish(PyObject *ctx, PyObject *publisher)
{
    PyObject *census = attr_get(ctx, names.census);
    if (census == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(census, names.first_publish, publisher);
    Py_DECREF(census);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static int
lane_account(LaneObject *self, PyObject *const *objs)
{
    PyObject *arena = objs[0], *publisher = objs[1], *waker = objs[2], *pacer = objs[3],
             *ctx = objs[4], *confirm_channels = objs[5];
    long long n = self->n;
    unsigned long long body_bytes = self->body_bytes, used = self->used;
    long long buckets[SIZE_BUCKET_COUNT];
    memcpy(buckets, self->buckets, sizeof buckets);
    TakenRoute taken[LANE_TOUCHED];
    int ntaken = self->ntouched;
    for (int i = 0; i < ntaken; i++) {
        LaneTouch *t = &self->touched[i];
        taken[i].qid = (unsigned long long)t->qid;
        taken[i].n = t->n;
        taken[i].watcher = t->watcher;
        taken[i].exchange = Py_NewRef(t->exchange);
    }
    PyObject *cursor = PyLong_FromSsize_t(self->cursor);
    lane_reset_taken(self);
    int result = -1;
    if (cursor == NULL || attr_set(arena, names.cursor, cursor) < 0)
        goto done;
    if (!n) {
        result = 0;
        goto done;
    }
    PyObject *v = PyLong_FromUnsignedLongLong(used);
    if (v == NULL)
        goto done;
    int r = attr_set(arena, names.used, v);
    if (r == 0)
        r = attr_set(arena, names.dirty, Py_True);
    PyObject *high = r < 0 ? NULL : attr_get(arena, names.high);
    int above = high == NULL ? -1 : PyObject_RichCompareBool(v, high, Py_GT);
    Py_XDECREF(high);
    if (above > 0) {
        PyObject *on_high = attr_get(arena, names.on_high);
        if (on_high == NULL)
            above = -1;
        else if (on_high != Py_None) {
            PyObject *done_ = PyObject_CallOneArg(on_high, v);
            above = done_ == NULL ? -1 : 0;
            Py_XDECREF(done_);
        }
        Py_XDECREF(on_high);
    }
    Py_DECREF(v);
    if (above < 0)
        goto done;
    PyObject *exchanges = attr_get(publisher, names.exchange_counts);
    if (exchanges == NULL)
        goto done;
    if (!PyDict_Check(exchanges)) {
        PyErr_SetString(PyExc_TypeError, "exchange_counts: a dict");
        Py_DECREF(exchanges);
        goto done;
    }
    for (int i = 0; i < ntaken; i++) {
        TakenRoute *t = &taken[i];
        if (t->watcher) { /* the watch its scan took after the counters (shm/wake.py) */
            if (waker_wake(self->atomic, waker, t->qid, t->watcher) < 0) {
                Py_DECREF(exchanges);
                goto done;
            }
        }
        PyObject *counted = PyDict_GetItemWithError(exchanges, t->exchange); /* (borrowed) */
        if (counted == NULL) {
            if (PyErr_Occurred() || (counted = Py_BuildValue("[ii]", 0, 0)) == NULL ||
                PyDict_SetItem(exchanges, t->exchange, counted) < 0) {
                Py_XDECREF(counted);
                Py_DECREF(exchanges);
                goto done;
            }
            Py_DECREF(counted); /* (the dict holds it) */
        }
        if (item_add(counted, 0, t->n) < 0 || item_add(counted, 1, t->n) < 0) {
            Py_DECREF(exchanges);
            goto done; /* every lane publish is routed */
        }
    }
    Py_DECREF(exchanges);
    PyObject *count = attr_get(publisher, names.publish_count);
    if (count == NULL)
        goto done;
    int first = PyObject_Not(count);
    Py_DECREF(count);
    if (first < 0 || (first && first_publish(ctx, publisher) < 0))
        goto done; /* a new publisher (the statistics count them) */
    if (attr_add(publisher, names.publish_count, n) < 0)
        goto done;
    PyObject *stats = attr_get(publisher, names.stats);
    if (stats == NULL)
        goto done;
    r = item_add(stats, stat_routed, n);
    if (r == 0)
        r = item_add(stats, stat_size_sum, (long long)body_bytes);
    for (int i = 0; r == 0 && i < SIZE_BUCKET_COUNT; i++)
        if (buckets[i])
            r = item_add(stats, stat_size_buckets + i, buckets[i]);
    int confirm = r;
    if (confirm == 0) {
        PyObject *c = attr_get(publisher, names.confirm);
        confirm = c == NULL ? -1 : PyObject_IsTrue(c);
        Py_XDECREF(c);
    }
    if (confirm > 0) {
        r = item_add(stats, stat_received_confirm, n);
        if (r == 0)
            r = attr_add(publisher, names.publish_seq, n);
        PyObject *seq = r < 0 ? NULL : attr_get(publisher, names.publish_seq);
        if (seq == NULL || attr_set(publisher, names.confirm_high, seq) < 0 ||
            PySet_Add(confirm_channels, publisher) < 0)
            confirm = -1;
        Py_XDECREF(seq);
    }
    Py_DECREF(stats);
    if (confirm < 0)
        goto done;
    for (int i = 0; i < ntaken; i++)
        if (pacer_published(pacer, taken[i].qid, taken[i].n) < 0)
            goto done;
    result = 0;
done:
    Py_XDECREF(cursor);
    for (int i = 0; i < ntaken; i++)
        Py_DECREF(taken[i].exchange);
    return result;
}

/* A read's result, or NULL with the run's failure (PyErr_Fetch'd before
 * the count) raised: the one that says what went wrong first. */
static PyObject *
run_failure_first(PyObject *out, PyObject *exc_type, PyObject *exc_value, PyObject *exc_tb)
{
    if (exc_type == NULL)
        return out;
    Py_XDECREF(out);
    PyErr_Clear(); /* (the count's failure too, if any) */
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return NULL;
}

/* mqtt_read(data, exchange, topics, props0, props1, level5, max_packet,
 *           long_read_waker, arena, publisher, waker, pacer, ctx, confirm_channels)
 *     -> (at, n, acks, ids)
 *
 * mqtt_run, then what its run took counted as PublishLane.account and the
 * pacer count it (lane_account), unless it framed PUBLISH records or an
 * entry's queue went under the append: then lane.n stays non-zero and the
 * caller's PublishLane.account takes it. long_read_waker: for a long read
 * (MqttConnection.long_read) the waker whose next wake-up a run with a QoS 0
 * publish makes at once (Waker.at_once, as Inbound.publish), else None.
 * The objects are the inner connection's arena, channel publisher, waker,
 * pacer, worker context and confirm_channels. A failure of the run still
 * counts what it took before it. */
static PyObject *
Lane_mqtt_read(LaneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError,
                        "mqtt_read(data, exchange, topics, props0, props1, level5, max_packet, "
                        "long_read_waker, arena, publisher, waker, pacer, ctx, confirm_channels)");
        return NULL;
    }
    if (!PySet_Check(args[13]) || stat_routed < 0) {
        PyErr_SetString(PyExc_TypeError,
                        "confirm_channels must be a set (and stat_places() called)");
        return NULL;
    }
    SmallBuf acks, ids;
    small_init(&acks);
    small_init(&ids);
    Py_ssize_t at = 0;
    long long n = 0;
    PyObject *out = NULL;
    int armed = self->armed; /* (PublishLane.arm's: else nothing of it is this read's) */
    int ran = mqtt_run_core(self, args, &at, &n, &acks, &ids);
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb); /* (the run's failure, if any: after the count) */
    int counted = 0;
    if (args[7] != Py_None && self->n * 4 != (long long)acks.len) /* (QoS 0: Inbound.publish's) */
        counted = attr_set(args[7], names.at_once, Py_True);
    if (armed && counted == 0 && self->gone_seq < 0 && !self->st_count)
        counted = lane_account(self, args + 8);
    if (ran == 0 && counted == 0)
        out = Py_BuildValue("(nLy#y#)", at, n, (const char *)acks.p, acks.len,
                            (const char *)ids.p, ids.len);
    small_free(&acks);
    small_free(&ids);
    return run_failure_first(out, exc_type, exc_value, exc_tb);
}
