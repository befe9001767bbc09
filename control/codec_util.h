/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_CODEC_UTIL_H
#define KVX_CODEC_UTIL_H
/*
 * Helpers shared by the message codecs (codec.c: notify, heartbeat; codec_hs.c: handshake
 * metadata, region map, connection setup): typed field readers with error messages, and
 * bounded-buffer pack helpers. Private to control/ (and the fuzz targets that build the codec).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "control_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Object helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static inline int obj_is_text(const msgpack_object *o)
{
	/* Python's L2 dispatcher converts byte-string keys and values to str. */
	return o->type == MSGPACK_OBJECT_STR || o->type == MSGPACK_OBJECT_BIN;
}

static const char *obj_ptr(const msgpack_object *o)
{
	return o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr;
}

static inline uint32_t obj_size(const msgpack_object *o)
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
static inline int get_text(const msgpack_object *o, const char *field, char *dst, size_t cap,
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

static inline int get_uint(const msgpack_object *o, const char *field, uint64_t max, uint64_t *v,
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

static inline int get_int(const msgpack_object *o, const char *field, int64_t min, int64_t max,
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

static inline int key_is(const msgpack_object *k, const char *name)
{
	size_t n = strlen(name);
	return obj_is_text(k) && obj_size(k) == n && memcmp(obj_ptr(k), name, n) == 0;
}

/*
 * Look up the listed keys of a map: vals[i] = value of keys[i] or NULL. Keys must be text;
 * a known key present twice is an error; unknown keys are ignored.
 */
static inline int map_lookup(const msgpack_object *map, const char *const *keys, size_t nkeys,
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

static inline int need(const msgpack_object *v, const char *field, char *err, size_t err_len)
{
	if (v)
		return 0;
	kvx_ctl_seterr(err, err_len, "missing required key '%s'", field);
	return -EPROTO;
}

/* ---------------------------------------------------------------------------------------- */
/* Pack helpers (return nonzero when the bounded buffer overflowed)                           */
/* ---------------------------------------------------------------------------------------- */

static inline int pk_str(msgpack_packer *pk, const char *s)
{
	return msgpack_pack_str_with_body(pk, s, strlen(s));
}

static inline int pk_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	return pk_str(pk, k) || pk_str(pk, v);
}

static inline int pk_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
	return pk_str(pk, k) || msgpack_pack_uint64(pk, v);
}

static inline int pk_done(const struct kvx_ctl_wbuf *w, int failed)
{
	if (w->overflow || failed)
		return -EMSGSIZE;
	return (int)w->len;
}

static inline int id_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max + 1);
	return n >= 1 && n <= max && kvx_ctl_utf8_ok((const uint8_t *)s, n);
}

#endif /* KVX_CODEC_UTIL_H */
