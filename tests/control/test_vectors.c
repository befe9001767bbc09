/* SPDX-License-Identifier: Apache-2.0 */
/* docs/protocol.md §7 vectors T20-T22, T33-T36, T38-T43, T50, T52, T54 (T37 is not in the spec). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ctl_test_util.h"

TestSuite(control_vectors, .timeout = 90.0);

/* ---- helpers ------------------------------------------------------------------------- */

static void notify(struct kvx_msg_notify *m, enum kvx_msg_type t, const char *tid)
{
	memset(m, 0, sizeof(*m));
	m->type = t;
	snprintf(m->transfer_id, sizeof(m->transfer_id), "%s", tid);
}

static size_t enc(const struct kvx_msg_notify *m, uint8_t *buf, size_t cap)
{
	int n = kvx_msg_notify_encode(m, buf, cap);
	cr_assert_gt(n, 0);
	return (size_t)n;
}

struct hs_res {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int calls;
	int status[8];
	char stage[8][64];
	char error[8][512];
	uint64_t start_ns[8], end_ns[8];
	uint32_t nranks[8];
	int rank_status[8][8];
	uint32_t rank_dp[8][8];
	char rank_host[8][8][64];
	uint16_t rank_port[8][8];
	int rank_has_meta[8][8];
	uint64_t cookie[8];
};

static void hr_init(struct hs_res *h)
{
	memset(h, 0, sizeof(*h));
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
}

static void hr_done(void *arg, const struct kvx_ctl_hs_result *r)
{
	struct hs_res *h = arg;
	pthread_mutex_lock(&h->mu);
	int k = h->calls < 8 ? h->calls : 7;
	h->status[k] = r->status;
	h->cookie[k] = r->cookie;
	snprintf(h->error[k], sizeof(h->error[k]), "%s", r->error);
	h->start_ns[k] = r->start_ns;
	h->end_ns[k] = r->end_ns;
	h->nranks[k] = r->num_ranks;
	h->stage[k][0] = 0;
	for (uint32_t i = 0; i < r->num_ranks && i < 8; i++) {
		h->rank_status[k][i] = r->ranks[i].status;
		h->rank_dp[k][i] = r->ranks[i].dp_rank;
		h->rank_has_meta[k][i] = r->ranks[i].meta != NULL;
		snprintf(h->rank_host[k][i], 64, "%.60s", r->ranks[i].host);
		h->rank_port[k][i] = r->ranks[i].port;
		if (r->ranks[i].status && !h->stage[k][0])
			snprintf(h->stage[k], 64, "%s", r->ranks[i].stage);
	}
	h->calls++;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

static int hr_calls(void *arg)
{
	struct hs_res *h = arg;
	pthread_mutex_lock(&h->mu);
	int c = h->calls;
	pthread_mutex_unlock(&h->mu);
	return c;
}

struct calls_ge {
	struct hs_res *h;
	int n;
};
static int calls_ge(void *arg)
{
	struct calls_ge *c = arg;
	return hr_calls(c->h) >= c->n;
}
static int hr_wait(struct hs_res *h, int n, double t)
{
	struct calls_ge c = {h, n};
	return wait_until(calls_ge, &c, t);
}

static void hsp(struct kvx_ctl_hs_params *p, const char *host, uint16_t port, struct hs_res *h)
{
	memset(p, 0, sizeof(*p));
	p->host = host;
	p->handshake_base_port = port;
	p->dp_size = 1;
	p->tp_size = 1;
	p->timeout_ms = 10000;
	p->on_done = hr_done;
	p->arg = h;
}

/* A listener control object bound at fixed ports (for multi-rank port arithmetic). */
static struct kvx_ctl *listener_at(const char *host, uint16_t hs_base, uint16_t nt_base,
				   uint32_t dp_rank, uint32_t dp_size, uint32_t dp_local,
				   uint32_t tp_rank, uint32_t tp_size, struct collector *coll)
{
	struct kvx_ctl_params p;
	tctl_params(&p, coll);
	p.host = host;
	p.bind_host = host;
	p.ephemeral_ports = false;
	p.handshake_base_port = hs_base;
	p.notify_base_port = nt_base;
	p.dp_rank = dp_rank;
	p.dp_size = dp_size;
	p.dp_size_local = dp_local;
	p.tp_rank = tp_rank;
	p.tp_size = tp_size;
	struct kvx_ctl *l = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &l), 0);
	tctl_set_local(l, 2);
	int rc = kvx_ctl_start(l);
	if (rc) {
		kvx_ctl_destroy(l);
		return NULL;
	}
	return l;
}

/* A port base with `span` free consecutive ports on host (bind-probed through a listener). */
/* A base port below the kernel's ephemeral range (ip_local_port_range), so no socket that a
 * parallel test binds to port 0 can take the fixed ports a listener binds later (CI of 7d0d536:
 * t43's second listener found its notify port taken). */
