/* A device's plain MQTT PUBLISH, parsed: one definition for the two C paths
 * that take a run of them (workers/_mqtt_wire.c publishes: as the inner
 * AMQP connection's frames; workers/_wire.c Lane.mqtt_run: straight into
 * their queues through the publish lane).
 *
 * Plain: QoS 0, or QoS 1 with DUP or without; not retained; whole in the
 * buffer; within max_packet; with a packet id (not 0) at QoS 1; a 5.0
 * packet with no properties (a zero property length). Anything else is not
 * plain: the run stops there and Python's decoder takes it (and refuses
 * what is malformed). */
#ifndef SHOAL_MQTT_PUBLISH_H
#define SHOAL_MQTT_PUBLISH_H

#include <Python.h>

typedef struct {
    const unsigned char *topic; /* the topic name's bytes (not its length prefix) */
    Py_ssize_t topic_len;
    const unsigned char *body; /* the application message */
    Py_ssize_t body_len;
    int qos;
    long id;         /* the packet id; 0 at QoS 0 */
    Py_ssize_t next; /* where the packet after it starts */
} PlainPublish;

/* 1 and the packet's parts when a plain PUBLISH starts at `at` of p[0:n],
 * else 0. */
static inline int
plain_publish_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t at, int level5,
                 Py_ssize_t max_packet, PlainPublish *out)
{
    if (n - at < 2)
        return 0;
    unsigned char first = p[at];
    if (first != 0x30 && first != 0x32 && first != 0x3A)
        return 0; /* not a PUBLISH at QoS 0 or 1 (with DUP or without), or retained */
    Py_ssize_t remaining = 0, i = at + 1;
    int shift = 0, complete = 0;
    while (i < n && shift <= 21) {
        unsigned char b = p[i++];
        remaining |= (Py_ssize_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            complete = 1;
            break;
        }
        shift += 7;
    }
    if (!complete || i - at + remaining > max_packet || n - i < remaining)
        return 0; /* not whole here, malformed or too large: Python says which */
    const unsigned char *packet = p + i;
    if (remaining < 2)
        return 0;
    Py_ssize_t topic_end = 2 + (((Py_ssize_t)packet[0] << 8) | packet[1]);
    if (remaining < topic_end)
        return 0;
    Py_ssize_t k = topic_end;
    long id = 0;
    int qos = (first >> 1) & 3;
    if (qos) {
        if (remaining < k + 2)
            return 0;
        id = ((long)packet[k] << 8) | packet[k + 1];
        if (!id)
            return 0;
        k += 2;
    }
    if (level5) {
        if (remaining <= k || packet[k])
            return 0; /* properties: the decoder's */
        k += 1;
    }
    out->topic = packet + 2;
    out->topic_len = topic_end - 2;
    out->body = packet + k;
    out->body_len = remaining - k;
    out->qos = qos;
    out->id = id;
    out->next = i + remaining;
    return 1;
}

/* A connection's topics dict this small is scanned, its keys' bytes
 * compared with the PUBLISH's, not looked up: a device publishes to a topic
 * or a few, and a lookup first made a bytes object of the topic and hashed
 * it, each PUBLISH (4 % of a fan-in worker's time, perf). */
#define FEW_TOPICS 4

/* What `topics` (a dict keyed by topic bytes, of tuples) holds at `index`
 * for the PUBLISH's topic, borrowed: NULL when it has no such bytes (the
 * run stops there) or on an error (*error set to 1, an exception set). */
static inline PyObject *
plain_publish_known(PyObject *topics, const PlainPublish *pub, Py_ssize_t index, int *error)
{
    *error = 0;
    PyObject *known = NULL;
    if (PyDict_GET_SIZE(topics) <= FEW_TOPICS) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(topics, &pos, &key, &value)) { /* (borrowed) */
            if (PyBytes_CheckExact(key) && PyBytes_GET_SIZE(key) == pub->topic_len &&
                memcmp(PyBytes_AS_STRING(key), pub->topic, (size_t)pub->topic_len) == 0) {
                known = value;
                break;
            }
        }
        if (known == NULL)
            return NULL;
    } else {
        PyObject *topic = PyBytes_FromStringAndSize((const char *)pub->topic, pub->topic_len);
        if (topic == NULL) {
            *error = 1;
            return NULL;
        }
        known = PyDict_GetItemWithError(topics, topic); /* borrowed */
        Py_DECREF(topic);
        if (known == NULL) {
            *error = PyErr_Occurred() != NULL;
            return NULL;
        }
    }
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) <= index ||
        !PyBytes_Check(PyTuple_GET_ITEM(known, index)))
        return NULL;
    return PyTuple_GET_ITEM(known, index);
}

#endif
