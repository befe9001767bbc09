/* SPDX-License-Identifier: Apache-2.0 */
/* Strict codec: exact bytes (Python msgpack-compatible), round trips, rejections. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "control_internal.h"

TestSuite(control_codec, .timeout = 20.0);

/* Expected-bytes builder: fixstr / raw bytes. */
struct exp {
	uint8_t b[512];
	size_t n;
};
static void e_raw(struct exp *e, const void *p, size_t n)
{
	memcpy(e->b + e->n, p, n);
	e->n += n;
}
static void e_byte(struct exp *e, uint8_t v)
{
	e->b[e->n++] = v;
}
static void e_str(struct exp *e, const char *s)
{
	size_t n = strlen(s);
	if (n < 32) {
		e_byte(e, (uint8_t)(0xa0 | n));
	} else {
		e_byte(e, 0xd9);
		e_byte(e, (uint8_t)n);
	}
	e_raw(e, s, n);
}

static void notify_init(struct kvx_msg_notify *m, enum kvx_msg_type t, const char *tid)
{
	memset(m, 0, sizeof(*m));
	m->type = t;
	strcpy(m->transfer_id, tid);
	m->decode_rank = 0;
}

Test(control_codec, write_done_exact_bytes)
{
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_WRITE_DONE, "xfer");
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x82);
	e_str(&e, "type");
	e_str(&e, "write_done");
	e_str(&e, "transfer_id");
	e_str(&e, "xfer");
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, e.n - 1), -EMSGSIZE);
}

Test(control_codec, release_exact_bytes_with_and_without_tp)
{
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_RELEASE, "xfer-7");
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 2;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x83);
	e_str(&e, "type");
	e_str(&e, "release");
	e_str(&e, "transfer_id");
	e_str(&e, "xfer-7");
	e_str(&e, "consumer_tp_size");
	e_byte(&e, 0x02);
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	m.has_consumer_tp_size = false;
	n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(buf[0], 0x82);
	struct kvx_msg_notify d;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_RELEASE);
	cr_assert_eq(d.consumer_tp_size, 1, "default consumer_tp_size is 1");
	cr_assert_not(d.has_consumer_tp_size);
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
}

Test(control_codec, remote_blocks_exact_bytes_and_roundtrip)
{
	uint32_t ids[] = {4, 5};
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_REMOTE_BLOCKS, "xfer");
	strcpy(m.req_id, "req");
	m.decode_rank = 3;
	m.block_ids = ids;
	m.num_blocks = 2;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x85);
	e_str(&e, "req_id");
	e_str(&e, "req");
	e_str(&e, "transfer_id");
	e_str(&e, "xfer");
	e_str(&e, "block_notify_list");
	e_byte(&e, 0x92);
	e_byte(&e, 4);
	e_byte(&e, 5);
	e_str(&e, "decode_rank");
	e_byte(&e, 3);
	e_str(&e, "type");
	e_str(&e, "remote_blocks");
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);

	uint32_t out[8];
	struct kvx_msg_notify d;
	d.block_ids = out;
	d.blocks_cap = 8;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_REMOTE_BLOCKS);
	cr_assert_str_eq(d.transfer_id, "xfer");
	cr_assert_str_eq(d.req_id, "req");
	cr_assert_eq(d.decode_rank, 3);
	cr_assert_eq(d.num_blocks, 2);
	cr_assert_eq(d.num_groups, 0);
	cr_assert_eq(out[0], 4);
	cr_assert_eq(out[1], 5);
	/* Too small an id array. */
	d.blocks_cap = 1;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), -EMSGSIZE);
	m.num_blocks = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
}

/* kvxfer's extension: the allocating incarnation's epoch travels as `kvx_epoch` after MoRIIO's
 * five keys (a MoRIIO receiver looks keys up by name and ignores it); without it the frame is
 * MoRIIO's, byte for byte (previous test), and decodes with sender_epoch 0. */
