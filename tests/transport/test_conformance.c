/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Provider conformance suite (docs/architecture.md §3), parameterised over providers: every test runs
 * for tcp, shm and verbs; a provider that cannot run here skips with its reason. The target
 * is a real forked process (tests/transport/peer.c) that runs kvx_xport_progress() in its
 * loop; every byte moved is checked against a per-byte pattern.
 *
 * Every test also runs with device memory on both sides where a provider moves it: the
 * hostdev mock (KVX_MEM_HOSTDEV: same provider code paths as HIP, no GPU needed; its pointers
 * fault on CPU and CMA access) and HIP (skips with "no HIP device" without a GPU). Local
 * device bytes are filled and checked through kvx_mem copies, never with the CPU.
 *
 * Run one provider only: test_conformance --filter '*' with env KVX_XPORT_PROVIDERS=verbs;
 * one memory kind only: KVX_XPORT_MEM=host|hostdev|hip.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/mem.h"
#include "peer.h"

#define MIB (1ull << 20)

static void free_params(struct criterion_test_params *crp)
{
	cr_free(crp->params);
}

static struct criterion_test_params providers(void)
{
	/* verbs registers device memory only through dma-buf or peer memory (not the mock). */
	static const char *all[][2] = {{"tcp", "host"},    {"shm", "host"}, {"verbs", "host"},
				       {"tcp", "hostdev"}, {"shm", "hostdev"}, {"tcp", "hip"},
				       {"shm", "hip"},     {"verbs", "hip"}};
	const char *only = getenv("KVX_XPORT_PROVIDERS"), *mem = getenv("KVX_XPORT_MEM");
	struct xport_param *p = cr_calloc(KVX_ARRAY_SIZE(all), sizeof(*p));
	size_t n = 0;
	for (size_t i = 0; i < KVX_ARRAY_SIZE(all); i++) {
		if ((only && !strstr(only, all[i][0])) || (mem && strcmp(mem, all[i][1])))
			continue;
		strcpy(p[n].name, all[i][0]);
		strcpy(p[n++].mem, all[i][1]);
	}
	return cr_make_param_array(struct xport_param, p, n, free_params);
}

struct rig {
	struct peer peer;
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	struct kvx_xport_caps caps;
	struct kvx_mem *mem;             /* device kinds: local regions live there; else NULL */
	enum kvx_xport_mem_type mem_type;
};

static void rig_params(struct kvx_xport_ctx_params *p)
{
	kvx_xport_ctx_params_init(p);
	p->op_timeout_ns = 20000000000ull; /* generous: the 2-core CI machine is shared */
	/* Channels per endpoint (verbs QPs, tcp connections): tests/rxe/payload-verbs.sh runs
	 * the suite with 1 and 8. */
	const char *ch = getenv("KVX_XPORT_CHANNELS");
	if (ch && *ch)
		p->num_channels = (uint32_t)strtoul(ch, NULL, 10);
}

static struct kvx_xport_ep *rig_connect(struct rig *r)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0;
	struct kvx_xport_ep *ep = NULL;
	cr_assert_eq(kvx_xport_ep_create(r->ctx, &ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_accept(&r->peer, a, al, b, &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), -EISCONN);
	return ep;
}

/* verbs: an error the NIC detects (bad rkey) moves the RC QPs of both sides to ERR, and the
 * endpoint reports it (status -ECONNRESET). Recover through the control plane before reuse:
 * reset -> peer reaccept -> connect. tcp/shm endpoints stay healthy: nothing to do. */
