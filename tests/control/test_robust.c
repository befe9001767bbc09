/* SPDX-License-Identifier: Apache-2.0 */
/* Untrusted input on both ROUTERs: every hostile message is dropped and counted, and the
 * valid message sent right after it is still processed (docs/protocol.md §6 item 3). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctl_test_util.h"

TestSuite(control_robust, .timeout = 90.0);

struct fixture {
	struct collector c;
	struct kvx_ctl *ctl;
	uint16_t hs, nt;
	void *z;
	void *d;
	size_t expect;
};

static void fx_init(struct fixture *f)
{
	coll_init(&f->c);
	struct kvx_ctl_params p;
	tctl_params(&p, &f->c);
	struct kvx_ctl *ctl = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &ctl), 0);
	tctl_set_local(ctl, 2);
	cr_assert_eq(kvx_ctl_start(ctl), 0);
	f->ctl = ctl;
	kvx_ctl_bound_ports(ctl, &f->hs, &f->nt);
	f->z = zmq_ctx_new();
	f->d = raw_dealer(f->z, f->nt);
	f->expect = 0;
}

static void fx_fini(struct fixture *f)
{
	zmq_close(f->d);
	zmq_ctx_term(f->z);
	kvx_ctl_destroy(f->ctl);
	coll_fini(&f->c);
}

/* Send a hostile frame, then a valid write_done; the valid one must arrive. */
static void hostile_then_valid(struct fixture *f, const void *bad, size_t len, const char *what)
{
	uint64_t mal = CTR(f->ctl, malformed);
	zmq_send(f->d, bad, len, 0);
	char tid[64];
	snprintf(tid, sizeof(tid), "tx-after-%zu", f->expect);
	struct kvx_msg_notify m;
	memset(&m, 0, sizeof(m));
	m.type = KVX_MSG_WRITE_DONE;
	strcpy(m.transfer_id, tid);
	uint8_t buf[128];
	int n = kvx_msg_notify_encode(&m, buf, sizeof(buf));
	zmq_send(f->d, buf, (size_t)n, 0);
	f->expect++;
	cr_assert_eq(coll_wait(&f->c, f->expect, 10.0), f->expect, "%s: valid message lost", what);
	cr_assert_str_eq(f->c.msgs[f->expect - 1].m.transfer_id, tid, "%s", what);
	cr_assert_eq(CTR(f->ctl, malformed), mal + 1, "%s: counted once", what);
}

Test(control_robust, garbage_bytes)
{
	struct fixture f;
	fx_init(&f);
	uint8_t g[256];
	uint32_t x = 0x9e3779b9u;
	for (size_t i = 0; i < sizeof(g); i++) {
		x = x * 1664525u + 1013904223u;
		g[i] = (uint8_t)(0x80 | (x >> 24)); /* high bytes: not UTF-8, not a valid map */
	}
	g[0] = 0x8f;
	hostile_then_valid(&f, g, sizeof(g), "garbage");
	fx_fini(&f);
}

Test(control_robust, truncated_msgpack)
{
	struct fixture f;
	fx_init(&f);
	const uint8_t t[] = "\x82\xa4type\xaawrite_done\xabtransfer_id\xa4xf";
	hostile_then_valid(&f, t, sizeof(t) - 1, "truncated");
	fx_fini(&f);
}

Test(control_robust, map_header_claiming_2_pow_32_entries)
{
	struct fixture f;
	fx_init(&f);
	hostile_then_valid(&f, "\xdf\xff\xff\xff\xff", 5, "map32 header");
	/* Also an array32 of 2^32-1 inside a valid-looking map. */
	const uint8_t a[] = "\x81\xb1" "block_notify_list\xdd\xff\xff\xff\xff";
	hostile_then_valid(&f, a, sizeof(a) - 1, "array32 header");
	fx_fini(&f);
}

Test(control_robust, deep_nesting)
{
	struct fixture f;
	fx_init(&f);
	uint8_t d[200];
	size_t n = 0;
	d[n++] = 0x81;
	d[n++] = 0xa1;
	d[n++] = 'k';
	for (int i = 0; i < 100; i++)
		d[n++] = 0x91;
	d[n++] = 0x00;
	hostile_then_valid(&f, d, n, "deep nesting");
	cr_assert_geq(CTR(f.ctl, oversize), 1);
	fx_fini(&f);
}

Test(control_robust, wrong_types_and_ranges)
{
	struct fixture f;
	fx_init(&f);
	const uint8_t t1[] = "\x82\xa4type\xaawrite_done\xabtransfer_id\x92\x01\x02";
	hostile_then_valid(&f, t1, sizeof(t1) - 1, "transfer_id array");
	const uint8_t t2[] = "\x82\xa4type\x07\xabtransfer_id\xa1x";
	hostile_then_valid(&f, t2, sizeof(t2) - 1, "type int");
	const uint8_t t3[] = "\x83\xa4type\xadremote_blocks\xabtransfer_id\xa1x"
			     "\xb1" "block_notify_list\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xff";
	hostile_then_valid(&f, t3, sizeof(t3) - 1, "block id 2^64-1");
	const uint8_t t4[] = "\x83\xa4type\xa7release\xabtransfer_id\xa1x"
			     "\xb0" "consumer_tp_size\xcb\x3f\xf0\0\0\0\0\0\0";
	hostile_then_valid(&f, t4, sizeof(t4) - 1, "float tp size");
	fx_fini(&f);
}

Test(control_robust, unknown_type)
{
	struct fixture f;
	fx_init(&f);
	const uint8_t u[] = "\x82\xa4type\xa4ping\xabtransfer_id\xa1x";
	hostile_then_valid(&f, u, sizeof(u) - 1, "unknown type");
	cr_assert_eq(CTR(f.ctl, unknown_type), 1);
	fx_fini(&f);
}

