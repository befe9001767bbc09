/* SPDX-License-Identifier: Apache-2.0 */
/* Strict msgpack codec for the MoRIIO control wire format (docs/protocol.md §3, docs/runtime-notes.md §5.1):
 * notifications and the proxy heartbeat. Handshake messages: codec_hs.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "codec_util.h"

/* ---------------------------------------------------------------------------------------- */
/* Notify                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* The identity keys of a kvxfer sender, after the message's own keys (a MoRIIO receiver looks
 * keys up by name and ignores these). */
static int pk_ident(msgpack_packer *pk, const struct kvx_msg_notify *m)
{
	if (!m->sender_id[0])
		return 0;
	int f = pk_kv_str(pk, "kvx_engine", m->sender_id);
	f |= pk_kv_u64(pk, "kvx_rank", (uint64_t)m->sender_rank);
	if (m->sender_epoch)
		f |= pk_kv_u64(pk, "kvx_epoch", m->sender_epoch);
	return f;
}

int kvx_msg_notify_encode(const struct kvx_msg_notify *m, void *buf, size_t cap)
{
	if (!m || !buf || cap > INT32_MAX)
		return -EINVAL;
	if (!id_ok(m->transfer_id, KVX_MSG_ID_MAX))
		return -EINVAL;
	/* The sender's identity (kvxfer peers): kvx_engine + kvx_rank [+ kvx_epoch]. */
	uint32_t ident = 0;
	if (m->type != KVX_MSG_REMOTE_BLOCKS && m->type != KVX_MSG_COMPLETION && m->sender_id[0]) {
		if (!id_ok(m->sender_id, KVX_MSG_NAME_MAX) || m->sender_rank < 0 || m->sender_rank > 65535)
			return -EINVAL;
		ident = m->sender_epoch ? 3 : 2;
	}
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
		f |= msgpack_pack_map(&pk, 2 + ident);
		f |= pk_kv_str(&pk, "type", "write_done");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		f |= pk_ident(&pk, m);
		break;
	case KVX_MSG_RELEASE:
		if (m->has_consumer_tp_size && m->consumer_tp_size == 0)
			return -EINVAL;
		f |= msgpack_pack_map(&pk, (m->has_consumer_tp_size ? 3 : 2) + ident);
		f |= pk_kv_str(&pk, "type", "release");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		if (m->has_consumer_tp_size)
			f |= pk_kv_u64(&pk, "consumer_tp_size", m->consumer_tp_size);
		f |= pk_ident(&pk, m);
		break;
	case KVX_MSG_FAILED:
		if (!ident || m->fail_status < 1 || m->fail_status > 3 || m->fail_error > 0 ||
		    m->fail_error < -4095 || strnlen(m->reason, KVX_MSG_REASON_MAX + 1) > KVX_MSG_REASON_MAX ||
		    !kvx_ctl_utf8_ok((const uint8_t *)m->reason, strlen(m->reason)))
			return -EINVAL;
		f |= msgpack_pack_map(&pk, 5 + ident);
		f |= pk_kv_str(&pk, "type", "kvx_failed");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		f |= pk_kv_u64(&pk, "kvx_status", m->fail_status);
		f |= pk_str(&pk, "kvx_error");
		f |= msgpack_pack_int32(&pk, m->fail_error);
		f |= pk_kv_str(&pk, "kvx_reason", m->reason);
		f |= pk_ident(&pk, m);
		break;
	case KVX_MSG_STATUS_QUERY: {
		bool reply = m->notify_host[0] != 0;
		if (!ident || (reply && (!id_ok(m->notify_host, KVX_MSG_NAME_MAX) || m->notify_port == 0 ||
					 m->notify_port > 65535)))
			return -EINVAL;
		f |= msgpack_pack_map(&pk, 2 + ident + (reply ? 3 : 0));
		f |= pk_kv_str(&pk, "type", "kvx_status_query");
		f |= pk_kv_str(&pk, "transfer_id", m->transfer_id);
		f |= pk_ident(&pk, m);
		if (reply) {
			f |= pk_kv_str(&pk, "kvx_notify_host", m->notify_host);
			f |= pk_kv_u64(&pk, "kvx_notify_port", m->notify_port);
			f |= pk_kv_u64(&pk, "kvx_revoked", m->lease_revoked ? 1 : 0);
		}
		break;
	}
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
	m->sender_id[0] = 0;
	m->sender_rank = -1;
	m->fail_status = 0;
	m->fail_error = 0;
	m->reason[0] = 0;
	m->notify_host[0] = 0;
	m->notify_port = 0;
	m->lease_revoked = false;
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
					   "decode_rank", "consumer_tp_size", "kvx_epoch", "kvx_engine",
					   "kvx_rank", "kvx_status", "kvx_error", "kvx_reason",
					   "kvx_notify_host", "kvx_notify_port", "kvx_revoked"};
	const msgpack_object *v[15];
	rc = map_lookup(&u.data, keys, 15, v, err, err_len);
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
		} else if (key_is(v[0], "kvx_failed")) {
			m->type = KVX_MSG_FAILED;
		} else if (key_is(v[0], "kvx_status_query")) {
			m->type = KVX_MSG_STATUS_QUERY;
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
		goto out;
	}
	/* The sender's identity: both keys or neither (kvx_epoch optional with them). */
	if ((v[7] != NULL) != (v[8] != NULL) && (m->type != KVX_MSG_FAILED && m->type != KVX_MSG_STATUS_QUERY)) {
		kvx_ctl_seterr(err, err_len, "fields 'kvx_engine' and 'kvx_rank' come together");
		rc = -EPROTO;
		goto out;
	}
	if (m->type == KVX_MSG_FAILED || m->type == KVX_MSG_STATUS_QUERY) {
		if ((rc = need(v[7], "kvx_engine", err, err_len)) || (rc = need(v[8], "kvx_rank", err, err_len)))
			goto out;
	}
	if (v[7]) {
		uint64_t r;
		if ((rc = get_text(v[7], "kvx_engine", m->sender_id, sizeof(m->sender_id), 0, err, err_len)) ||
		    (rc = get_uint(v[8], "kvx_rank", 65535, &r, err, err_len)) ||
		    (v[6] && (rc = get_uint(v[6], "kvx_epoch", UINT64_MAX, &m->sender_epoch, err, err_len))))
			goto out;
		m->sender_rank = (int64_t)r;
	}
	if (m->type == KVX_MSG_FAILED) {
		uint64_t st;
		int64_t er;
		if ((rc = need(v[9], "kvx_status", err, err_len)) || (rc = need(v[10], "kvx_error", err, err_len)) ||
		    (rc = need(v[11], "kvx_reason", err, err_len)) ||
		    (rc = get_uint(v[9], "kvx_status", 3, &st, err, err_len)) ||
		    (rc = get_int(v[10], "kvx_error", -4095, 0, &er, err, err_len)) ||
		    (rc = get_text(v[11], "kvx_reason", m->reason, sizeof(m->reason), 1, err, err_len)))
			goto out;
		if (st == 0) {
			kvx_ctl_seterr(err, err_len, "field 'kvx_status' must name a failure (1..3)");
			rc = -EPROTO;
			goto out;
		}
		m->fail_status = (uint32_t)st;
		m->fail_error = (int32_t)er;
	}
	if (m->type == KVX_MSG_STATUS_QUERY && (v[12] || v[13] || v[14])) {
		/* A READ consumer's query: where to send kvx_failed (all three keys or none). */
		uint64_t port, rev;
		if ((rc = need(v[12], "kvx_notify_host", err, err_len)) ||
		    (rc = need(v[13], "kvx_notify_port", err, err_len)) ||
		    (rc = need(v[14], "kvx_revoked", err, err_len)) ||
		    (rc = get_text(v[12], "kvx_notify_host", m->notify_host, sizeof(m->notify_host), 0, err, err_len)) ||
		    (rc = get_uint(v[13], "kvx_notify_port", 65535, &port, err, err_len)) ||
		    (rc = get_uint(v[14], "kvx_revoked", 1, &rev, err, err_len)))
			goto out;
		if (port == 0) {
			kvx_ctl_seterr(err, err_len, "field 'kvx_notify_port' must be > 0");
			rc = -EPROTO;
			goto out;
		}
		m->notify_port = (uint32_t)port;
		m->lease_revoked = rev != 0;
	}
	if (m->type == KVX_MSG_RELEASE && v[5]) {
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
