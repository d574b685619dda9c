/*
 * Looks at one word of many queue records in one call: the once-a-second
 * sweeps (a worker's look for lost wake-ups, the scheduler's, the pinned
 * heads' look at every log's fill) walked every queue in Python, two to
 * five calls a queue; a broker with 10,000 idle MQTT subscribers (a queue
 * each) spent most of its idle CPU there. The qids come from any iterable
 * of ints (a dict's keys, a set, a tuple); the word of queue `qid` is at
 * base + qid * stride + offset, checked against the buffer like load().
 * Loads are atomic (acquire): the same reads the Python loops made.
 *
 * Included by _atomic.c (AtomicObject, word offsets checked there).
 */

enum scan_test {
    SCAN_COUNTED, /* the word read as a counter (shm/queue_table.py counted) is > 0 */
    SCAN_DIFFERS, /* the word is not `value` */
    SCAN_SPAN,    /* word at offset2 - word at offset >= value: (qid, first word) */
};

static PyObject *
scan_records(AtomicObject *self, PyObject *qids, Py_ssize_t base, Py_ssize_t stride,
             Py_ssize_t offset, Py_ssize_t offset2, uint64_t value, enum scan_test test,
             PyObject *skip)
{
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "Atomic is not attached to a buffer");
        return NULL;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL)
        return NULL;
    PyObject *it = PyObject_GetIter(qids);
    if (it == NULL)
        goto fail;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        Py_ssize_t qid = PyLong_AsSsize_t(item);
        if (qid == -1 && PyErr_Occurred()) {
            Py_DECREF(item);
            goto fail_it;
        }
        if (skip != NULL) {
            int known = PySequence_Contains(skip, item);
            if (known != 0) {
                Py_DECREF(item);
                if (known < 0)
                    goto fail_it;
                continue;
            }
        }
        Py_ssize_t at = base + qid * stride;
        Py_ssize_t far = offset > offset2 ? offset : offset2;
        if (qid < 0 || at < 0 || at + far > self->len - 8 || ((at + offset) & 7) != 0 ||
            ((at + offset2) & 7) != 0) {
            PyErr_Format(PyExc_IndexError, "queue %zd's record is out of range", qid);
            Py_DECREF(item);
            goto fail_it;
        }
        uint64_t word = __atomic_load_n((uint64_t *)(self->base + at + offset), __ATOMIC_ACQUIRE);
        PyObject *keep = NULL;
        int owned = 0;
        switch (test) {
        case SCAN_COUNTED:
            keep = (word != 0 && word < ((uint64_t)1 << 63)) ? item : NULL;
            break;
        case SCAN_DIFFERS:
            keep = word != value ? item : NULL;
            break;
        case SCAN_SPAN: {
            uint64_t far_word =
                __atomic_load_n((uint64_t *)(self->base + at + offset2), __ATOMIC_ACQUIRE);
            if (far_word - word >= value && far_word - word < ((uint64_t)1 << 63)) {
                keep = Py_BuildValue("(OK)", item, (unsigned long long)word);
                if (keep == NULL) {
                    Py_DECREF(item);
                    goto fail_it;
                }
                owned = 1;
            }
            break;
        }
        }
        int failed = keep != NULL && PyList_Append(found, keep) < 0;
        if (owned)
            Py_DECREF(keep);
        Py_DECREF(item);
        if (failed)
            goto fail_it;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        goto fail;
    return found;
fail_it:
    Py_DECREF(it);
fail:
    Py_DECREF(found);
    return NULL;
}

static int
scan_sizes(PyObject *const *args, Py_ssize_t from, Py_ssize_t n, Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(args[from + i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* counted_among(qids, base, stride, offset) and
 * differ_among(qids, base, stride, offset, value) -> [qid, ...] */
static PyObject *
scan_one_word(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs, enum scan_test test)
{
    Py_ssize_t s[3];
    uint64_t value = 0;
    Py_ssize_t want = test == SCAN_DIFFERS ? 5 : 4;
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, test == SCAN_DIFFERS
                                             ? "differ_among(qids, base, stride, offset, value)"
                                             : "counted_among(qids, base, stride, offset)");
        return NULL;
    }
    if (scan_sizes(args, 1, 3, s) < 0 || (want == 5 && as_u64(args[4], &value) < 0))
        return NULL;
    return scan_records(self, args[0], s[0], s[1], s[2], s[2], value, test, NULL);
}

static PyObject *
Atomic_counted_among(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return scan_one_word(self, args, nargs, SCAN_COUNTED);
}

static PyObject *
Atomic_differ_among(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return scan_one_word(self, args, nargs, SCAN_DIFFERS);
}

/* span_among(qids, skip, base, stride, low, high, least) -> [(qid, low word), ...]:
 * the records whose word at `high` is at least `least` above the one at `low`,
 * qids in `skip` (a container) left out. */
static PyObject *
Atomic_span_among(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t s[4];
    uint64_t least;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "span_among(qids, skip, base, stride, low, high, least)");
        return NULL;
    }
    if (scan_sizes(args, 2, 4, s) < 0 || as_u64(args[6], &least) < 0)
        return NULL;
    return scan_records(self, args[0], s[0], s[1], s[2], s[3], least, SCAN_SPAN, args[1]);
}
