/* Waker.wake and Pacer.published in C, for the lane's counting
 * (workers/_lane_account.h, issue 41's fan-in).
 *
 * A device's read that appends to a queue whose consumer's worker watches
 * it takes that watch, and the counting woke the watcher through
 * Waker.wake (shm/wake.py): wake, the layout's worker_bitmap and _set,
 * three Python calls a message, then the pacer's count (Pacer.published,
 * workers/pacing.py), a fourth that returns at once 31 times in 32. Here
 * both are the same steps in C where they are plain: a watching IO worker
 * (not the scheduler), a Waker over a plain Atomic (not the crash tests'
 * interposer), a pacer holding nothing and not due for a look. Anything
 * else calls the Python method, which stays the one definition of what a
 * wake-up and a look are.
 *
 * Included by _wire.c after _attrs.h; part of that module. */

#include <unistd.h>

/* The attribute names read here, interned by waker_names_init(). */
static struct {
    PyObject *a, *local, *on_local, *worker_efds, *bitmaps, *deferred, *at_once, *schedule,
        *flush_deferred, *wake, *qid, *due, *published;
} waker_names;

static int
waker_names_init(void)
{
    const char *texts[] = {"a",        "local",    "on_local", "worker_efds",    "bitmaps",
                           "deferred", "at_once",  "schedule", "flush_deferred", "wake",
                           "qid",      "due",      "published"};
    PyObject **fields[] = {&waker_names.a,        &waker_names.local,    &waker_names.on_local,
                           &waker_names.worker_efds, &waker_names.bitmaps, &waker_names.deferred,
                           &waker_names.at_once,  &waker_names.schedule, &waker_names.flush_deferred,
                           &waker_names.wake,     &waker_names.qid,      &waker_names.due,
                           &waker_names.published};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if ((*fields[i] = PyUnicode_InternFromString(texts[i])) == NULL)
            return -1;
    return 0;
}

/* WATCH_WORKER (shm/layout.py): Q_WATCH's value for IO worker 0. */
#define SHOAL_WATCH_WORKER 2

/* Waker.wake(qid, watcher)'s Python, for what the C below does not take. */
static int
waker_wake_python(PyObject *waker, unsigned long long qid, int watcher)
{
    PyObject *w = PyObject_CallMethod(waker, "wake", "Ki", qid, watcher);
    Py_XDECREF(w);
    return w == NULL ? -1 : 0;
}

/* The eventfd write Waker._set owes when the bitmap word was empty: at
 * once, or deferred to the iteration's end (defer_to, at_once). 0 or -1. */
