/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs provider against a real RDMA device (Soft-RoCE rxe0 inside tests/rxe/run-vm.sh):
 * READ and WRITE with 1..8 QPs per peer, striping, SGE merging, send-queue backpressure,
 * initiator-side and NIC-side errors (bad rkey, out of bounds), the flush cascade, QP
 * recovery through reset/reaccept/connect, a peer process that dies, poll groups sharing one
 * CQ, ep_wait on the completion channel, device async events and HIP region registration.
 * Without RDMA the tests skip with the ibv_get_device_list reason; the probe test asserts
 * that reason.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/mem.h"
#include "kvxfer/transport.h"
#ifdef KVX_HAVE_VERBS
#include "verbs/verbs_internal.h" /* forcing a QP to ERR behind the provider's back */
#endif

#define REG_BYTES (4u << 20)
#define DEADLINE_NS (60ull * 1000000000ull)

static void skip_without_verbs(void)
{
	char reason[KVX_XPORT_REASON_MAX];
	int rc = kvx_xport_provider_probe("verbs", reason, sizeof(reason));
	if (rc)
		cr_skip_test("%s", reason);
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
}

struct pair {
	struct kvx_xport_ctx *ci, *ct;
	struct kvx_xport_ep *ei, *et;
	struct kvx_xport_mr *mi, *mt;
	struct kvx_xport_rmr *rt; /* target region imported on ei */
	uint8_t *bi, *bt;
	uint8_t desc[KVX_XPORT_RDESC_BYTES];
};

static void pair_open(struct pair *p, uint32_t nqp, uint64_t timeout_ns)
{
	memset(p, 0, sizeof(*p));
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.num_channels = nqp;
	prm.op_timeout_ns = timeout_ns;
	prm.queue_depth = 4096;
	cr_assert_eq(kvx_xport_open("verbs", &prm, &p->ci), 0);
	prm.num_channels = 0;
	cr_assert_eq(kvx_xport_open("verbs", &prm, &p->ct), 0);
	p->bi = aligned_alloc(4096, REG_BYTES);
	p->bt = aligned_alloc(4096, REG_BYTES);
	cr_assert(p->bi && p->bt);
	fill(p->bi, REG_BYTES, 1);
	fill(p->bt, REG_BYTES, 2);
	struct kvx_xport_mr_params mp = {.addr = p->bi, .len_bytes = REG_BYTES,
					 .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(p->ci, &mp, &p->mi), 0);
	mp.addr = p->bt;
	cr_assert_eq(kvx_xport_mr_register(p->ct, &mp, &p->mt), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t alen = 0, blen = 0;
	cr_assert_eq(kvx_xport_ep_create(p->ci, &p->ei, a, sizeof(a), &alen), 0);
	cr_assert_eq(kvx_xport_ep_accept(p->ct, a, alen, &p->et, b, sizeof(b), &blen), 0);
	cr_assert_eq(kvx_xport_ep_connect(p->ei, b, blen), 0);
	size_t dl = 0;
	cr_assert_eq(kvx_xport_mr_export(p->mt, p->desc, sizeof(p->desc), &dl), 0);
	cr_assert_eq(kvx_xport_rmr_import(p->ei, p->desc, dl, &p->rt), 0);
	struct kvx_xport_caps caps;
	cr_assert_eq(kvx_xport_query_caps(p->ci, &caps), 0);
	cr_assert_eq(caps.num_channels, nqp);
}

static void pair_close(struct pair *p)
{
	kvx_xport_close(p->ci);
	kvx_xport_close(p->ct);
	free(p->bi);
	free(p->bt);
}

/* Post one batch and poll until its completion (bounded by a deadline, never a sleep). */
static struct kvx_xport_cpl run(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc,
				const struct kvx_xport_op *ops, uint32_t n, uint64_t cookie)
{
	cr_assert_eq(kvx_xport_post_bulk(ep, opc, ops, n, cookie), 0);
	struct kvx_xport_cpl c;
	uint64_t end = kvx_now_ns() + DEADLINE_NS;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0)
		cr_assert(kvx_now_ns() < end, "no completion for cookie %llu",
			  (unsigned long long)cookie);
	cr_assert_eq(c.cookie, cookie);
	return c;
}

static void recover(struct pair *p)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t alen = 0, blen = 0;
	cr_assert_eq(kvx_xport_ep_reset(p->ei, a, sizeof(a), &alen), 0);
	cr_assert_eq(kvx_xport_ep_status(p->ei), 0);
	cr_assert_eq(kvx_xport_ep_reaccept(p->et, a, alen, b, sizeof(b), &blen), 0);
	cr_assert_eq(kvx_xport_ep_connect(p->ei, b, blen), 0);
}

