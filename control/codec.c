/* SPDX-License-Identifier: Apache-2.0 */
/* Strict msgpack codec for the MoRIIO control wire format (PROTOCOL.md §3, RUNTIME_GUIDE §5.1). */
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

/* ---------------------------------------------------------------------------------------- */
/* Object helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static int obj_is_text(const msgpack_object *o)
{
	/* Python's L2 dispatcher converts byte-string keys and values to str. */
	return o->type == MSGPACK_OBJECT_STR || o->type == MSGPACK_OBJECT_BIN;
}

static const char *obj_ptr(const msgpack_object *o)
{
	return o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr;
}

static uint32_t obj_size(const msgpack_object *o)
{
	return o->type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
}

static const char *type_name(const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
	case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
	case MSGPACK_OBJECT_STR: return "str";
	case MSGPACK_OBJECT_ARRAY: return "array";
	case MSGPACK_OBJECT_MAP: return "map";
	case MSGPACK_OBJECT_BIN: return "bin";
	default: return "ext";
	}
}

/* Copy a text value into dst[cap] as a NUL-terminated C string; 1..cap-1 bytes (0 if allow_empty). */
static int get_text(const msgpack_object *o, const char *field, char *dst, size_t cap,
		    int allow_empty, char *err, size_t err_len)
{
	if (!obj_is_text(o)) {
		kvx_ctl_seterr(err, err_len, "field '%s' must be str, got %s", field, type_name(o));
		return -EPROTO;
	}
	uint32_t n = obj_size(o);
	if (n >= cap) {
		kvx_ctl_seterr(err, err_len, "field '%s' is %u bytes, limit %zu", field, n, cap - 1);
		return -EMSGSIZE;
	}
	if (n == 0 && !allow_empty) {
		kvx_ctl_seterr(err, err_len, "field '%s' is empty", field);
		return -EPROTO;
	}
	if (!kvx_ctl_utf8_ok((const uint8_t *)obj_ptr(o), n)) {
		kvx_ctl_seterr(err, err_len, "field '%s' is not valid UTF-8 (or has NUL)", field);
		return -EPROTO;
	}
	if (n)
		memcpy(dst, obj_ptr(o), n);
	dst[n] = 0;
	return 0;
}

static int get_uint(const msgpack_object *o, const char *field, uint64_t max, uint64_t *v,
		    char *err, size_t err_len)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
			kvx_ctl_seterr(err, err_len, "field '%s' is negative (%" PRId64 ")", field,
				       o->via.i64);
		else
			kvx_ctl_seterr(err, err_len, "field '%s' must be an integer, got %s", field,
				       type_name(o));
		return -EPROTO;
	}
	if (o->via.u64 > max) {
		kvx_ctl_seterr(err, err_len, "field '%s' = %" PRIu64 " exceeds %" PRIu64, field,
			       o->via.u64, max);
		return -EPROTO;
	}
	*v = o->via.u64;
	return 0;
}

static int get_int(const msgpack_object *o, const char *field, int64_t min, int64_t max,
		   int64_t *v, char *err, size_t err_len)
{
	int64_t x;
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (o->via.u64 > (uint64_t)INT64_MAX)
			goto range;
		x = (int64_t)o->via.u64;
	} else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		x = o->via.i64;
	} else {
		kvx_ctl_seterr(err, err_len, "field '%s' must be an integer, got %s", field,
			       type_name(o));
		return -EPROTO;
	}
	if (x < min || x > max)
		goto range;
	*v = x;
	return 0;
range:
	kvx_ctl_seterr(err, err_len, "field '%s' out of range [%" PRId64 ", %" PRId64 "]", field,
		       min, max);
	return -EPROTO;
}

static int key_is(const msgpack_object *k, const char *name)
{
	size_t n = strlen(name);
	return obj_is_text(k) && obj_size(k) == n && memcmp(obj_ptr(k), name, n) == 0;
}

/*
 * Look up the listed keys of a map: vals[i] = value of keys[i] or NULL. Keys must be text;
 * a known key present twice is an error; unknown keys are ignored.
 */
static int map_lookup(const msgpack_object *map, const char *const *keys, size_t nkeys,
		      const msgpack_object **vals, char *err, size_t err_len)
{
	for (size_t i = 0; i < nkeys; i++)
		vals[i] = NULL;
	for (uint32_t j = 0; j < map->via.map.size; j++) {
		const msgpack_object *k = &map->via.map.ptr[j].key;
		if (!obj_is_text(k)) {
			kvx_ctl_seterr(err, err_len, "map key %u must be str, got %s", j, type_name(k));
			return -EPROTO;
		}
		for (size_t i = 0; i < nkeys; i++) {
			if (!key_is(k, keys[i]))
				continue;
			if (vals[i]) {
				kvx_ctl_seterr(err, err_len, "duplicate key '%s'", keys[i]);
				return -EPROTO;
			}
			vals[i] = &map->via.map.ptr[j].val;
		}
	}
	return 0;
}

static int need(const msgpack_object *v, const char *field, char *err, size_t err_len)
{
	if (v)
		return 0;
	kvx_ctl_seterr(err, err_len, "missing required key '%s'", field);
	return -EPROTO;
}

/* ---------------------------------------------------------------------------------------- */
/* Pack helpers (return nonzero when the bounded buffer overflowed)                           */
/* ---------------------------------------------------------------------------------------- */

static int pk_str(msgpack_packer *pk, const char *s)
{
	return msgpack_pack_str_with_body(pk, s, strlen(s));
}

