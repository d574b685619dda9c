/* A device's read in one C call (workers/mqtt_lane.py DeviceRead, issue 41's
 * fan-in).
 *
 * A device publishing one message a read paid, around Lane.mqtt_read, the
 * Python of three layers for each: MqttConnection.data_received's
 * conditions, Inbound.publish_run's, lane_run with the definitions journal
 * (ConnectionAccess.refresh), PublishLane.arm's checks and the confirms'.
 * With a thousand devices per worker each read finds those objects out of
 * the cache: about 25 µs a message, three times the run itself.
 *
 * Once a read went whole through the lane with its PUBACKs sent at once,
 * lane_run makes a DeviceRead; the connection's MqttFront gives it the next
 * reads first, without a Python frame (workers/_mqtt_front.h).
 * read() takes a read only where that path would have taken it the same
 * way, and else takes nothing (0: Python's path reads it, as before, and
 * drops the DeviceRead):
 *   - the MQTT side as data_received's branch needs it (open, not closed,
 *     not busy, nothing held, no settled acks, no partial packet) and no
 *     SUBSCRIBE under way anywhere (workers/_barrier.h);
 *   - no definitions changed since (the journal's generation word is the
 *     one its routes last replayed, so refresh() would do nothing) and no
 *     queue created or deleted (the catalog generation, as arm's); else,
 *     the other conditions holding, lane_run's steps before its run in
 *     Python (device_recheck: refresh, arm with its re-check of the
 *     lane's places) and, where they leave the lane armed, the conditions
 *     once more under the new generations;
 *   - each of PublishLane.arm's conditions on the inner connection, its
 *     channel and publisher, read from them now (workers/lane.py);
 *   - nothing that lets confirms wait (lane_run's condition for sending them
 *     at once: no PUBACK held, no inner frames unread, nothing unsynced).
 * Then it arms the lane from the arena as arm() does, runs it
 * (mqtt_run_core), counts it (lane_account) and does lane_run's rest: the
 * inner connection's read counters (owed, until fold()), the confirm
 * numbers, the PUBACKs through the transport. A run that framed records or
 * lost an entry's queue under its append comes back as mqtt_run's tuple,
 * uncounted: lane_run's Python counts it (PublishLane.account). What the
 * run did not take (at < len(data)) is Python's path's.
 *
 * The conditions on the device's own objects (all but the barrier, the
 * generations, the size limit and the pager, read every time) are read
 * once and then stand behind a gate: a thousand devices a worker find
 * those dozen objects out of the cache at every read (device_may_read was
 * a tenth of fan-in's CPU). The gate opens when they all hold and is shut
 * by whatever may turn one false between reads (shut_gate(), through the
 * inner Connection's `device_gate`; the list and why it is whole:
 * docs/mqtt.md, "A device's gate"): the inner connection's first write of
 * a loop turn (a close, a channel's end, a frame for the client each come
 * with one), its failure and end, the publisher blocks' alarm and flow
 * block, the inner connection's entry points outside the device's reads,
 * and a run this read could not count itself. (The MQTT connection's close
 * drops the DeviceRead: _mqtt_front.h.) With device_gate_audit(True) (the
 * test runs) an open gate reads the conditions anyway and raises where one
 * fails.
 *
 * Included by _wire.c after _lane_account.h; part of that module. */