/* Large striped op + scattered small ops (some remote-contiguous: merged into SGE lists). */
static void roundtrip(uint32_t nqp, enum kvx_xport_opcode opc)
{
	struct pair p;
	pair_open(&p, nqp, 0);
	struct kvx_xport_op ops[66];
	uint32_t n = 0;
	ops[n++] = (struct kvx_xport_op){p.mi, p.rt, 0, 0, 1u << 20};
	/* 64 x 4 KiB: remote ranges contiguous from 2 MiB, local ranges every other 4 KiB. */
	for (uint32_t i = 0; i < 64; i++)
		ops[n++] = (struct kvx_xport_op){p.mi, p.rt, (2u << 20) + 8192u * i,
						 (2u << 20) + 4096u * i, 4096};
	ops[n++] = (struct kvx_xport_op){p.mi, p.rt, 3u << 20, (3u << 20) + 17, 1000}; /* odd */
	uint8_t *src = opc == KVX_XPORT_OP_WRITE ? p.bi : p.bt;
	uint8_t *dst = opc == KVX_XPORT_OP_WRITE ? p.bt : p.bi;
	uint8_t *ref = malloc(REG_BYTES);
	memcpy(ref, dst, REG_BYTES);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t s = opc == KVX_XPORT_OP_WRITE ? ops[i].loff : ops[i].roff;
		uint64_t d = opc == KVX_XPORT_OP_WRITE ? ops[i].roff : ops[i].loff;
		memcpy(ref + d, src + s, ops[i].len);
	}
	struct kvx_xport_cpl c = run(p.ei, opc, ops, n, 77);
	cr_assert_eq(c.status, 0, "status %d (%s) nqp %u", c.status, kvx_strerror(c.status), nqp);
	cr_assert_eq(c.n_ops, n);
	cr_assert_eq(c.n_failed, 0);
	cr_assert_eq(c.first_failed, n);
	cr_assert_eq(c.bytes, (1u << 20) + 64u * 4096u + 1000u);
	cr_assert_eq(memcmp(ref, dst, REG_BYTES), 0, "bytes differ (nqp %u)", nqp);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(p.ei, &k);
	cr_assert_eq(k.ops_ok, n);
	cr_assert_eq(k.ops_failed, 0);
	cr_assert_eq(opc == KVX_XPORT_OP_WRITE ? k.bytes_written : k.bytes_read, c.bytes);
	free(ref);
	pair_close(&p);
}

Test(verbs_provider, probe_reports_reason_or_device, .timeout = 30)
{
	char reason[KVX_XPORT_REASON_MAX];
	int rc = kvx_xport_provider_probe("verbs", reason, sizeof(reason));
	if (rc == 0) {
		cr_assert_str_empty(reason);
		return;
	}
	cr_assert_eq(rc, -ENODEV);
	cr_assert(strncmp(reason, "verbs: ", 7) == 0, "reason '%s'", reason);
	struct kvx_xport_ctx *c = NULL;
	cr_assert_eq(kvx_xport_open("verbs", NULL, &c), -ENODEV);
	cr_assert_null(c);
}

Test(verbs_provider, write_exact_bytes_1_to_8_qps, .timeout = 240)
{
	skip_without_verbs();
	for (uint32_t q = 1; q <= 8; q++)
		roundtrip(q, KVX_XPORT_OP_WRITE);
}

Test(verbs_provider, read_exact_bytes_1_to_8_qps, .timeout = 240)
{
	skip_without_verbs();
	for (uint32_t q = 1; q <= 8; q++)
		roundtrip(q, KVX_XPORT_OP_READ);
}

Test(verbs_provider, full_send_queue_is_backpressure, .timeout = 120)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 2, 0);
	/* 3000 x 1 KiB with gaps (no merging): far more WRs than 2 send queues hold. */
	static struct kvx_xport_op ops[3000];
	for (uint32_t i = 0; i < 3000; i++)
		ops[i] = (struct kvx_xport_op){p.mi, p.rt, 1024u * i, 1024u * i, 512};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, ops, 3000, 5);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_failed, 0);
	cr_assert_eq(c.bytes, 3000u * 512u);
	for (uint32_t i = 0; i < 3000; i++)
		cr_assert_eq(memcmp(p.bt + 1024u * i, p.bi + 1024u * i, 512), 0, "op %u", i);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(p.ei, &k);
	cr_assert_eq(k.post_nobufs, 0);
	pair_close(&p);
}

Test(verbs_provider, out_of_bounds_fails_op_keeps_endpoint, .timeout = 60)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 2, 0);
	struct kvx_xport_op ops[3] = {
		{p.mi, p.rt, 0, 0, 4096},
		{p.mi, p.rt, 0, REG_BYTES - 100, 4096}, /* past the remote end */
		{p.mi, p.rt, REG_BYTES - 10, 0, 20},    /* past the local end */
	};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, ops, 3, 9);
	cr_assert_eq(c.status, -ERANGE);
	cr_assert_eq(c.n_failed, 2);
	cr_assert_eq(c.first_failed, 1);
	cr_assert_eq(c.bytes, 4096);
	cr_assert_eq(kvx_xport_ep_status(p.ei), 0);
	cr_assert_eq(memcmp(p.bt, p.bi, 4096), 0);
	c = run(p.ei, KVX_XPORT_OP_READ, ops, 1, 10);
	cr_assert_eq(c.status, 0);
	pair_close(&p);
}