static int pk_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	return pk_str(pk, k) || pk_str(pk, v);
}

static int pk_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
	return pk_str(pk, k) || msgpack_pack_uint64(pk, v);
}

static int pk_done(const struct kvx_ctl_wbuf *w, int failed)
{
	if (w->overflow || failed)
		return -EMSGSIZE;
	return (int)w->len;
}

static int id_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max + 1);
	return n >= 1 && n <= max && kvx_ctl_utf8_ok((const uint8_t *)s, n);
}

/* ---------------------------------------------------------------------------------------- */
/* Notify                                                                                    */
/* ---------------------------------------------------------------------------------------- */

int kvx_msg_notify_encode(const struct kvx_msg_notify *m, void *buf, size_t cap)
{
	if (!m || !buf || cap > INT32_MAX)
		return -EINVAL;
	if (!id_ok(m->transfer_id, KVX_MSG_ID_MAX))
		return -EINVAL;
	struct kvx_ctl_wbuf w;
	kvx_ctl_wbuf_init(&w, buf, cap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, kvx_ctl_wbuf_write);
	int f = 0;
	switch (m->type) {
	case KVX_MSG_REMOTE_BLOCKS: {
		if (m->num_blocks == 0 || !m->block_ids || m->decode_rank < 0 ||
		    m->decode_rank > INT32_MAX || m->num_groups > KVX_MSG_GROUPS_MAX ||
		    strnlen(m->req_id, KVX_MSG_ID_MAX + 1) > KVX_MSG_ID_MAX)
			return -EINVAL;
		uint64_t sum = 0;
		for (uint32_t g = 0; g < m->num_groups; g++)
			sum += m->group_len[g];
		if (m->num_groups && sum != m->num_blocks)
			return -EINVAL;
		for (uint32_t i = 0; i < m->num_blocks; i++)
			if (m->block_ids[i] > INT32_MAX)
				return -EINVAL;
		f |= msgpack_pack_map(&pk, m->sender_epoch ? 6 : 5);
		f |= pk_kv_str(&pk, "req_id", m->req_id);
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		f |= pk_str(&pk, "block_notify_list");
		if (m->num_groups == 0) {
			f |= msgpack_pack_array(&pk, m->num_blocks);
			for (uint32_t i = 0; i < m->num_blocks && !f; i++)
				f |= msgpack_pack_uint32(&pk, m->block_ids[i]);
		} else {
			uint32_t at = 0;
			f |= msgpack_pack_array(&pk, m->num_groups);
			for (uint32_t g = 0; g < m->num_groups && !f; g++) {
				f |= msgpack_pack_array(&pk, m->group_len[g]);
				for (uint32_t i = 0; i < m->group_len[g] && !f; i++)
					f |= msgpack_pack_uint32(&pk, m->block_ids[at++]);
			}
		}
		f |= pk_kv_u64(&pk, "decode_rank", (uint64_t)m->decode_rank);
		f |= pk_kv_str(&pk, "type", "remote_blocks");
		if (m->sender_epoch)
			f |= pk_kv_u64(&pk, "kvx_epoch", m->sender_epoch);
		break;
	}
	case KVX_MSG_WRITE_DONE:
		f |= msgpack_pack_map(&pk, 2);
		f |= pk_kv_str(&pk, "type", "write_done");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		break;
	case KVX_MSG_RELEASE:
		if (m->has_consumer_tp_size && m->consumer_tp_size == 0)
			return -EINVAL;
		f |= msgpack_pack_map(&pk, m->has_consumer_tp_size ? 3 : 2);
		f |= pk_kv_str(&pk, "type", "release");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		if (m->has_consumer_tp_size)
			f |= pk_kv_u64(&pk, "consumer_tp_size", m->consumer_tp_size);
		break;
	case KVX_MSG_COMPLETION: {
		size_t n = strlen(m->transfer_id);
		f |= kvx_ctl_wbuf_write(&w, m->transfer_id, n);
		break;
	}
	default:
		return -EINVAL;
	}
	return pk_done(&w, f);
}

static int decode_blocks(const msgpack_object *o, struct kvx_msg_notify *m, char *err,
			 size_t err_len)
{
	if (o->type != MSGPACK_OBJECT_ARRAY) {
		kvx_ctl_seterr(err, err_len, "field 'block_notify_list' must be an array, got %s",
			       type_name(o));
		return -EPROTO;
	}
	const msgpack_object_array *a = &o->via.array;
	if (a->size == 0) {
		kvx_ctl_seterr(err, err_len, "block_notify_list cannot be empty");
		return -EPROTO;
	}
	int nested = a->ptr[0].type == MSGPACK_OBJECT_ARRAY;
	uint32_t total = 0;
	if (nested && a->size > KVX_MSG_GROUPS_MAX) {
		kvx_ctl_seterr(err, err_len, "block_notify_list has %u groups, limit %u", a->size,
			       KVX_MSG_GROUPS_MAX);
		return -EMSGSIZE;
	}
	for (uint32_t g = 0; g < (nested ? a->size : 1); g++) {
		if (nested && a->ptr[g].type != MSGPACK_OBJECT_ARRAY) {
			kvx_ctl_seterr(err, err_len, "block_notify_list[%u] must be an array", g);
			return -EPROTO;
		}
		const msgpack_object *items = nested ? a->ptr[g].via.array.ptr : a->ptr;
		uint32_t n = nested ? a->ptr[g].via.array.size : a->size;
		if (n > m->blocks_cap - total) {
			kvx_ctl_seterr(err, err_len, "block_notify_list has more than %u ids",
				       m->blocks_cap);
			return -EMSGSIZE;
		}
		for (uint32_t i = 0; i < n; i++) {
			uint64_t v;
			int rc = get_uint(&items[i], "block_notify_list[]", INT32_MAX, &v, err, err_len);
			if (rc)
				return rc;
			m->block_ids[total++] = (uint32_t)v;
		}
		if (nested)
			m->group_len[g] = n;
	}
	if (total == 0) {
		kvx_ctl_seterr(err, err_len, "block_notify_list cannot be empty");
		return -EPROTO;
	}
	m->num_groups = nested ? a->size : 0;
	m->num_blocks = total;
	return 0;
}

