/* WatchedPull: the pull of a watched queue's only consumer when a publish
 * wakes it (Worker._on_watch_wake: pull_each; pull.py go_on_watched; issue 41's
 * fan-in: the subscriber's side).
 *
 * A consumer that watches its queue itself (pull.py take_watch) is woken
 * for each message that finds it idle: one pull per message at a device's
 * rate. Python's pull for it was pull's checks, wants_work and has_credit,
 * rewind_if_released, credit_room, DeliveryBook.deliver_run and
 * SharedQueues.run_args around the C run (deliver_run, above), went_dry's
 * watch CAS and CHANGES load, and write_many: about 12 % of the broker's
 * CPU in the fan-in row, for a C run of 1.
 *
 * pull() does what pull's plain branch does for such a consumer, in the
 * same order and with the same effects, as long as every condition of that
 * branch holds; where one does not it hands back to Python before it has
 * changed anything (PULL_IN_PYTHON: pull() then runs as before), and where
 * a run stops on something only Python does (an entry left to it, a burst's
 * end, a watch another took) after writing what it delivered:
 *   - the consumer is a Consumer on a DeliveryBook of a Connection (exact
 *     types: their methods are the ones mirrored here), not cancelled,
 *     interested, not starting, acquiring, watching (direct), plain (no
 *     stream, priority levels or selector), no x-shoal-id stamp, and its
 *     connection is not traced (the firehose copies each delivery);
 *   - each run as pull's: wants_work (else PULL_IN_PYTHON: pull()'s
 *     update_interest), rewind_if_released, credit_room, at most
 *     LOCAL_BURST entries a wake-up (then PULL_YIELD: pull's _yield);
 *   - RUN_EMPTY is went_dry's for a direct consumer: watch armed again and
 *     CHANGES compared, or PULL_WATCH_LOST (someone else watches: drop_watch
 *     and DONE in Python); RUN_ENTRY hands the acquired entry to Python
 *     (PULL_ENTRY).
 * Its deliveries go to the connection's output as write_many's, before it
 * returns. Included by _wire.c after deliver_run; part of that module. */

enum { PULL_IN_PYTHON = 0, PULL_YIELD = 1, PULL_WATCH_LOST = 2, PULL_ENTRY = 3 };
#define PULL_LOCAL_BURST 512 /* pull.py LOCAL_BURST */
#define PULL_ROOM_UNBOUNDED (1LL << 30)

#define WP_NAMES(X)                                                                             \
    X(cancelled) X(interested) X(starting) X(stream) X(acquiring) X(levels) X(wanted) X(direct)    \
    X(stamp) X(channel) X(conn) X(access) X(tracing) X(notified) X(qid) X(no_ack) X(no_ack_held)   \
    X(prefetch_count) X(global_prefetch) X(prefetch_size) X(global_prefetch_size) X(unacked)       \
    X(gets) X(unacked_bytes) X(flow_active) X(closing) X(write_paused) X(state) X(release_gen)     \
    X(pointer) X(number) X(tag_sstr) X(next_tag) X(frame_max) X(records_settles) X(dry_at) X(out)  \
    X(flush_scheduled) X(scheduled_flush) X(flush_soon) X(confirm_timer) X(deliveries_written)     \
    X(drained) X(ctx) X(write_many) X(flushes_now) X(device_gate)          \
    X(shut_gate)

#define WP_NAME_FIELD(name) PyObject *name;
static struct {
    WP_NAMES(WP_NAME_FIELD)
} wpnames;

