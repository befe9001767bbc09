/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verbs provider against a real RDMA device (Soft-RoCE rxe0 inside tests/rxe/run-vm.sh):
 * READ and WRITE with 1..8 QPs per peer, striping, SGE merging, send-queue backpressure,
 * initiator-side and NIC-side errors (bad rkey, out of bounds), the flush cascade, QP
 * recovery through reset/reaccept/connect, and a peer process that dies. Without RDMA the
 * tests skip with the ibv_get_device_list reason; the probe test asserts that reason.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvxfer/transport.h"

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