static void recover_if_in_error(struct rig *r)
{
	if (!kvx_xport_ep_status(r->ep))
		return;
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0;
	cr_assert_eq(kvx_xport_ep_reset(r->ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_reaccept(&r->peer, a, al, b, &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(r->ep, b, bl), 0);
	cr_assert_eq(kvx_xport_ep_status(r->ep), 0);
}

/* One memory context per test process (each Criterion test runs in its own process). */
static struct kvx_mem *g_mem;

static void rig_up(struct rig *r, const struct xport_param *pp,
		   const struct kvx_xport_ctx_params *prm)
{
	const char *provider = pp->name;
	skip_unless_available(provider);
	struct kvx_xport_ctx_params d;
	if (!prm) {
		rig_params(&d);
		prm = &d;
	}
	memset(r, 0, sizeof(*r));
	/* The target starts first: with HIP, fork after the parent started the HIP runtime would
	 * leave the child without a usable device. */
	char why[KVX_MEM_WHY_LEN] = "";
	int rc = peer_start_mem(&r->peer, provider, pp->mem, prm, why, sizeof(why));
	if ((rc == -ENODEV || rc == -ENOTSUP) && strcmp(pp->mem, "host")) {
		peer_kill(&r->peer);
		cr_skip_test("%s memory on %s: %s", pp->mem, provider, why);
	}
	cr_assert_eq(rc, 0, "target process failed to open %s with %s memory", provider, pp->mem);
	cr_assert_eq(kvx_xport_open(provider, prm, &r->ctx), 0);
	cr_assert_str_eq(kvx_xport_name(r->ctx), provider);
	cr_assert_eq(kvx_xport_query_caps(r->ctx, &r->caps), 0);
	struct kvx_mem_type mt;
	cr_assert_eq(kvx_mem_parse_type(pp->mem, &mt), 0);
	r->mem_type = (enum kvx_xport_mem_type)mt.kind;
	if (mt.kind != KVX_MEM_HOST) {
		if (!g_mem)
			cr_assert_eq(kvx_mem_open(&mt, &g_mem), 0);
		r->mem = g_mem;
		cr_assert(r->caps.mem_types & (1u << r->mem_type), "%s does not list %s memory",
			  provider, pp->mem);
	}
	r->ep = rig_connect(r);
}

static void rig_down(struct rig *r)
{
	kvx_xport_close(r->ctx);
	if (r->peer.pid > 0)
		cr_assert_eq(peer_quit(&r->peer), 0, "target process did not exit cleanly");
}

/* Local region bytes: direct for host memory, through a host buffer and a copy for device
 * memory (the test never touches device memory with the CPU either). */
static void lfill(const struct rig *r, uint8_t *p, uint64_t len, uint64_t seed, uint64_t pos)
{
	if (!r->mem) {
		pat_fill(p, len, seed, pos);
		return;
	}
	uint8_t *t = malloc(len);
	cr_assert_not_null(t);
	pat_fill(t, len, seed, pos);
	cr_assert_eq(kvx_mem_copy_sync(r->mem, p, t, len, KVX_MEM_H2D), 0);
	free(t);
}

static uint64_t lcheck(const struct rig *r, const uint8_t *p, uint64_t len, uint64_t seed,
		       uint64_t pos)
{
	if (!r->mem)
		return pat_check(p, len, seed, pos);
	uint8_t *t = malloc(len);
	cr_assert_not_null(t);
	cr_assert_eq(kvx_mem_copy_sync(r->mem, t, p, len, KVX_MEM_D2H), 0);
	uint64_t k = pat_check(t, len, seed, pos);
	free(t);
	return k;
}

static void lfree(const struct rig *r, uint8_t *p)
{
	if (r->mem)
		kvx_mem_free(r->mem, p);
	else
		free(p);
}

static struct kvx_xport_rmr *import(struct kvx_xport_ep *ep, const uint8_t *desc)
{
	struct kvx_xport_rmr *rmr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(ep, desc, KVX_XPORT_RDESC_BYTES, &rmr), 0);
	return rmr;
}

static struct kvx_xport_mr *local_mr(const struct rig *r, uint8_t **mem, uint64_t len,
				     uint32_t access)
{
	if (r->mem) {
		cr_assert_eq(kvx_mem_alloc(r->mem, len, (void **)mem), 0);
	} else {
		*mem = aligned_alloc(4096, (len + 4095) & ~4095ull);
		cr_assert_not_null(*mem);
	}
	struct kvx_mem_type mt = {.kind = KVX_MEM_HOST};
	if (r->mem)
		mt = kvx_mem_get_type(r->mem);
	struct kvx_xport_mr_params p = {.addr = *mem, .len_bytes = len, .access = access,
					.mem_type = r->mem_type, .device_id = mt.device};
	struct kvx_xport_mr *mr = NULL;
	cr_assert_eq(kvx_xport_mr_register(r->ctx, &p, &mr), 0);
	return mr;
}

/* Poll until the completion of @p cookie arrives; fails the test after @p timeout_s. */
static struct kvx_xport_cpl wait_cpl(struct kvx_xport_ep *ep, uint64_t cookie, double timeout_s)
{
	uint64_t deadline = kvx_now_ns() + (uint64_t)(timeout_s * 1e9);
	struct kvx_xport_cpl c;
	for (;;) {
		int n = kvx_xport_poll_burst(ep, &c, 1);
		cr_assert_geq(n, 0);
		if (n == 1) {
			cr_assert_eq(c.cookie, cookie, "completion for cookie %llu, expected %llu",
				     (unsigned long long)c.cookie, (unsigned long long)cookie);
			return c;
		}
		cr_assert_lt(kvx_now_ns(), deadline, "no completion for cookie %llu within %.1f s",
			     (unsigned long long)cookie, timeout_s);
	}
}

static void post1(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, struct kvx_xport_mr *l,
		  uint64_t loff, struct kvx_xport_rmr *r, uint64_t roff, uint64_t len,
		  uint64_t cookie)
{
	struct kvx_xport_op op = {.lmr = l, .rmr = r, .loff = loff, .roff = roff, .len = len};
	cr_assert_eq(kvx_xport_post_bulk(ep, opc, &op, 1, cookie), 0);
}

TestSuite(transport_conformance, .timeout = 120);

ParameterizedTestParameters(transport_conformance, register_export_import_roundtrip)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, register_export_import_roundtrip)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	uint8_t *m1, *m2;
	struct kvx_xport_mr *a = local_mr(&r, &m1, 4096, KVX_XPORT_ACCESS_ALL);
	struct kvx_xport_mr *b = local_mr(&r, &m2, 100, KVX_XPORT_ACCESS_REMOTE_READ);
	cr_assert_neq(kvx_xport_mr_key(a), kvx_xport_mr_key(b));
	uint8_t d[KVX_XPORT_RDESC_BYTES + 8];
	size_t dl = 0;
	cr_assert_eq(kvx_xport_mr_export(a, d, KVX_XPORT_RDESC_BYTES - 1, &dl), -EMSGSIZE);
	cr_assert_eq(kvx_xport_mr_export(b, d, sizeof(d), &dl), 0);
	cr_assert_eq(dl, KVX_XPORT_RDESC_BYTES);
	cr_assert_arr_eq(d, "KXRD", 4);
	struct kvx_xport_rmr *rm = NULL;
	cr_assert_eq(kvx_xport_rmr_import(r.ep, d, dl - 1, &rm), -EMSGSIZE);
	d[4] = 9; /* version */
	cr_assert_eq(kvx_xport_rmr_import(r.ep, d, dl, &rm), -EPROTO);
	d[4] = 1;
	d[8] = 0xf0; /* unknown access bits */
	cr_assert_eq(kvx_xport_rmr_import(r.ep, d, dl, &rm), -EPROTO);
	/* Bad registration parameters. */
	struct kvx_xport_mr *x = NULL;
	struct kvx_xport_mr_params bad = {.addr = m1, .len_bytes = 0, .access = 1};
	cr_assert_eq(kvx_xport_mr_register(r.ctx, &bad, &x), -EINVAL);
	bad = (struct kvx_xport_mr_params){.addr = m1, .len_bytes = 8, .access = 0x100};
	cr_assert_eq(kvx_xport_mr_register(r.ctx, &bad, &x), -EINVAL);
	bad = (struct kvx_xport_mr_params){.addr = m1, .len_bytes = 8, .access = 1,
					   .mem_type = KVX_XPORT_MEM_HIP};
	int hip = kvx_xport_mr_register(r.ctx, &bad, &x);
	if (r.caps.mem_types & (1u << KVX_XPORT_MEM_HIP))
		cr_assert(hip == 0 || hip == -ENODEV, "HIP registration: %d", hip);
	else
		cr_assert_eq(hip, -ENOTSUP);
	if (hip == 0)
		cr_assert_eq(kvx_xport_mr_unregister(x), 0);
	cr_assert_eq(kvx_xport_mr_unregister(a), 0);
	cr_assert_eq(kvx_xport_mr_unregister(b), 0);
	cr_assert_eq(kvx_xport_mr_unregister(NULL), 0);
	/* Target side: register, unregister, and the key is refused afterwards. */
	uint8_t rd[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, 8192, KVX_XPORT_ACCESS_ALL, 7, rd);
	cr_assert_geq(idx, 0);
	struct kvx_xport_rmr *rr = import(r.ep, rd);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, 8192, KVX_XPORT_ACCESS_ALL);
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, 0, 8192, 1);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 30);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(lcheck(&r, lm, 8192, 7, 0), 8192);
	cr_assert_eq(peer_unreg(&r.peer, idx), 0);
	if (r.caps.needs_progress || !strcmp(pp->name, "verbs")) {
		/* tcp and verbs enforce at the target: the old key is dead at once. shm checks at
		 * import (trust model), so a fresh import is refused instead. */
		post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, 0, 64, 2);
		c = wait_cpl(r.ep, 2, 30);
		cr_assert_eq(c.status, -EACCES);
	} else {
		struct kvx_xport_rmr *r2 = import(r.ep, rd);
		post1(r.ep, KVX_XPORT_OP_READ, l, 0, r2, 0, 64, 2);
		c = wait_cpl(r.ep, 2, 30);
		cr_assert_eq(c.status, -EACCES);
	}
	kvx_xport_rmr_release(rr);
	rig_down(&r);
	lfree(&r, m1);
	lfree(&r, m2);
	lfree(&r, lm);
}