static uint16_t pick_base(unsigned salt)
{
	unsigned lo = 32768, hi = 60999;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f) {
		if (fscanf(f, "%u %u", &lo, &hi) != 2)
			lo = 32768;
		fclose(f);
	}
	unsigned top = lo > 10200 ? lo - 100 : 60000; /* bases + 60 stay below the range */
	unsigned first = top > 20000 ? 10000 : 1024;
	return (uint16_t)(first + ((unsigned)getpid() * 131u + salt * 977u) % (top - first));
}

/* Raw ROUTER played by the test (a silent or partial peer). */
static void *raw_router(void *zctx, uint16_t *port)
{
	void *s = zmq_socket(zctx, ZMQ_ROUTER);
	int zero = 0;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	cr_assert_eq(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
	char ep[64];
	size_t l = sizeof(ep);
	zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &l);
	*port = (uint16_t)atoi(strrchr(ep, ':') + 1);
	return s;
}

/* Receive one [id, payload] on a raw ROUTER within timeout_ms; returns payload size or -1. */
static int router_get(void *s, zmq_msg_t *id, uint8_t *buf, size_t cap, int timeout_ms)
{
	zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
	if (zmq_poll(&it, 1, timeout_ms) <= 0)
		return -1;
	zmq_msg_init(id);
	zmq_msg_recv(id, s, 0);
	int n = zmq_recv(s, buf, cap, 0);
	return n;
}

/* ---- T20-T22 ------------------------------------------------------------------------- */

Test(control_vectors, t20_remote_blocks_for_terminal_transfer_ignored)
{
	struct collector c;
	coll_init(&c);
	struct kvx_ctl_params p;
	tctl_params(&p, &c);
	struct kvx_ctl *P = tctl_start(&p);
	uint16_t nt;
	kvx_ctl_bound_ports(P, NULL, &nt);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(P, &ib), 0);
	uint32_t ids[] = {4, 5};
	struct kvx_msg_notify m;
	notify(&m, KVX_MSG_REMOTE_BLOCKS, "xfer");
	m.block_ids = ids;
	m.num_blocks = 2;
	/* One inbox is FIFO: the mark is processed before the send leaves. */
	cr_assert_eq(kvx_ctl_mark_terminal(ib, "xfer"), 0);
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", nt, &m), 0);
	snprintf(m.transfer_id, sizeof(m.transfer_id), "xfer-live");
	cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", nt, &m), 0);
	cr_assert_eq(coll_wait(&c, 1, 10.0), 1);
	cr_assert_str_eq(c.msgs[0].m.transfer_id, "xfer-live");
	cr_assert(WAIT_CTR(P, dropped_terminal, 1, 10.0));
	cr_assert_eq(CTR(P, notify_rx), 1);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(P);
	coll_fini(&c);
}

Test(control_vectors, t21_message_routing)
{
	struct collector c;
	coll_init(&c);
	struct kvx_ctl_params p;
	tctl_params(&p, &c);
	struct kvx_ctl *P = tctl_start(&p);
	uint16_t nt;
	kvx_ctl_bound_ports(P, NULL, &nt);
	void *z = zmq_ctx_new();
	void *d = raw_dealer(z, nt);
	uint8_t buf[512];
	uint32_t ids[] = {4, 5};
	struct kvx_msg_notify m;
	notify(&m, KVX_MSG_REMOTE_BLOCKS, "xfer");
	strcpy(m.req_id, "req");
	m.block_ids = ids;
	m.num_blocks = 2;
	m.decode_rank = 3;
	zmq_send(d, buf, enc(&m, buf, sizeof(buf)), 0);
	notify(&m, KVX_MSG_WRITE_DONE, "xfer");
	zmq_send(d, buf, enc(&m, buf, sizeof(buf)), 0);
	notify(&m, KVX_MSG_RELEASE, "xfer");
	zmq_send(d, buf, enc(&m, buf, sizeof(buf)), 0);
	zmq_send(d, "xfer", 4, 0);
	cr_assert_eq(coll_wait(&c, 4, 10.0), 4);
	cr_assert_eq(c.msgs[0].m.type, KVX_MSG_REMOTE_BLOCKS);
	cr_assert_str_eq(c.msgs[0].m.req_id, "req");
	cr_assert_str_eq(c.msgs[0].m.transfer_id, "xfer");
	cr_assert_eq(c.msgs[0].m.num_blocks, 2);
	cr_assert_eq(c.msgs[0].ids[0], 4);
	cr_assert_eq(c.msgs[0].ids[1], 5);
	cr_assert_eq(c.msgs[0].m.decode_rank, 3);
	cr_assert_eq(c.msgs[1].m.type, KVX_MSG_WRITE_DONE);
	cr_assert_str_eq(c.msgs[1].m.transfer_id, "xfer");
	cr_assert_eq(c.msgs[2].m.type, KVX_MSG_RELEASE);
	cr_assert_eq(c.msgs[2].m.consumer_tp_size, 1);
	cr_assert_eq(c.msgs[3].m.type, KVX_MSG_COMPLETION);
	cr_assert_str_eq(c.msgs[3].m.transfer_id, "xfer");
	zmq_close(d);
	zmq_ctx_term(z);
	kvx_ctl_destroy(P);
	coll_fini(&c);
}