/* A descriptor that lies (wrong rkey, or a length past the MR): only the NIC can refuse it. */
static void nic_error_then_recover(bool bad_key)
{
	struct pair p;
	pair_open(&p, 4, 0);
	uint8_t forged[KVX_XPORT_RDESC_BYTES];
	memcpy(forged, p.desc, sizeof(forged));
	if (bad_key)
		forged[12] ^= 0x5a; /* key (offset 12) */
	else
		forged[24 + 3] ^= 0x01; /* len (offset 24) + 16 MiB */
	struct kvx_xport_rmr *bad = NULL;
	cr_assert_eq(kvx_xport_rmr_import(p.ei, forged, sizeof(forged), &bad), 0);
	uint64_t roff = bad_key ? 0 : REG_BYTES + 4096;
	struct kvx_xport_op ops[9];
	for (int i = 0; i < 8; i++) /* good ops on every QP, in flight with the bad one */
		ops[i] = (struct kvx_xport_op){p.mi, p.rt, 65536u * i, 65536u * i, 65536};
	ops[8] = (struct kvx_xport_op){p.mi, bad, 0, roff, 4096};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, ops, 9, 11);
	cr_assert_leq(1, c.n_failed);
	cr_assert(c.status == -EACCES || c.status == -ECONNRESET, "status %d", c.status);
	cr_assert_eq(kvx_xport_ep_status(p.ei), -ECONNRESET);
	/* In error state: later posts complete at once with -ECONNRESET (flush cascade). */
	c = run(p.ei, KVX_XPORT_OP_WRITE, ops, 1, 12);
	cr_assert_eq(c.status, -ECONNRESET);
	cr_assert_eq(c.n_failed, 1);
	/* The bad op alone, after recovery, reports the NIC's verdict exactly. */
	recover(&p);
	c = run(p.ei, KVX_XPORT_OP_WRITE, &ops[8], 1, 13);
	cr_assert_eq(c.status, -EACCES);
	cr_assert_eq(kvx_xport_ep_status(p.ei), -ECONNRESET);
	recover(&p);
	fill(p.bi, REG_BYTES, 99);
	c = run(p.ei, KVX_XPORT_OP_WRITE, ops, 8, 14);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.bytes, 8u * 65536u);
	cr_assert_eq(memcmp(p.bt, p.bi, 8u * 65536u), 0);
	c = run(p.ei, KVX_XPORT_OP_READ, ops, 8, 15);
	cr_assert_eq(c.status, 0);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(p.ei, &k);
	cr_assert_eq(k.resets, 2);
	pair_close(&p);
}

Test(verbs_provider, bad_rkey_fails_then_qp_recovers, .timeout = 120)
{
	skip_without_verbs();
	nic_error_then_recover(true);
}

Test(verbs_provider, nic_out_of_bounds_fails_then_qp_recovers, .timeout = 120)
{
	skip_without_verbs();
	nic_error_then_recover(false);
}

Test(verbs_provider, reconnect_blob_is_checked, .timeout = 60)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 2, 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t alen = 0, blen = 0;
	cr_assert_eq(kvx_xport_ep_reset(p.ei, a, sizeof(a), &alen), 0);
	/* A reconnect request is not a new connection, and a wrong token is refused. */
	struct kvx_xport_ep *x = NULL;
	cr_assert_eq(kvx_xport_ep_accept(p.ct, a, alen, &x, b, sizeof(b), &blen), -EPROTO);
	a[8] ^= 1;
	cr_assert_eq(kvx_xport_ep_reaccept(p.et, a, alen, b, sizeof(b), &blen), -EPROTO);
	a[8] ^= 1;
	cr_assert_eq(kvx_xport_ep_reaccept(p.et, a, alen - 1, b, sizeof(b), &blen), -EMSGSIZE);
	cr_assert_eq(kvx_xport_ep_reaccept(p.et, a, alen, b, sizeof(b), &blen), 0);
	cr_assert_eq(kvx_xport_ep_connect(p.ei, b, blen), 0);
	struct kvx_xport_op op = {p.mi, p.rt, 0, 0, 8192};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 3);
	cr_assert_eq(c.status, 0);
	pair_close(&p);
}