static const uint64_t g_sizes[] = {1, 2, 3, 7, 64, 4095, 4096, 4097, 65537, MIB + 3, 8 * MIB + 1};

static void sizes_case(const struct xport_param *pp, enum kvx_xport_opcode opc)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	const uint64_t cap = 8 * MIB + 4096;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, cap, KVX_XPORT_ACCESS_ALL, 11, d);
	cr_assert_geq(idx, 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, cap, KVX_XPORT_ACCESS_ALL);
	for (size_t i = 0; i < KVX_ARRAY_SIZE(g_sizes); i++) {
		uint64_t len = g_sizes[i], loff = 13 + i * 7, roff = 1001 + i * 3;
		if (opc == KVX_XPORT_OP_READ) {
			lfill(&r, lm, cap, 99, 0);
			post1(r.ep, opc, l, loff, rr, roff, len, 100 + i);
			struct kvx_xport_cpl c = wait_cpl(r.ep, 100 + i, 60);
			cr_assert_eq(c.status, 0, "READ %llu B: status %d", (unsigned long long)len,
				     c.status);
			cr_assert_eq(c.bytes, len);
			cr_assert_eq(c.n_ops, 1);
			cr_assert_eq(c.n_failed, 0);
			cr_assert_eq(lcheck(&r, lm + loff, len, 11, roff), len, "READ %llu B corrupt",
				     (unsigned long long)len);
			/* Bytes around the destination are untouched. */
			cr_assert_eq(lcheck(&r, lm, loff, 99, 0), loff);
			cr_assert_eq(lcheck(&r, lm + loff + len, 64, 99, loff + len), 64);
		} else {
			lfill(&r, lm + loff, len, 500 + i, 0);
			post1(r.ep, opc, l, loff, rr, roff, len, 100 + i);
			struct kvx_xport_cpl c = wait_cpl(r.ep, 100 + i, 60);
			cr_assert_eq(c.status, 0, "WRITE %llu B: status %d", (unsigned long long)len,
				     c.status);
			cr_assert_eq(c.bytes, len);
			cr_assert_eq(peer_verify(&r.peer, idx, roff, len, 500 + i, 0), (int64_t)len,
				     "WRITE %llu B corrupt at target", (unsigned long long)len);
			cr_assert_eq(peer_verify(&r.peer, idx, roff - 16, 16, 11, roff - 16), 16,
				     "WRITE %llu B touched bytes before its range",
				     (unsigned long long)len);
			cr_assert_eq(peer_verify(&r.peer, idx, roff + len, 64, 11, roff + len), 64,
				     "WRITE %llu B touched bytes after its range",
				     (unsigned long long)len);
			/* Restore the target pattern for the next size. */
			cr_assert_eq(peer_fill(&r.peer, idx, roff, len, 11, roff), 0);
		}
	}
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.ops_posted, KVX_ARRAY_SIZE(g_sizes));
	cr_assert_eq(k.ops_ok, KVX_ARRAY_SIZE(g_sizes));
	cr_assert_eq(k.ops_failed, 0);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, read_sizes_unaligned_exact_bytes)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, read_sizes_unaligned_exact_bytes)
{
	sizes_case(pp, KVX_XPORT_OP_READ);
}