static int
waker_signal(PyObject *waker, PyObject *efd)
{
    PyObject *deferred = attr_get(waker, waker_names.deferred);
    if (deferred == NULL)
        return -1;
    int now = deferred == Py_None;
    int r = 0;
    if (!now) {
        now = attr_true(waker, waker_names.at_once);
        if (now > 0) /* one wake-up now, the rest at the iteration's end */
            r = attr_set(waker, waker_names.at_once, Py_False);
    }
    if (now < 0 || r < 0) {
        Py_DECREF(deferred);
        return -1;
    }
    if (now) {
        Py_DECREF(deferred);
        long fd = PyLong_AsLong(efd);
        if (fd == -1 && PyErr_Occurred())
            return -1;
        uint64_t one = 1;
        if (write((int)fd, &one, sizeof one) != (ssize_t)sizeof one) {
            PyErr_SetFromErrno(PyExc_OSError); /* (os.eventfd_write's) */
            return -1;
        }
        return 0;
    }
    if (!PyList_Check(deferred)) {
        Py_DECREF(deferred);
        PyErr_SetString(PyExc_TypeError, "Waker.deferred: a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(deferred);
    for (Py_ssize_t i = 0; i < n; i++) {
        int same = PyObject_RichCompareBool(PyList_GET_ITEM(deferred, i), efd, Py_EQ);
        if (same != 0) {
            Py_DECREF(deferred);
            return same < 0 ? -1 : 0; /* already owed */
        }
    }
    if (n == 0) {
        PyObject *schedule = attr_get(waker, waker_names.schedule);
        if (schedule == NULL)
            r = -1;
        else if (schedule != Py_None) {
            PyObject *flush = attr_get(waker, waker_names.flush_deferred);
            PyObject *h = flush == NULL ? NULL : PyObject_CallOneArg(schedule, flush);
            r = h == NULL ? -1 : 0;
            Py_XDECREF(h);
            Py_XDECREF(flush);
        }
        Py_XDECREF(schedule);
    }
    if (r == 0)
        r = PyList_Append(deferred, efd);
    Py_DECREF(deferred);
    return r;
}

/* Waker.wake(qid, watcher) for `atomic`'s segment: 0, or -1 with an error
 * set. */
static int
waker_wake(PyObject *atomic, PyObject *waker, unsigned long long qid, int watcher)
{
    PyObject *a = attr_get(waker, waker_names.a);
    if (a == NULL)
        return -1;
    Py_DECREF(a); /* (the waker holds it) */
    PyObject *bitmaps = attr_get(waker, waker_names.bitmaps);
    if (bitmaps == NULL)
        return -1;
    Py_ssize_t worker = (Py_ssize_t)watcher - SHOAL_WATCH_WORKER;
    if (a != atomic || !queues_api->is_atomic(a) || !PyTuple_Check(bitmaps) || worker < 0 ||
        worker >= PyTuple_GET_SIZE(bitmaps)) {
        Py_DECREF(bitmaps); /* the scheduler's watch, an interposer: Python's */
        return waker_wake_python(waker, qid, watcher);
    }
    Py_ssize_t bitmap = PyLong_AsSsize_t(PyTuple_GET_ITEM(bitmaps, worker));
    Py_DECREF(bitmaps);
    uint64_t *word = bitmap < 0 ? NULL : queues_api->word(a, bitmap + (Py_ssize_t)(qid >> 6) * 8);
    if (word == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a worker's bitmap outside the segment");
        return -1;
    }
    long long local;
    if (attr_ll(waker, waker_names.local, &local) < 0)
        return -1;
    PyObject *on_local = NULL;
    if (local == worker) {
        on_local = attr_get(waker, waker_names.on_local);
        if (on_local == NULL)
            return -1;
        if (on_local == Py_None)
            Py_CLEAR(on_local);
    }
    uint64_t old = __atomic_fetch_or(word, 1ULL << (qid & 63), __ATOMIC_SEQ_CST);
    if (old) {
        Py_XDECREF(on_local);
        return 0; /* the word's first bit wrote (or owes) the eventfd */
    }
    if (on_local != NULL) { /* the watcher in this process: no system call */
        PyObject *r = PyObject_CallNoArgs(on_local);
        Py_DECREF(on_local);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *efds = attr_get(waker, waker_names.worker_efds);
    if (efds == NULL)
        return -1;
    int r;
    if (!PyTuple_Check(efds) || worker >= PyTuple_GET_SIZE(efds)) {
        PyErr_SetString(PyExc_TypeError, "Waker.worker_efds: one per worker");
        r = -1;
    } else
        r = waker_signal(waker, PyTuple_GET_ITEM(efds, worker));
    Py_DECREF(efds);
    return r;
}

/* Pacer.published(qid, n), where it would return at once: the pacer
 * holds no queue and its next look is not due (its `due` counted down
 * here). Else the method. 0, or -1 with an error set. */
static int
pacer_published(PyObject *pacer, unsigned long long qid, long long n)
{
    long long holding, due;
    if (attr_ll(pacer, waker_names.qid, &holding) < 0)
        return -1;
    if (holding >= 0)
        return 0; /* (the method's first test) */
    if (attr_ll(pacer, waker_names.due, &due) < 0)
        return -1;
    if (due - n > 0) {
        PyObject *v = PyLong_FromLongLong(due - n);
        int r = v == NULL ? -1 : attr_set(pacer, waker_names.due, v);
        Py_XDECREF(v);
        return r;
    }
    PyObject *p = PyObject_CallMethod(pacer, "published", "KL", qid, n);
    Py_XDECREF(p);
    return p == NULL ? -1 : 0;
}