typedef struct {
    PyObject_HEAD
    LaneObject *lane;
    /* The MQTT side: MqttConnection, its Inbound, transport, reader. */
    PyObject *conn, *inbound, *transport, *reader;
    /* The inner AMQP connection, its publish lane, channel and publisher. */
    PyObject *amqp, *publish_lane, *channels, *channel, *publisher, *transactions, *delivery;
    /* The worker's: context, arena, waker, the inner connection's pacer
     * and confirming publishers, the statistics list. */
    PyObject *ctx, *arena, *waker, *pacer, *confirm_channels, *stats;
    /* mqtt_run's arguments 1-6 after data (exchange ... max_packet). */
    PyObject *run_args[6];
    PyObject *number; /* the channel's number, an int (the channels' key) */
    PyObject *recheck; /* device_recheck's Python: recheck(amqp, journal, catalog) -> (journal, catalog) | None */
    PyObject *wave;    /* the worker's last change waves, a bytearray (see device_wave_passes) */
    uint64_t *journal, *catalog;
    uint64_t journal_gen, catalog_gen;
    BarrierWords barrier;
    long long open_state, idle_state;
    char gate_open; /* the conditions held, and nothing shut it since */
    /* The inner connection's read counters (recv_oct, recv_cnt) owed by the
     * reads taken since the last fold(): only its management row reads them
     * (Connection.describe folds first), and adding to them touched that
     * cold object at every read. */
    long long owed_oct, owed_cnt;
    /* During a read through a plain TCP socket's front: where its PUBACKs
     * are held to the turn's end (workers/_ack_defer.h; borrowed, NULL
     * otherwise: they are written at once). */
    AckBatchObject *defer_batch;
    AckHold *defer_hold;
    PyObject *defer_owner;
} DeviceReadObject;

/* device_gate_audit(on): an open gate's conditions read anyway (tests). */
static int device_gate_audit_on;

static uint64_t
word_now(const uint64_t *word)
{
    return __atomic_load_n(word, __ATOMIC_SEQ_CST);
}

/* After a change of the definitions or the queues (the journal's or the
 * catalog's generation moved): lane_run's steps before its run, in Python
 * (mqtt_lane.py device_recheck: the journal replayed, the lane's places
 * checked again by arm), and the generations they hold for. 1: go on, 0:
 * Python's path takes the read, -1 with an error set. */
static int
device_recheck(DeviceReadObject *d)
{
    PyObject *gens = PyObject_CallFunction(d->recheck, "OKK", d->amqp,
                                           (unsigned long long)d->journal_gen,
                                           (unsigned long long)d->catalog_gen);
    if (gens == NULL)
        return -1;
    unsigned long long journal_gen, catalog_gen;
    int r = gens != Py_None && PyArg_ParseTuple(gens, "KK", &journal_gen, &catalog_gen);
    Py_DECREF(gens);
    if (r <= 0)
        return PyErr_Occurred() ? -1 : 0;
    d->journal_gen = journal_gen;
    d->catalog_gen = catalog_gen;
    return 1;
}

/* The worker's last change waves (workers/route_touch.py DeviceWave): after
 * a device's re-check in Python found its lane armed under generations
 * (to_journal, to_catalog), what changed since (from_journal,
 * from_catalog), in a signature's words (_wire.c SIG_*): a bloom of the
 * exchanges it touched, the (exchange, key)s, queues and queue names
 * exactly (a fleet's devices share their one queue: a bloom's false positive
 * there sent all of them to Python, and one of a key 1 in 64). Another device that held at the same `from` and
 * sees the same `to` now, whose lane's places depend on none of them (its
 * signature, LaneObject.sig), is where the re-check would leave it: it goes
 * on under the new generations without Python (a fleet's thousand devices
 * each re-checked in Python after every SUBSCRIBE and every clean
 * session's end elsewhere: 7 us each, out of the cache). */
enum {
    WAVE_VALID,
    WAVE_FROM_JOURNAL,
    WAVE_FROM_CATALOG,
    WAVE_TO_JOURNAL,
    WAVE_TO_CATALOG,
    WAVE_TOUCHED, /* SIG_WORDS: what it touched, as a lane's signature (_wire.c) */
    WAVE_WORDS = WAVE_TOUCHED + SIG_WORDS,
    /* The last few waves, each for its own `from` (devices that missed a
     * change, reading less often than changes come, are one or two behind). */
    WAVE_SLOTS = 4,
};

/* Whether two of the signature's exact sets share a value (SET_ALL: more
 * than SET_MAX, meets any that is not empty). */