ParameterizedTestParameters(transport_conformance, write_sizes_unaligned_exact_bytes)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, write_sizes_unaligned_exact_bytes)
{
	sizes_case(pp, KVX_XPORT_OP_WRITE);
}

ParameterizedTestParameters(transport_conformance, op_64mib_read_and_write)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, op_64mib_read_and_write)
{
	struct kvx_xport_ctx_params prm;
	rig_params(&prm);
	prm.num_channels = 2; /* striping over two channels where the provider has them */
	if (!strcmp(pp->name, "shm"))
		prm.num_channels = 1;
	struct rig r;
	rig_up(&r, pp, &prm);
	const uint64_t len = 64 * MIB;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, len + 8, KVX_XPORT_ACCESS_ALL, 21, d);
	cr_assert_geq(idx, 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, len + 8, KVX_XPORT_ACCESS_ALL);
	post1(r.ep, KVX_XPORT_OP_READ, l, 1, rr, 3, len, 1);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 90);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.bytes, len);
	cr_assert_eq(lcheck(&r, lm + 1, len, 21, 3), len);
	lfill(&r, lm, len + 8, 77, 0);
	post1(r.ep, KVX_XPORT_OP_WRITE, l, 5, rr, 7, len, 2);
	c = wait_cpl(r.ep, 2, 90);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(peer_verify(&r.peer, idx, 7, len, 77, 5), (int64_t)len);
	cr_assert_eq(peer_verify(&r.peer, idx, 0, 7, 21, 0), 7);
	rig_down(&r);
	lfree(&r, lm);
}

static void batch_case(struct rig *r, enum kvx_xport_opcode opc, uint32_t n, uint64_t cookie,
		       struct kvx_xport_mr *l, uint8_t *lm, struct kvx_xport_rmr *rr, int idx)
{
	/* Op i moves 1 + (i * 37) % 300 bytes between disjoint, unaligned slots of 512 B. */
	struct kvx_xport_op *ops = calloc(n, sizeof(*ops));
	for (uint32_t i = 0; i < n; i++) {
		uint64_t len = 1 + (i * 37u) % 300u;
		ops[i] = (struct kvx_xport_op){.lmr = l, .rmr = rr, .loff = (uint64_t)i * 512 + 5,
					       .roff = (uint64_t)((i * 7919u) % n) * 512 + 3, .len = len};
		if (opc == KVX_XPORT_OP_WRITE)
			lfill(r, lm + ops[i].loff, len, cookie, ops[i].loff);
	}
	int rc;
	while ((rc = kvx_xport_post_bulk(r->ep, opc, ops, n, cookie)) == -ENOBUFS)
		kvx_xport_poll_burst(r->ep, NULL, 0);
	cr_assert_eq(rc, 0);
	struct kvx_xport_cpl c = wait_cpl(r->ep, cookie, 60);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_ops, n);
	cr_assert_eq(c.n_failed, 0);
	cr_assert_eq(c.first_failed, n);
	uint64_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		total += ops[i].len;
		if (opc == KVX_XPORT_OP_READ)
			cr_assert_eq(lcheck(r, lm + ops[i].loff, ops[i].len, 31, ops[i].roff),
				     ops[i].len, "batch %u op %u corrupt", n, i);
		else
			cr_assert_eq(peer_verify(&r->peer, idx, ops[i].roff, ops[i].len, cookie,
						 ops[i].loff),
				     (int64_t)ops[i].len, "batch %u op %u corrupt at target", n, i);
	}
	cr_assert_eq(c.bytes, total);
	free(ops);
}