Test(control_vectors, t22_rejections_are_counted_and_dropped)
{
	/* The decoder's messages (named in T22). */
	char err[256];
	struct kvx_msg_notify d;
	uint32_t ids[4];
	d.block_ids = ids;
	d.blocks_cap = 4;
	const uint8_t unknown[] = "\x82\xa4type\xa7unknown\xabtransfer_id\xa4xfer";
	cr_assert_eq(kvx_msg_notify_decode(unknown, sizeof(unknown) - 1, &d, err, sizeof(err)),
		     -EPROTO);
	cr_assert_not_null(strstr(err, "Unhandled structured message type"), "%s", err);
	const uint8_t empty_list[] = "\x83\xa4type\xadremote_blocks\xabtransfer_id\xa4xfer"
				     "\xb1" "block_notify_list\x90";
	cr_assert_eq(kvx_msg_notify_decode(empty_list, sizeof(empty_list) - 1, &d, err, sizeof(err)),
		     -EPROTO);
	cr_assert_str_eq(err, "block_notify_list cannot be empty");
	cr_assert_eq(kvx_msg_notify_decode("", 0, &d, err, sizeof(err)), -EPROTO);
	cr_assert_not_null(strstr(err, "Unhandled message format"), "%s", err);

	/* Live: each rejection is counted, the listener keeps serving. */
	struct collector c;
	coll_init(&c);
	struct kvx_ctl_params p;
	tctl_params(&p, &c);
	struct kvx_ctl *P = tctl_start(&p);
	uint16_t nt;
	kvx_ctl_bound_ports(P, NULL, &nt);
	void *z = zmq_ctx_new();
	void *s = raw_dealer(z, nt);
	zmq_send(s, unknown, sizeof(unknown) - 1, 0);
	zmq_send(s, empty_list, sizeof(empty_list) - 1, 0);
	zmq_send(s, "", 0, 0);
	zmq_send(s, "tx-after", 8, 0);
	cr_assert_eq(coll_wait(&c, 1, 10.0), 1);
	cr_assert_str_eq(c.msgs[0].m.transfer_id, "tx-after");
	cr_assert_eq(CTR(P, malformed), 3);
	cr_assert_eq(CTR(P, unknown_type), 1);
	zmq_close(s);
	zmq_ctx_term(z);
	kvx_ctl_destroy(P);
	coll_fini(&c);
}

/* ---- T33-T38: ports --------------------------------------------------------------------- */

Test(control_vectors, t33_port_offsets)
{
	const uint32_t shapes[][2] = {{2, 2}, {2, 4}, {4, 2}};
	for (int s = 0; s < 3; s++) {
		uint32_t seen = 0;
		for (uint32_t d = 0; d < shapes[s][0]; d++)
			for (uint32_t t = 0; t < shapes[s][1]; t++) {
				uint32_t off;
				cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, d, t,
								 shapes[s][1], &off), 0);
				cr_assert_eq(seen & (1u << off), 0);
				seen |= 1u << off;
			}
	}
	uint32_t off;
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, 1, 0, 0, &off), -EINVAL);
	cr_assert_eq(kvx_ctl_peer_tp_size(0, 0, 4), 4);
	cr_assert_eq(kvx_ctl_peer_tp_size(0, 0, 4), 4);
	cr_assert_eq(kvx_ctl_peer_tp_size(0, 2, 4), 2);
	cr_assert_eq(kvx_ctl_peer_tp_size(8, 2, 4), 8);
}

Test(control_vectors, t34_early_write_release_ports)
{
	/* producer tp 2, remote_dp_rank 1, notify base 7000 -> 7002, 7003 */
	uint16_t port;
	for (uint32_t t = 0; t < 2; t++) {
		cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 7000, 1, t, 2, &port), 0);
		cr_assert_eq(port, 7002 + t);
	}
}

