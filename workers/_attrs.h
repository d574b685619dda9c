/* Reading and adding to a Python object's attributes from C: the checks
 * the C twins of Python paths make (workers/_lane_device.h, _lane_account.h,
 * _ack_read.h in _wire.c; _mqtt_flush.h in _mqtt_wire.c). One definition,
 * included by each module. */

#include <structmember.h> /* PyMemberDef, T_OBJECT_EX, READONLY: a __slots__ entry */

/* attr_get / attr_set: obj.name where it is a plain __slots__ entry, read or
 * written in its place. PyObject_GetAttr's generic path (the type's lookup,
 * the member descriptor's call) was a fifth of the IO workers' user time in
 * MQTT fan-in (perf, issue 41): these C paths read a dozen slots a message.
 *
 * A small direct-mapped cache holds, per (type, name), the slot's offset.
 * An entry holds while the type's version tag is the one it learnt under:
 * CPython gives a type a new tag (never reused) whenever the type or a base
 * changes, and 0 where it has none, which matches nothing. It holds a
 * reference to its name, so no other string takes that address meanwhile.
 * What is not a plain slot (a property, an instance's dict, a class with
 * __getattr__ or its own getattro/setattro) takes the generic path. */
typedef struct {
    PyTypeObject *type; /* (not a reference: the tag decides) */
    PyObject *name;     /* a reference */
    unsigned int version;
    Py_ssize_t get_at; /* the slot's offset, or 0: PyObject_GetAttr */
    Py_ssize_t set_at; /* the same for PyObject_SetAttr */
} slot_place;

/* Two places a set (the last learnt first), 4,096 sets: the workers' C
 * paths read some 150 (type, name) pairs; with one place a set and 256
 * sets, pairs that shared one took turns evicting each other (perf: a
 * lookup in every few). */
#define SLOT_SETS 4096 /* a power of two */
static slot_place slot_places[SLOT_SETS][2];
/* What `p` says of (tp, name), learnt again: _PyType_Lookup gives the type
 * a tag where it can. */
static slot_place *
slot_learn(slot_place *p, PyTypeObject *tp, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(tp, name); /* (borrowed) */
    Py_ssize_t at = 0;
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
        PyType_IsSubtype(tp, PyDescr_TYPE(descr))) { /* (its own layout's) */
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY) && m->offset > 0)
            at = m->offset;
    }
    Py_INCREF(name);
    Py_XSETREF(p->name, name);
    p->type = tp;
    p->version = (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? tp->tp_version_tag : 0;
    p->get_at = tp->tp_getattro == PyObject_GenericGetAttr ? at : 0;
    p->set_at = tp->tp_setattro == PyObject_GenericSetAttr ? at : 0;
    return p;
}

static inline slot_place *
slot_place_of(PyTypeObject *tp, PyObject *name)
{
    uint64_t h = (uint64_t)(uintptr_t)tp * 0x9E3779B97F4A7C15ull +
                 (uint64_t)(uintptr_t)name * 0xC2B2AE3D27D4EB4Full;
    slot_place *set = slot_places[h >> (64 - 12)];
    unsigned int version = tp->tp_version_tag;
    if (set[0].type == tp && set[0].name == name && set[0].version == version && version)
        return &set[0];
    if (set[1].type == tp && set[1].name == name && set[1].version == version && version)
        return &set[1];
    /* the first place's pair moves to the second (its name's reference with it) */
    Py_XDECREF(set[1].name);
    set[1] = set[0];
    set[0].name = NULL;
    return slot_learn(&set[0], tp, name);
}

/* obj.name: a new reference, or NULL with an error set. */
static inline PyObject *
attr_get(PyObject *obj, PyObject *name)
{
    slot_place *p = slot_place_of(Py_TYPE(obj), name);
    if (p->get_at) {
        PyObject *v = *(PyObject **)((char *)obj + p->get_at);
        if (v != NULL)
            return Py_NewRef(v);
    } /* (an empty slot: the generic path's AttributeError) */
    return PyObject_GetAttr(obj, name);
}

/* obj.name = v: 0, or -1 with an error set. */
static inline int
attr_set(PyObject *obj, PyObject *name, PyObject *v)
{
    slot_place *p = slot_place_of(Py_TYPE(obj), name);
    if (p->set_at && v != NULL) { /* as PyMember_SetOne's T_OBJECT_EX */
        PyObject **slot = (PyObject **)((char *)obj + p->set_at);
        PyObject *old = *slot;
        *slot = Py_NewRef(v);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, name, v);
}

/* The truth of obj.name: 1, 0, or -1 with an error set. */
static inline int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = attr_get(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* obj.name as a C integer: 0, or -1 with an error set. */
static inline int
attr_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = attr_get(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* Whether obj.name is `what`: 1, 0, or -1 with an error set. */
static inline int
attr_is(PyObject *obj, PyObject *name, PyObject *what)
{
    PyObject *v = attr_get(obj, name);
    if (v == NULL)
        return -1;
    int r = v == what;
    Py_DECREF(v);
    return r;
}

/* obj.name += n (an int attribute): 0, or -1 with an error set. */
static inline int
attr_add(PyObject *obj, PyObject *name, long long n)
{
    PyObject *v = attr_get(obj, name);
    if (v == NULL)
        return -1;
    PyObject *add = PyLong_FromLongLong(n);
    PyObject *sum = add == NULL ? NULL : PyNumber_Add(v, add);
    Py_DECREF(v);
    Py_XDECREF(add);
    if (sum == NULL)
        return -1;
    int r = attr_set(obj, name, sum);
    Py_DECREF(sum);
    return r;
}