ParameterizedTestParameters(transport_conformance, batches_1_to_4096_ops_exact_bytes)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, batches_1_to_4096_ops_exact_bytes)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	cr_assert_geq(r.caps.max_batch, 4096);
	const uint64_t cap = 4096 * 512 + 512;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, cap, KVX_XPORT_ACCESS_ALL, 31, d);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, cap, KVX_XPORT_ACCESS_ALL);
	static const uint32_t ns[] = {1, 2, 7, 64, 1000, 4096};
	for (size_t i = 0; i < KVX_ARRAY_SIZE(ns); i++)
		batch_case(&r, KVX_XPORT_OP_READ, ns[i], 10 + i, l, lm, rr, idx);
	for (size_t i = 0; i < KVX_ARRAY_SIZE(ns); i++)
		batch_case(&r, KVX_XPORT_OP_WRITE, ns[i], 20 + i, l, lm, rr, idx);
	/* Several batches outstanding at once, completed with their own cookies. */
	cr_assert_eq(peer_fill(&r.peer, idx, 0, cap, 31, 0), 0);
	struct kvx_xport_op op = {.lmr = l, .rmr = rr, .loff = 0, .roff = 0, .len = 4096};
	for (uint64_t k = 0; k < 32; k++) {
		op.loff = k * 4096;
		op.roff = k * 4096;
		cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, &op, 1, 1000 + k), 0);
	}
	bool seen[32] = {0};
	uint64_t deadline = kvx_now_ns() + 60000000000ull;
	for (int got = 0; got < 32;) {
		struct kvx_xport_cpl c[8];
		int n = kvx_xport_poll_burst(r.ep, c, 8);
		for (int j = 0; j < n; j++) {
			cr_assert(c[j].cookie >= 1000 && c[j].cookie < 1032);
			cr_assert_not(seen[c[j].cookie - 1000], "duplicate completion");
			seen[c[j].cookie - 1000] = true;
			cr_assert_eq(c[j].status, 0);
		}
		got += n;
		cr_assert_lt(kvx_now_ns(), deadline);
	}
	cr_assert_eq(lcheck(&r, lm, 32 * 4096, 31, 0), 32 * 4096);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, out_of_bounds_is_erange_target_untouched)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance,
		  out_of_bounds_is_erange_target_untouched)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	const uint64_t rlen = 64 * 1024;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, rlen, KVX_XPORT_ACCESS_ALL, 41, d);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, 4 * rlen, KVX_XPORT_ACCESS_ALL);
	lfill(&r, lm, 4 * rlen, 42, 0);
	/* WRITE crossing the end of the remote region (large: several tcp chunks). */
	post1(r.ep, KVX_XPORT_OP_WRITE, l, 0, rr, 100, rlen, 1);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 30);
	cr_assert_eq(c.status, -ERANGE);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(c.first_failed, 0);
	cr_assert_eq(c.bytes, 0);
	cr_assert_eq(peer_verify(&r.peer, idx, 0, rlen, 41, 0), (int64_t)rlen,
		     "target memory changed by a rejected WRITE");
	/* Offset beyond the end, and an offset+len that overflows 64 bits. */
	post1(r.ep, KVX_XPORT_OP_WRITE, l, 0, rr, rlen + 1, 1, 2);
	cr_assert_eq(wait_cpl(r.ep, 2, 30).status, -ERANGE);
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, UINT64_MAX - 2, 16, 3);
	cr_assert_eq(wait_cpl(r.ep, 3, 30).status, -ERANGE);
	/* READ crossing the end: local memory unchanged. */
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, rlen - 10, 11, 4);
	cr_assert_eq(wait_cpl(r.ep, 4, 30).status, -ERANGE);
	cr_assert_eq(lcheck(&r, lm, 4 * rlen, 42, 0), 4 * rlen);
	/* Local range out of bounds. */
	post1(r.ep, KVX_XPORT_OP_READ, l, 4 * rlen - 1, rr, 0, 2, 5);
	cr_assert_eq(wait_cpl(r.ep, 5, 30).status, -ERANGE);
	/* Mixed batch: good, bad, good -> one failure at index 1, the good ones land. */
	struct kvx_xport_op ops[3] = {
		{.lmr = l, .rmr = rr, .loff = 0, .roff = 0, .len = 1000},
		{.lmr = l, .rmr = rr, .loff = 1000, .roff = rlen - 5, .len = 6},
		{.lmr = l, .rmr = rr, .loff = 2000, .roff = 5000, .len = 777},
	};
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_WRITE, ops, 3, 6), 0);
	c = wait_cpl(r.ep, 6, 30);
	cr_assert_eq(c.status, -ERANGE);
	cr_assert_eq(c.n_ops, 3);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(c.first_failed, 1);
	cr_assert_eq(c.bytes, 1777);
	cr_assert_eq(peer_verify(&r.peer, idx, 0, 1000, 42, 0), 1000);
	cr_assert_eq(peer_verify(&r.peer, idx, 5000, 777, 42, 2000), 777);
	cr_assert_eq(peer_verify(&r.peer, idx, 1000, 4000, 41, 1000), 4000);
	cr_assert_eq(peer_verify(&r.peer, idx, rlen - 64, 64, 41, rlen - 64), 64);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.ops_failed, 6);
	cr_assert_eq(k.ops_ok, 2);
	if (r.caps.needs_progress) {
		struct kvx_xport_counters t;
		cr_assert_eq(peer_counters(&r.peer, &t), 0);
		cr_assert_geq(t.reqs_rejected, 4, "target rejected %llu requests",
			      (unsigned long long)t.reqs_rejected);
	}
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, wrong_key_or_access_is_eacces_target_untouched)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance,
		  wrong_key_or_access_is_eacces_target_untouched)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	const uint64_t rlen = 256 * 1024;
	uint8_t d[KVX_XPORT_RDESC_BYTES], dro[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, rlen, KVX_XPORT_ACCESS_ALL, 51, d);
	int ro = peer_reg(&r.peer, rlen, KVX_XPORT_ACCESS_REMOTE_READ, 52, dro);
	cr_assert_geq(ro, 0);
	uint8_t forged[KVX_XPORT_RDESC_BYTES];
	memcpy(forged, d, sizeof(forged));
	forged[14] ^= 0x5a; /* key bits above the slot index */
	struct kvx_xport_rmr *bad = import(r.ep, forged);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, rlen, KVX_XPORT_ACCESS_ALL);
	lfill(&r, lm, rlen, 53, 0);
	post1(r.ep, KVX_XPORT_OP_WRITE, l, 0, bad, 0, rlen, 1);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 30);
	cr_assert_eq(c.status, -EACCES);
	cr_assert_eq(c.n_failed, 1);
	cr_assert_eq(peer_verify(&r.peer, idx, 0, rlen, 51, 0), (int64_t)rlen);
	recover_if_in_error(&r);
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, bad, 0, 100, 2);
	cr_assert_eq(wait_cpl(r.ep, 2, 30).status, -EACCES);
	cr_assert_eq(lcheck(&r, lm, rlen, 53, 0), rlen);
	recover_if_in_error(&r);
	/* WRITE into a read-only region. */
	struct kvx_xport_rmr *rro = import(r.ep, dro);
	post1(r.ep, KVX_XPORT_OP_WRITE, l, 0, rro, 0, rlen, 3);
	cr_assert_eq(wait_cpl(r.ep, 3, 30).status, -EACCES);
	cr_assert_eq(peer_verify(&r.peer, ro, 0, rlen, 52, 0), (int64_t)rlen);
	/* READ from it works. */
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rro, 10, 1000, 4);
	cr_assert_eq(wait_cpl(r.ep, 4, 30).status, 0);
	cr_assert_eq(lcheck(&r, lm, 1000, 52, 10), 1000);
	/* READ into a local region without LOCAL_WRITE. */
	uint8_t *lm2;
	struct kvx_xport_mr *l2 = local_mr(&r, &lm2, 4096, KVX_XPORT_ACCESS_REMOTE_READ);
	lfill(&r, lm2, 4096, 54, 0);
	post1(r.ep, KVX_XPORT_OP_READ, l2, 0, rro, 0, 4096, 5);
	cr_assert_eq(wait_cpl(r.ep, 5, 30).status, -EACCES);
	cr_assert_eq(lcheck(&r, lm2, 4096, 54, 0), 4096);
	rig_down(&r);
	lfree(&r, lm);
	lfree(&r, lm2);
}

