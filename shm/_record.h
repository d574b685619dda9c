/*
 * A message record in a block of a worker's arena: the one definition of its
 * format in C, included by shm/_atomic.c and workers/_wire.c. shm/layout.py is
 * the Python one; tests/unit/test_wire_fast.py checks that the two agree
 * (these constants as both C modules export them, and the writers byte for
 * byte).
 *
 *   block:  [u64 size][u64 refs] (BLOCK_HEADER bytes), then the record
 *   record: MSG_PREFIX "<BBHIQ" (exchange length, routing key length, flags,
 *           properties length, body length), the exchange, the routing key,
 *           the properties, the body; MSG_TIME "<qq" (published, expires at,
 *           ms) when flags has MSG_TIMED; MSG_TAG "<IIQ" (segment slot, check,
 *           record offset) after that when flags has MSG_TAGGED.
 */
#ifndef SHOAL_RECORD_H
#define SHOAL_RECORD_H

#include <stdint.h>
#include <string.h>

#define BLOCK_HEADER 16
#define MSG_PREFIX_SIZE 16
#define MSG_TAGGED 1
#define MSG_TIMED 2
#define MSG_TIME_SIZE 16
#define MSG_TAG_SIZE 16
/* The body length word of the record in a block (what Q_BYTES counts). */
#define MSG_BODY_LEN (BLOCK_HEADER + 8)

static inline void
record_put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The size of a record of these parts (without a tag). */
static inline Py_ssize_t
record_size(Py_ssize_t ex_len, Py_ssize_t rk_len, Py_ssize_t props_len, Py_ssize_t body_len,
            int timed)
{
    return MSG_PREFIX_SIZE + ex_len + rk_len + props_len + body_len + (timed ? MSG_TIME_SIZE : 0);
}

/* Write a record's prefix and its exchange, routing key and properties at
 * `o` (the record's start); with `timed`, its MSG_TIME after the body-to-be.
 * Returns where the body goes. */
static inline unsigned char *
record_write_head(unsigned char *o, const void *ex, Py_ssize_t ex_len, const void *rk,
                  Py_ssize_t rk_len, const void *props, Py_ssize_t props_len, Py_ssize_t body_len,
                  int timed, long long published, long long expires)
{
    o[0] = (unsigned char)ex_len;
    o[1] = (unsigned char)rk_len;
    record_put_le(o + 2, timed ? MSG_TIMED : 0, 2);
    record_put_le(o + 4, (uint64_t)props_len, 4);
    record_put_le(o + 8, (uint64_t)body_len, 8);
    o += MSG_PREFIX_SIZE;
    memcpy(o, ex, ex_len);
    o += ex_len;
    memcpy(o, rk, rk_len);
    o += rk_len;
    memcpy(o, props, props_len);
    o += props_len;
    if (timed) {
        record_put_le(o + body_len, (uint64_t)published, 8);
        record_put_le(o + body_len + 8, (uint64_t)expires, 8);
    }
    return o;
}

/* Tag the record at `record` (its start; `size`: its bytes without the tag,
 * MSG_TIME included) with the place of its PUBLISH record in the message
 * store (shm/arena.py write_tag): the tag after the record, MSG_TAGGED in
 * its flags. The block must have MSG_TAG_SIZE bytes to spare. */
static inline void
record_write_tag(unsigned char *record, Py_ssize_t size, uint32_t slot, uint32_t check,
                 uint64_t offset)
{
    unsigned char *t = record + size;
    record_put_le(t, slot, 4);
    record_put_le(t + 4, check, 4);
    record_put_le(t + 8, offset, 8);
    record[2] |= MSG_TAGGED; /* the flags' low byte */
}

/* The offset of the body of the record at `record` (its start) in a buffer
 * of `len` bytes, from the record's prefix; -1 if the lengths point past it. */
static inline Py_ssize_t
record_body_at(const unsigned char *base, Py_ssize_t len, Py_ssize_t record,
               uint64_t *body_len)
{
    if (record < 0 || record > len - MSG_PREFIX_SIZE)
        return -1;
    const unsigned char *r = base + record;
    uint64_t props = (uint64_t)r[4] | (uint64_t)r[5] << 8 | (uint64_t)r[6] << 16 |
                     (uint64_t)r[7] << 24;
    uint64_t body = 0;
    for (int i = 7; i >= 0; i--)
        body = body << 8 | r[8 + i];
    uint64_t at = (uint64_t)record + MSG_PREFIX_SIZE + r[0] + r[1] + props;
    if (at > (uint64_t)len || body > (uint64_t)len - at)
        return -1;
    *body_len = body;
    return (Py_ssize_t)at;
}

#endif