static int
set_meets(const uint64_t *a, const uint64_t *b)
{
    if (!a[0] || !b[0])
        return 0;
    if (a[0] > SET_MAX || b[0] > SET_MAX)
        return 1;
    for (uint64_t i = 1; i <= a[0]; i++)
        for (uint64_t j = 1; j <= b[0]; j++)
            if (a[i] == b[j])
                return 1;
    return 0;
}

static int
device_wave_passes(DeviceReadObject *d, uint64_t journal, uint64_t catalog)
{
    const LaneObject *lane = d->lane;
    if (!lane->sig_ok || PyByteArray_GET_SIZE(d->wave) < WAVE_SLOTS * WAVE_WORDS * 8)
        return 0;
    uint64_t w[WAVE_SLOTS][WAVE_WORDS];
    memcpy(w, PyByteArray_AS_STRING(d->wave), sizeof w);
    for (int slot = 0; slot < WAVE_SLOTS; slot++) {
        const uint64_t *v = w[slot];
        if (!v[WAVE_VALID] || v[WAVE_FROM_JOURNAL] != d->journal_gen ||
            v[WAVE_FROM_CATALOG] != d->catalog_gen || v[WAVE_TO_JOURNAL] != journal ||
            v[WAVE_TO_CATALOG] != catalog)
            continue;
        const uint64_t *touched = v + WAVE_TOUCHED, *sig = lane->sig;
        return !((sig[SIG_EXCHANGES] & touched[SIG_EXCHANGES]) ||
                 set_meets(sig + SIG_KEYS, touched + SIG_KEYS) ||
                 set_meets(sig + SIG_QUEUES, touched + SIG_QUEUES) ||
                 set_meets(sig + SIG_NAMES, touched + SIG_NAMES));
    }
    return 0;
}

/* The conditions on the device's own objects (see the top): 1 when each
 * holds, 0 when one does not, -1 with an error set. */
static int
device_conditions(DeviceReadObject *d)
{
    /* Each false is required, in data_received's, publish_run's, arm's and
     * lane_run's order (and the inner connection's flush not scheduled:
     * its first write of a turn shuts the gate, Connection.write). */
    struct {
        PyObject *obj, *name;
    } falses[] = {
        {d->conn, names.closed},         {d->conn, names.busy},
        {d->conn, names.acks},           {d->reader, names.buffer},
        {d->inbound, names.plain},       {d->amqp, names.flow_blocked},
        {d->channel, names.closing},     {d->channel, names.busy},
        {d->channel, names.flow_backlog}, {d->delivery, names.consumers},
        {d->publisher, names.confirm_held}, {d->inbound, names.confirms},
        {d->amqp, names.out},            {d->amqp, names.flush_scheduled},
        {d->conn, names.amqp_out},       {d->publisher, names.unsynced},
        {d->publisher, names.stream_waits},
    };
    for (size_t i = 0; i < sizeof falses / sizeof falses[0]; i++) {
        int r = attr_true(falses[i].obj, falses[i].name);
        if (r != 0)
            return r < 0 ? -1 : 0;
    }
    int r = attr_true(d->conn, names.open);
    if (r <= 0)
        return r;
    PyObject *subscriptions = attr_get(d->conn, names.subscriptions);
    if (subscriptions == NULL)
        return -1;
    r = attr_true(subscriptions, names.binding);
    Py_DECREF(subscriptions);
    if (r != 0)
        return r < 0 ? -1 : 0;
    long long state;
    if (attr_ll(d->amqp, names.state, &state) < 0)
        return -1;
    if (state != d->open_state)
        return 0;
    PyObject *current = PyDict_GetItemWithError(d->channels, d->number); /* (borrowed) */
    if (current != d->channel)
        return PyErr_Occurred() ? -1 : 0;
    if (attr_ll(d->publisher, names.state, &state) < 0)
        return -1;
    if (state != d->idle_state)
        return 0;
    if ((r = attr_is(d->publisher, names.pending, Py_None)) <= 0 ||
        (r = attr_is(d->transactions, names.tx, Py_None)) <= 0 ||
        (r = attr_is(d->publish_lane, names.publisher, d->publisher)) <= 0)
        return r;
    return 1;
}