/* The target is a real process that exits: the initiator's ops fail, nothing hangs. */
Test(verbs_provider, peer_gone_fails_ops_not_hangs, .timeout = 120)
{
	skip_without_verbs();
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(sv[0]);
		struct kvx_xport_ctx *ct = NULL;
		if (kvx_xport_open("verbs", NULL, &ct))
			_exit(2);
		uint8_t *buf = aligned_alloc(4096, REG_BYTES);
		struct kvx_xport_mr *mt = NULL;
		struct kvx_xport_mr_params mp = {.addr = buf, .len_bytes = REG_BYTES,
						 .access = KVX_XPORT_ACCESS_ALL};
		if (!buf || kvx_xport_mr_register(ct, &mp, &mt))
			_exit(3);
		uint8_t msg[KVX_XPORT_BLOB_MAX + KVX_XPORT_RDESC_BYTES];
		ssize_t n = recv(sv[1], msg, sizeof(msg), 0);
		struct kvx_xport_ep *et = NULL;
		size_t blen = 0;
		if (n <= 0 || kvx_xport_ep_accept(ct, msg, (size_t)n, &et, msg, KVX_XPORT_BLOB_MAX,
						  &blen))
			_exit(4);
		size_t dl = 0;
		kvx_xport_mr_export(mt, msg + blen, KVX_XPORT_RDESC_BYTES, &dl);
		if (send(sv[1], msg, blen + dl, 0) < 0)
			_exit(5);
		char q;
		(void)recv(sv[1], &q, 1, 0); /* exits (QPs destroyed with the process) on request */
		_exit(0);
	}
	close(sv[1]);
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.num_channels = 2;
	prm.op_timeout_ns = 3000000000ull;
	struct kvx_xport_ctx *ci = NULL;
	cr_assert_eq(kvx_xport_open("verbs", &prm, &ci), 0);
	uint8_t *bi = aligned_alloc(4096, REG_BYTES);
	struct kvx_xport_mr *mi = NULL;
	struct kvx_xport_mr_params mp = {.addr = bi, .len_bytes = REG_BYTES,
					 .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(ci, &mp, &mi), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], msg[KVX_XPORT_BLOB_MAX + KVX_XPORT_RDESC_BYTES];
	size_t alen = 0;
	struct kvx_xport_ep *ei = NULL;
	cr_assert_eq(kvx_xport_ep_create(ci, &ei, a, sizeof(a), &alen), 0);
	cr_assert_eq(send(sv[0], a, alen, 0), (ssize_t)alen);
	ssize_t n = recv(sv[0], msg, sizeof(msg), 0);
	cr_assert_gt(n, KVX_XPORT_RDESC_BYTES);
	size_t blen = (size_t)n - KVX_XPORT_RDESC_BYTES;
	cr_assert_eq(kvx_xport_ep_connect(ei, msg, blen), 0);
	struct kvx_xport_rmr *rt = NULL;
	cr_assert_eq(kvx_xport_rmr_import(ei, msg + blen, KVX_XPORT_RDESC_BYTES, &rt), 0);
	struct kvx_xport_op op = {mi, rt, 0, 0, 65536};
	struct kvx_xport_cpl c = run(ei, KVX_XPORT_OP_WRITE, &op, 1, 1);
	cr_assert_eq(c.status, 0, "write to the live peer: %d", c.status);
	/* The peer exits; wait for it (a real condition), then the next op must fail. */
	cr_assert_eq(send(sv[0], "q", 1, 0), 1);
	int wst = 0;
	cr_assert_eq(waitpid(pid, &wst, 0), pid);
	cr_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
	/* RC retries run out (RETRY_EXC: -ECONNRESET) or the 3 s op deadline fires first
	 * (-ETIMEDOUT; rxe on lo may drop packets for a dead QPN without exhausting retries). */
	c = run(ei, KVX_XPORT_OP_WRITE, &op, 1, 2);
	cr_assert(c.status == -ECONNRESET || c.status == -ETIMEDOUT, "status %d", c.status);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(kvx_xport_ep_status(ei), c.status);
	c = run(ei, KVX_XPORT_OP_WRITE, &op, 1, 3);
	cr_assert_eq(c.status, -ECONNRESET);
	kvx_xport_close(ci);
	free(bi);
	close(sv[0]);
}

Test(verbs_provider, op_deadline_completes_with_etimedout, .timeout = 120)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 1, 1000); /* 1 us: the op cannot finish in time */
	struct kvx_xport_op op = {p.mi, p.rt, 0, 0, 1u << 20};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 4);
	/* Either the 1 MiB WRITE beat the first poll (status 0) or the deadline fired. */
	if (c.status) {
		cr_assert_eq(c.status, -ETIMEDOUT);
		cr_assert_eq(kvx_xport_ep_status(p.ei), -ETIMEDOUT);
		recover(&p);
	}
	pair_close(&p);
}

/* ---- poll groups: endpoints of one group share one CQ ---- */

#define GRP_EPS 4
#define GRP_ROUNDS 24

struct group_rig {
	struct kvx_xport_ctx *ci, *ct;
	struct kvx_xport_mr *mi, *mt;
	uint8_t *bi, *bt;
	uint8_t desc[KVX_XPORT_RDESC_BYTES];
};

static void rig_open(struct group_rig *g, uint32_t nqp)
{
	memset(g, 0, sizeof(*g));
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.num_channels = nqp;
	prm.queue_depth = 256;
	cr_assert_eq(kvx_xport_open("verbs", &prm, &g->ci), 0);
	prm.num_channels = 0;
	cr_assert_eq(kvx_xport_open("verbs", &prm, &g->ct), 0);
	g->bi = aligned_alloc(4096, REG_BYTES);
	g->bt = aligned_alloc(4096, REG_BYTES);
	cr_assert(g->bi && g->bt);
	fill(g->bi, REG_BYTES, 7);
	memset(g->bt, 0, REG_BYTES);
	struct kvx_xport_mr_params mp = {.addr = g->bi, .len_bytes = REG_BYTES,
					 .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(g->ci, &mp, &g->mi), 0);
	mp.addr = g->bt;
	cr_assert_eq(kvx_xport_mr_register(g->ct, &mp, &g->mt), 0);
	size_t dl = 0;
	cr_assert_eq(kvx_xport_mr_export(g->mt, g->desc, sizeof(g->desc), &dl), 0);
}