ParameterizedTestParameters(transport_conformance, peer_killed_mid_batch_completes_econnreset)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance,
		  peer_killed_mid_batch_completes_econnreset)
{
	struct kvx_xport_ctx_params prm;
	rig_params(&prm);
	prm.op_timeout_ns = 5000000000ull;
	struct rig r;
	rig_up(&r, pp, &prm);
	const uint64_t rlen = 32 * MIB;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&r.peer, rlen, KVX_XPORT_ACCESS_ALL, 61, d), 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, rlen, KVX_XPORT_ACCESS_ALL);
	struct kvx_xport_op ops[32];
	for (int i = 0; i < 32; i++)
		ops[i] = (struct kvx_xport_op){.lmr = l, .rmr = rr, .loff = (uint64_t)i * MIB,
					       .roff = (uint64_t)i * MIB, .len = MIB};
	/* Freeze the target so the batch is in flight when it dies, then kill it. */
	peer_stop(&r.peer);
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_WRITE, ops, 32, 1), 0);
	peer_kill(&r.peer);
	uint64_t t0 = kvx_now_ns();
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 10);
	cr_assert_lt(kvx_now_ns() - t0, 7000000000ull, "completion later than the op timeout");
	cr_assert_eq(c.n_ops, 32);
	if (r.caps.needs_progress) {
		cr_assert_eq(c.status, -ECONNRESET);
		cr_assert_eq(c.n_failed, 32);
	} else {
		/* shm/verbs move data without the target's CPU: a frozen peer still completes.
		 * verbs: the dying process's MRs may go before its QPs, so in-flight WRITEs can
		 * also meet a dead rkey (REM_ACCESS_ERR -> -EACCES). */
		cr_assert(c.status == 0 || c.status == -ECONNRESET ||
				  (!strcmp(pp->name, "verbs") && c.status == -EACCES),
			  "status %d", c.status);
	}
	/* A batch posted after the death completes with -ECONNRESET, promptly. */
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, ops, 32, 2), 0);
	c = wait_cpl(r.ep, 2, 10);
	cr_assert_eq(c.status, -ECONNRESET);
	cr_assert_eq(c.n_failed, 32);
	cr_assert_eq(kvx_xport_ep_status(r.ep), -ECONNRESET);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_geq(k.resets, 1);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, frozen_peer_times_out_with_etimedout)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance,
		  frozen_peer_times_out_with_etimedout)
{
	struct kvx_xport_ctx_params prm;
	rig_params(&prm);
	prm.op_timeout_ns = 1000000000ull;
	struct rig r;
	rig_up(&r, pp, &prm);
	if (!r.caps.needs_progress) {
		rig_down(&r);
		cr_skip_test("%s moves data without the target's CPU: a frozen peer cannot stall it",
			     pp->name);
	}
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&r.peer, MIB, KVX_XPORT_ACCESS_ALL, 71, d), 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, MIB, KVX_XPORT_ACCESS_ALL);
	peer_stop(&r.peer);
	uint64_t t0 = kvx_now_ns();
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, 0, MIB, 1);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 10);
	uint64_t dt = kvx_now_ns() - t0;
	cr_assert_eq(c.status, -ETIMEDOUT);
	cr_assert_geq(dt, 1000000000ull);
	cr_assert_lt(dt, 5000000000ull);
	cr_assert_eq(kvx_xport_ep_status(r.ep), -ETIMEDOUT);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.timeouts, 1);
	peer_kill(&r.peer);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, many_endpoints_at_once_exact_bytes)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, many_endpoints_at_once_exact_bytes)
{
	enum { NEP = 24 };
	struct rig r;
	rig_up(&r, pp, NULL);
	const uint64_t rlen = NEP * 65536;
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	int idx = peer_reg(&r.peer, rlen, KVX_XPORT_ACCESS_ALL, 81, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, rlen, KVX_XPORT_ACCESS_ALL);
	lfill(&r, lm, rlen, 82, 0);
	struct kvx_xport_ep *eps[NEP];
	struct kvx_xport_rmr *rr[NEP];
	for (int i = 0; i < NEP; i++) {
		eps[i] = rig_connect(&r);
		rr[i] = import(eps[i], d);
	}
	/* Endpoint i WRITEs its own 64 KiB slice; all in flight together. */
	for (int i = 0; i < NEP; i++)
		post1(eps[i], KVX_XPORT_OP_WRITE, l, (uint64_t)i * 65536, rr[i], (uint64_t)i * 65536,
		      65536, (uint64_t)i);
	int done = 0;
	bool seen[NEP] = {0};
	uint64_t deadline = kvx_now_ns() + 60000000000ull;
	while (done < NEP) {
		for (int i = 0; i < NEP; i++) {
			struct kvx_xport_cpl c;
			if (kvx_xport_poll_burst(eps[i], &c, 1) == 1) {
				cr_assert_eq(c.cookie, (uint64_t)i);
				cr_assert_eq(c.status, 0);
				cr_assert_not(seen[i]);
				seen[i] = true;
				done++;
			}
		}
		cr_assert_lt(kvx_now_ns(), deadline);
	}
	cr_assert_eq(peer_verify(&r.peer, idx, 0, rlen, 82, 0), (int64_t)rlen);
	for (int i = 0; i < NEP; i++)
		kvx_xport_ep_destroy(eps[i]);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, post_arguments_and_backpressure)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, post_arguments_and_backpressure)
{
	struct kvx_xport_ctx_params prm;
	rig_params(&prm);
	prm.queue_depth = 16;
	struct rig r;
	rig_up(&r, pp, &prm);
	cr_assert_eq(r.caps.max_batch, 16);
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&r.peer, 65536, KVX_XPORT_ACCESS_ALL, 91, d), 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, 65536, KVX_XPORT_ACCESS_ALL);
	struct kvx_xport_op ops[17];
	for (int i = 0; i < 17; i++)
		ops[i] = (struct kvx_xport_op){.lmr = l, .rmr = rr, .loff = (uint64_t)i * 100,
					       .roff = (uint64_t)i * 100, .len = 100};
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, ops, 0, 1), -EINVAL);
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, ops, 17, 1), -EINVAL);
	cr_assert_eq(kvx_xport_post_bulk(r.ep, (enum kvx_xport_opcode)7, ops, 1, 1), -EINVAL);
	ops[0].len = 0;
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, ops, 1, 1), -EINVAL);
	ops[0].len = 100;
	/* 16 ops fill the queue: one more is -ENOBUFS until completions are polled. */
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, ops, 16, 1), 0);
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, &ops[16], 1, 2), -ENOBUFS);
	struct kvx_xport_cpl c = wait_cpl(r.ep, 1, 30);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(c.n_ops, 16);
	cr_assert_eq(kvx_xport_post_bulk(r.ep, KVX_XPORT_OP_READ, &ops[16], 1, 2), 0);
	cr_assert_eq(wait_cpl(r.ep, 2, 30).status, 0);
	cr_assert_eq(lcheck(&r, lm, 1700, 91, 0), 1700);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.post_nobufs, 1);
	cr_assert_eq(k.ops_posted, 17);
	cr_assert_eq(k.batches_done, 2);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, malformed_blobs_rejected)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance, malformed_blobs_rejected)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX];
	size_t al = 0, bl = 0;
	struct kvx_xport_ep *ep = NULL;
	cr_assert_eq(kvx_xport_ep_create(r.ctx, &ep, a, 4, &al), -EMSGSIZE);
	cr_assert_eq(kvx_xport_ep_create(r.ctx, &ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_accept(&r.peer, a, al - 1, b, &bl), -EMSGSIZE);
	a[0] ^= 1;
	cr_assert_eq(peer_accept(&r.peer, a, al, b, &bl), -EPROTO);
	a[0] ^= 1;
	a[6] = 2; /* kind B where A is expected */
	cr_assert_eq(peer_accept(&r.peer, a, al, b, &bl), -EPROTO);
	a[6] = 1;
	cr_assert_eq(peer_accept(&r.peer, a, al, b, &bl), 0);
	b[4] = 2; /* version */
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), -EPROTO);
	b[4] = 1;
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl + 1), -EMSGSIZE);
	cr_assert_eq(kvx_xport_ep_connect(ep, b, bl), 0);
	/* The endpoint works after the rejected attempts. */
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&r.peer, 4096, KVX_XPORT_ACCESS_ALL, 95, d), 0);
	struct kvx_xport_rmr *rr = import(ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, 4096, KVX_XPORT_ACCESS_ALL);
	post1(ep, KVX_XPORT_OP_READ, l, 0, rr, 0, 4096, 9);
	cr_assert_eq(wait_cpl(ep, 9, 30).status, 0);
	cr_assert_eq(lcheck(&r, lm, 4096, 95, 0), 4096);
	rig_down(&r);
	lfree(&r, lm);
}