/* 1 when every condition for taking this read (`data`, bytes) holds (see
 * the top), 0 when one does not, -1 with an error set. `again`: a second
 * look, after a re-check (device_recheck ran Python, which may have shut
 * the gate). */
static int
device_may_read(DeviceReadObject *d, PyObject *data, int again)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    const unsigned char *bytes = NULL; /* (not bytes: every topic) */
    Py_ssize_t len = 0;
    if (PyBytes_Check(data)) {
        bytes = (const unsigned char *)PyBytes_AS_STRING(data);
        len = PyBytes_GET_SIZE(data);
    }
    if (barrier_holds(&d->barrier, now, bytes, len))
        return 0; /* a SUBSCRIBE under way that its topics may match: Python's barrier holds it */
    if (!d->gate_open || device_gate_audit_on) {
        int r = device_conditions(d);
        if (r == 0 && d->gate_open) {
            PyErr_SetString(PyExc_RuntimeError,
                            "a device's gate stood open over a condition that changed");
            return -1;
        }
        if (r <= 0)
            return r;
        d->gate_open = 1; /* (before the run: what shuts it during the run stands) */
    }
    PyObject *config = attr_get(d->ctx, names.config);
    if (config == NULL)
        return -1;
    long long max_body;
    int r = attr_ll(config, names.max_message_size, &max_body);
    Py_DECREF(config);
    if (r < 0)
        return -1;
    if ((uint64_t)max_body != d->lane->max_body)
        return 0;
    uint64_t journal = word_now(d->journal), catalog = word_now(d->catalog);
    if (journal == d->journal_gen && catalog == d->catalog_gen)
        return 1;
    if (again)
        return 0; /* changed again under the re-check: Python's path */
    if (device_wave_passes(d, journal, catalog)) {
        d->journal_gen = journal; /* (what the re-check would have left) */
        d->catalog_gen = catalog;
        return 1;
    }
    return device_recheck(d) <= 0 ? (PyErr_Occurred() ? -1 : 0) : device_may_read(d, data, 1);
}

/* arm(): the lane from the arena's cursor and fill and the pager's high
 * mark, as PublishLane.arm gives them. 1, 0 (a pager with files: not now),
 * or -1 with an error set. */
static int
device_arm(DeviceReadObject *d)
{
    long long page_out = 1LL << 62;
    PyObject *pager = attr_get(d->ctx, names.pager);
    if (pager == NULL)
        return -1;
    if (pager != Py_None) {
        int files = attr_true(pager, names.files);
        int r = files != 0 ? files : attr_ll(pager, names.arena_high, &page_out);
        Py_DECREF(pager);
        if (r != 0)
            return r < 0 ? -1 : 0;
    } else
        Py_DECREF(pager);
    long long cursor, used, high;
    if (attr_ll(d->arena, names.cursor, &cursor) < 0 || attr_ll(d->arena, names.used, &used) < 0 ||
        attr_ll(d->arena, names.high, &high) < 0)
        return -1;
    return lane_arm_at(d->lane, (Py_ssize_t)cursor, (uint64_t)used, (uint64_t)high,
                       (uint64_t)page_out); /* (0: Python's arm says why) */
}

/* read(data, long_read) -> int | (at, n, acks, ids): bytes of data taken,
 * counted and confirmed (0: none, Python's path reads it all); the tuple:
 * a run lane_run's Python must count (records, or an entry gone). */