/* Connect an initiator endpoint (in `group`, or with its own CQ when group < 0). */
static struct kvx_xport_ep *rig_ep(struct group_rig *g, int group, struct kvx_xport_rmr **rmr)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t alen = 0, blen = 0;
	struct kvx_xport_ep *ei = NULL, *et = NULL;
	if (group < 0)
		cr_assert_eq(kvx_xport_ep_create(g->ci, &ei, a, sizeof(a), &alen), 0);
	else
		cr_assert_eq(kvx_xport_ep_create_in_group(g->ci, (uint32_t)group, &ei, a, sizeof(a),
							  &alen), 0);
	cr_assert_eq(kvx_xport_ep_accept(g->ct, a, alen, &et, b, sizeof(b), &blen), 0);
	cr_assert_eq(kvx_xport_ep_connect(ei, b, blen), 0);
	cr_assert_eq(kvx_xport_rmr_import(ei, g->desc, sizeof(g->desc), rmr), 0);
	return ei;
}

static void rig_close(struct group_rig *g)
{
	kvx_xport_close(g->ci);
	kvx_xport_close(g->ct);
	free(g->bi);
	free(g->bt);
}

/* Byte range of endpoint k, round r: distinct per (k, r), 1..16 KiB, odd offsets. */
static struct kvx_xport_op grp_op(struct kvx_xport_mr *mi, struct kvx_xport_rmr *rt, uint32_t k,
				  uint32_t r)
{
	uint64_t off = ((uint64_t)k * GRP_ROUNDS + r) * 20000u + 3u * k;
	uint64_t len = 1024u + 613u * ((k + 3u * r) % 25u);
	return (struct kvx_xport_op){mi, rt, off, off, len};
}

Test(verbs_provider, group_endpoints_each_get_exactly_their_completions, .timeout = 180)
{
	skip_without_verbs();
	struct group_rig g;
	rig_open(&g, 2);
	struct kvx_xport_ep *ep[GRP_EPS];
	struct kvx_xport_rmr *rt[GRP_EPS];
	for (uint32_t k = 0; k < GRP_EPS; k++) {
		ep[k] = rig_ep(&g, 3, &rt[k]);
		cr_assert_eq(kvx_xport_ep_group(ep[k]), 3);
	}
	/* Interleaved posts: round r posts one batch on every endpoint, in rotating order. */
	for (uint32_t r = 0; r < GRP_ROUNDS; r++)
		for (uint32_t j = 0; j < GRP_EPS; j++) {
			uint32_t k = (j + r) % GRP_EPS;
			struct kvx_xport_op op = grp_op(g.mi, rt[k], k, r);
			cr_assert_eq(kvx_xport_post_bulk(ep[k], KVX_XPORT_OP_WRITE, &op, 1,
							 (uint64_t)k << 32 | r), 0);
		}
	/* Drain the endpoints one after another, last first: the first polls also drain the
	 * shared CQ for the others, whose completions must wait in their own queues. */
	for (int k = GRP_EPS - 1; k >= 0; k--) {
		bool seen[GRP_ROUNDS] = {false};
		uint32_t got = 0;
		uint64_t end = kvx_now_ns() + DEADLINE_NS;
		while (got < GRP_ROUNDS) {
			struct kvx_xport_cpl c[8];
			int n = kvx_xport_poll_burst(ep[k], c, 8);
			cr_assert_geq(n, 0);
			for (int i = 0; i < n; i++) {
				cr_assert_eq(c[i].cookie >> 32, (uint64_t)k, "ep %d got cookie %llx", k,
					     (unsigned long long)c[i].cookie);
				uint32_t r = (uint32_t)c[i].cookie;
				cr_assert_lt(r, GRP_ROUNDS);
				cr_assert(!seen[r], "ep %d: round %u completed twice", k, r);
				seen[r] = true;
				cr_assert_eq(c[i].status, 0);
				cr_assert_eq(c[i].bytes, grp_op(g.mi, rt[k], (uint32_t)k, r).len);
				got++;
			}
			cr_assert(kvx_now_ns() < end, "ep %d: %u of %u completions", k, got,
				  GRP_ROUNDS);
		}
		struct kvx_xport_cpl extra;
		cr_assert_eq(kvx_xport_poll_burst(ep[k], &extra, 1), 0);
		struct kvx_xport_counters cn;
		kvx_xport_ep_counters(ep[k], &cn);
		cr_assert_eq(cn.batches_done, GRP_ROUNDS);
		cr_assert_eq(cn.ops_ok, GRP_ROUNDS);
	}
	for (uint32_t k = 0; k < GRP_EPS; k++)
		for (uint32_t r = 0; r < GRP_ROUNDS; r++) {
			struct kvx_xport_op op = grp_op(g.mi, rt[k], k, r);
			cr_assert_eq(memcmp(g.bt + op.roff, g.bi + op.loff, op.len), 0, "ep %u r %u", k,
				     r);
		}
	/* A connected endpoint cannot change group; before connecting, a grouped one cannot
	 * leave its group's CQ, and one with its own CQ records any group. */
	cr_assert_eq(kvx_xport_ep_set_group(ep[0], 3), -EISCONN);
	uint8_t a[KVX_XPORT_BLOB_MAX];
	size_t alen = 0;
	struct kvx_xport_ep *x = NULL;
	cr_assert_eq(kvx_xport_ep_create_in_group(g.ci, 3, &x, a, sizeof(a), &alen), 0);
	cr_assert_eq(kvx_xport_ep_set_group(x, 4), -EBUSY);
	cr_assert_eq(kvx_xport_ep_set_group(x, 3), 0);
	cr_assert_eq(kvx_xport_ep_set_group(x, KVX_XPORT_MAX_GROUPS), -EINVAL);
	kvx_xport_ep_destroy(x);
	cr_assert_eq(kvx_xport_ep_create(g.ci, &x, a, sizeof(a), &alen), 0);
	cr_assert_eq(kvx_xport_ep_set_group(x, 5), 0);
	cr_assert_eq(kvx_xport_ep_group(x), 5);
	kvx_xport_ep_destroy(x);
	cr_assert_eq(kvx_xport_ep_create_in_group(g.ci, KVX_XPORT_MAX_GROUPS, &x, a, sizeof(a),
						  &alen), -EINVAL);
	rig_close(&g);
}