static int decode_completion(const uint8_t *p, size_t len, struct kvx_msg_notify *m, char *err,
			     size_t err_len)
{
	if (len == 0 || !kvx_ctl_utf8_ok(p, len)) {
		kvx_ctl_seterr(err, err_len, "Unhandled message format (%zu bytes, %s)", len,
			       len ? "not msgpack, not UTF-8" : "empty");
		return -EPROTO;
	}
	if (len > KVX_MSG_ID_MAX) {
		kvx_ctl_seterr(err, err_len, "completion id is %zu bytes, limit %u", len,
			       KVX_MSG_ID_MAX);
		return -EMSGSIZE;
	}
	m->type = KVX_MSG_COMPLETION;
	memcpy(m->transfer_id, p, len);
	m->transfer_id[len] = 0;
	return 0;
}

int kvx_msg_notify_decode(const void *buf, size_t len, struct kvx_msg_notify *m, char *err,
			  size_t err_len)
{
	if (!m || (!buf && len))
		return -EINVAL;
	const uint8_t *p = buf;
	m->type = 0;
	m->transfer_id[0] = 0;
	m->req_id[0] = 0;
	m->decode_rank = -1;
	m->consumer_tp_size = 1;
	m->has_consumer_tp_size = false;
	m->num_groups = 0;
	m->num_blocks = 0;
	m->sender_epoch = 0;
	if (len > KVX_MSG_NOTIFY_MAX_BYTES) {
		kvx_ctl_seterr(err, err_len, "frame of %zu bytes exceeds %u", len,
			       KVX_MSG_NOTIFY_MAX_BYTES);
		return -EMSGSIZE;
	}
	if (len == 0) {
		kvx_ctl_seterr(err, err_len, "Unhandled message format (empty payload)");
		return -EPROTO;
	}
	int is_map = p[0] >= 0x80 ? (p[0] <= 0x8f || p[0] == 0xde || p[0] == 0xdf) : 0;
	if (!is_map)
		return decode_completion(p, len, m, err, err_len);

	msgpack_unpacked u;
	int rc = kvx_ctl_unpack_strict(buf, len, KVX_MSG_DEPTH_MAX, &u, err, err_len);
	if (rc)
		return rc;
	static const char *const keys[] = {"type", "transfer_id", "req_id", "block_notify_list",
					   "decode_rank", "consumer_tp_size", "kvx_epoch"};
	const msgpack_object *v[7];
	rc = map_lookup(&u.data, keys, 7, v, err, err_len);
	if (rc)
		goto out;
	if (v[0]) {
		if (!obj_is_text(v[0])) {
			kvx_ctl_seterr(err, err_len, "field 'type' must be str, got %s",
				       type_name(v[0]));
			rc = -EPROTO;
			goto out;
		}
		if (key_is(v[0], "remote_blocks")) {
			m->type = KVX_MSG_REMOTE_BLOCKS;
		} else if (key_is(v[0], "write_done")) {
			m->type = KVX_MSG_WRITE_DONE;
		} else if (key_is(v[0], "release")) {
			m->type = KVX_MSG_RELEASE;
		} else {
			uint32_t n = obj_size(v[0]) > 64 ? 64 : obj_size(v[0]);
			char t[65];
			if (n)
				memcpy(t, obj_ptr(v[0]), n);
			t[n] = 0;
			for (uint32_t i = 0; i < n; i++)
				if ((unsigned char)t[i] < 0x20 || (unsigned char)t[i] >= 0x7f)
					t[i] = '?';
			kvx_ctl_seterr(err, err_len, "Unhandled structured message type '%s'", t);
			rc = -EPROTO;
			goto out;
		}
	} else if (v[2]) {
		m->type = KVX_MSG_REMOTE_BLOCKS;
	} else {
		kvx_ctl_seterr(err, err_len, "Unhandled structured message type (no 'type')");
		rc = -EPROTO;
		goto out;
	}
	if ((rc = need(v[1], "transfer_id", err, err_len)) ||
	    (rc = get_text(v[1], "transfer_id", m->transfer_id, sizeof(m->transfer_id), 0, err,
			   err_len)))
		goto out;
	if (m->type == KVX_MSG_REMOTE_BLOCKS) {
		if (v[2] && (rc = get_text(v[2], "req_id", m->req_id, sizeof(m->req_id), 1, err,
					   err_len)))
			goto out;
		if ((rc = need(v[3], "block_notify_list", err, err_len)) ||
		    (rc = decode_blocks(v[3], m, err, err_len)))
			goto out;
		if (v[4]) {
			int64_t r;
			if ((rc = get_int(v[4], "decode_rank", 0, INT32_MAX, &r, err, err_len)))
				goto out;
			m->decode_rank = r;
		}
		if (v[6] && (rc = get_uint(v[6], "kvx_epoch", UINT64_MAX, &m->sender_epoch, err,
					   err_len)))
			goto out;
	} else if (m->type == KVX_MSG_RELEASE && v[5]) {
		uint64_t t;
		if ((rc = get_uint(v[5], "consumer_tp_size", 1u << 16, &t, err, err_len)))
			goto out;
		if (t == 0) {
			kvx_ctl_seterr(err, err_len, "field 'consumer_tp_size' must be > 0");
			rc = -EPROTO;
			goto out;
		}
		m->consumer_tp_size = (uint32_t)t;
		m->has_consumer_tp_size = true;
	}
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Heartbeat                                                                                 */
/* ---------------------------------------------------------------------------------------- */

int kvx_msg_heartbeat_encode(const struct kvx_msg_heartbeat *h, void *buf, size_t cap)
{
	if (!h || !buf || cap > INT32_MAX || h->dp_size == 0 || h->tp_size == 0 ||
	    !id_ok(h->http_address, KVX_MSG_NAME_MAX) || !id_ok(h->zmq_address, KVX_MSG_NAME_MAX) ||
	    (h->role != KVX_CTL_ROLE_PRODUCER && h->role != KVX_CTL_ROLE_CONSUMER) ||
	    (h->mode != KVX_CTL_MODE_WRITE && h->mode != KVX_CTL_MODE_READ))
		return -EINVAL;
	struct kvx_ctl_wbuf w;
	kvx_ctl_wbuf_init(&w, buf, cap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, kvx_ctl_wbuf_write);
	int f = msgpack_pack_map(&pk, 6);
	f |= pk_kv_str(&pk, "type", h->role == KVX_CTL_ROLE_PRODUCER ? "P" : "D");
	f |= pk_kv_str(&pk, "http_address", h->http_address);
	f |= pk_kv_str(&pk, "zmq_address", h->zmq_address);
	f |= pk_kv_u64(&pk, "dp_size", h->dp_size);
	f |= pk_kv_u64(&pk, "tp_size", h->tp_size);
	f |= pk_kv_str(&pk, "transfer_mode", h->mode == KVX_CTL_MODE_READ ? "READ" : "WRITE");
	return pk_done(&w, f);
}

int kvx_msg_heartbeat_decode(const void *buf, size_t len, struct kvx_msg_heartbeat *h,
			     char *err, size_t err_len)
{
	if (!h || (!buf && len))
		return -EINVAL;
	msgpack_unpacked u;
	int rc = kvx_ctl_unpack_strict(buf, len, 2, &u, err, err_len);
	if (rc)
		return rc;
	static const char *const keys[] = {"type", "http_address", "zmq_address", "dp_size",
					   "tp_size", "transfer_mode"};
	const msgpack_object *v[6];
	char t[8];
	uint64_t dp, tp;
	if (u.data.type != MSGPACK_OBJECT_MAP) {
		kvx_ctl_seterr(err, err_len, "heartbeat must be a map, got %s", type_name(&u.data));
		rc = -EPROTO;
		goto out;
	}
	if ((rc = map_lookup(&u.data, keys, 6, v, err, err_len)))
		goto out;
	for (int i = 0; i < 6; i++)
		if ((rc = need(v[i], keys[i], err, err_len)))
			goto out;
	if ((rc = get_text(v[0], "type", t, sizeof(t), 0, err, err_len)) ||
	    (rc = get_text(v[1], "http_address", h->http_address, sizeof(h->http_address), 0, err,
			   err_len)) ||
	    (rc = get_text(v[2], "zmq_address", h->zmq_address, sizeof(h->zmq_address), 0, err,
			   err_len)) ||
	    (rc = get_uint(v[3], "dp_size", 1u << 16, &dp, err, err_len)) ||
	    (rc = get_uint(v[4], "tp_size", 1u << 16, &tp, err, err_len)))
		goto out;
	if (!strcmp(t, "P")) {
		h->role = KVX_CTL_ROLE_PRODUCER;
	} else if (!strcmp(t, "D")) {
		h->role = KVX_CTL_ROLE_CONSUMER;
	} else {
		kvx_ctl_seterr(err, err_len, "field 'type' must be \"P\" or \"D\", got \"%s\"", t);
		rc = -EPROTO;
		goto out;
	}
	if (key_is(v[5], "READ")) {
		h->mode = KVX_CTL_MODE_READ;
	} else if (key_is(v[5], "WRITE")) {
		h->mode = KVX_CTL_MODE_WRITE;
	} else {
		kvx_ctl_seterr(err, err_len, "field 'transfer_mode' must be \"READ\" or \"WRITE\"");
		rc = -EPROTO;
		goto out;
	}
	if (dp == 0 || tp == 0) {
		kvx_ctl_seterr(err, err_len, "field '%s' must be > 0", dp == 0 ? "dp_size" : "tp_size");
		rc = -EPROTO;
		goto out;
	}
	h->dp_size = (uint32_t)dp;
	h->tp_size = (uint32_t)tp;
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Handshake metadata (a)                                                                    */
/* ---------------------------------------------------------------------------------------- */

int kvx_msg_meta_encode(const struct kvx_msg_meta *m, void *buf, size_t cap)
{
	if (!m || !buf || cap > INT32_MAX || !id_ok(m->engine_id, KVX_MSG_NAME_MAX) ||
	    (m->num_regions && !m->regions) || m->kv_port > 65535 ||
	    strnlen(m->engine_key, sizeof(m->engine_key)) >= sizeof(m->engine_key) ||
	    strnlen(m->hostname, sizeof(m->hostname)) >= sizeof(m->hostname) ||
	    strnlen(m->host, sizeof(m->host)) >= sizeof(m->host) ||
	    strnlen(m->attn_backend, sizeof(m->attn_backend)) >= sizeof(m->attn_backend) ||
	    strnlen(m->transport, sizeof(m->transport)) >= sizeof(m->transport) ||
	    strnlen(m->layout, sizeof(m->layout)) >= sizeof(m->layout))
		return -EINVAL;
	/* EngineDesc is packed separately and embedded as bin (MoRI EngineDesc.pack()). */
	uint8_t desc[4 * (KVX_MSG_NAME_MAX + 8) + 16];
	struct kvx_ctl_wbuf dw;
	kvx_ctl_wbuf_init(&dw, desc, sizeof(desc));
	msgpack_packer dp;
	msgpack_packer_init(&dp, &dw, kvx_ctl_wbuf_write);
	int f = msgpack_pack_array(&dp, 4);
	f |= pk_str(&dp, m->engine_key);
	f |= pk_str(&dp, m->hostname);
	f |= pk_str(&dp, m->host);
	f |= msgpack_pack_uint32(&dp, m->kv_port);
	if (f || dw.overflow)
		return -EINVAL;

	struct kvx_ctl_wbuf w;
	kvx_ctl_wbuf_init(&w, buf, cap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, kvx_ctl_wbuf_write);
	f = msgpack_pack_map(&pk, m->has_kvx ? 11 : 6);
	f |= pk_kv_str(&pk, "engine_id", m->engine_id);
	f |= pk_str(&pk, "agent_metadata") || msgpack_pack_bin_with_body(&pk, desc, dw.len);
	f |= pk_str(&pk, "kv_caches_base_addr") || msgpack_pack_array(&pk, m->num_regions);
	for (uint32_t i = 0; i < m->num_regions && !f; i++)
		f |= msgpack_pack_uint64(&pk, m->regions[i].addr);
	f |= pk_kv_u64(&pk, "num_blocks", m->num_blocks);
	f |= pk_kv_u64(&pk, "block_len", m->block_len);
	f |= pk_kv_str(&pk, "attn_backend_name", m->attn_backend);
	if (m->has_kvx) {
		f |= pk_kv_u64(&pk, "kvx_version", m->version);
		f |= pk_kv_u64(&pk, "kvx_epoch", m->epoch);
		f |= pk_kv_str(&pk, "kvx_transport", m->transport);
		f |= pk_kv_str(&pk, "kvx_layout", m->layout);
		f |= pk_str(&pk, "kvx_regions") || msgpack_pack_array(&pk, m->num_regions);
		for (uint32_t i = 0; i < m->num_regions && !f; i++) {
			f |= msgpack_pack_array(&pk, 3);
			f |= msgpack_pack_uint64(&pk, m->regions[i].addr);
			f |= msgpack_pack_uint64(&pk, m->regions[i].len_bytes);
			f |= msgpack_pack_uint64(&pk, m->regions[i].key);
		}
	}
	return pk_done(&w, f);
}

static int decode_engine_desc(const msgpack_object *o, struct kvx_msg_meta *m, char *err,
			      size_t err_len)
{
	if (o->type != MSGPACK_OBJECT_BIN) {
		kvx_ctl_seterr(err, err_len, "field 'agent_metadata' must be bin, got %s",
			       type_name(o));
		return -EPROTO;
	}
	msgpack_unpacked u;
	char e2[160];
	int rc = kvx_ctl_unpack_strict(o->via.bin.ptr, o->via.bin.size, 2, &u, e2, sizeof(e2));
	if (rc) {
		kvx_ctl_seterr(err, err_len, "field 'agent_metadata': %s", e2);
		return rc;
	}
	const msgpack_object *a = &u.data;
	uint64_t port;
	if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != 4) {
		kvx_ctl_seterr(err, err_len, "field 'agent_metadata' must pack a 4-element array");
		rc = -EPROTO;
	} else if (!(rc = get_text(&a->via.array.ptr[0], "agent_metadata.key", m->engine_key,
				   sizeof(m->engine_key), 1, err, err_len)) &&
		   !(rc = get_text(&a->via.array.ptr[1], "agent_metadata.hostname", m->hostname,
				   sizeof(m->hostname), 1, err, err_len)) &&
		   !(rc = get_text(&a->via.array.ptr[2], "agent_metadata.host", m->host,
				   sizeof(m->host), 1, err, err_len)) &&
		   !(rc = get_uint(&a->via.array.ptr[3], "agent_metadata.port", 65535, &port, err,
				   err_len))) {
		m->kv_port = (uint32_t)port;
	}
	msgpack_unpacked_destroy(&u);
	return rc;
}

int kvx_msg_meta_decode(const void *buf, size_t len, struct kvx_msg_meta *m, char *err,
			size_t err_len)
{
	if (!m || (!buf && len))
		return -EINVAL;
	m->has_kvx = false;
	m->version = 0;
	m->epoch = 0;
	m->transport[0] = 0;
	m->layout[0] = 0;
	m->num_regions = 0;
	msgpack_unpacked u;
	int rc = kvx_ctl_unpack_strict(buf, len, KVX_MSG_DEPTH_MAX, &u, err, err_len);
	if (rc)
		return rc;
	static const char *const keys[] = {"engine_id", "agent_metadata", "kv_caches_base_addr",
					   "num_blocks", "block_len", "attn_backend_name",
					   "kvx_version", "kvx_epoch", "kvx_transport", "kvx_layout",
					   "kvx_regions"};
	const msgpack_object *v[11];
	uint64_t x;
	if (u.data.type != MSGPACK_OBJECT_MAP) {
		kvx_ctl_seterr(err, err_len, "agent metadata must be a map, got %s",
			       type_name(&u.data));
		rc = -EPROTO;
		goto out;
	}
	if ((rc = map_lookup(&u.data, keys, 11, v, err, err_len)))
		goto out;
	for (int i = 0; i < 6; i++)
		if ((rc = need(v[i], keys[i], err, err_len)))
			goto out;
	if ((rc = get_text(v[0], "engine_id", m->engine_id, sizeof(m->engine_id), 0, err,
			   err_len)) ||
	    (rc = decode_engine_desc(v[1], m, err, err_len)) ||
	    (rc = get_uint(v[3], "num_blocks", UINT64_MAX, &m->num_blocks, err, err_len)) ||
	    (rc = get_uint(v[4], "block_len", UINT64_MAX, &m->block_len, err, err_len)) ||
	    (rc = get_text(v[5], "attn_backend_name", m->attn_backend, sizeof(m->attn_backend), 1,
			   err, err_len)))
		goto out;
	if (v[2]->type != MSGPACK_OBJECT_ARRAY) {
		kvx_ctl_seterr(err, err_len, "field 'kv_caches_base_addr' must be an array");
		rc = -EPROTO;
		goto out;
	}
	uint32_t n = v[2]->via.array.size;
	if (n > m->regions_cap || (n && !m->regions)) {
		kvx_ctl_seterr(err, err_len, "kv_caches_base_addr has %u regions, capacity %u", n,
			       m->regions_cap);
		rc = -EMSGSIZE;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		if ((rc = get_uint(&v[2]->via.array.ptr[i], "kv_caches_base_addr[]", UINT64_MAX,
				   &m->regions[i].addr, err, err_len)))
			goto out;
		m->regions[i].len_bytes = 0;
		m->regions[i].key = 0;
	}
	m->num_regions = n;
	int nk = 0;
	for (int i = 6; i < 11; i++)
		nk += v[i] != NULL;
	if (nk == 0)
		goto out;
	if (nk != 5) {
		kvx_ctl_seterr(err, err_len, "kvx_ keys must be all present or all absent");
		rc = -EPROTO;
		goto out;
	}
	if ((rc = get_uint(v[6], "kvx_version", UINT32_MAX, &x, err, err_len)))
		goto out;
	m->version = (uint32_t)x;
	if ((rc = get_uint(v[7], "kvx_epoch", UINT64_MAX, &m->epoch, err, err_len)) ||
	    (rc = get_text(v[8], "kvx_transport", m->transport, sizeof(m->transport), 0, err,
			   err_len)) ||
	    (rc = get_text(v[9], "kvx_layout", m->layout, sizeof(m->layout), 1, err, err_len)))
		goto out;
	if (v[10]->type != MSGPACK_OBJECT_ARRAY || v[10]->via.array.size != n) {
		kvx_ctl_seterr(err, err_len, "field 'kvx_regions' must be an array of %u entries", n);
		rc = -EPROTO;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *r = &v[10]->via.array.ptr[i];
		uint64_t a, l, k;
		if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 3) {
			kvx_ctl_seterr(err, err_len, "kvx_regions[%u] must be [addr, len, key]", i);
			rc = -EPROTO;
			goto out;
		}
		if ((rc = get_uint(&r->via.array.ptr[0], "kvx_regions[].addr", UINT64_MAX, &a, err,
				   err_len)) ||
		    (rc = get_uint(&r->via.array.ptr[1], "kvx_regions[].len", UINT64_MAX, &l, err,
				   err_len)) ||
		    (rc = get_uint(&r->via.array.ptr[2], "kvx_regions[].key", UINT64_MAX, &k, err,
				   err_len)))
			goto out;
		if (a != m->regions[i].addr) {
			kvx_ctl_seterr(err, err_len,
				       "kvx_regions[%u].addr differs from kv_caches_base_addr[%u]", i,
				       i);
			rc = -EPROTO;
			goto out;
		}
		if (l > UINT64_MAX - a) {
			kvx_ctl_seterr(err, err_len, "kvx_regions[%u] wraps the address space", i);
			rc = -EPROTO;
			goto out;
		}
		m->regions[i].len_bytes = l;
		m->regions[i].key = k;
	}
	m->has_kvx = true;
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Region map (b)                                                                            */
/* ---------------------------------------------------------------------------------------- */

int kvx_msg_layers_encode(const struct kvx_msg_layers *l, void *buf, size_t cap)
{
	if (!l || !buf || cap > INT32_MAX || (l->num_descs && !l->descs) ||
	    strnlen(l->engine_key, sizeof(l->engine_key)) >= sizeof(l->engine_key))
		return -EINVAL;
	/* Count runs and reject a layer name that reappears after another layer. */
	uint32_t runs = 0;
	for (uint32_t i = 0; i < l->num_descs; i++) {
		const struct kvx_msg_memdesc *d = &l->descs[i];
		if (!id_ok(d->layer, KVX_MSG_NAME_MAX) || (d->loc != 1 && d->loc != 2))
			return -EINVAL;
		if (i > 0 && !strcmp(d->layer, l->descs[i - 1].layer))
			continue;
		for (uint32_t j = 0; j + 1 < i; j++)
			if (!strcmp(d->layer, l->descs[j].layer))
				return -EINVAL;
		runs++;
	}
	struct kvx_ctl_wbuf w;
	kvx_ctl_wbuf_init(&w, buf, cap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, kvx_ctl_wbuf_write);
	int f = msgpack_pack_map(&pk, runs);
	for (uint32_t i = 0; i < l->num_descs && !f;) {
		uint32_t j = i;
		while (j < l->num_descs && !strcmp(l->descs[j].layer, l->descs[i].layer))
			j++;
		f |= pk_str(&pk, l->descs[i].layer);
		f |= msgpack_pack_array(&pk, j - i);
		for (uint32_t k = i; k < j && !f; k++) {
			const struct kvx_msg_memdesc *d = &l->descs[k];
			uint8_t md[KVX_MSG_NAME_MAX + 64];
			struct kvx_ctl_wbuf mw;
			kvx_ctl_wbuf_init(&mw, md, sizeof(md));
			msgpack_packer mp;
			msgpack_packer_init(&mp, &mw, kvx_ctl_wbuf_write);
			int g = msgpack_pack_array(&mp, 6);
			g |= pk_str(&mp, l->engine_key);
			g |= msgpack_pack_uint32(&mp, d->id);
			g |= msgpack_pack_int32(&mp, d->device_id);
			g |= msgpack_pack_uint64(&mp, d->addr);
			g |= msgpack_pack_uint64(&mp, d->len_bytes);
			g |= msgpack_pack_uint32(&mp, d->loc);
			if (g || mw.overflow)
				return -EINVAL;
			f |= msgpack_pack_bin_with_body(&pk, md, mw.len);
		}
		i = j;
	}
	return pk_done(&w, f);
}

static int decode_memdesc(const msgpack_object *o, struct kvx_msg_layers *l, int first,
			  struct kvx_msg_memdesc *d, char *err, size_t err_len)
{
	if (o->type != MSGPACK_OBJECT_BIN) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc must be bin, got %s", d->layer,
			       type_name(o));
		return -EPROTO;
	}
	msgpack_unpacked u;
	char e2[160];
	int rc = kvx_ctl_unpack_strict(o->via.bin.ptr, o->via.bin.size, 2, &u, e2, sizeof(e2));
	if (rc) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc: %s", d->layer, e2);
		return rc;
	}
	const msgpack_object *a = &u.data;
	char key[KVX_MSG_NAME_MAX + 1];
	uint64_t id, addr, size, loc;
	int64_t dev;
	if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != 6) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc must pack a 6-element array",
			       d->layer);
		rc = -EPROTO;
		goto out;
	}
	const msgpack_object *e = a->via.array.ptr;
	if ((rc = get_text(&e[0], "MemoryDesc.engineKey", key, sizeof(key), 1, err, err_len)) ||
	    (rc = get_uint(&e[1], "MemoryDesc.id", UINT32_MAX, &id, err, err_len)) ||
	    (rc = get_int(&e[2], "MemoryDesc.deviceId", INT32_MIN, INT32_MAX, &dev, err, err_len)) ||
	    (rc = get_uint(&e[3], "MemoryDesc.data", UINT64_MAX, &addr, err, err_len)) ||
	    (rc = get_uint(&e[4], "MemoryDesc.size", UINT64_MAX, &size, err, err_len)) ||
	    (rc = get_uint(&e[5], "MemoryDesc.loc", UINT32_MAX, &loc, err, err_len)))
		goto out;
	if (loc != 1 && loc != 2) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc.loc = %" PRIu64 " (want 1 or 2)",
			       d->layer, loc);
		rc = -EPROTO;
		goto out;
	}
	if (size > UINT64_MAX - addr) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc wraps the address space",
			       d->layer);
		rc = -EPROTO;
		goto out;
	}
	if (first) {
		memcpy(l->engine_key, key, sizeof(key));
	} else if (strcmp(l->engine_key, key)) {
		kvx_ctl_seterr(err, err_len, "layer '%s': MemoryDesc engine key differs", d->layer);
		rc = -EPROTO;
		goto out;
	}
	d->id = (uint32_t)id;
	d->device_id = (int32_t)dev;
	d->addr = addr;
	d->len_bytes = size;
	d->loc = (uint32_t)loc;
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

