/*
 * shm._atomic: sequentially consistent 64-bit atomics on a shared buffer.
 *
 * Why C: a compare-and-swap through the `atomics` PyPI package costs 15-18 us
 * from CPython 3.11; one METH_FASTCALL call into __atomic_* costs ~0.1 us.
 * This module knows nothing about Shoal's layout: offsets come from
 * shm/layout.py. Every call checks bounds and 8-byte alignment, so a bad
 * offset raises instead of corrupting memory.
 *
 * All operations are __ATOMIC_SEQ_CST: the store-then-load handshakes between
 * publishers and the scheduler (see shm/ARCHITECTURE.md, "no lost wake-ups")
 * are Dekker-style and need a total order, not just acquire/release.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int has_view;
} AtomicObject;

static int
Atomic_init(AtomicObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj))
        return -1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    self->has_view = 1;
    self->base = (char *)self->view.buf;
    self->len = self->view.len;
    if (((uintptr_t)self->base) % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "buffer is not 8-byte aligned");
        return -1;
    }
    return 0;
}

static void
Atomic_dealloc(AtomicObject *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Returns a pointer to the 64-bit word at `off`, or NULL with an exception set. */
static inline uint64_t *
word_at(AtomicObject *self, PyObject *off_obj)
{
    Py_ssize_t off = PyLong_AsSsize_t(off_obj);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "Atomic is not attached to a buffer");
        return NULL;
    }
    if (off < 0 || off > self->len - 8 || (off & 7) != 0) {
        PyErr_Format(PyExc_IndexError, "offset %zd out of range or unaligned", off);
        return NULL;
    }
    return (uint64_t *)(self->base + off);
}

static inline int
as_u64(PyObject *obj, uint64_t *out)
{
    /* Accept negative values as two's complement so counters can take deltas. */
    unsigned long long v = PyLong_AsUnsignedLongLongMask(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject *
Atomic_load(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "load(offset)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(p, __ATOMIC_SEQ_CST));
}

static PyObject *
Atomic_store(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t v;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(offset, value)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &v) < 0)
        return NULL;
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *
Atomic_cas(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t expected, desired;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cas(offset, expected, desired)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &expected) < 0 || as_u64(args[2], &desired) < 0)
        return NULL;
    if (__atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *
Atomic_fetch_add(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t delta;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fetch_add(offset, delta)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &delta) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_fetch_add(p, delta, __ATOMIC_SEQ_CST));
}

static PyObject *
Atomic_fetch_or(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t bits;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fetch_or(offset, bits)");
        return NULL;
    }
    uint64_t *p = word_at(self, args[0]);
    if (p == NULL || as_u64(args[1], &bits) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_fetch_or(p, bits, __ATOMIC_SEQ_CST));
}

/*
 * find_entry(ring_offset, mask, start, end) -> int
 *
 * Scans queue-log cells for sequence numbers start..end-1. A cell is 16 bytes
 * (state word, body reference); the state word keeps the sequence number in
 * bits 20..63 and the state in bits 0..3 (see shm/layout.py). Returns the
 * first sequence whose cell holds that sequence in state AVAILABLE (1);
 * -1 if none; or -(seq + 2) when cell `seq` is reserved but not yet published
 * (its word still carries an older sequence), because nothing past it may be
 * skipped by a FIFO consumer yet.
 */
static PyObject *
Atomic_find_entry(AtomicObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "find_entry(ring_offset, mask, start, end)");
        return NULL;
    }
    Py_ssize_t ring = PyLong_AsSsize_t(args[0]);
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!self->has_view || ring < 0 || (ring & 7) != 0 ||
        ring + (Py_ssize_t)((mask + 1) * 16) > self->len) {
        PyErr_SetString(PyExc_IndexError, "ring out of range");
        return NULL;
    }
    const char *base = self->base + ring;
    for (unsigned long long seq = start; seq < end; seq++) {
        uint64_t w = __atomic_load_n((uint64_t *)(base + (seq & mask) * 16), __ATOMIC_SEQ_CST);
        uint64_t wseq = w >> 20;
        if (wseq < seq || (wseq == seq && (w & 15) == 0))
            return PyLong_FromLongLong(-(long long)seq - 2);
        if (wseq == seq && (w & 15) == 1)
            return PyLong_FromUnsignedLongLong(seq);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef Atomic_methods[] = {
    {"load", (PyCFunction)(void (*)(void))Atomic_load, METH_FASTCALL, "Atomic 64-bit load."},
    {"store", (PyCFunction)(void (*)(void))Atomic_store, METH_FASTCALL, "Atomic 64-bit store."},
    {"cas", (PyCFunction)(void (*)(void))Atomic_cas, METH_FASTCALL,
     "Compare-and-swap; True if the word held `expected` and now holds `desired`."},
    {"fetch_add", (PyCFunction)(void (*)(void))Atomic_fetch_add, METH_FASTCALL,
     "Atomic add (mod 2**64); returns the old value."},
    {"fetch_or", (PyCFunction)(void (*)(void))Atomic_fetch_or, METH_FASTCALL,
     "Atomic or; returns the old value."},
    {"find_entry", (PyCFunction)(void (*)(void))Atomic_find_entry, METH_FASTCALL,
     "Scan a queue log for the first AVAILABLE entry."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject AtomicType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shm._atomic.Atomic",
    .tp_basicsize = sizeof(AtomicObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Atomic(buffer): 64-bit seq_cst atomics on a writable, 8-byte aligned buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Atomic_init,
    .tp_dealloc = (destructor)Atomic_dealloc,
    .tp_methods = Atomic_methods,
};

static struct PyModuleDef atomicmodule = {PyModuleDef_HEAD_INIT, "_atomic",
                                          "64-bit atomics on shared buffers.", -1, NULL};

PyMODINIT_FUNC
PyInit__atomic(void)
{
    if (PyType_Ready(&AtomicType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&atomicmodule);
    if (m == NULL)
        return NULL;
    Py_INCREF(&AtomicType);
    if (PyModule_AddObject(m, "Atomic", (PyObject *)&AtomicType) < 0) {
        Py_DECREF(&AtomicType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