/* An endpoint destroyed while its group keeps running; its slot is reused by a new one. */
Test(verbs_provider, group_survives_destroy_and_slot_reuse, .timeout = 120)
{
	skip_without_verbs();
	struct group_rig g;
	rig_open(&g, 1);
	struct kvx_xport_rmr *r0, *r1, *r2;
	struct kvx_xport_ep *e0 = rig_ep(&g, 0, &r0), *e1 = rig_ep(&g, 0, &r1);
	struct kvx_xport_op op0 = grp_op(g.mi, r0, 0, 1), op1 = grp_op(g.mi, r1, 1, 1);
	/* e0's completion sits in the shared CQ (or e1's queue) when e0 is destroyed. */
	cr_assert_eq(kvx_xport_post_bulk(e0, KVX_XPORT_OP_WRITE, &op0, 1, 100), 0);
	cr_assert_eq(kvx_xport_post_bulk(e1, KVX_XPORT_OP_WRITE, &op1, 1, 101), 0);
	struct kvx_xport_cpl c;
	uint64_t end = kvx_now_ns() + DEADLINE_NS;
	while (kvx_xport_poll_burst(e1, &c, 1) == 0)
		cr_assert(kvx_now_ns() < end);
	cr_assert_eq(c.cookie, 101);
	cr_assert_eq(c.status, 0);
	kvx_xport_ep_destroy(e0);
	struct kvx_xport_ep *e2 = rig_ep(&g, 0, &r2);
	for (uint32_t r = 2; r < 10; r++) {
		struct kvx_xport_op a = grp_op(g.mi, r1, 1, r), b = grp_op(g.mi, r2, 2, r);
		cr_assert_eq(kvx_xport_post_bulk(e1, KVX_XPORT_OP_READ, &a, 1, 200 + r), 0);
		cr_assert_eq(kvx_xport_post_bulk(e2, KVX_XPORT_OP_WRITE, &b, 1, 300 + r), 0);
	}
	for (uint32_t r = 2; r < 10; r++) { /* RC: in order per endpoint (one QP each) */
		end = kvx_now_ns() + DEADLINE_NS;
		while (kvx_xport_poll_burst(e2, &c, 1) == 0)
			cr_assert(kvx_now_ns() < end);
		cr_assert_eq(c.cookie, 300 + r);
		cr_assert_eq(c.status, 0);
	}
	for (uint32_t r = 2; r < 10; r++) {
		end = kvx_now_ns() + DEADLINE_NS;
		while (kvx_xport_poll_burst(e1, &c, 1) == 0)
			cr_assert(kvx_now_ns() < end);
		cr_assert_eq(c.cookie, 200 + r);
		cr_assert_eq(c.status, 0);
	}
	rig_close(&g);
}

/* ---- ep_wait over the CQ's completion channel ---- */