int kvx_msg_layers_decode(const void *buf, size_t len, struct kvx_msg_layers *l, char *err,
			  size_t err_len)
{
	if (!l || (!buf && len))
		return -EINVAL;
	l->num_descs = 0;
	l->num_layers = 0;
	l->engine_key[0] = 0;
	msgpack_unpacked u;
	int rc = kvx_ctl_unpack_strict(buf, len, 3, &u, err, err_len);
	if (rc)
		return rc;
	const msgpack_object *map = &u.data;
	uint32_t nd = 0;
	if (map->type != MSGPACK_OBJECT_MAP) {
		kvx_ctl_seterr(err, err_len, "KV-cache metadata must be a map, got %s",
			       type_name(map));
		rc = -EPROTO;
		goto out;
	}
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		const msgpack_object *v = &map->via.map.ptr[i].val;
		char name[KVX_MSG_NAME_MAX + 1];
		if ((rc = get_text(k, "layer name", name, sizeof(name), 0, err, err_len)))
			goto out;
		for (uint32_t j = 0; j < i; j++) {
			if (key_is(&map->via.map.ptr[j].key, name)) {
				kvx_ctl_seterr(err, err_len, "duplicate layer '%s'", name);
				rc = -EPROTO;
				goto out;
			}
		}
		if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size == 0 ||
		    v->via.array.size > 16) {
			kvx_ctl_seterr(err, err_len, "layer '%s': value must be an array of 1..16 bin",
				       name);
			rc = -EPROTO;
			goto out;
		}
		for (uint32_t j = 0; j < v->via.array.size; j++) {
			if (nd >= l->descs_cap || !l->descs) {
				kvx_ctl_seterr(err, err_len, "more than %u MemoryDescs", l->descs_cap);
				rc = -EMSGSIZE;
				goto out;
			}
			struct kvx_msg_memdesc *d = &l->descs[nd];
			memcpy(d->layer, name, sizeof(name));
			if ((rc = decode_memdesc(&v->via.array.ptr[j], l, nd == 0, d, err, err_len)))
				goto out;
			nd++;
		}
	}
	l->num_descs = nd;
	l->num_layers = map->via.map.size;
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Connection setup                                                                          */
/* ---------------------------------------------------------------------------------------- */