static PyObject *
DeviceRead_read(DeviceReadObject *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(data, long_read)");
        return NULL;
    }
    int long_read = PyObject_IsTrue(args[1]);
    if (long_read < 0)
        return NULL;
    int may = device_may_read(d, args[0], 0);
    if (may > 0)
        may = device_arm(d);
    if (may <= 0)
        return may < 0 ? NULL : PyLong_FromLong(0);
    PyObject *run_args[7] = {args[0]};
    memcpy(run_args + 1, d->run_args, sizeof d->run_args);
    SmallBuf acks, ids;
    small_init(&acks);
    small_init(&ids);
    Py_ssize_t at = 0;
    long long n = 0;
    PyObject *out = NULL;
    LaneObject *lane = d->lane;
    int ran = mqtt_run_core(lane, run_args, &at, &n, &acks, &ids);
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb); /* (the run's failure: after the count) */
    /* Inbound.publish's rule: a short read (a device's message or few) or a
     * long run's QoS 0 publish wakes the subscriber's worker now. */
    int at_once = !long_read || lane->n * 4 != (long long)acks.len;
    int r = at_once ? attr_set(d->waker, names.at_once, Py_True) : 0;
    if (r == 0 && (lane->gone_seq >= 0 || lane->st_count)) {
        /* Python counts it (lane_run's account): mqtt_run's result; its
         * confirms may wait (run_end), so the next read looks again. */
        d->gate_open = 0;
        if (ran == 0)
            out = Py_BuildValue("(nLy#y#)", at, n, (const char *)acks.p, acks.len,
                                (const char *)ids.p, ids.len);
        goto done;
    }
    PyObject *objs[6] = {d->arena, d->publisher, d->waker, d->pacer, d->ctx, d->confirm_channels};
    if (r == 0)
        r = lane_account(lane, objs);
    if (at_once && attr_set(d->waker, names.at_once, Py_False) < 0)
        r = -1; /* (it does not outlive the read: data_received's finally) */
    if (r < 0 || ran < 0 || !n) {
        if (r == 0 && ran == 0)
            out = PyLong_FromLong(0); /* nothing taken: Python's path reads it */
        goto done;
    }
    /* lane_run's rest: the read's counters (owed: fold), the confirm
     * numbers, the confirms (nothing waits before them: device_may_read) and
     * so the PUBACKs, now. */
    long long high, sent, seq;
    d->owed_oct += at;
    d->owed_cnt += 1;
    if (attr_add(d->inbound, names.confirm_seq, n) < 0 ||
        attr_ll(d->publisher, names.confirm_high, &high) < 0 ||
        attr_ll(d->publisher, names.confirm_sent, &sent) < 0 ||
        attr_ll(d->publisher, names.publish_seq, &seq) < 0)
        goto done;
    if (high != seq) {
        PyErr_SetString(PyExc_RuntimeError, "a device's run left confirms behind");
        goto done;
    }
    if (item_add(d->stats, stat_confirmed, high - sent) < 0)
        goto done;
    PyObject *v = PyLong_FromLongLong(high);
    r = v == NULL ? -1 : attr_set(d->publisher, names.confirm_sent, v);
    Py_XDECREF(v);
    if (r < 0)
        goto done;
    if (acks.len && d->defer_hold != NULL) { /* behind the deliveries (_ack_defer.h) */
        if (ack_hold_add(d->defer_batch, d->defer_hold, d->defer_owner, acks.p, acks.len) < 0)
            goto done;
        acks.len = 0;
    }
    if (acks.len) {
        PyObject *packets = PyBytes_FromStringAndSize((const char *)acks.p, acks.len);
        PyObject *w = packets == NULL
                          ? NULL
                          : PyObject_CallMethodOneArg(d->transport, names.write, packets);
        Py_XDECREF(packets);
        if (w == NULL)
            goto done;
        Py_DECREF(w);
    }
    out = PyLong_FromSsize_t(at);
done:
    small_free(&acks);
    small_free(&ids);
    return run_failure_first(out, exc_type, exc_value, exc_tb);
}