Test(control_vectors, t35_write_done_port)
{
	/* base 7000, P tp 4, D tp 2: D dp d, P rank r -> 7000 + 2d + r/2 */
	for (uint32_t d = 0; d < 4; d++)
		for (uint32_t r = 0; r < 4; r++) {
			uint32_t rt;
			uint16_t port;
			cr_assert_eq(kvx_ctl_remote_tp_rank(r, 4, 2, &rt, NULL, 0), 0);
			cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 7000, d, rt, 2, &port), 0);
			cr_assert_eq(port, 7000 + 2 * d + r / 2);
		}
	/* per-request D tp: tx-a (D tp 2, dp 1) -> 7002; tx-b (D tp 4, dp 1) -> 7004 */
	uint32_t rt;
	uint16_t port;
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 4, 2, &rt, NULL, 0), 0);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 7000, 1, rt, 2, &port), 0);
	cr_assert_eq(port, 7002);
	cr_assert_eq(kvx_ctl_remote_tp_rank(0, 4, 4, &rt, NULL, 0), 0);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, 7000, 1, rt, 4, &port), 0);
	cr_assert_eq(port, 7004);
}

Test(control_vectors, t36_wide_ep_completion_routing)
{
	const char *hosts[] = {"10.0.0.1", "10.0.0.2"};
	const char *h;
	uint32_t local;
	uint16_t port;
	kvx_ctl_dp_target(9, 8, hosts, 2, "remote", &h, &local);
	cr_assert_str_eq(h, "10.0.0.2");
	cr_assert_eq(local, 1);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_VLLM, 20000, local, 0, 1, &port), 0);
	cr_assert_eq(port, 20001);
	/* single pod (dp_local 0), dp 3, tp 2 -> 20005 */
	kvx_ctl_dp_target(3, 0, NULL, 0, "remote", &h, &local);
	cr_assert_eq(local, 3);
	cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_VLLM, 20000, local, 2, 4, &port), 0);
	cr_assert_eq(port, 20005);
	/* hosts are per call: a later call with other hosts does not change an earlier result */
	const char *later[] = {"10.0.0.2"};
	const char *ha, *hb;
	kvx_ctl_dp_target(0, 8, hosts, 2, "remote", &ha, &local);
	kvx_ctl_dp_target(0, 8, later, 1, "remote", &hb, &local);
	cr_assert_str_eq(ha, "10.0.0.1");
	cr_assert_str_eq(hb, "10.0.0.2");
	/* empty multi_pod_hosts falls back to remote_host, dp_local = remote_dp_size (4) */
	for (uint32_t d = 0; d < 4; d++) {
		kvx_ctl_dp_target(d, 4, NULL, 0, "remote", &h, &local);
		cr_assert_str_eq(h, "remote");
		cr_assert_eq(local, d);
	}
}

Test(control_vectors, t38_write_abort_release_before_allocation)
{
	/* Payload: {type:"release", transfer_id:"xfer-7", consumer_tp_size:2}, byte-exact. */
	struct kvx_msg_notify m;
	notify(&m, KVX_MSG_RELEASE, "xfer-7");
	m.has_consumer_tp_size = true;
	m.consumer_tp_size = 2;
	uint8_t buf[128];
	size_t n = enc(&m, buf, sizeof(buf));
	const uint8_t want[] = "\x83\xa4type\xa7release\xabtransfer_id\xa6xfer-7"
			       "\xb0" "consumer_tp_size\x02";
	cr_assert_eq(n, sizeof(want) - 1);
	cr_assert_arr_eq(buf, want, n);
	/* No address and a plain request id: nothing to resolve, so no release. */
	char a[256];
	cr_assert_eq(kvx_ctl_reqid_prefill_addr("cmpl-plain-1", a, sizeof(a)), -ENOENT);
	/* Live: releases to notify base + port_offset(0, t, 2) reach both P TP ranks. */
	struct collector c0, c1;
	coll_init(&c0);
	coll_init(&c1);
	struct kvx_ctl *l0 = NULL, *l1 = NULL;
	uint16_t base = 0;
	for (unsigned salt = 0; salt < 20 && !l1; salt++) {
		base = pick_base(salt);
		kvx_ctl_destroy(l0);
		l0 = listener_at("127.0.0.1", (uint16_t)(base + 10), base, 0, 1, 0, 0, 2, &c0);
		l1 = l0 ? listener_at("127.0.0.1", (uint16_t)(base + 10), base, 0, 1, 0, 1, 2, &c1)
			: NULL;
	}
	cr_assert_not_null(l1, "no free port pair found");
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *D = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(D, &ib), 0);
	for (uint32_t t = 0; t < 2; t++) {
		uint16_t port;
		cr_assert_eq(kvx_ctl_port(KVX_CTL_PORT_INJECTIVE, base, 0, t, 2, &port), 0);
		cr_assert_eq(kvx_ctl_send_notify(ib, "127.0.0.1", port, &m), 0);
	}
	cr_assert_eq(coll_wait(&c0, 1, 10.0), 1);
	cr_assert_eq(coll_wait(&c1, 1, 10.0), 1);
	cr_assert_str_eq(c0.msgs[0].m.transfer_id, "xfer-7");
	cr_assert_eq(c1.msgs[0].m.consumer_tp_size, 2);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(D);
	kvx_ctl_destroy(l0);
	kvx_ctl_destroy(l1);
	coll_fini(&c0);
	coll_fini(&c1);
}