int kvx_msg_connect_encode(const struct kvx_msg_connect *c, void *buf, size_t cap)
{
	if (!c || !buf || cap > INT32_MAX || c->blob_len > KVX_MSG_BLOB_MAX ||
	    (c->blob_len && !c->blob))
		return -EINVAL;
	struct kvx_ctl_wbuf w;
	kvx_ctl_wbuf_init(&w, buf, cap);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, kvx_ctl_wbuf_write);
	int f;
	if (c->is_reply) {
		if (c->status > 0 || c->status < -4095)
			return -EINVAL;
		f = msgpack_pack_map(&pk, 3);
		f |= pk_kv_str(&pk, "type", "kvx_connect_reply");
		f |= pk_str(&pk, "status") || msgpack_pack_int32(&pk, c->status);
	} else {
		if (!id_ok(c->engine_id, KVX_MSG_NAME_MAX))
			return -EINVAL;
		f = msgpack_pack_map(&pk, 5);
		f |= pk_kv_str(&pk, "type", "kvx_connect");
		f |= pk_kv_str(&pk, "engine_id", c->engine_id);
		f |= pk_kv_u64(&pk, "epoch", c->epoch);
		f |= pk_kv_u64(&pk, "dp_rank", c->dp_rank);
	}
	f |= pk_str(&pk, "blob") || msgpack_pack_bin_with_body(&pk, c->blob, c->blob_len);
	return pk_done(&w, f);
}