static int
wp_names_init(void)
{
#define WP_NAME_INIT(name)                                                                      \
    if ((wpnames.name = PyUnicode_InternFromString(#name)) == NULL)                              \
        return -1;
    WP_NAMES(WP_NAME_INIT)
    return 0;
}

typedef struct {
    PyObject_HEAD
    /* The worker's SharedQueues, its events (records_settles), its
     * statistics counters, and the types whose methods are mirrored. */
    PyObject *shared, *events, *stats, *consumer_type, *book_type, *conn_type;
    PyObject *atomic;
    long long open_state;  /* connection.OPEN */
    Py_ssize_t queues, logs, log_stride, queue_size, max_queues;
    Py_ssize_t q_release_gen, q_uid, q_watch, q_changes;
    unsigned long long mask, owner;
    Py_ssize_t arenas, arena_bytes, dropping;
    uint64_t watch_value; /* WATCH_WORKER + this worker's index */
    Py_ssize_t stat_auto_ack, stat_manual_ack;
    Py_ssize_t queues_used; /* H_QUEUES_USED: a drain's words stop at its slot */
} WatchedPullObject;

/* The word at `off` of the segment (NULL with an error set). */
static inline uint64_t *
wp_word(WatchedPullObject *w, Py_ssize_t off)
{
    return queues_api->word(w->atomic, off);
}

/* obj.name = value (an int): 0 or -1. */
static int
wp_set_ll(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    int r = v == NULL ? -1 : attr_set(obj, name, v);
    Py_XDECREF(v);
    return r;
}

/* Whether every condition of pull's plain branch for a watching consumer
 * holds: 1, 0, or -1 with an error set. */
static int
wp_plain(WatchedPullObject *w, PyObject *consumer, PyObject *book, PyObject *conn)
{
    int r;
    if ((r = attr_true(consumer, wpnames.cancelled)) != 0 ||
        (r = attr_true(consumer, wpnames.starting)) != 0 ||
        (r = attr_true(consumer, wpnames.stamp)) != 0)
        return r < 0 ? -1 : 0;
    if ((r = attr_true(consumer, wpnames.interested)) <= 0 ||
        (r = attr_true(consumer, wpnames.acquiring)) <= 0 ||
        (r = attr_true(consumer, wpnames.direct)) <= 0 ||
        (r = attr_is(consumer, wpnames.stream, Py_None)) <= 0 ||
        (r = attr_is(consumer, wpnames.levels, Py_None)) <= 0 ||
        (r = attr_is(consumer, wpnames.wanted, Py_None)) <= 0)
        return r;
    PyObject *access = attr_get(conn, wpnames.access);
    if (access == NULL)
        return -1;
    r = attr_true(access, wpnames.tracing);
    Py_DECREF(access);
    return r != 0 ? (r < 0 ? -1 : 0) : 1;
}

/* The deliveries a channel's global prefetch counts, len(unacked) - gets,
 * into *held: 0, or -1 with an error set. */
static int
wp_book_held(PyObject *book, long long *held)
{
    PyObject *unacked = attr_get(book, wpnames.unacked);
    if (unacked == NULL)
        return -1;
    Py_ssize_t have = PyObject_Size(unacked);
    Py_DECREF(unacked);
    long long gets;
    if (have < 0 || attr_ll(book, wpnames.gets, &gets) < 0)
        return -1;
    *held = (long long)have - gets;
    return 0;
}

/* Whether `owner`'s count `have_name` (NULL: wp_book_held's) is under the
 * book's limit `limit_name` (0: no limit): 1, 0, or -1 with an error set. */
static int
wp_under(PyObject *book, PyObject *limit_name, PyObject *owner, PyObject *have_name)
{
    long long limit, have;
    if (attr_ll(book, limit_name, &limit) < 0)
        return -1;
    if (!limit)
        return 1;
    if ((have_name == NULL ? wp_book_held(owner, &have) : attr_ll(owner, have_name, &have)) < 0)
        return -1;
    return have < limit;
}

/* DeliveryBook.has_credit: 1, 0, or -1 with an error set. */
static int
wp_has_credit(PyObject *consumer, PyObject *book)
{
    int r;
    if ((r = wp_under(book, wpnames.prefetch_count, consumer, wpnames.unacked)) <= 0 ||
        (r = wp_under(book, wpnames.global_prefetch, book, NULL)) <= 0 ||
        (r = wp_under(book, wpnames.prefetch_size, consumer, wpnames.unacked_bytes)) <= 0 ||
        (r = wp_under(book, wpnames.global_prefetch_size, book, wpnames.unacked_bytes)) <= 0)
        return r;
    return 1;
}

/* DeliveryBook.wants_work (Connection.can_deliver's included): 1, 0, or
 * -1 with an error set. */
static int
wp_wants_work(WatchedPullObject *w, PyObject *consumer, PyObject *book, PyObject *conn,
              int no_ack)
{
    int r = attr_true(consumer, wpnames.cancelled);
    if (r != 0)
        return r < 0 ? -1 : 0;
    r = 0;
    if (no_ack && (r = attr_true(book, wpnames.no_ack_held)) < 0)
        return -1;
    if (!(no_ack && !r) && (r = wp_has_credit(consumer, book)) <= 0)
        return r;
    if ((r = attr_true(book, wpnames.flow_active)) <= 0)
        return r;
    PyObject *channel = attr_get(book, wpnames.channel);
    if (channel == NULL)
        return -1;
    r = attr_true(channel, wpnames.closing);
    Py_DECREF(channel);
    if (r != 0 || (r = attr_true(conn, wpnames.write_paused)) != 0)
        return r < 0 ? -1 : 0;
    long long state;
    if (attr_ll(conn, wpnames.state, &state) < 0)
        return -1;
    return state == w->open_state;
}

/* DeliveryBook.credit_room, after wants_work, into *room: 0, or -1 with
 * an error set. */
static int
wp_credit_room(PyObject *consumer, PyObject *book, int no_ack, long long *room)
{
    *room = PULL_ROOM_UNBOUNDED;
    if (no_ack)
        return 0;
    long long size, global_size, count, global, have;
    if (attr_ll(book, wpnames.prefetch_size, &size) < 0 ||
        attr_ll(book, wpnames.global_prefetch_size, &global_size) < 0)
        return -1;
    if (size || global_size) {
        *room = 1;
        return 0;
    }
    if (attr_ll(book, wpnames.prefetch_count, &count) < 0)
        return -1;
    if (count) {
        if (attr_ll(consumer, wpnames.unacked, &have) < 0)
            return -1;
        *room = count - have;
    }
    if (attr_ll(book, wpnames.global_prefetch, &global) < 0)
        return -1;
    if (global) {
        if (wp_book_held(book, &have) < 0)
            return -1;
        if (global - have < *room)
            *room = global - have;
    }
    return 0;
}

/* stats[index] += n (the worker's counters, shm/stats.py). */
static int
wp_count(WatchedPullObject *w, Py_ssize_t index, Py_ssize_t n)
{
    PyObject *v = PySequence_GetItem(w->stats, index);
    if (v == NULL)
        return -1;
    PyObject *add = PyLong_FromSsize_t(n);
    PyObject *sum = add == NULL ? NULL : PyNumber_Add(v, add);
    Py_DECREF(v);
    Py_XDECREF(add);
    if (sum == NULL)
        return -1;
    int r = PySequence_SetItem(w->stats, index, sum);
    Py_DECREF(sum);
    return r;
}

/* Connection.write_many(out), inline where its output is a list, then
 * pull's deliveries_written when confirms wait for deliveries: 0 or -1. */
static int
wp_write(PyObject *conn, PyObject *out)
{
    if (PyList_GET_SIZE(out) == 0)
        return 0;
    PyObject *buffer = attr_get(conn, wpnames.out);
    if (buffer == NULL)
        return -1;
    int r;
    if (PyList_CheckExact(buffer)) {
        r = PyList_SetSlice(buffer, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, out); /* out += frames */
        Py_DECREF(buffer);
        int scheduled = r < 0 ? -1 : attr_true(conn, wpnames.flush_scheduled);
        if (scheduled < 0)
            return -1;
        if (!scheduled) {
            if (attr_set(conn, wpnames.flush_scheduled, Py_True) < 0)
                return -1;
            /* Connection.write's: an MQTT device's gate shut (_lane_device.h). */
            PyObject *gate = attr_get(conn, wpnames.device_gate);
            PyObject *shut = gate == NULL || gate == Py_None
                                 ? Py_XNewRef(gate)
                                 : PyObject_CallMethodNoArgs(gate, wpnames.shut_gate);
            Py_XDECREF(gate);
            if (shut == NULL)
                return -1;
            Py_DECREF(shut);
            /* WorkerContext.flush_soon: held for the wake-up's end (its
             * flushes_now list), else the loop's call_soon. */
            PyObject *ctx = attr_get(conn, wpnames.ctx);
            PyObject *flush = ctx == NULL ? NULL : attr_get(conn, wpnames.scheduled_flush);
            PyObject *held = flush == NULL ? NULL : attr_get(ctx, wpnames.flushes_now);
            int failed = held == NULL;
            if (!failed && PyList_CheckExact(held)) {
                failed = PyList_Append(held, flush) < 0;
            } else if (!failed) {
                PyObject *done = PyObject_CallMethodOneArg(ctx, wpnames.flush_soon, flush);
                failed = done == NULL;
                Py_XDECREF(done);
            }
            Py_XDECREF(ctx);
            Py_XDECREF(flush);
            Py_XDECREF(held);
            if (failed)
                return -1;
        }
    } else {
        Py_DECREF(buffer);
        PyObject *done = PyObject_CallMethodOneArg(conn, wpnames.write_many, out);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    r = attr_is(conn, wpnames.confirm_timer, Py_None);
    if (r != 0)
        return r < 0 ? -1 : 0;
    PyObject *done = PyObject_CallMethodNoArgs(conn, wpnames.deliveries_written);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* A run's bookkeeping, as DeliveryBook.deliver_run's after its C call:
 * 0 or -1 with an error set. */
static int
wp_book_run(WatchedPullObject *w, PyObject *consumer, PyObject *book, PyObject *qid,
            const RunOut *o, int no_ack, PyObject *out)
{
    if (wp_set_ll(consumer, wpnames.pointer, (long long)o->pointer) < 0)
        return -1;
    if (!o->delivered)
        return 0;
    PyObject *frames = PyBytes_FromStringAndSize((const char *)run_buf, o->used);
    int r = frames == NULL ? -1 : PyList_Append(out, frames);
    Py_XDECREF(frames);
    if (r < 0 || wp_set_ll(book, wpnames.next_tag, (long long)o->tag) < 0)
        return -1;
    if (no_ack) {
        if (wp_count(w, w->stat_auto_ack, o->delivered) < 0)
            return -1;
        PyObject *done = PyObject_CallMethodOneArg(w->shared, wpnames.drained, qid);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    if (wp_count(w, w->stat_manual_ack, o->delivered) < 0 ||
        attr_add(consumer, wpnames.unacked, o->delivered) < 0 ||
        attr_add(consumer, wpnames.unacked_bytes, (long long)o->body_bytes) < 0 ||
        attr_add(book, wpnames.unacked_bytes, (long long)o->body_bytes) < 0)
        return -1;
    return 0;
}

/* One run of deliver_run's core for the consumer, from its pointer, with
 * its channel's numbers: 0 with `o` filled, or -1 with an error set. */
static int
wp_run(WatchedPullObject *w, PyObject *consumer, PyObject *book, PyObject *conn, PyObject *qid,
       Py_ssize_t qoff, uint64_t *uid, int no_ack, Py_ssize_t limit, RunOut *o)
{
    RunIn in = {
        .atomic = w->atomic,
        .qoff = qoff,
        .roff = w->logs + (Py_ssize_t)PyLong_AsSsize_t(qid) * w->log_stride,
        .arenas = w->arenas,
        .arena_bytes = w->arena_bytes,
        .dropping_off = w->dropping,
        .mask = w->mask,
        .owner = w->owner,
        .limit = limit,
        .no_ack = no_ack,
        .consumer = consumer,
        .qid = qid,
    };
    long long pointer, number, tag, frame_max;
    if (attr_ll(consumer, wpnames.pointer, &pointer) < 0 ||
        attr_ll(book, wpnames.number, &number) < 0 || attr_ll(book, wpnames.next_tag, &tag) < 0 ||
        attr_ll(conn, wpnames.frame_max, &frame_max) < 0)
        return -1;
    in.pointer = (uint64_t)pointer;
    in.channel = (long)number;
    in.tag = (unsigned long long)tag;
    in.frame_max = (Py_ssize_t)frame_max;
    int settles = attr_true(w->events, wpnames.records_settles);
    if (settles < 0)
        return -1;
    in.settle_hook = settles && __atomic_load_n(uid, __ATOMIC_SEQ_CST) != 0;
    PyObject *ctag = attr_get(consumer, wpnames.tag_sstr);
    PyObject *unacked = ctag == NULL ? NULL : no_ack ? Py_NewRef(Py_None)
                                                     : attr_get(book, wpnames.unacked);
    char *ctag_p;
    int r = -1;
    if (unacked != NULL && PyBytes_AsStringAndSize(ctag, &ctag_p, &in.ctag_len) == 0) {
        in.ctag = ctag_p;
        in.unacked = unacked;
        r = run_core(&in, o);
    }
    Py_XDECREF(ctag);
    Py_XDECREF(unacked);
    return r;
}

/* pull(consumer) -> None | (code, a, b, c): the wake-up's pull, or where
 * Python goes on (the codes above; PULL_WATCH_LOST: a, the CHANGES value
 * for DONE; PULL_ENTRY: (seq, block, redelivered) of the entry acquired). */
static PyObject *
WatchedPull_pull(WatchedPullObject *w, PyObject *consumer)
{
    if (Py_TYPE(consumer) != (PyTypeObject *)w->consumer_type)
        return Py_BuildValue("(iiii)", PULL_IN_PYTHON, 0, 0, 0);
    PyObject *book = attr_get(consumer, wpnames.channel);
    if (book == NULL)
        return NULL;
    PyObject *conn = NULL, *qid = NULL, *out = NULL, *result = NULL;
    int code = PULL_IN_PYTHON, idle = 0, r;
    unsigned long long a = 0, b = 0, c = 0;
    if (Py_TYPE(book) != (PyTypeObject *)w->book_type)
        goto answer;
    if ((conn = attr_get(book, wpnames.conn)) == NULL)
        goto fail;
    if (Py_TYPE(conn) != (PyTypeObject *)w->conn_type)
        goto answer;
    if ((r = wp_plain(w, consumer, book, conn)) <= 0) {
        if (r < 0)
            goto fail;
        goto answer;
    }
    if ((qid = attr_get(consumer, wpnames.qid)) == NULL)
        goto fail;
    Py_ssize_t q_id = PyLong_AsSsize_t(qid);
    if (q_id == -1 && PyErr_Occurred())
        goto fail;
    if (q_id < 0 || q_id >= w->max_queues)
        goto answer;
    int no_ack = attr_true(consumer, wpnames.no_ack);
    if (no_ack < 0)
        goto fail;
    Py_ssize_t qoff = w->queues + q_id * w->queue_size;
    uint64_t *release_gen = wp_word(w, qoff + w->q_release_gen);
    uint64_t *uid = release_gen == NULL ? NULL : wp_word(w, qoff + w->q_uid);
    uint64_t *watch = uid == NULL ? NULL : wp_word(w, qoff + w->q_watch);
    uint64_t *changes = watch == NULL ? NULL : wp_word(w, qoff + w->q_changes);
    if (changes == NULL || (out = PyList_New(0)) == NULL)
        goto fail;
    /* From here on as pull(): notified, then runs until one stops it. */
    if (attr_set(consumer, wpnames.notified, Py_True) < 0)
        goto write_fail;
    Py_ssize_t work = 0;
    for (;;) {
        if ((r = wp_wants_work(w, consumer, book, conn, no_ack)) <= 0) {
            if (r < 0)
                goto write_fail;
            code = PULL_IN_PYTHON; /* pull(): notified off, update_interest */
            break;
        }
        if (work >= PULL_LOCAL_BURST) {
            code = PULL_YIELD;
            break;
        }
        /* rewind_if_released */
        uint64_t generation = __atomic_load_n(release_gen, __ATOMIC_SEQ_CST);
        long long seen;
        if (attr_ll(consumer, wpnames.release_gen, &seen) < 0)
            goto write_fail;
        if ((uint64_t)seen != generation &&
            (wp_set_ll(consumer, wpnames.release_gen, (long long)generation) < 0 ||
             wp_set_ll(consumer, wpnames.pointer, 0) < 0))
            goto write_fail;
        long long room;
        if (wp_credit_room(consumer, book, no_ack, &room) < 0)
            goto write_fail;
        /* pull's min(credit, quota - delivered, stop - work): the burst's
         * quota is the larger while the run is under LOCAL_BURST. */
        long long n = PULL_LOCAL_BURST - work < room ? PULL_LOCAL_BURST - work : room;
        RunOut o;
        if (wp_run(w, consumer, book, conn, qid, qoff, uid, no_ack, n < 1 ? 1 : n, &o) < 0 ||
            wp_book_run(w, consumer, book, qid, &o, no_ack, out) < 0)
            goto write_fail;
        work += o.delivered;
        if (o.status == RUN_FULL)
            continue;
        if (o.status == RUN_ENTRY) {
            code = PULL_ENTRY;
            a = o.a, b = o.b, c = o.c;
            break;
        }
        /* RUN_EMPTY: went_dry, for a consumer that watches its queue. */
        if (attr_set(consumer, wpnames.notified, Py_False) < 0 ||
            wp_set_ll(consumer, wpnames.dry_at, (long long)o.a) < 0)
            goto write_fail;
        uint64_t expected = 0;
        if (!__atomic_compare_exchange_n(watch, &expected, w->watch_value, 0, __ATOMIC_SEQ_CST,
                                         __ATOMIC_SEQ_CST)) {
            code = PULL_WATCH_LOST; /* someone else watches: drop_watch, DONE */
            a = o.a;
            break;
        }
        /* Armed, then CHANGES read (publishers: bump, then load the watch):
         * a publish after the scan is seen here or wakes us. */
        expected = w->watch_value;
        if (__atomic_load_n(changes, __ATOMIC_SEQ_CST) == o.a ||
            !__atomic_compare_exchange_n(watch, &expected, 0, 0, __ATOMIC_SEQ_CST,
                                         __ATOMIC_SEQ_CST)) {
            idle = 1; /* idle; or a publisher took the watch: its wake comes */
            break;
        }
        if (attr_set(consumer, wpnames.notified, Py_True) < 0)
            goto write_fail;
    }
    if (wp_write(conn, out) < 0)
        goto fail;
    if (idle) {
        result = Py_NewRef(Py_None);
        goto fail; /* (the common exit) */
    }
answer:
    result = Py_BuildValue("(iKKK)", code, a, b, c);
fail:
    Py_DECREF(book);
    Py_XDECREF(conn);
    Py_XDECREF(qid);
    Py_XDECREF(out);
    return result;
write_fail: {
    /* As pull's finally: what was delivered is written, the error kept. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (wp_write(conn, out) < 0)
        PyErr_Clear();
    PyErr_Restore(type, value, tb);
    goto fail;
}
}

/* pull_each(qids, watching, go_on): a wake-up's pulls, as
 * A wake-up's loop (wake, below): for each queue drained from the worker's
 * bitmap, the consumer that watches it (none: skipped, the watch dropped
 * meanwhile) pulled, and where Python goes on, go_on(consumer, answer)
 * (pull.py go_on_watched). One C loop for a fan-out's thousand queues. */
static PyObject *
WatchedPull_pull_each(WatchedPullObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pull_each(qids: list, watching: dict, go_on)");
        return NULL;
    }
    PyObject *qids = args[0], *watching = args[1], *go_on = args[2];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(qids); i++) {
        PyObject *consumer = PyDict_GetItemWithError(watching, PyList_GET_ITEM(qids, i));
        if (consumer == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        Py_INCREF(consumer); /* (go_on may drop the watch and its dict entry) */
        PyObject *answer = WatchedPull_pull(w, consumer);
        PyObject *done = answer == NULL || answer == Py_None
                             ? Py_XNewRef(answer)
                             : PyObject_CallFunctionObjArgs(go_on, consumer, answer, NULL);
        Py_DECREF(consumer);
        Py_XDECREF(answer);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
}

/* A flush's exception given to flush_failed (it logs it), or its own
 * failure reported as unraisable: the next flushes still run. */
static void
wp_flush_failed(PyObject *flush_failed)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = value == NULL ? NULL : PyObject_CallOneArg(flush_failed, value);
    if (r == NULL)
        PyErr_WriteUnraisable(flush_failed);
    Py_XDECREF(r);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* wake(efd, bitmap, words, ctx, watching, go_on, flush_failed): a watch's
 * wake-up (Worker._on_watch_wake) in one call, without its Python frames:
 * the worker's eventfd read (efd < 0: woken by Waker.on_local, nothing to
 * read), its bitmap's `words` drained at offset `bitmap` (Waker._drain's
 * take_bits; those past the highest slot ever used, H_QUEUES_USED, have no
 * bit to find and are not looked at), pull_each of those queues while ctx.flushes_now holds the
 * flushes their connections ask for, and then those flushes, each its own:
 * one that raises an Exception goes to flush_failed(exc) and the rest
 * still run. */
static PyObject *
WatchedPull_wake(WatchedPullObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyDict_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "wake(efd, bitmap, words, ctx, watching: dict, go_on, flush_failed)");
        return NULL;
    }
    long efd = PyLong_AsLong(args[0]);
    Py_ssize_t bitmap = PyLong_AsSsize_t(args[1]), words = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    uint64_t *word = words > 0 && bitmap >= 0 ? wp_word(w, bitmap) : NULL;
    if (word == NULL || wp_word(w, bitmap + (words - 1) * 8) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "wake: a bitmap of at least one word");
        return NULL;
    }
    uint64_t *used = wp_word(w, w->queues_used);
    if (used == NULL)
        return NULL;
    Py_ssize_t in_use = (Py_ssize_t)((__atomic_load_n(used, __ATOMIC_SEQ_CST) + 63) / 64);
    if (in_use < words)
        words = in_use;
    PyObject *ctx = args[3], *flush_failed = args[6];
    PyObject *held = PyList_New(0);
    if (held == NULL || attr_set(ctx, wpnames.flushes_now, held) < 0) {
        Py_XDECREF(held);
        return NULL;
    }
    int r = 0;
    if (efd >= 0) {
        uint64_t count;
        if (read((int)efd, &count, sizeof count) < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            PyErr_SetFromErrno(PyExc_OSError); /* (os.eventfd_read's; empty: nothing) */
            r = -1;
        }
    }
    PyObject *qids = r < 0 ? NULL : PyList_New(0);
    for (Py_ssize_t i = 0; qids != NULL && i < words; i++) {
        if (!__atomic_load_n(word + i, __ATOMIC_SEQ_CST))
            continue;
        uint64_t bits = __atomic_exchange_n(word + i, 0, __ATOMIC_SEQ_CST);
        while (bits) {
            PyObject *qid = PyLong_FromSsize_t(i * 64 + __builtin_ctzll(bits));
            if (qid == NULL || PyList_Append(qids, qid) < 0)
                Py_CLEAR(qids); /* (the bits taken are the sweeps' to find) */
            Py_XDECREF(qid);
            bits &= bits - 1;
            if (qids == NULL)
                break;
        }
    }
    if (qids != NULL && PyList_GET_SIZE(qids)) {
        PyObject *each[3] = {qids, args[4], args[5]};
        PyObject *done = WatchedPull_pull_each(w, each, 3);
        r = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    } else if (qids == NULL)
        r = -1;
    Py_XDECREF(qids);
    /* finally: the flushes held, each its own */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (attr_set(ctx, wpnames.flushes_now, Py_None) < 0)
        PyErr_WriteUnraisable(ctx);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(held); i++) {
        PyObject *flush = Py_NewRef(PyList_GET_ITEM(held, i));
        PyObject *done = PyObject_CallNoArgs(flush);
        Py_DECREF(flush);
        if (done != NULL) {
            Py_DECREF(done);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) { /* (as Python's: it goes up now) */
            Py_XDECREF(exc_type);
            Py_XDECREF(exc_value);
            Py_XDECREF(exc_tb);
            Py_DECREF(held);
            return NULL;
        }
        wp_flush_failed(flush_failed);
    }
    Py_DECREF(held);
    if (exc_type != NULL) {
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
WatchedPull_init(WatchedPullObject *w, PyObject *args, PyObject *kwds)
{
    PyObject *shared, *events, *stats, *consumer_type, *book_type, *conn_type, *geometry;
    long long open_state;
    Py_ssize_t queues, logs, log_stride, queue_size, max_queues, q_release_gen, q_uid, q_watch,
        q_changes, arenas, arena_bytes, dropping, stat_auto_ack, stat_manual_ack, queues_used;
    unsigned long long mask, owner, watch_value;
    if (!PyArg_ParseTuple(args, "OOOO!O!O!LnnKKnO!:WatchedPull", &shared, &events, &stats,
                          &PyType_Type, &consumer_type, &PyType_Type, &book_type, &PyType_Type,
                          &conn_type, &open_state, &stat_auto_ack, &stat_manual_ack, &mask, &owner,
                          &dropping, &PyTuple_Type, &geometry) ||
        !PyArg_ParseTuple(geometry, "nnnnnnnnnnnKn:Layout.pull_geometry", &queues, &logs,
                          &log_stride, &queue_size, &max_queues, &q_release_gen, &q_uid, &q_watch,
                          &q_changes, &arenas, &arena_bytes, &watch_value, &queues_used))
        return -1;
    PyObject *atomic = PyObject_GetAttrString(shared, "a");
    if (atomic == NULL)
        return -1;
    if (!queues_api->is_atomic(atomic) || arenas < 0 || arena_bytes <= 0 || max_queues <= 0 ||
        !PySequence_Check(stats)) {
        Py_DECREF(atomic);
        PyErr_SetString(PyExc_TypeError, "WatchedPull: the plain Atomic, its geometry, counters");
        return -1;
    }
    PyObject **fields[] = {&w->shared, &w->events, &w->stats, &w->consumer_type, &w->book_type,
                           &w->conn_type, &w->atomic};
    PyObject *values[] = {shared, events, stats, consumer_type, book_type, conn_type, atomic};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        Py_XINCREF(values[i]);
        Py_XSETREF(*fields[i], values[i]);
    }
    Py_DECREF(atomic);
    w->open_state = open_state;
    w->queues = queues, w->logs = logs, w->log_stride = log_stride, w->queue_size = queue_size;
    w->max_queues = max_queues;
    w->q_release_gen = q_release_gen, w->q_uid = q_uid, w->q_watch = q_watch;
    w->q_changes = q_changes;
    w->mask = mask, w->owner = owner, w->arenas = arenas, w->arena_bytes = arena_bytes;
    w->dropping = dropping, w->watch_value = watch_value, w->queues_used = queues_used;
    w->stat_auto_ack = stat_auto_ack, w->stat_manual_ack = stat_manual_ack;
    return 0;
}

static int
WatchedPull_traverse(WatchedPullObject *w, visitproc visit, void *arg)
{
    Py_VISIT(w->shared);
    Py_VISIT(w->events);
    Py_VISIT(w->stats);
    Py_VISIT(w->consumer_type);
    Py_VISIT(w->book_type);
    Py_VISIT(w->conn_type);
    Py_VISIT(w->atomic);
    return 0;
}

static int
WatchedPull_clear(WatchedPullObject *w)
{
    Py_CLEAR(w->shared);
    Py_CLEAR(w->events);
    Py_CLEAR(w->stats);
    Py_CLEAR(w->consumer_type);
    Py_CLEAR(w->book_type);
    Py_CLEAR(w->conn_type);
    Py_CLEAR(w->atomic);
    return 0;
}

static void
WatchedPull_dealloc(WatchedPullObject *w)
{
    PyObject_GC_UnTrack(w);
    WatchedPull_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef WatchedPull_methods[] = {
    {"pull", (PyCFunction)WatchedPull_pull, METH_O,
     "A watch's wake-up pull: None, or (code, a, b, c) for Python to go on."},
    {"pull_each", (PyCFunction)(void (*)(void))WatchedPull_pull_each, METH_FASTCALL,
     "A wake-up's pulls of the queues drained, each watching consumer's."},
    {"wake", (PyCFunction)(void (*)(void))WatchedPull_wake, METH_FASTCALL,
     "A watch's wake-up: the eventfd, the bitmap drained, its pulls and their flushes."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WatchedPullType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shoal.workers._wire.WatchedPull",
    .tp_basicsize = sizeof(WatchedPullObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The pull of a watched queue's only consumer, woken by a publish.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)WatchedPull_init,
    .tp_traverse = (traverseproc)WatchedPull_traverse,
    .tp_clear = (inquiry)WatchedPull_clear,
    .tp_dealloc = (destructor)WatchedPull_dealloc,
    .tp_methods = WatchedPull_methods,
};