Test(control_codec, remote_blocks_kvx_epoch_appended_and_decoded)
{
	uint32_t ids[] = {7};
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_REMOTE_BLOCKS, "t");
	m.decode_rank = 0;
	m.block_ids = ids;
	m.num_blocks = 1;
	m.sender_epoch = 0x0123456789abcdefull;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x86);
	e_str(&e, "req_id");
	e_str(&e, "");
	e_str(&e, "transfer_id");
	e_str(&e, "t");
	e_str(&e, "block_notify_list");
	e_byte(&e, 0x91);
	e_byte(&e, 7);
	e_str(&e, "decode_rank");
	e_byte(&e, 0);
	e_str(&e, "type");
	e_str(&e, "remote_blocks");
	e_str(&e, "kvx_epoch");
	e_byte(&e, 0xcf);
	e_raw(&e, "\x01\x23\x45\x67\x89\xab\xcd\xef", 8);
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	uint32_t out[4];
	struct kvx_msg_notify d;
	d.block_ids = out;
	d.blocks_cap = 4;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.sender_epoch, 0x0123456789abcdefull);
	cr_assert_eq(d.num_blocks, 1);
	cr_assert_eq(out[0], 7);
	/* The same message without the key decodes with epoch 0 (a MoRIIO sender). */
	m.sender_epoch = 0;
	n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n - 10 - 9); /* fixstr "kvx_epoch", uint64 */
	cr_assert_eq(buf[0], 0x85);
	d.sender_epoch = 42;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.sender_epoch, 0);
	/* A kvx_epoch of the wrong type is rejected, naming the field. */
	const uint8_t bad[] = "\x83\xa4type\xadremote_blocks\xabtransfer_id\xa1x\xb1"
			      "block_notify_list\x91\x01";
	uint8_t frame[128];
	size_t bn = sizeof(bad) - 1;
	memcpy(frame, bad, bn);
	frame[0] = 0x84;
	memcpy(frame + bn, "\xa9kvx_epoch\xa1z", 12);
	char err[128] = "";
	cr_assert_eq(kvx_msg_notify_decode(frame, bn + 12, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_epoch"), "%s", err);
}

Test(control_codec, remote_blocks_nested_groups_roundtrip)
{
	uint32_t ids[] = {1, 2, 3, 70000, 9};
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_REMOTE_BLOCKS, "tx-hybrid");
	m.block_ids = ids;
	m.num_blocks = 5;
	m.num_groups = 2;
	m.group_len[0] = 3;
	m.group_len[1] = 2;
	uint8_t buf[256];
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_gt(n, 0);
	uint32_t out[8];
	struct kvx_msg_notify d;
	d.block_ids = out;
	d.blocks_cap = 8;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.num_groups, 2);
	cr_assert_eq(d.group_len[0], 3);
	cr_assert_eq(d.group_len[1], 2);
	cr_assert_arr_eq(out, ids, sizeof(ids));
	m.group_len[1] = 1; /* inconsistent with num_blocks */
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
}

static int dec(const void *b, size_t n, struct kvx_msg_notify *d, char *err)
{
	static uint32_t ids[64];
	d->block_ids = ids;
	d->blocks_cap = 64;
	return kvx_msg_notify_decode(b, n, d, err, 256);
}

Test(control_codec, legacy_completion_and_empty)
{
	struct kvx_msg_notify d;
	char err[256];
	cr_assert_eq(dec("xfer", 4, &d, err), 0);
	cr_assert_eq(d.type, KVX_MSG_COMPLETION);
	cr_assert_str_eq(d.transfer_id, "xfer");
	cr_assert_eq(dec("7", 1, &d, err), 0, "a msgpack int that is not a map is a plain id");
	cr_assert_str_eq(d.transfer_id, "7");
	cr_assert_eq(dec("", 0, &d, err), -EPROTO);
	cr_assert_not_null(strstr(err, "Unhandled message format"), "%s", err);
	cr_assert_eq(dec("\xff\xfe\x01", 3, &d, err), -EPROTO, "not UTF-8");
	cr_assert_eq(dec("a\0b", 3, &d, err), -EPROTO, "embedded NUL");
	char big[600];
	memset(big, 'a', sizeof(big));
	cr_assert_eq(dec(big, sizeof(big), &d, err), -EMSGSIZE);
	/* Encoding a completion gives the raw bytes. */
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_COMPLETION, "cmpl-1");
	uint8_t buf[32];
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), 6);
	cr_assert_arr_eq(buf, "cmpl-1", 6);
}

/* A hostile or malformed notify frame and what the decoder must say about it. */
struct rejection {
	const char *what;
	const char *bytes;
	size_t len;
	const char *msg; /* substring of the error message naming the field */
};
#define FRAME(lit) lit, sizeof(lit) - 1

