/* SPDX-License-Identifier: Apache-2.0 */
/* Strict msgpack codec, handshake messages (docs/protocol.md §3.1): metadata (a), region map (b) and
 * the kvx_connect request/reply. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "codec_util.h"

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