static void wait_case(int group)
{
	struct group_rig g;
	rig_open(&g, 1);
	struct kvx_xport_rmr *ra, *rb;
	struct kvx_xport_ep *a = rig_ep(&g, group, &ra), *b = rig_ep(&g, group, &rb);
	/* Nothing outstanding: the wait times out (0), a zero timeout does not block. */
	cr_assert_eq(kvx_xport_ep_wait(a, 0), 0);
	cr_assert_eq(kvx_xport_ep_wait(a, 30), 0);
	struct kvx_xport_op op = {g.mi, ra, 0, 0, 1u << 20};
	for (int round = 0; round < 3; round++) {
		cr_assert_eq(kvx_xport_post_bulk(a, KVX_XPORT_OP_WRITE, &op, 1, 40 + round), 0);
		/* Sleep on the channel until the completion arrives (bounded). */
		uint64_t end = kvx_now_ns() + DEADLINE_NS;
		struct kvx_xport_cpl c;
		int n;
		while ((n = kvx_xport_poll_burst(a, &c, 1)) == 0) {
			int w = kvx_xport_ep_wait(a, 5000);
			cr_assert_geq(w, 0, "ep_wait: %d", w);
			cr_assert(kvx_now_ns() < end);
		}
		cr_assert_eq(c.cookie, (uint64_t)(40 + round));
		cr_assert_eq(c.status, 0);
	}
	if (group >= 0) {
		/* b's wait wakes for a's completion (one channel, one CQ for the group) and parks
		 * it; a then finds it with one poll. */
		cr_assert_eq(kvx_xport_post_bulk(a, KVX_XPORT_OP_WRITE, &op, 1, 77), 0);
		uint64_t end = kvx_now_ns() + DEADLINE_NS;
		while (kvx_xport_ep_wait(b, 5000) != 1)
			cr_assert(kvx_now_ns() < end);
		struct kvx_xport_cpl c;
		while (kvx_xport_poll_burst(a, &c, 1) == 0) {
			cr_assert_eq(kvx_xport_ep_wait(b, 100) >= 0, 1);
			cr_assert(kvx_now_ns() < end);
		}
		cr_assert_eq(c.cookie, 77);
	}
	cr_assert_eq(memcmp(g.bt, g.bi, 1u << 20), 0);
	rig_close(&g);
}

Test(verbs_provider, ep_wait_sleeps_on_completion_channel_own_cq, .timeout = 120)
{
	skip_without_verbs();
	wait_case(-1);
}

Test(verbs_provider, ep_wait_sleeps_on_completion_channel_group_cq, .timeout = 120)
{
	skip_without_verbs();
	wait_case(2);
}

/* ---- device async events (control thread) ---- */
#ifdef KVX_HAVE_VERBS

Test(verbs_provider, async_events_fd_and_forced_qp_error, .timeout = 120)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 1, 0);
	int fd = kvx_xport_ctx_event_fd(p.ci);
	cr_assert_geq(fd, 0);
	cr_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
	cr_assert_eq(kvx_xport_ctx_handle_events(p.ci), 0);
	cr_assert_eq(kvx_xport_ctx_handle_events(p.ct), 0);
	struct kvx_xport_op op = {p.mi, p.rt, 0, 0, 65536};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 1);
	cr_assert_eq(c.status, 0);
	/* Traffic on healthy QPs raises no async event. */
	cr_assert_eq(kvx_xport_ctx_handle_events(p.ci), 0);
	cr_assert_eq(kvx_xport_ctx_handle_events(p.ct), 0);
	/* Force the initiator's QP to ERR behind the provider's back. What rxe really does
	 * (Debian 12 kernel 6.1, seen in the VM): a transition the consumer asked for raises no
	 * async event (QP_FATAL is for errors the device detects), so the fd stays quiet for the
	 * whole bounded wait and nothing is handled; the error surfaces as a flushed WR. */
	struct vep *e = (struct vep *)p.ei;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	cr_assert_eq(ibv_modify_qp(e->qps[0].qp, &a, IBV_QP_STATE), 0);
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	int ready = poll(&pf, 1, 500);
	int n = kvx_xport_ctx_handle_events(p.ci);
	cr_log_info("forced QP error: async fd readable %d, %d event(s) handled", ready, n);
	cr_assert_eq(ready, 0);
	cr_assert_eq(n, 0);
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(p.ci, &k);
	cr_assert_eq(k.async_events, 0);
	cr_assert_eq(k.async_errors, 0);
	/* The next op completes with an error through the normal completion path. */
	c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 2);
	cr_assert_eq(c.status, -ECONNRESET, "status %d", c.status);
	cr_assert_eq(kvx_xport_ep_status(p.ei), -ECONNRESET);
	recover(&p);
	c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 3);
	cr_assert_eq(c.status, 0);
	pair_close(&p);
}

/*
 * A real device event: overflow the endpoint's CQ. rxe (seen in the VM) flushes every WR
 * posted to a QP in ERR into its CQ and, once the CQ is full, drops each further completion
 * and raises IBV_EVENT_CQ_ERR for it (one event per dropped completion). A QP of the test's
 * own on the endpoint's CQ does that; kvx_xport_ctx_handle_events() must count the events as
 * errors and fail the endpoint on that CQ, whose next op completes with -ECONNRESET.
 */