Test(control_codec, structured_rejections_name_the_field)
{
	static const struct rejection cases[] = {
		{"unknown type", FRAME("\x82\xa4type\xa7unknown\xabtransfer_id\xa4xfer"),
		 "Unhandled structured message type"},
		{"empty block list", FRAME("\x83\xa4type\xadremote_blocks\xabtransfer_id\xa4xfer\xb1" "block_notify_list\x90"),
		 "block_notify_list cannot be empty"},
		{"missing transfer_id", FRAME("\x81\xa4type\xaawrite_done"), "transfer_id"},
		{"transfer_id not str", FRAME("\x82\xa4type\xaawrite_done\xabtransfer_id\x05"), "'transfer_id' must be str"},
		{"negative block id",
		 FRAME("\x83\xa4type\xadremote_blocks\xabtransfer_id\xa1x\xb1" "block_notify_list\x91\xff"), "negative"},
		{"duplicate key", FRAME("\x83\xa4type\xaawrite_done\xabtransfer_id\xa1" "a\xabtransfer_id\xa1" "b"),
		 "duplicate"},
		{"consumer_tp_size 0", FRAME("\x83\xa4type\xa7release\xabtransfer_id\xa1" "a\xb0" "consumer_tp_size\x00"),
		 "consumer_tp_size"},
		{"map key not str", FRAME("\x81\x01\x01"), ""},
	};
	struct kvx_msg_notify d;
	char err[256];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		err[0] = 0;
		cr_assert_eq(dec(cases[i].bytes, cases[i].len, &d, err), -EPROTO, "%s", cases[i].what);
		cr_assert_not_null(strstr(err, cases[i].msg), "%s: message '%s' lacks '%s'", cases[i].what, err,
				   cases[i].msg);
		cr_assert_neq(err[0], 0, "%s: no message", cases[i].what);
	}
	/* docs/protocol.md T22 pins this message exactly. */
	cr_assert_eq(dec(cases[1].bytes, cases[1].len, &d, err), -EPROTO);
	cr_assert_str_eq(err, "block_notify_list cannot be empty");
	struct exp e = {.n = 0};
	/* no type but req_id: remote_blocks */
	e.n = 0;
	e_byte(&e, 0x83);
	e_str(&e, "req_id");
	e_str(&e, "r");
	e_str(&e, "transfer_id");
	e_str(&e, "t");
	e_str(&e, "block_notify_list");
	e_byte(&e, 0x91);
	e_byte(&e, 0x07);
	cr_assert_eq(dec(e.b, e.n, &d, err), 0, "%s", err);
	cr_assert_eq(d.type, KVX_MSG_REMOTE_BLOCKS);
	cr_assert_eq(d.decode_rank, -1);
}

Test(control_codec, hostile_headers_rejected_before_allocation)
{
	struct kvx_msg_notify d;
	char err[256];
	/* map32 claiming 2^32-1 pairs in 5 bytes */
	cr_assert_eq(dec("\xdf\xff\xff\xff\xff", 5, &d, err), -EPROTO);
	cr_assert_not_null(strstr(err, "declares"), "%s", err);
	/* map whose value is an array32 claiming 16 M elements */
	struct exp e = {.n = 0};
	e_byte(&e, 0x81);
	e_str(&e, "block_notify_list");
	e_raw(&e, "\xdd\x01\x00\x00\x00", 5);
	cr_assert_eq(dec(e.b, e.n, &d, err), -EPROTO);
	/* str32 claiming 4 GiB */
	e.n = 0;
	e_byte(&e, 0x81);
	e_raw(&e, "\xdb\xff\xff\xff\xff", 5);
	cr_assert_eq(dec(e.b, e.n, &d, err), -EPROTO);
	/* deep nesting */
	e.n = 0;
	e_byte(&e, 0x81);
	e_str(&e, "a");
	for (int i = 0; i < 40; i++)
		e_byte(&e, 0x91);
	e_byte(&e, 0x01);
	cr_assert_eq(dec(e.b, e.n, &d, err), -EMSGSIZE);
	cr_assert_not_null(strstr(err, "nesting"), "%s", err);
	/* truncated map */
	e.n = 0;
	e_byte(&e, 0x82);
	e_str(&e, "type");
	e_str(&e, "write_done");
	e_str(&e, "transfer_id");
	cr_assert_eq(dec(e.b, e.n, &d, err), -EPROTO);
	/* trailing bytes after a valid map */
	e.n = 0;
	e_byte(&e, 0x82);
	e_str(&e, "type");
	e_str(&e, "write_done");
	e_str(&e, "transfer_id");
	e_str(&e, "x");
	e_byte(&e, 0x00);
	cr_assert_eq(dec(e.b, e.n, &d, err), -EPROTO);
	cr_assert_not_null(strstr(err, "trailing"), "%s", err);
	/* 0xc1 and ext types */
	cr_assert_eq(dec("\x81\xc1\x01", 3, &d, err), -EPROTO);
	cr_assert_eq(dec("\x81\xa1x\xd4\x01\x02", 6, &d, err), -EPROTO);
	/* over the frame limit */
	size_t big = KVX_MSG_NOTIFY_MAX_BYTES + 1;
	uint8_t *p = calloc(1, big);
	p[0] = 0x81;
	cr_assert_eq(dec(p, big, &d, err), -EMSGSIZE);
	free(p);
}

