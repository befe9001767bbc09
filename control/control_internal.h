/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_CONTROL_INTERNAL_H
#define KVX_CONTROL_INTERNAL_H
/*
 * Module-private helpers of the control module (never included outside control, tests/control,
 * tests/fuzz). Besides the control sources, this header is the only user of msgpack.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "kvxfer/control.h"

/* Bounded output buffer used as a msgpack_packer write target. */
struct kvx_ctl_wbuf {
	uint8_t *p;
	size_t cap;
	size_t len;
	int overflow;
};

void kvx_ctl_wbuf_init(struct kvx_ctl_wbuf *w, void *buf, size_t cap);
int kvx_ctl_wbuf_write(void *data, const char *buf, size_t len);

/*
 * Walk the msgpack encoding of exactly one object in buf[0..len) without allocating: every
 * container's declared element count must fit in the bytes left (>= 1 byte per element), the
 * depth must stay <= max_depth and the total object count <= KVX_MSG_ELEMS_MAX; ext types and
 * 0xc1 are rejected. *end receives the offset just past the object (may be < len).
 * Returns 0, -EPROTO (malformed/truncated) or -EMSGSIZE (over a limit).
 */
int kvx_ctl_prescan(const uint8_t *buf, size_t len, unsigned max_depth, size_t *end, char *err,
		    size_t err_len);

/*
 * Prescan, then unpack exactly one object spanning all of buf with msgpack-c. On success the
 * caller owns *u (msgpack_unpacked_destroy) and its STR/BIN objects point into buf.
 */
int kvx_ctl_unpack_strict(const void *buf, size_t len, unsigned max_depth, msgpack_unpacked *u,
			  char *err, size_t err_len);

/* Strict UTF-8 check (no overlongs, no surrogates, no NUL bytes). */
int kvx_ctl_utf8_ok(const uint8_t *s, size_t len);

void kvx_ctl_seterr(char *err, size_t err_len, const char *fmt, ...) KVX_PRINTF(3, 4);

#endif /* KVX_CONTROL_INTERNAL_H */