int kvx_msg_connect_decode(const void *buf, size_t len, struct kvx_msg_connect *c, char *err,
			   size_t err_len)
{
	if (!c || (!buf && len))
		return -EINVAL;
	memset(c, 0, sizeof(*c));
	msgpack_unpacked u;
	int rc = kvx_ctl_unpack_strict(buf, len, 2, &u, err, err_len);
	if (rc)
		return rc;
	static const char *const keys[] = {"type", "engine_id", "epoch", "dp_rank", "status",
					   "blob"};
	const msgpack_object *v[6];
	if (u.data.type != MSGPACK_OBJECT_MAP) {
		kvx_ctl_seterr(err, err_len, "connect message must be a map, got %s",
			       type_name(&u.data));
		rc = -EPROTO;
		goto out;
	}
	if ((rc = map_lookup(&u.data, keys, 6, v, err, err_len)) ||
	    (rc = need(v[0], "type", err, err_len)) || (rc = need(v[5], "blob", err, err_len)))
		goto out;
	if (key_is(v[0], "kvx_connect")) {
		uint64_t x;
		if ((rc = need(v[1], "engine_id", err, err_len)) ||
		    (rc = need(v[2], "epoch", err, err_len)) ||
		    (rc = need(v[3], "dp_rank", err, err_len)) ||
		    (rc = get_text(v[1], "engine_id", c->engine_id, sizeof(c->engine_id), 0, err,
				   err_len)) ||
		    (rc = get_uint(v[2], "epoch", UINT64_MAX, &c->epoch, err, err_len)) ||
		    (rc = get_uint(v[3], "dp_rank", INT32_MAX, &x, err, err_len)))
			goto out;
		c->dp_rank = (uint32_t)x;
	} else if (key_is(v[0], "kvx_connect_reply")) {
		int64_t s;
		c->is_reply = true;
		if ((rc = need(v[4], "status", err, err_len)) ||
		    (rc = get_int(v[4], "status", -4095, 0, &s, err, err_len)))
			goto out;
		c->status = (int32_t)s;
	} else {
		kvx_ctl_seterr(err, err_len, "field 'type' must be kvx_connect or kvx_connect_reply");
		rc = -EPROTO;
		goto out;
	}
	if (v[5]->type != MSGPACK_OBJECT_BIN) {
		kvx_ctl_seterr(err, err_len, "field 'blob' must be bin, got %s", type_name(v[5]));
		rc = -EPROTO;
		goto out;
	}
	if (v[5]->via.bin.size > KVX_MSG_BLOB_MAX) {
		kvx_ctl_seterr(err, err_len, "blob of %u bytes exceeds %u", v[5]->via.bin.size,
			       KVX_MSG_BLOB_MAX);
		rc = -EMSGSIZE;
		goto out;
	}
	/* BIN objects point into the input buffer, which the caller keeps. */
	c->blob = (const uint8_t *)v[5]->via.bin.ptr;
	c->blob_len = v[5]->via.bin.size;
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}