Test(control_codec, prescan_depth_boundary)
{
	uint8_t b[16];
	size_t end;
	/* map(1) > array(2) > array(3) > array(4) > int: allowed at depth 4 */
	const uint8_t ok[] = {0x81, 0xa1, 'a', 0x91, 0x91, 0x91, 0x01};
	cr_assert_eq(kvx_ctl_prescan(ok, sizeof(ok), 4, &end, NULL, 0), 0);
	cr_assert_eq(end, sizeof(ok));
	const uint8_t deep[] = {0x81, 0xa1, 'a', 0x91, 0x91, 0x91, 0x91, 0x01};
	cr_assert_eq(kvx_ctl_prescan(deep, sizeof(deep), 4, &end, NULL, 0), -EMSGSIZE);
	memset(b, 0, sizeof(b));
	cr_assert_eq(kvx_ctl_prescan(b, 0, 4, &end, NULL, 0), -EPROTO);
	cr_assert_eq(kvx_ctl_prescan(b, 3, 4, &end, NULL, 0), 0);
	cr_assert_eq(end, 1);
}

Test(control_codec, heartbeat_exact_bytes_t50_payload)
{
	struct kvx_msg_heartbeat h = {.role = KVX_CTL_ROLE_PRODUCER, .dp_size = 1, .tp_size = 8,
				      .mode = KVX_CTL_MODE_READ};
	strcpy(h.http_address, "127.0.0.1:8000");
	strcpy(h.zmq_address, "host:127.0.0.1,handshake:6301,notify:61005");
	struct exp e = {.n = 0};
	e_byte(&e, 0x86);
	e_str(&e, "type");
	e_str(&e, "P");
	e_str(&e, "http_address");
	e_str(&e, "127.0.0.1:8000");
	e_str(&e, "zmq_address");
	e_str(&e, "host:127.0.0.1,handshake:6301,notify:61005");
	e_str(&e, "dp_size");
	e_byte(&e, 1);
	e_str(&e, "tp_size");
	e_byte(&e, 8);
	e_str(&e, "transfer_mode");
	e_str(&e, "READ");
	uint8_t buf[512];
	int n = kvx_msg_heartbeat_encode(&h, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	struct kvx_msg_heartbeat d;
	char err[256];
	cr_assert_eq(kvx_msg_heartbeat_decode(buf, (size_t)n, &d, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(d.role, KVX_CTL_ROLE_PRODUCER);
	cr_assert_eq(d.mode, KVX_CTL_MODE_READ);
	cr_assert_eq(d.tp_size, 8);
	cr_assert_str_eq(d.zmq_address, h.zmq_address);
	buf[3] = 'X'; /* type "X" */
	cr_assert_eq(kvx_msg_heartbeat_decode(buf, (size_t)n, &d, err, sizeof(err)), -EPROTO);
	h.dp_size = 0;
	cr_assert_eq(kvx_msg_heartbeat_encode(&h, buf, sizeof(buf)), -EINVAL);
}

static void meta_fill(struct kvx_msg_meta *m, struct kvx_msg_region *r, uint32_t n, bool kvx)
{
	memset(m, 0, sizeof(*m));
	strcpy(m->engine_id, "10.0.0.1:6301");
	strcpy(m->engine_key, "producer:10.0.0.1:6301:tp0:dp0");
	strcpy(m->hostname, "node1");
	strcpy(m->host, "10.0.0.1");
	m->kv_port = 40000;
	m->num_blocks = 1024;
	m->block_len = 65536;
	strcpy(m->attn_backend, "FLASH_ATTN");
	m->has_kvx = kvx;
	m->version = KVX_MSG_PROTO_VERSION;
	m->epoch = 0x1234567890ull;
	strcpy(m->transport, "tcp");
	strcpy(m->layout, "split");
	for (uint32_t i = 0; i < n; i++)
		r[i] = (struct kvx_msg_region){.addr = 0x7f0000000000ull + i * 0x100000ull,
					       .len_bytes = 0x100000, .key = 0xabc0 + i};
	m->regions = r;
	m->num_regions = n;
}

Test(control_codec, meta_roundtrip_and_moriio_key_order)
{
	struct kvx_msg_region r[4], out[4];
	struct kvx_msg_meta m, d;
	meta_fill(&m, r, 4, true);
	uint8_t buf[2048];
	int n = kvx_msg_meta_encode(&m, buf, sizeof(buf));
	cr_assert_gt(n, 0);
	/* The first six keys are MoRIIO's, in order; kvx_ keys follow (11 pairs). */
	cr_assert_eq(buf[0], 0x8b);
	cr_assert_eq(buf[1], 0xa9);
	cr_assert_arr_eq(buf + 2, "engine_id", 9);
	memset(&d, 0, sizeof(d));
	d.regions = out;
	d.regions_cap = 4;
	char err[256];
	cr_assert_eq(kvx_msg_meta_decode(buf, (size_t)n, &d, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(d.engine_id, m.engine_id);
	cr_assert_str_eq(d.engine_key, m.engine_key);
	cr_assert_str_eq(d.hostname, "node1");
	cr_assert_str_eq(d.host, "10.0.0.1");
	cr_assert_eq(d.kv_port, 40000);
	cr_assert_eq(d.num_blocks, 1024);
	cr_assert_eq(d.block_len, 65536);
	cr_assert(d.has_kvx);
	cr_assert_eq(d.epoch, 0x1234567890ull);
	cr_assert_str_eq(d.transport, "tcp");
	cr_assert_eq(d.num_regions, 4);
	cr_assert_arr_eq(out, r, sizeof(r));
	d.regions_cap = 3;
	cr_assert_eq(kvx_msg_meta_decode(buf, (size_t)n, &d, err, sizeof(err)), -EMSGSIZE);
}

Test(control_codec, meta_without_kvx_keys_is_moriio_compatible)
{
	struct kvx_msg_region r[2], out[2];
	struct kvx_msg_meta m, d;
	meta_fill(&m, r, 2, false);
	uint8_t buf[2048];
	int n = kvx_msg_meta_encode(&m, buf, sizeof(buf));
	cr_assert_eq(buf[0], 0x86, "exactly the six MoRIIO keys");
	memset(&d, 0, sizeof(d));
	d.regions = out;
	d.regions_cap = 2;
	cr_assert_eq(kvx_msg_meta_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_not(d.has_kvx);
	cr_assert_eq(out[1].addr, r[1].addr);
	cr_assert_eq(out[1].len_bytes, 0);
	/* Drop one required key: not a valid AgentMetadata. */
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "engine_id", 9);
	msgpack_pack_str_with_body(&pk, "x", 1);
	char err[256];
	cr_assert_eq(kvx_msg_meta_decode(sb.data, sb.size, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "agent_metadata"), "%s", err);
	msgpack_sbuffer_destroy(&sb);
}

Test(control_codec, layers_roundtrip_groups_runs)
{
	struct kvx_msg_memdesc in[3], out[3];
	memset(in, 0, sizeof(in));
	const char *names[] = {"l0", "l1", "l1"};
	for (int i = 0; i < 3; i++) {
		strcpy(in[i].layer, names[i]);
		in[i].id = (uint32_t)i;
		in[i].device_id = i == 0 ? -1 : 0;
		in[i].addr = 0x1000u * (uint32_t)(i + 1);
		in[i].len_bytes = 4096;
		in[i].loc = i == 0 ? 1 : 2;
	}
	struct kvx_msg_layers l = {.num_descs = 3, .descs = in};
	strcpy(l.engine_key, "producer:h:1:tp0:dp0");
	uint8_t buf[2048];
	int n = kvx_msg_layers_encode(&l, buf, sizeof(buf));
	cr_assert_gt(n, 0);
	cr_assert_eq(buf[0], 0x82, "two layers");
	struct kvx_msg_layers d = {.descs = out, .descs_cap = 3};
	char err[256];
	cr_assert_eq(kvx_msg_layers_decode(buf, (size_t)n, &d, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(d.num_layers, 2);
	cr_assert_eq(d.num_descs, 3);
	cr_assert_str_eq(d.engine_key, l.engine_key);
	for (int i = 0; i < 3; i++) {
		cr_assert_str_eq(out[i].layer, in[i].layer);
		cr_assert_eq(out[i].device_id, in[i].device_id);
		cr_assert_eq(out[i].addr, in[i].addr);
		cr_assert_eq(out[i].loc, in[i].loc);
	}
	d.descs_cap = 2;
	cr_assert_eq(kvx_msg_layers_decode(buf, (size_t)n, &d, err, sizeof(err)), -EMSGSIZE);
	strcpy(in[2].layer, "l0"); /* l0, l1, l0: duplicate key */
	cr_assert_eq(kvx_msg_layers_encode(&l, buf, sizeof(buf)), -EINVAL);
	strcpy(in[2].layer, "l2");
	in[2].loc = 3;
	cr_assert_eq(kvx_msg_layers_encode(&l, buf, sizeof(buf)), -EINVAL);
}

Test(control_codec, connect_roundtrip_blob_is_opaque)
{
	uint8_t blob[300];
	for (size_t i = 0; i < sizeof(blob); i++)
		blob[i] = (uint8_t)(i * 7);
	struct kvx_msg_connect c = {.is_reply = false, .epoch = 99, .dp_rank = 3, .blob = blob,
				    .blob_len = sizeof(blob)};
	strcpy(c.engine_id, "10.0.0.2:6301");
	uint8_t buf[1024];
	int n = kvx_msg_connect_encode(&c, buf, sizeof(buf));
	cr_assert_gt(n, 0);
	struct kvx_msg_connect d;
	cr_assert_eq(kvx_msg_connect_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_not(d.is_reply);
	cr_assert_eq(d.epoch, 99);
	cr_assert_eq(d.dp_rank, 3);
	cr_assert_str_eq(d.engine_id, "10.0.0.2:6301");
	cr_assert_eq(d.blob_len, sizeof(blob));
	cr_assert_arr_eq(d.blob, blob, sizeof(blob));
	cr_assert(d.blob >= buf && d.blob < buf + n, "blob points into the input");
	struct kvx_msg_connect rep = {.is_reply = true, .status = -ENOTSUP};
	n = kvx_msg_connect_encode(&rep, buf, sizeof(buf));
	cr_assert_eq(kvx_msg_connect_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert(d.is_reply);
	cr_assert_eq(d.status, -ENOTSUP);
	cr_assert_eq(d.blob_len, 0);
	rep.status = 5;
	cr_assert_eq(kvx_msg_connect_encode(&rep, buf, sizeof(buf)), -EINVAL);
	rep.status = 0;
	rep.blob = blob;
	rep.blob_len = KVX_MSG_BLOB_MAX + 1;
	cr_assert_eq(kvx_msg_connect_encode(&rep, buf, sizeof(buf)), -EINVAL);
}

Test(control_codec, utf8_validation)
{
	cr_assert(kvx_ctl_utf8_ok((const uint8_t *)"h\xc3\xa9llo", 6));
	cr_assert(kvx_ctl_utf8_ok((const uint8_t *)"\xf0\x9f\x98\x80", 4));
	cr_assert_not(kvx_ctl_utf8_ok((const uint8_t *)"\xc0\xaf", 2), "overlong");
	cr_assert_not(kvx_ctl_utf8_ok((const uint8_t *)"\xed\xa0\x80", 3), "surrogate");
	cr_assert_not(kvx_ctl_utf8_ok((const uint8_t *)"\xe2\x82", 2), "truncated");
	cr_assert_not(kvx_ctl_utf8_ok((const uint8_t *)"\xf4\x90\x80\x80", 4), "> U+10FFFF");
}

/* Issue 14: between kvxfer peers, write_done and release name their sender (`kvx_engine`,
 * `kvx_rank`, `kvx_epoch` after the MoRIIO keys, which a MoRIIO receiver ignores), so a
 * duplicate from one sender is recognised; without them the frame is MoRIIO's (tests above). */
Test(control_codec, write_done_and_release_name_their_sender)
{
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_WRITE_DONE, "xfer");
	strcpy(m.sender_id, "10.0.0.1:6301");
	m.sender_rank = 1;
	m.sender_epoch = 0x0102030405060708ull;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x85);
	e_str(&e, "type");
	e_str(&e, "write_done");
	e_str(&e, "transfer_id");
	e_str(&e, "xfer");
	e_str(&e, "kvx_engine");
	e_str(&e, "10.0.0.1:6301");
	e_str(&e, "kvx_rank");
	e_byte(&e, 0x01);
	e_str(&e, "kvx_epoch");
	e_byte(&e, 0xcf);
	e_raw(&e, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	struct kvx_msg_notify d;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_WRITE_DONE);
	cr_assert_str_eq(d.sender_id, "10.0.0.1:6301");
	cr_assert_eq(d.sender_rank, 1);
	cr_assert_eq(d.sender_epoch, 0x0102030405060708ull);

	/* release: after consumer_tp_size; no epoch -> two identity keys. */
	notify_init(&m, KVX_MSG_RELEASE, "xfer-7");
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 2;
	strcpy(m.sender_id, "d:1");
	m.sender_rank = 0;
	e.n = 0;
	e_byte(&e, 0x85);
	e_str(&e, "type");
	e_str(&e, "release");
	e_str(&e, "transfer_id");
	e_str(&e, "xfer-7");
	e_str(&e, "consumer_tp_size");
	e_byte(&e, 0x02);
	e_str(&e, "kvx_engine");
	e_str(&e, "d:1");
	e_str(&e, "kvx_rank");
	e_byte(&e, 0x00);
	n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_str_eq(d.sender_id, "d:1");
	cr_assert_eq(d.sender_rank, 0);
	cr_assert_eq(d.sender_epoch, 0);
	cr_assert_eq(d.consumer_tp_size, 2);

	/* A MoRIIO frame decodes without a sender. */
	const uint8_t moriio[] = "\x82\xa4type\xaawrite_done\xabtransfer_id\xa1x";
	cr_assert_eq(kvx_msg_notify_decode(moriio, sizeof(moriio) - 1, &d, NULL, 0), 0);
	cr_assert_str_eq(d.sender_id, "");
	cr_assert_eq(d.sender_rank, -1);
	/* One identity key without the other is malformed. */
	const uint8_t half[] = "\x83\xa4type\xaawrite_done\xabtransfer_id\xa1x\xa8kvx_rank\x01";
	char err[128] = "";
	cr_assert_eq(kvx_msg_notify_decode(half, sizeof(half) - 1, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_engine"), "%s", err);
	/* Encoder: a named sender needs a rank in range. */
	notify_init(&m, KVX_MSG_WRITE_DONE, "x");
	strcpy(m.sender_id, "p:1");
	m.sender_rank = -1;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
}

/* kvx_failed (P -> D) and kvx_status_query (D -> P): kvxfer-only types, identity required. */
Test(control_codec, kvx_failed_and_status_query_exact_bytes)
{
	struct kvx_msg_notify m;
	notify_init(&m, KVX_MSG_FAILED, "tx-f");
	m.fail_status = 2; /* KVX_CPL_ABORTED */
	m.fail_error = -125;
	strcpy(m.reason, "aborted");
	strcpy(m.sender_id, "p:7");
	m.sender_rank = 0;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x87);
	e_str(&e, "type");
	e_str(&e, "kvx_failed");
	e_str(&e, "transfer_id");
	e_str(&e, "tx-f");
	e_str(&e, "kvx_status");
	e_byte(&e, 0x02);
	e_str(&e, "kvx_error");
	e_byte(&e, 0xd0);
	e_byte(&e, 0x83); /* -125 */
	e_str(&e, "kvx_reason");
	e_str(&e, "aborted");
	e_str(&e, "kvx_engine");
	e_str(&e, "p:7");
	e_str(&e, "kvx_rank");
	e_byte(&e, 0x00);
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	struct kvx_msg_notify d;
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_FAILED);
	cr_assert_eq(d.fail_status, 2);
	cr_assert_eq(d.fail_error, -125);
	cr_assert_str_eq(d.reason, "aborted");
	cr_assert_str_eq(d.sender_id, "p:7");
	/* Without identity, or with status 0 (not a failure), it is refused both ways. */
	m.sender_id[0] = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
	strcpy(m.sender_id, "p:7");
	m.fail_status = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
	m.fail_status = 2;
	m.fail_error = 5;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
	const uint8_t zero[] = "\x87\xa4type\xaakvx_failed\xabtransfer_id\xa1x\xaakvx_status\x00\xa9kvx_error\x00"
			       "\xaakvx_reason\xa0\xaakvx_engine\xa1p\xa8kvx_rank\x00";
	char err[128] = "";
	cr_assert_eq(kvx_msg_notify_decode(zero, sizeof(zero) - 1, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_status"), "%s", err);
	const uint8_t anon[] = "\x85\xa4type\xaakvx_failed\xabtransfer_id\xa1x\xaakvx_status\x01\xa9kvx_error\x00"
			       "\xaakvx_reason\xa0";
	cr_assert_eq(kvx_msg_notify_decode(anon, sizeof(anon) - 1, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_engine"), "%s", err);

	notify_init(&m, KVX_MSG_STATUS_QUERY, "tx-q");
	strcpy(m.sender_id, "d:9");
	m.sender_rank = 3;
	m.sender_epoch = 5;
	e.n = 0;
	e_byte(&e, 0x85);
	e_str(&e, "type");
	e_str(&e, "kvx_status_query");
	e_str(&e, "transfer_id");
	e_str(&e, "tx-q");
	e_str(&e, "kvx_engine");
	e_str(&e, "d:9");
	e_str(&e, "kvx_rank");
	e_byte(&e, 0x03);
	e_str(&e, "kvx_epoch");
	e_byte(&e, 0x05);
	n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_STATUS_QUERY);
	cr_assert_eq(d.sender_rank, 3);
	cr_assert_eq(d.sender_epoch, 5);
	cr_assert_str_eq(d.notify_host, "");
	m.sender_id[0] = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
}

/* A READ consumer's kvx_status_query names its notify listener and whether it found the lease
 * revoked (docs/protocol.md §5.10): three extra keys, all or none. */
Test(control_codec, status_query_with_notify_endpoint_exact_bytes)
{
	struct kvx_msg_notify m, d;
	notify_init(&m, KVX_MSG_STATUS_QUERY, "tx-r");
	strcpy(m.sender_id, "d:9");
	m.sender_rank = 0;
	strcpy(m.notify_host, "10.0.0.2");
	m.notify_port = 5601;
	m.lease_revoked = true;
	uint8_t buf[256];
	struct exp e = {.n = 0};
	e_byte(&e, 0x87);
	e_str(&e, "type");
	e_str(&e, "kvx_status_query");
	e_str(&e, "transfer_id");
	e_str(&e, "tx-r");
	e_str(&e, "kvx_engine");
	e_str(&e, "d:9");
	e_str(&e, "kvx_rank");
	e_byte(&e, 0x00);
	e_str(&e, "kvx_notify_host");
	e_str(&e, "10.0.0.2");
	e_str(&e, "kvx_notify_port");
	e_byte(&e, 0xcd);
	e_byte(&e, 0x15);
	e_byte(&e, 0xe1); /* 5601 */
	e_str(&e, "kvx_revoked");
	e_byte(&e, 0x01);
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	cr_assert_eq(n, (int)e.n);
	cr_assert_arr_eq(buf, e.b, e.n);
	cr_assert_eq(kvx_msg_notify_decode(buf, (size_t)n, &d, NULL, 0), 0);
	cr_assert_eq(d.type, KVX_MSG_STATUS_QUERY);
	cr_assert_str_eq(d.notify_host, "10.0.0.2");
	cr_assert_eq(d.notify_port, 5601);
	cr_assert(d.lease_revoked);
	m.notify_port = 0;
	cr_assert_eq(kvx_msg_notify_encode(&m, buf, sizeof(buf)), -EINVAL);
	/* A host without its port, or a port 0, is malformed. */
	const uint8_t half[] = "\x85\xa4type\xb0kvx_status_query\xabtransfer_id\xa1x\xaakvx_engine\xa1q"
			       "\xa8kvx_rank\x00\xafkvx_notify_host\xa1h";
	char err[128] = "";
	cr_assert_eq(kvx_msg_notify_decode(half, sizeof(half) - 1, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_notify_port"), "%s", err);
	const uint8_t zero[] = "\x87\xa4type\xb0kvx_status_query\xabtransfer_id\xa1x\xaakvx_engine\xa1q"
			       "\xa8kvx_rank\x00\xafkvx_notify_host\xa1h\xafkvx_notify_port\x00\xabkvx_revoked\x00";
	cr_assert_eq(kvx_msg_notify_decode(zero, sizeof(zero) - 1, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "kvx_notify_port"), "%s", err);
}