/* DeviceRead(lane, conn, inbound, transport, reader, amqp, publish_lane,
 *            channels, channel, publisher, transactions, delivery, ctx,
 *            arena, waker, pacer, confirm_channels, stats, exchange, topics,
 *            props0, props1, level5, max_packet, number, journal_word,
 *            journal_gen, catalog_word, catalog_gen, barrier_words,
 *            open_state, idle_state, recheck, wave): made by lane_run (workers/mqtt_lane.py)
 * after a read the lane took whole. The words are offsets into the segment
 * of the lane's Atomic (barrier_words: SubscribeBarrier.words). */
static int
DeviceRead_init(DeviceReadObject *d, PyObject *args, PyObject *kwds)
{
    PyObject *o[25];
    unsigned long long journal_word, journal_gen, catalog_word, catalog_gen;
    PyObject *barrier;
    long long open_state, idle_state;
    PyObject *recheck, *wave;
    if (!PyArg_ParseTuple(args, "O!OOOOOOO!OOOOOOOOO!O!O!O!OOOOOKKKKO!LLOO!:DeviceRead", &LaneType,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &PyDict_Type, &o[7],
                          &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15],
                          &PySet_Type, &o[16], &PyList_Type, &o[17], &PyBytes_Type, &o[18],
                          &PyDict_Type, &o[19], &o[20], &o[21], &o[22], &o[23], &o[24],
                          &journal_word, &journal_gen, &catalog_word, &catalog_gen,
                          &PyTuple_Type, &barrier, &open_state, &idle_state, &recheck,
                          &PyByteArray_Type, &wave))
        return -1;
    LaneObject *lane = (LaneObject *)o[0];
    uint64_t *journal = queues_api->word(lane->atomic, (Py_ssize_t)journal_word);
    uint64_t *catalog = journal == NULL ? NULL : queues_api->word(lane->atomic, (Py_ssize_t)catalog_word);
    BarrierWords words;
    if (catalog == NULL || barrier_words(&words, lane->atomic, barrier) < 0)
        return -1;
    PyObject **fields[] = {
        (PyObject **)&d->lane, &d->conn,      &d->inbound,     &d->transport,
        &d->reader,            &d->amqp,      &d->publish_lane, &d->channels,
        &d->channel,           &d->publisher, &d->transactions, &d->delivery,
        &d->ctx,               &d->arena,     &d->waker,       &d->pacer,
        &d->confirm_channels,  &d->stats,     &d->run_args[0], &d->run_args[1],
        &d->run_args[2],       &d->run_args[3], &d->run_args[4], &d->run_args[5],
        &d->number,
    };
    for (int i = 0; i < 25; i++)
        Py_XSETREF(*fields[i], Py_NewRef(o[i]));
    Py_XSETREF(d->recheck, Py_NewRef(recheck));
    Py_XSETREF(d->wave, Py_NewRef(wave));
    d->journal = journal;
    d->catalog = catalog;
    d->barrier = words;
    d->journal_gen = journal_gen;
    d->catalog_gen = catalog_gen;
    d->open_state = open_state;
    d->idle_state = idle_state;
    d->gate_open = 0; /* (its first read reads every condition) */
    d->owed_oct = d->owed_cnt = 0;
    return 0;
}

static int
DeviceRead_traverse(DeviceReadObject *d, visitproc visit, void *arg)
{
    Py_VISIT(d->lane);
    Py_VISIT(d->conn);
    Py_VISIT(d->inbound);
    Py_VISIT(d->transport);
    Py_VISIT(d->reader);
    Py_VISIT(d->amqp);
    Py_VISIT(d->publish_lane);
    Py_VISIT(d->channels);
    Py_VISIT(d->channel);
    Py_VISIT(d->publisher);
    Py_VISIT(d->transactions);
    Py_VISIT(d->delivery);
    Py_VISIT(d->ctx);
    Py_VISIT(d->arena);
    Py_VISIT(d->waker);
    Py_VISIT(d->pacer);
    Py_VISIT(d->confirm_channels);
    Py_VISIT(d->stats);
    for (int i = 0; i < 6; i++)
        Py_VISIT(d->run_args[i]);
    Py_VISIT(d->number);
    Py_VISIT(d->recheck);
    Py_VISIT(d->wave);
    return 0;
}