/* ---- T39-T43: handshakes ---------------------------------------------------------------- */

Test(control_vectors, t39_eager_handshake_dials_every_dp_rank_in_order)
{
	const char *hosts[] = {"pod0", "pod1"};
	const char *want_h[] = {"pod0", "pod0", "pod1", "pod1"};
	const uint32_t want_l[] = {0, 1, 0, 1};
	for (uint32_t d = 0; d < 4; d++) {
		const char *h;
		uint32_t l;
		kvx_ctl_dp_target(d, 2, hosts, 2, "fallback", &h, &l);
		cr_assert_str_eq(h, want_h[d]);
		cr_assert_eq(l, want_l[d]);
	}
	/* Live: 2 pods (127.0.0.1, 127.0.0.2) x 2 local DP ranks, same ports on both pods. */
	struct kvx_ctl *L[4] = {0};
	uint16_t base = 0;
	for (unsigned salt = 0; salt < 20; salt++) {
		base = pick_base(100 + salt);
		int ok = 1;
		for (uint32_t g = 0; g < 4; g++) {
			L[g] = listener_at(g < 2 ? "127.0.0.1" : "127.0.0.2", base,
					   (uint16_t)(base + 50), g, 4, 2, 0, 1, NULL);
			if (!L[g])
				ok = 0;
		}
		if (ok)
			break;
		for (uint32_t g = 0; g < 4; g++) {
			kvx_ctl_destroy(L[g]);
			L[g] = NULL;
		}
	}
	cr_assert_not_null(L[3], "no free ports");
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *I = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(I, &ib), 0);
	struct hs_res h;
	hr_init(&h);
	struct kvx_ctl_hs_params hp;
	const char *pods[] = {"127.0.0.1", "127.0.0.2"};
	hsp(&hp, "127.0.0.9", base, &h);
	hp.dp_size = 4;
	hp.dp_size_local = 2;
	hp.remote_hosts = pods;
	hp.num_remote_hosts = 2;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hr_wait(&h, 1, 20.0));
	cr_assert_eq(h.status[0], 0, "%s", h.error[0]);
	cr_assert_eq(h.nranks[0], 4);
	for (uint32_t d = 0; d < 4; d++) {
		cr_assert_eq(h.rank_dp[0][d], d);
		cr_assert_str_eq(h.rank_host[0][d], pods[d / 2]);
		cr_assert_eq(h.rank_port[0][d], base + d % 2);
		cr_assert_eq(CTR(L[d], hs_served), 1, "rank %u served once", d);
	}
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(I);
	for (uint32_t g = 0; g < 4; g++)
		kvx_ctl_destroy(L[g]);
}

Test(control_vectors, t40_timeout_and_partial_exchange_never_register)
{
	void *z = zmq_ctx_new();
	uint16_t port;
	void *silent = raw_router(z, &port);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *I = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(I, &ib), 0);
	struct hs_res h;
	hr_init(&h);
	struct kvx_ctl_hs_params hp;
	/* (a) a 50 ms deadline: fails "receiving agent metadata" */
	hsp(&hp, "127.0.0.1", port, &h);
	hp.timeout_ms = 50;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hr_wait(&h, 1, 10.0));
	cr_assert_eq(h.status[0], -ETIMEDOUT);
	cr_assert_str_eq(h.stage[0], "receiving agent metadata");
	cr_assert_not_null(strstr(h.error[0], "receiving agent metadata"), "%s", h.error[0]);
	uint64_t el = h.end_ns[0] - h.start_ns[0];
	cr_assert_geq(el, 49000000ull, "deadline honoured (%" PRIu64 " ns)", el);
	cr_assert_eq(h.rank_has_meta[0][0], 0);
	/* (b) first reply only: fails "receiving KV-cache metadata", nothing registered. The
	 * silent peer answers every get_meta_msg it sees (also a late one from job (a), whose
	 * DEALER is gone: that reply is dropped by the ROUTER) with message (a) only. */
	hsp(&hp, "127.0.0.1", port, &h);
	hp.timeout_ms = 4000; /* margin for a loaded machine: the test thread must reply first */
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	struct kvx_msg_region r = {.addr = 0x1000, .len_bytes = 64, .key = 1};
	struct kvx_msg_meta m;
	memset(&m, 0, sizeof(m));
	strcpy(m.engine_id, "127.0.0.1:1");
	m.num_regions = 1;
	m.regions = &r;
	uint8_t buf[4096], meta[1024];
	int mn = kvx_msg_meta_encode(&m, meta, sizeof(meta));
	cr_assert_gt(mn, 0);
	int replied = 0;
	double end = now_s() + 20.0;
	while (hr_calls(&h) < 2 && now_s() < end) {
		zmq_msg_t id;
		int n = router_get(silent, &id, buf, sizeof(buf), 20);
		if (n < 0)
			continue;
		if (n == 12 && !memcmp(buf, "get_meta_msg", 12)) {
			zmq_msg_send(&id, silent, ZMQ_SNDMORE);
			zmq_send(silent, "", 0, ZMQ_SNDMORE);
			zmq_send(silent, meta, (size_t)mn, 0);
			replied++;
		}
		zmq_msg_close(&id);
	}
	cr_assert_geq(replied, 1);
	cr_assert(hr_wait(&h, 2, 10.0));
	cr_assert_eq(h.status[1], -ETIMEDOUT);
	cr_assert_str_eq(h.stage[1], "receiving KV-cache metadata");
	cr_assert_eq(h.rank_has_meta[1][0], 0, "no metadata handed out after a partial exchange");
	cr_assert_eq(CTR(I, hs_ok), 0);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(I);
	zmq_close(silent);
	zmq_ctx_term(z);
}