ParameterizedTestParameters(transport_conformance, ep_wait_wakes_on_response_not_timeout)
{
	return providers();
}
ParameterizedTest(struct xport_param *pp, transport_conformance,
		  ep_wait_wakes_on_response_not_timeout)
{
	struct rig r;
	rig_up(&r, pp, NULL);
	uint8_t d[KVX_XPORT_RDESC_BYTES];
	cr_assert_geq(peer_reg(&r.peer, MIB, KVX_XPORT_ACCESS_ALL, 97, d), 0);
	struct kvx_xport_rmr *rr = import(r.ep, d);
	uint8_t *lm;
	struct kvx_xport_mr *l = local_mr(&r, &lm, MIB, KVX_XPORT_ACCESS_ALL);
	/* Nothing outstanding: after at most one stale wake-up (e.g. the first writability
	 * edge of a new socket), the wait times out; or the provider has nothing to wait on. */
	int rc = kvx_xport_ep_wait(r.ep, 20);
	cr_assert(rc == 0 || rc == 1 || rc == -ENOTSUP, "idle wait: %d", rc);
	bool evented = rc != -ENOTSUP;
	if (evented)
		cr_assert_eq(kvx_xport_ep_wait(r.ep, 20), 0, "second idle wait did not time out");
	uint64_t t0 = kvx_now_ns();
	post1(r.ep, KVX_XPORT_OP_READ, l, 0, rr, 0, MIB, 1);
	struct kvx_xport_cpl c;
	int n;
	while ((n = kvx_xport_poll_burst(r.ep, &c, 1)) == 0) {
		rc = kvx_xport_ep_wait(r.ep, 20000);
		cr_assert_eq(rc, evented ? 1 : -ENOTSUP, "wait returned %d", rc);
		cr_assert_lt(kvx_now_ns() - t0, 15000000000ull);
	}
	cr_assert_eq(c.status, 0);
	cr_assert_lt(kvx_now_ns() - t0, 15000000000ull, "woke by timeout, not by the response");
	cr_assert_eq(lcheck(&r, lm, MIB, 97, 0), MIB);
	/* Target side: its wait fd exists exactly when the provider needs progress. */
	cr_assert_eq(kvx_xport_ctx_wait_fd(r.ctx) >= 0, r.caps.needs_progress);
	rig_down(&r);
	lfree(&r, lm);
}