static int
DeviceRead_clear(DeviceReadObject *d)
{
    Py_CLEAR(d->lane);
    Py_CLEAR(d->conn);
    Py_CLEAR(d->inbound);
    Py_CLEAR(d->transport);
    Py_CLEAR(d->reader);
    Py_CLEAR(d->amqp);
    Py_CLEAR(d->publish_lane);
    Py_CLEAR(d->channels);
    Py_CLEAR(d->channel);
    Py_CLEAR(d->publisher);
    Py_CLEAR(d->transactions);
    Py_CLEAR(d->delivery);
    Py_CLEAR(d->ctx);
    Py_CLEAR(d->arena);
    Py_CLEAR(d->waker);
    Py_CLEAR(d->pacer);
    Py_CLEAR(d->confirm_channels);
    Py_CLEAR(d->stats);
    for (int i = 0; i < 6; i++)
        Py_CLEAR(d->run_args[i]);
    Py_CLEAR(d->number);
    Py_CLEAR(d->recheck);
    Py_CLEAR(d->wave);
    return 0;
}

static void
DeviceRead_dealloc(DeviceReadObject *d)
{
    PyObject_GC_UnTrack(d);
    DeviceRead_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* fold(): the read counters owed, added to the inner connection's. */
static PyObject *
DeviceRead_fold(DeviceReadObject *d, PyObject *unused)
{
    if (d->amqp != NULL && d->owed_oct) {
        if (attr_add(d->amqp, names.recv_oct, d->owed_oct) < 0)
            return NULL;
        d->owed_oct = 0;
    }
    if (d->amqp != NULL && d->owed_cnt) {
        if (attr_add(d->amqp, names.recv_cnt, d->owed_cnt) < 0)
            return NULL;
        d->owed_cnt = 0;
    }
    Py_RETURN_NONE;
}

/* shut_gate(): a condition may have changed; the next read reads them all. */
static PyObject *
DeviceRead_shut_gate(DeviceReadObject *d, PyObject *unused)
{
    d->gate_open = 0;
    Py_RETURN_NONE;
}

static PyObject *
DeviceRead_get_gate_open(DeviceReadObject *d, void *closure)
{
    return PyBool_FromLong(d->gate_open);
}

/* device_gate_audit(on) (module function): where on, an open gate's
 * conditions are read anyway and one that fails raises (the test runs:
 * a change that should have shut the gate and did not). */
static PyObject *
device_gate_audit(PyObject *module, PyObject *on)
{
    int r = PyObject_IsTrue(on);
    if (r < 0)
        return NULL;
    device_gate_audit_on = r;
    Py_RETURN_NONE;
}

static PyMethodDef DeviceRead_methods[] = {
    {"read", (PyCFunction)(void (*)(void))DeviceRead_read, METH_FASTCALL,
     "A device's read through its lane, counted and confirmed; 0: Python's path reads it."},
    {"shut_gate", (PyCFunction)DeviceRead_shut_gate, METH_NOARGS,
     "A condition may have changed: the next read reads them all again."},
    {"fold", (PyCFunction)DeviceRead_fold, METH_NOARGS,
     "The reads' counters owed since the last fold, added to the inner connection's."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef DeviceRead_getset[] = {
    {"gate_open", (getter)DeviceRead_get_gate_open, NULL,
     "Whether the next read skips the conditions on the device's objects.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DeviceReadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal.workers._wire.DeviceRead",
    .tp_basicsize = sizeof(DeviceReadObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A device's reads through its publish lane in C (workers/_lane_device.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)DeviceRead_init,
    .tp_traverse = (traverseproc)DeviceRead_traverse,
    .tp_clear = (inquiry)DeviceRead_clear,
    .tp_dealloc = (destructor)DeviceRead_dealloc,
    .tp_methods = DeviceRead_methods,
    .tp_getset = DeviceRead_getset,
};