/* on_accept of t41: runs on the control thread, once per job that is not a duplicate. */
static atomic_int g_t41_accepts;
static void t41_accept(void *arg)
{
	(void)arg;
	atomic_fetch_add(&g_t41_accepts, 1);
}

Test(control_vectors, t41_one_handshake_per_cold_peer)
{
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *L = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &L), 0);
	tctl_set_local(L, 1);
	cr_assert_eq(kvx_ctl_start(L), 0);
	uint16_t hs;
	kvx_ctl_bound_ports(L, &hs, NULL);
	/* Queue the 4 requests before I's loop runs, so they are concurrent: a running loop could
	 * finish the first handshake before the test thread queued the second. */
	struct kvx_ctl *I = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &I), 0);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(I, &ib), 0);
	struct hs_res h;
	hr_init(&h);
	struct kvx_ctl_hs_params hp;
	for (uint64_t k = 0; k < 4; k++) {
		hsp(&hp, "127.0.0.1", hs, &h);
		hp.cookie = k;
		hp.on_accept = t41_accept;
		cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	}
	cr_assert_eq(kvx_ctl_start(I), 0);
	cr_assert(hr_wait(&h, 4, 15.0));
	cr_assert_eq(atomic_load(&g_t41_accepts), 1, "one job accepted, the duplicates are not");
	int ok = 0, busy = 0;
	for (int k = 0; k < 4; k++) {
		ok += h.status[k] == 0;
		busy += h.status[k] == -EBUSY;
	}
	cr_assert_eq(ok, 1);
	cr_assert_eq(busy, 3);
	cr_assert_eq(CTR(L, hs_served), 1, "exactly one handshake reached the peer");

	/* A shared failed handshake: one attempt, every waiter told, no retry. */
	void *z = zmq_ctx_new();
	uint16_t dead;
	void *silent = raw_router(z, &dead);
	hr_init(&h);
	for (uint64_t k = 0; k < 4; k++) {
		hsp(&hp, "127.0.0.1", dead, &h);
		hp.timeout_ms = 1000;
		cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	}
	cr_assert(hr_wait(&h, 4, 15.0));
	int tmo = 0;
	for (int k = 0; k < 4; k++)
		tmo += h.status[k] == -ETIMEDOUT;
	cr_assert_eq(tmo, 1);
	zmq_msg_t id;
	uint8_t buf[64];
	cr_assert_eq(router_get(silent, &id, buf, sizeof(buf), 1000), 12);
	zmq_msg_close(&id);
	cr_assert_eq(router_get(silent, &id, buf, sizeof(buf), 100), -1, "not retried");
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(I);
	kvx_ctl_destroy(L);
	zmq_close(silent);
	zmq_ctx_term(z);
}

