/* Reading and adding to a Python object's attributes from C: the checks
 * the C twins of Python paths make (workers/_lane_device.h, _lane_account.h,
 * _ack_read.h in _wire.c; _mqtt_flush.h in _mqtt_wire.c). One definition,
 * included by each module. */

/* The truth of obj.name: 1, 0, or -1 with an error set. */
static inline int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
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
    PyObject *v = PyObject_GetAttr(obj, name);
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
    PyObject *v = PyObject_GetAttr(obj, name);
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
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    PyObject *add = PyLong_FromLongLong(n);
    PyObject *sum = add == NULL ? NULL : PyNumber_Add(v, add);
    Py_DECREF(v);
    Py_XDECREF(add);
    if (sum == NULL)
        return -1;
    int r = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return r;
}
