/* SPDX-License-Identifier: Apache-2.0 */
/*
 * msgpack wire primitives of the control codec: bounded write buffer, the allocation-free
 * pre-scan, strict unpacking and the UTF-8 check (control_internal.h). The messages built on
 * them are in codec.c. docs/protocol.md §3, docs/runtime-notes.md §5.1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "control_internal.h"

void kvx_ctl_seterr(char *err, size_t err_len, const char *fmt, ...)
{
	if (!err || !err_len)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, err_len, fmt, ap);
	va_end(ap);
}

void kvx_ctl_wbuf_init(struct kvx_ctl_wbuf *w, void *buf, size_t cap)
{
	w->p = buf;
	w->cap = cap;
	w->len = 0;
	w->overflow = 0;
}

int kvx_ctl_wbuf_write(void *data, const char *buf, size_t len)
{
	struct kvx_ctl_wbuf *w = data;
	if (len == 0)
		return 0;
	if (w->overflow || len > w->cap - w->len) {
		w->overflow = 1;
		return -1;
	}
	memcpy(w->p + w->len, buf, len);
	w->len += len;
	return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Pre-scan: bounds every declared count by the bytes that remain, before msgpack-c runs.    */
/* ---------------------------------------------------------------------------------------- */

static uint64_t be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

int kvx_ctl_prescan(const uint8_t *buf, size_t len, unsigned max_depth, size_t *end, char *err,
		    size_t err_len)
{
	/* pending[d] = objects still expected at depth d (depth 0 holds the single root). */
	uint64_t pending[KVX_MSG_DEPTH_MAX + 2];
	unsigned depth = 0;
	size_t off = 0;
	uint64_t elems = 0;
	if (max_depth > KVX_MSG_DEPTH_MAX)
		max_depth = KVX_MSG_DEPTH_MAX;
	pending[0] = 1;
	if (len == 0) {
		kvx_ctl_seterr(err, err_len, "empty payload");
		return -EPROTO;
	}
	for (;;) {
		while (depth > 0 && pending[depth] == 0)
			depth--;
		if (depth == 0 && pending[0] == 0)
			break;
		if (off >= len) {
			kvx_ctl_seterr(err, err_len, "truncated msgpack at byte %zu", off);
			return -EPROTO;
		}
		pending[depth]--;
		if (++elems > KVX_MSG_ELEMS_MAX) {
			kvx_ctl_seterr(err, err_len, "more than %u msgpack objects", KVX_MSG_ELEMS_MAX);
			return -EMSGSIZE;
		}
		uint8_t b = buf[off++];
		size_t left = len - off;
		uint64_t n = 0;      /* payload bytes (str/bin) or children (array/map) */
		unsigned hdr = 0;    /* extra header bytes */
		int kind = 0;        /* 0 scalar, 1 bytes, 2 array, 3 map */
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
			kind = 0;
		} else if (b <= 0x8f) {
			kind = 3, n = b & 0x0f;
		} else if (b <= 0x9f) {
			kind = 2, n = b & 0x0f;
		} else if (b <= 0xbf) {
			kind = 1, n = b & 0x1f;
		} else {
			switch (b) {
			case 0xc4: case 0xd9: kind = 1, hdr = 1; break;
			case 0xc5: case 0xda: kind = 1, hdr = 2; break;
			case 0xc6: case 0xdb: kind = 1, hdr = 4; break;
			case 0xca: case 0xcc: case 0xcd: case 0xce: case 0xcf:
			case 0xcb: case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
				static const uint8_t sz[] = {[0xca - 0xca] = 4, [0xcb - 0xca] = 8,
					[0xcc - 0xca] = 1, [0xcd - 0xca] = 2, [0xce - 0xca] = 4,
					[0xcf - 0xca] = 8, [0xd0 - 0xca] = 1, [0xd1 - 0xca] = 2,
					[0xd2 - 0xca] = 4, [0xd3 - 0xca] = 8};
				n = sz[b - 0xca];
				if (n > left) {
					kvx_ctl_seterr(err, err_len, "truncated number at byte %zu", off - 1);
					return -EPROTO;
				}
				off += n;
				continue;
			}
			case 0xdc: kind = 2, hdr = 2; break;
			case 0xdd: kind = 2, hdr = 4; break;
			case 0xde: kind = 3, hdr = 2; break;
			case 0xdf: kind = 3, hdr = 4; break;
			default:
				kvx_ctl_seterr(err, err_len, "unsupported msgpack byte 0x%02x at %zu", b,
					       off - 1);
				return -EPROTO;
			}
			if (hdr > left) {
				kvx_ctl_seterr(err, err_len, "truncated header at byte %zu", off - 1);
				return -EPROTO;
			}
			n = be(buf + off, hdr);
			off += hdr;
			left -= hdr;
		}
		if (kind == 0)
			continue;
		if (kind == 1) {
			if (n > left) {
				kvx_ctl_seterr(err, err_len,
					       "string/bin declares %" PRIu64 " bytes, %zu left", n, left);
				return -EPROTO;
			}
			off += n;
			continue;
		}
		uint64_t children = kind == 3 ? 2 * n : n;
		if (children > left) {
			kvx_ctl_seterr(err, err_len, "%s declares %" PRIu64 " entries, %zu bytes left",
				       kind == 3 ? "map" : "array", n, left);
			return -EPROTO;
		}
		if (children == 0)
			continue;
		if (depth + 1 > max_depth) {
			kvx_ctl_seterr(err, err_len, "msgpack nesting deeper than %u", max_depth);
			return -EMSGSIZE;
		}
		pending[++depth] = children;
	}
	*end = off;
	return 0;
}

int kvx_ctl_unpack_strict(const void *buf, size_t len, unsigned max_depth, msgpack_unpacked *u,
			  char *err, size_t err_len)
{
	size_t end = 0;
	int rc = kvx_ctl_prescan(buf, len, max_depth, &end, err, err_len);
	if (rc)
		return rc;
	if (end != len) {
		kvx_ctl_seterr(err, err_len, "%zu trailing bytes after the msgpack object", len - end);
		return -EPROTO;
	}
	size_t off = 0;
	msgpack_unpacked_init(u);
	msgpack_unpack_return r = msgpack_unpack_next(u, buf, len, &off);
	if (r != MSGPACK_UNPACK_SUCCESS || off != len) {
		msgpack_unpacked_destroy(u);
		kvx_ctl_seterr(err, err_len, "msgpack unpack failed (%d)", (int)r);
		return r == MSGPACK_UNPACK_NOMEM_ERROR ? -EMSGSIZE : -EPROTO;
	}
	return 0;
}

int kvx_ctl_utf8_ok(const uint8_t *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		uint8_t c = s[i];
		if (c == 0)
			return 0;
		if (c < 0x80) {
			i++;
			continue;
		}
		unsigned n;
		uint32_t cp;
		if (c >= 0xc2 && c <= 0xdf)
			n = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			n = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 3, cp = c & 0x07;
		else
			return 0;
		if (len - i - 1 < n)
			return 0;
		for (unsigned k = 1; k <= n; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += n + 1;
	}
	return 1;
}