Test(control_vectors, t42_queued_handshake_gets_full_deadline)
{
	void *z = zmq_ctx_new();
	uint16_t dead;
	void *silent = raw_router(z, &dead);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *L = NULL;
	cr_assert_eq(kvx_ctl_create(&p, &L), 0);
	tctl_set_local(L, 1);
	cr_assert_eq(kvx_ctl_start(L), 0);
	uint16_t hs;
	kvx_ctl_bound_ports(L, &hs, NULL);
	p.max_active_handshakes = 1; /* one executor, like vLLM's */
	struct kvx_ctl *I = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(I, &ib), 0);
	struct hs_res h;
	hr_init(&h);
	struct kvx_ctl_hs_params hp;
	hsp(&hp, "127.0.0.1", dead, &h);
	hp.timeout_ms = 1000;
	hp.cookie = 1;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0); /* engine-a: times out */
	hsp(&hp, "127.0.0.1", hs, &h);
	hp.timeout_ms = 1000;
	hp.cookie = 2;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0); /* engine-b: queued behind a */
	cr_assert(hr_wait(&h, 2, 15.0));
	cr_assert_eq(h.cookie[0], 1);
	cr_assert_eq(h.status[0], -ETIMEDOUT);
	cr_assert_eq(h.cookie[1], 2);
	cr_assert_eq(h.status[1], 0, "b got its whole deadline from its start: %s", h.error[1]);
	cr_assert_geq(h.start_ns[1], h.end_ns[0] - 1000000ull, "b started after a ended");
	cr_assert_geq(h.end_ns[0] - h.start_ns[0], 999000000ull);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(I);
	kvx_ctl_destroy(L);
	zmq_close(silent);
	zmq_ctx_term(z);
}

Test(control_vectors, t43_dp_readiness_needs_every_rank)
{
	struct kvx_ctl *L0 = NULL;
	uint16_t base = 0;
	for (unsigned salt = 0; salt < 20 && !L0; salt++) {
		base = pick_base(300 + salt);
		L0 = listener_at("127.0.0.1", base, (uint16_t)(base + 50), 0, 2, 0, 0, 1, NULL);
	}
	cr_assert_not_null(L0);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	struct kvx_ctl *I = tctl_start(&p);
	struct kvx_ctl_inbox *ib;
	cr_assert_eq(kvx_ctl_inbox_open(I, &ib), 0);
	struct hs_res h;
	hr_init(&h);
	struct kvx_ctl_hs_params hp;
	hsp(&hp, "127.0.0.1", base, &h);
	hp.dp_size = 2;
	hp.timeout_ms = 1500;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hr_wait(&h, 1, 15.0));
	cr_assert_eq(h.status[0], -ETIMEDOUT, "{eng_dp0} alone is not ready");
	cr_assert_eq(h.rank_status[0][0], 0);
	cr_assert_eq(h.rank_has_meta[0][0], 1);
	cr_assert_eq(h.rank_status[0][1], -ETIMEDOUT);
	cr_assert_not_null(strstr(h.error[0], "dp rank 1"), "%s", h.error[0]);
	/* Bring up rank 1, retry only the missing rank. */
	struct kvx_ctl *L1 = listener_at("127.0.0.1", base, (uint16_t)(base + 50), 1, 2, 0, 0, 1,
					 NULL);
	cr_assert_not_null(L1, "rank 1's ports %u/%u were taken meanwhile", base + 1, base + 51);
	uint32_t missing[] = {1};
	hsp(&hp, "127.0.0.1", base, &h);
	hp.dp_size = 2;
	hp.ranks = missing;
	hp.num_ranks = 1;
	cr_assert_eq(kvx_ctl_handshake_start(ib, &hp), 0);
	cr_assert(hr_wait(&h, 2, 15.0));
	cr_assert_eq(h.status[1], 0, "%s", h.error[1]);
	cr_assert_eq(h.nranks[1], 1);
	cr_assert_eq(h.rank_dp[1][0], 1);
	cr_assert_eq(CTR(L0, hs_served), 1, "rank 0 was not dialled again");
	cr_assert_eq(CTR(L1, hs_served), 1);
	kvx_ctl_inbox_close(ib);
	kvx_ctl_destroy(I);
	kvx_ctl_destroy(L0);
	kvx_ctl_destroy(L1);
}

/* ---- T50 heartbeat ---------------------------------------------------------------------- */

static int drain(void *s, uint8_t *last, size_t cap, int *last_len, int timeout_ms)
{
	int n = 0;
	zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
	while (zmq_poll(&it, 1, n ? 0 : timeout_ms) > 0) {
		zmq_msg_t id;
		zmq_msg_init(&id);
		zmq_msg_recv(&id, s, 0);
		zmq_msg_close(&id);
		*last_len = zmq_recv(s, last, cap, 0);
		n++;
	}
	return n;
}