Test(control_robust, empty_payload)
{
	struct fixture f;
	fx_init(&f);
	hostile_then_valid(&f, "", 0, "empty");
	fx_fini(&f);
}

Test(control_robust, three_frame_message)
{
	struct fixture f;
	fx_init(&f);
	uint64_t mal = CTR(f.ctl, malformed);
	zmq_send(f.d, "tx-part1", 8, ZMQ_SNDMORE);
	zmq_send(f.d, "tx-part2", 8, 0);
	zmq_send(f.d, "tx-valid", 8, 0);
	cr_assert_eq(coll_wait(&f.c, 1, 10.0), 1);
	cr_assert_str_eq(f.c.msgs[0].m.transfer_id, "tx-valid");
	cr_assert_eq(CTR(f.ctl, malformed), mal + 1);
	fx_fini(&f);
}

Test(control_robust, sixteen_mib_frame)
{
	struct fixture f;
	fx_init(&f);
	size_t big = 16u << 20;
	uint8_t *p = malloc(big);
	memset(p, 'a', big);
	/* Over ZMQ_MAXMSGSIZE: libzmq drops the connection before buffering the frame. */
	zmq_send(f.d, p, big, 0);
	free(p);
	/* The same peer reconnects with a fresh DEALER (its old connection was cut). */
	void *d2 = raw_dealer(f.z, f.nt);
	zmq_send(d2, "tx-after-big", 12, 0);
	cr_assert_eq(coll_wait(&f.c, 1, 10.0), 1);
	cr_assert_str_eq(f.c.msgs[0].m.transfer_id, "tx-after-big");
	zmq_close(d2);
	fx_fini(&f);
}

Test(control_robust, per_peer_counters)
{
	struct fixture f;
	fx_init(&f);
	hostile_then_valid(&f, "\xc1", 1, "0xc1");
	struct kvx_ctl_peer_stats st[KVX_CTL_PEER_STATS_MAX];
	size_t n = kvx_ctl_peer_stats_get(f.ctl, st, KVX_CTL_PEER_STATS_MAX);
	cr_assert_eq(n, 1);
	cr_assert_str_eq(st[0].peer, "127.0.0.1");
	cr_assert_eq(st[0].rx, 2);
	cr_assert_eq(st[0].malformed, 1);
	fx_fini(&f);
}

/* Handshake ROUTER: garbage, 3 frames, an unknown request, a connect reply sent to the
 * listener; then a real get_meta_msg is still answered. */
Test(control_robust, handshake_listener_survives_bad_requests)
{
	struct fixture f;
	fx_init(&f);
	void *h = raw_dealer(f.z, f.hs);
	int rcv = 5000;
	zmq_setsockopt(h, ZMQ_RCVTIMEO, &rcv, sizeof(rcv));
	zmq_send(h, "\xde\xff\xff", 3, 0);
	zmq_send(h, "a", 1, ZMQ_SNDMORE);
	zmq_send(h, "b", 1, 0);
	zmq_send(h, "pop_done_recv", 13, 0);
	uint8_t buf[256];
	struct kvx_msg_connect rep = {.is_reply = true, .status = 0};
	int n = kvx_msg_connect_encode(&rep, buf, sizeof(buf));
	zmq_send(h, buf, (size_t)n, 0);
	zmq_send(h, "", 0, 0);
	zmq_send(h, "get_meta_msg", 12, 0);
	uint8_t r[65536];
	cr_assert_eq(zmq_recv(h, r, sizeof(r), 0), 0, "first frame is empty");
	int more = 0;
	size_t ml = sizeof(more);
	zmq_getsockopt(h, ZMQ_RCVMORE, &more, &ml);
	cr_assert(more);
	int len = zmq_recv(h, r, sizeof(r), 0);
	cr_assert_gt(len, 0);
	struct kvx_msg_region regs[4];
	struct kvx_msg_meta m;
	memset(&m, 0, sizeof(m));
	m.regions = regs;
	m.regions_cap = 4;
	cr_assert_eq(kvx_msg_meta_decode(r, (size_t)len, &m, NULL, 0), 0);
	cr_assert_eq(m.num_regions, 2);
	cr_assert_eq(zmq_recv(h, r, sizeof(r), 0), 0);
	len = zmq_recv(h, r, sizeof(r), 0);
	struct kvx_msg_memdesc ds[4];
	struct kvx_msg_layers l = {.descs = ds, .descs_cap = 4};
	cr_assert_eq(kvx_msg_layers_decode(r, (size_t)len, &l, NULL, 0), 0);
	cr_assert_eq(l.num_layers, 2);
	/* Counted after both replies left: the raw DEALER may read them first. */
	cr_assert(WAIT_CTR(f.ctl, hs_served, 1, 10.0));
	cr_assert_eq(CTR(f.ctl, hs_served), 1);
	cr_assert_eq(CTR(f.ctl, malformed), 5);
	/* A connect request with no handler configured is answered -ENOTSUP, not dropped. */
	struct kvx_msg_connect req = {.is_reply = false, .epoch = 1, .dp_rank = 0};
	strcpy(req.engine_id, "x:1");
	n = kvx_msg_connect_encode(&req, buf, sizeof(buf));
	zmq_send(h, buf, (size_t)n, 0);
	cr_assert_eq(zmq_recv(h, r, sizeof(r), 0), 0);
	len = zmq_recv(h, r, sizeof(r), 0);
	struct kvx_msg_connect got;
	cr_assert_eq(kvx_msg_connect_decode(r, (size_t)len, &got, NULL, 0), 0);
	cr_assert(got.is_reply);
	cr_assert_eq(got.status, -ENOTSUP);
	zmq_close(h);
	fx_fini(&f);
}