Test(verbs_provider, async_cq_overflow_fails_endpoint_on_that_cq, .timeout = 120)
{
	skip_without_verbs();
	struct pair p;
	pair_open(&p, 1, 0);
	struct vep *e = (struct vep *)p.ei;
	struct vctx *vc = (struct vctx *)p.ci;
	uint32_t nwr = (uint32_t)e->vc->cq->cqe + 64; /* the device may round the CQ size up */
	struct ibv_qp_init_attr ia = {
		.send_cq = e->vc->cq,
		.recv_cq = e->vc->cq,
		.cap = {.max_send_wr = nwr, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(vc->pd, &ia);
	cr_assert_not_null(qp, "ibv_create_qp(%u WRs)", nwr);
	/* RESET -> INIT -> ERR (rxe refuses RESET -> ERR). */
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = vc->port};
	cr_assert_eq(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS), 0);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
	cr_assert_eq(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
	struct ibv_sge sg = {(uint64_t)(uintptr_t)p.bi, 64, ((struct vmr *)p.mi)->mr->lkey};
	for (uint32_t i = 0; i < nwr; i++) {
		/* WR ids no endpoint owns (generation 0xffff): the endpoint's drain drops them. */
		struct ibv_send_wr wr = {.wr_id = 0xffffull << 48 | i, .sg_list = &sg, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
		struct ibv_send_wr *bad = NULL;
		cr_assert_eq(ibv_post_send(qp, &wr, &bad), 0, "post %u to the ERR QP", i);
	}
	int fd = kvx_xport_ctx_event_fd(p.ci);
	struct pollfd pf = {.fd = fd, .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 10000), 1, "no async event after overflowing the CQ");
	int n = kvx_xport_ctx_handle_events(p.ci);
	cr_log_info("CQ overflow: %d event(s) handled", n);
	cr_assert_geq(n, 1);
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(p.ci, &k);
	cr_assert_eq(k.async_events, (uint64_t)n);
	cr_assert_eq(k.async_errors, (uint64_t)n); /* every one a CQ error */
	/* The poller fails the endpoint at its next post: the op completes with -ECONNRESET and
	 * the status says so (the engine re-handshakes on that). */
	struct kvx_xport_op op = {p.mi, p.rt, 0, 0, 4096};
	struct kvx_xport_cpl c = run(p.ei, KVX_XPORT_OP_WRITE, &op, 1, 5);
	cr_assert_eq(c.status, -ECONNRESET);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(kvx_xport_ep_status(p.ei), -ECONNRESET);
	cr_assert_eq(ibv_destroy_qp(qp), 0);
	pair_close(&p);
}
#endif /* KVX_HAVE_VERBS */

Test(verbs_provider, tcp_shm_have_no_async_events, .timeout = 30)
{
	const char *names[] = {"tcp", "shm"};
	for (int i = 0; i < 2; i++) {
		struct kvx_xport_ctx *c = NULL;
		if (kvx_xport_open(names[i], NULL, &c))
			continue; /* shm may be refused by ptrace policy: nothing to check */
		cr_assert_eq(kvx_xport_ctx_event_fd(c), -ENOTSUP);
		cr_assert_eq(kvx_xport_ctx_handle_events(c), 0);
		kvx_xport_close(c);
	}
}

/* ---- HIP device memory registration (#8) ---- */

Test(verbs_provider, hip_region_registration_fails_cleanly_with_reason, .timeout = 60)
{
	skip_without_verbs();
	struct kvx_xport_ctx *c = NULL;
	cr_assert_eq(kvx_xport_open("verbs", NULL, &c), 0);
	struct kvx_xport_caps caps;
	cr_assert_eq(kvx_xport_query_caps(c, &caps), 0);
	struct kvx_mem_type t = {.kind = KVX_MEM_HIP, .device = 0};
	char why[KVX_MEM_WHY_LEN] = "";
	int probe = kvx_mem_probe(&t, why, sizeof(why));
	if (probe == 0) {
		kvx_xport_close(c);
		cr_skip_test("a HIP device is present: registration is covered by the GPU run");
	}
	cr_assert(probe == -ENODEV || probe == -ENOTSUP, "probe %d", probe);
	cr_assert_str_not_empty(why);
	cr_assert_eq(caps.mem_types & (1u << KVX_XPORT_MEM_HIP), 0);
	/* The refusal is logged with the reason: capture stderr around the call. */
	char path[] = "/tmp/kvx-verbs-log-XXXXXX";
	int lf = mkstemp(path);
	cr_assert_geq(lf, 0);
	fflush(stderr);
	int saved = dup(2);
	dup2(lf, 2);
	static uint8_t buf[8192];
	struct kvx_xport_mr_params mp = {.addr = buf, .len_bytes = sizeof(buf),
					 .access = KVX_XPORT_ACCESS_ALL,
					 .mem_type = KVX_XPORT_MEM_HIP};
	struct kvx_xport_mr *mr = NULL;
	int rc = kvx_xport_mr_register(c, &mp, &mr);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	char log[2048] = "";
	ssize_t got = pread(lf, log, sizeof(log) - 1, 0);
	close(lf);
	unlink(path);
	cr_assert_eq(rc, -ENOTSUP);
	cr_assert_null(mr);
	cr_assert_gt(got, 0);
	cr_assert(strstr(log, "verbs") && strstr(log, why), "log '%s' lacks '%s'", log, why);
	kvx_xport_close(c);
}