Test(control_vectors, t50_heartbeat_payload_rate_and_shutdown)
{
	void *z = zmq_ctx_new();
	uint16_t pport;
	void *proxy = raw_router(z, &pport);
	char paddr[64];
	snprintf(paddr, sizeof(paddr), "127.0.0.1:%u", pport);
	struct kvx_ctl_params p;
	tctl_params(&p, NULL);
	p.proxy_address = paddr;
	p.http_address = "127.0.0.1:8000";
	p.heartbeat_ms = 20;
	p.tp_size = 8;
	p.transfer_mode = KVX_CTL_MODE_READ;
	struct kvx_ctl *c = tctl_start(&p);
	uint16_t hs, nt;
	kvx_ctl_bound_ports(c, &hs, &nt);
	/* The engine thread is busy for 0.3 s: heartbeats keep flowing from the control lcore. */
	double end = now_s() + 0.3;
	volatile uint64_t spin = 0;
	while (now_s() < end)
		spin++;
	uint8_t last[512];
	int len = 0;
	int got = drain(proxy, last, sizeof(last), &len, 2000);
	cr_assert_geq(got, 3, "got %d heartbeats", got);
	struct kvx_msg_heartbeat want = {.role = KVX_CTL_ROLE_PRODUCER, .dp_size = 1, .tp_size = 8,
					 .mode = KVX_CTL_MODE_READ};
	strcpy(want.http_address, "127.0.0.1:8000");
	snprintf(want.zmq_address, sizeof(want.zmq_address),
		 "host:127.0.0.1,handshake:%u,notify:%u", hs, nt); /* the bound ports (ephemeral here) */
	uint8_t wb[512];
	int wn = kvx_msg_heartbeat_encode(&want, wb, sizeof(wb));
	cr_assert_eq(len, wn);
	cr_assert_arr_eq(last, wb, (size_t)wn, "heartbeat is msgpack-identical");
	kvx_ctl_stop(c);
	kvx_ctl_stop(c);
	drain(proxy, last, sizeof(last), &len, 0);
	cr_assert_eq(drain(proxy, last, sizeof(last), &len, 200), 0, "nothing after stop");
	kvx_ctl_destroy(c);
	/* Only global rank 0 heartbeats. */
	p.global_rank = 1;
	c = tctl_start(&p);
	cr_assert_eq(drain(proxy, last, sizeof(last), &len, 200), 0);
	cr_assert_eq(CTR(c, heartbeats), 0);
	kvx_ctl_destroy(c);
	zmq_close(proxy);
	zmq_ctx_term(z);
}

/* ---- T52, T54 ------------------------------------------------------------------------ */

Test(control_vectors, t52_address_parsing)
{
	struct kvx_ctl_addr a;
	char err[128];
	const char *s = "host:::1,handshake:6301,notify:61005";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(a.host, "::1");
	cr_assert_eq(a.handshake_port, 6301);
	cr_assert_eq(a.notify_port, 61005);
	s = "host:::1,handshake:6301";
	cr_assert_eq(kvx_ctl_zmq_address_parse(s, strlen(s), &a, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "Malformed zmq_address"), "%s", err);
	const char *rid = "cmpl-___prefill_addr_host:10.158.215.209,handshake:8405,notify:61005"
			  "___decode_addr_host:10.158.214.246,handshake:8405,notify:61005"
			  "_16f41eb3df75420fa6b78acc63bafd9a-0-b8ee174a";
	char b[256];
	cr_assert_gt(kvx_ctl_reqid_prefill_addr(rid, b, sizeof(b)), 0);
	cr_assert_str_eq(b, "host:10.158.215.209,handshake:8405,notify:61005");
	cr_assert_gt(kvx_ctl_reqid_decode_addr(rid, b, sizeof(b)), 0);
	cr_assert_str_eq(b, "host:10.158.214.246,handshake:8405,notify:61005");
	cr_assert_eq(kvx_ctl_reqid_strip_suffix("abc-1234abcd", b, sizeof(b)), 3);
	cr_assert_str_eq(b, "abc");
	cr_assert_eq(kvx_ctl_reqid_strip_suffix("abc", b, sizeof(b)), 3);
	cr_assert_str_eq(b, "abc");
	cr_assert_eq(kvx_ctl_reqid_strip_suffix("-1234abcd", b, sizeof(b)), 9, "(.+) needs a char");
}

Test(control_vectors, t54_fold_pod_and_vllm_collision)
{
	cr_assert_eq(kvx_ctl_fold_local_rank(9, 8), 1);
	cr_assert_eq(kvx_ctl_pod_index(9, 8), 1);
	cr_assert_eq(kvx_ctl_fold_local_rank(5, 0), 5);
	cr_assert_eq(kvx_ctl_pod_index(5, 0), 0);
	uint32_t a, b, c;
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_VLLM, 1, 1, 1, &a), 0);
	cr_assert_eq(a, 2);
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_VLLM, 0, 2, 1, &b), 0);
	cr_assert_eq(b, 2, "collision with port_offset(0,2)");
	cr_assert_eq(kvx_ctl_port_offset(KVX_CTL_PORT_INJECTIVE, 1, 1, 4, &c), 0);
	cr_assert_eq(c, 5);
}
