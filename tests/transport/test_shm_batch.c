/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shm: consecutive posts share one process_vm_readv/writev (transport/shm/shm.c, pending
 * group), and each post still completes on its own: exact bytes and statuses per post, a
 * failure stays in the post of the op that failed, ops move in post order across opcodes.
 * The target is a real forked process (tests/transport/peer.c). A local page made
 * inaccessible (mprotect) makes one op of a group fail inside the kernel, after the checks at
 * post passed: the only way to fail an op in the middle of a group.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "peer.h"

#define PG 4096ull

struct srig {
	struct peer peer;
	struct kvx_xport_ctx *ctx;
	struct kvx_xport_ep *ep;
	int idx;                   /* target region */
	struct kvx_xport_rmr *rr;  /* its import */
	uint8_t *lm;               /* local region: NPG pages, mmap */
	struct kvx_xport_mr *l;
};

#define NPG 8
#define RSEED 71 /* target region pattern */
#define LSEED 72 /* local region pattern */

static void srig_up(struct srig *r)
{
	skip_unless_available("shm");
	memset(r, 0, sizeof(*r));
	struct kvx_xport_ctx_params p;
	kvx_xport_ctx_params_init(&p);
	p.op_timeout_ns = 20000000000ull;
	cr_assert_eq(peer_start(&r->peer, "shm", &p), 0);
	cr_assert_eq(kvx_xport_open("shm", &p, &r->ctx), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al = 0, bl = 0;
	cr_assert_eq(kvx_xport_ep_create(r->ctx, &r->ep, a, sizeof(a), &al), 0);
	cr_assert_eq(peer_accept(&r->peer, a, al, b, &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(r->ep, b, bl), 0);
	r->idx = peer_reg(&r->peer, NPG * PG, KVX_XPORT_ACCESS_ALL, RSEED, d);
	cr_assert_geq(r->idx, 0);
	cr_assert_eq(kvx_xport_rmr_import(r->ep, d, sizeof(d), &r->rr), 0);
	r->lm = mmap(NULL, NPG * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(r->lm, MAP_FAILED);
	pat_fill(r->lm, NPG * PG, LSEED, 0);
	struct kvx_xport_mr_params mp = {.addr = r->lm, .len_bytes = NPG * PG,
					 .access = KVX_XPORT_ACCESS_ALL,
					 .mem_type = KVX_XPORT_MEM_HOST};
	cr_assert_eq(kvx_xport_mr_register(r->ctx, &mp, &r->l), 0);
}

static void srig_down(struct srig *r)
{
	kvx_xport_close(r->ctx);
	cr_assert_eq(peer_quit(&r->peer), 0, "target process did not exit cleanly");
	munmap(r->lm, NPG * PG);
}

static void post(struct srig *r, enum kvx_xport_opcode opc, const struct kvx_xport_op *ops,
		 uint32_t n, uint64_t cookie)
{
	cr_assert_eq(kvx_xport_post_bulk(r->ep, opc, ops, n, cookie), 0);
}

static struct kvx_xport_op op(struct srig *r, uint64_t loff, uint64_t roff, uint64_t len)
{
	return (struct kvx_xport_op){.lmr = r->l, .rmr = r->rr, .loff = loff, .roff = roff,
				     .len = len};
}

/* Poll until @p n completions arrived; they come in post order (cookies 1..n). */
static void poll_n(struct srig *r, struct kvx_xport_cpl *c, uint32_t n)
{
	uint32_t got = 0;
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (got < n) {
		int k = kvx_xport_poll_burst(r->ep, c + got, n - got);
		cr_assert_geq(k, 0);
		got += (uint32_t)k;
		cr_assert_lt(kvx_now_ns(), deadline, "%u of %u completions within 30 s", got, n);
	}
	for (uint32_t i = 0; i < n; i++)
		cr_assert_eq(c[i].cookie, i + 1, "completion %u has cookie %llu", i,
			     (unsigned long long)c[i].cookie);
}

TestSuite(transport_shm_batch, .timeout = 60);

/* Three one-op WRITE posts, a four-op post and another one-op post, posted back to back
 * (one pending group): local page 3 is unreadable, so the op that reads it fails in the
 * kernel. Only its post fails; every other op's bytes land, and the failed op's target range
 * keeps its old bytes. */
Test(transport_shm_batch, write_posts_complete_individually_failure_stays_in_its_post)
{
	struct srig r;
	srig_up(&r);
	cr_assert_eq(mprotect(r.lm + 3 * PG, PG, PROT_NONE), 0);
	struct kvx_xport_op o1;
	for (uint64_t i = 0; i < 3; i++) { /* cookies 1..3: local page i -> remote page 7-i */
		o1 = op(&r, i * PG, (7 - i) * PG, PG);
		post(&r, KVX_XPORT_OP_WRITE, &o1, 1, i + 1);
	}
	/* Cookie 4: local 4 -> remote 2; local 3 (unreadable) -> remote 1; 100 B of local 5 ->
	 * remote 0 + 7; and an out-of-bounds op rejected at post (-ERANGE as well, but at a
	 * higher index: the status and first_failed are index 1's). */
	struct kvx_xport_op b[4] = {op(&r, 4 * PG, 2 * PG, PG), op(&r, 3 * PG, 1 * PG, PG),
				    op(&r, 5 * PG, 7, 100), op(&r, 0, NPG * PG - 1, 2)};
	post(&r, KVX_XPORT_OP_WRITE, b, 4, 4);
	o1 = op(&r, 6 * PG + 1, 3 * PG + 5, 999); /* cookie 5 */
	post(&r, KVX_XPORT_OP_WRITE, &o1, 1, 5);
	struct kvx_xport_cpl c[5];
	poll_n(&r, c, 5);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(c[i].status, 0, "post %d: %d", i + 1, c[i].status);
		cr_assert_eq(c[i].n_ops, 1);
		cr_assert_eq(c[i].n_failed, 0);
		cr_assert_eq(c[i].first_failed, 1);
		cr_assert_eq(c[i].bytes, PG);
	}
	cr_assert_eq(c[3].status, -ERANGE);
	cr_assert_eq(c[3].n_ops, 4);
	cr_assert_eq(c[3].n_failed, 2);
	cr_assert_eq(c[3].first_failed, 1);
	cr_assert_eq(c[3].bytes, PG + 100);
	cr_assert_eq(c[4].status, 0);
	cr_assert_eq(c[4].n_failed, 0);
	cr_assert_eq(c[4].bytes, 999);
	for (uint64_t i = 0; i < 3; i++)
		cr_assert_eq(peer_verify(&r.peer, r.idx, (7 - i) * PG, PG, LSEED, i * PG),
			     (int64_t)PG, "remote page %llu", (unsigned long long)(7 - i));
	cr_assert_eq(peer_verify(&r.peer, r.idx, 2 * PG, PG, LSEED, 4 * PG), (int64_t)PG);
	cr_assert_eq(peer_verify(&r.peer, r.idx, 1 * PG, PG, RSEED, 1 * PG), (int64_t)PG,
		     "the failed op's target range changed");
	cr_assert_eq(peer_verify(&r.peer, r.idx, 0, 7, RSEED, 0), 7);
	cr_assert_eq(peer_verify(&r.peer, r.idx, 7, 100, LSEED, 5 * PG), 100);
	cr_assert_eq(peer_verify(&r.peer, r.idx, 107, PG - 107, RSEED, 107), (int64_t)(PG - 107));
	cr_assert_eq(peer_verify(&r.peer, r.idx, 3 * PG, 5, RSEED, 3 * PG), 5);
	cr_assert_eq(peer_verify(&r.peer, r.idx, 3 * PG + 5, 999, LSEED, 6 * PG + 1), 999);
	cr_assert_eq(peer_verify(&r.peer, r.idx, 3 * PG + 1004, 2 * PG - 1004, RSEED, 3 * PG + 1004),
		     (int64_t)(2 * PG - 1004));
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.ops_posted, 8);
	cr_assert_eq(k.ops_ok, 6);
	cr_assert_eq(k.ops_failed, 2);
	cr_assert_eq(k.bytes_written, 4 * PG + 100 + 999);
	cr_assert_eq(k.batches_done, 5);
	srig_down(&r);
}

/* WRITE then READ of the same remote page, posted back to back: the READ returns the bytes
 * the WRITE put there (ops move in post order across opcodes). A READ into a read-only local
 * page fails alone; the READ after it lands. */
Test(transport_shm_batch, posts_move_in_order_read_failure_stays_in_its_post)
{
	struct srig r;
	srig_up(&r);
	cr_assert_eq(mprotect(r.lm + 3 * PG, PG, PROT_READ), 0);
	struct kvx_xport_op o = op(&r, 0, 0, PG);
	post(&r, KVX_XPORT_OP_WRITE, &o, 1, 1); /* local 0 -> remote 0 */
	o = op(&r, 1 * PG, 0, PG);
	post(&r, KVX_XPORT_OP_READ, &o, 1, 2); /* remote 0 -> local 1 */
	o = op(&r, 3 * PG, 5 * PG, PG);
	post(&r, KVX_XPORT_OP_READ, &o, 1, 3); /* remote 5 -> local 3 (read-only) */
	o = op(&r, 2 * PG + 3, 6 * PG + 11, 2000);
	post(&r, KVX_XPORT_OP_READ, &o, 1, 4); /* remote 6 + 11 -> local 2 + 3 */
	struct kvx_xport_cpl c[4];
	poll_n(&r, c, 4);
	cr_assert_eq(c[0].status, 0);
	cr_assert_eq(c[0].bytes, PG);
	cr_assert_eq(c[1].status, 0);
	cr_assert_eq(c[1].bytes, PG);
	cr_assert_eq(c[2].status, -ERANGE);
	cr_assert_eq(c[2].n_failed, 1);
	cr_assert_eq(c[2].first_failed, 0);
	cr_assert_eq(c[2].bytes, 0);
	cr_assert_eq(c[3].status, 0);
	cr_assert_eq(c[3].bytes, 2000);
	cr_assert_eq(pat_check(r.lm + PG, PG, LSEED, 0), PG, "the READ did not see the WRITE");
	cr_assert_eq(pat_check(r.lm + 3 * PG, PG, LSEED, 3 * PG), PG, "the failed READ wrote");
	cr_assert_eq(pat_check(r.lm + 2 * PG, 3, LSEED, 2 * PG), 3);
	cr_assert_eq(pat_check(r.lm + 2 * PG + 3, 2000, RSEED, 6 * PG + 11), 2000);
	cr_assert_eq(pat_check(r.lm + 2 * PG + 2003, PG - 2003, LSEED, 2 * PG + 2003),
		     PG - 2003);
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.ops_ok, 3);
	cr_assert_eq(k.ops_failed, 1);
	cr_assert_eq(k.bytes_written, PG);
	cr_assert_eq(k.bytes_read, PG + 2000);
	srig_down(&r);
}

/*
 * 256 one-op READs of 64 B, 128 in flight, polled 64 at a time (as kvxfer-perf bw does):
 * op k reads remote bytes [64k, 64k + 64) into local slot (37k mod 256) (a permutation of the
 * first four local pages). With @p ro_page >= 0 that local page is read-only, so the ops whose
 * slot lies in it fail in the kernel, inside a group. Checks per op: status, bytes, the slot's
 * contents; and the grouping: a poll whose 64 completions are already final leaves the ops
 * posted since then pending, so the 256 ops move in two process_vm_readv calls of 128 iovecs
 * (counter cma_calls; a failing group adds one call per op redone).
 */
#define SM 64u
#define NSM 256u

static uint64_t slot_of(uint32_t k)
{
	return (uint64_t)((k * 37u) % NSM) * SM;
}

static void post_small(struct srig *r, uint32_t from, uint32_t to)
{
	for (uint32_t k = from; k < to; k++) {
		struct kvx_xport_op o = op(r, slot_of(k), (uint64_t)k * SM, SM);
		post(r, KVX_XPORT_OP_READ, &o, 1, k + 1);
	}
}

/* Poll exactly @p n completions with bursts of 64: cookies from + 1 .. from + n. */
static void poll_burst(struct srig *r, struct kvx_xport_cpl *c, uint32_t from, uint32_t n)
{
	uint32_t got = 0;
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (got < n) {
		int k = kvx_xport_poll_burst(r->ep, c + from + got, 64);
		cr_assert_geq(k, 0);
		got += (uint32_t)k;
		cr_assert_leq(got, n, "polled %u completions, expected %u", got, n);
		cr_assert_lt(kvx_now_ns(), deadline, "%u of %u completions within 30 s", got, n);
	}
	for (uint32_t i = from; i < from + n; i++)
		cr_assert_eq(c[i].cookie, i + 1, "completion %u has cookie %llu", i,
			     (unsigned long long)c[i].cookie);
}

static uint64_t cma_calls(struct srig *r)
{
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r->ep, &k);
	return k.cma_calls;
}

static void small_reads(int ro_page)
{
	struct srig r;
	srig_up(&r);
	if (ro_page >= 0)
		cr_assert_eq(mprotect(r.lm + (uint64_t)ro_page * PG, PG, PROT_READ), 0);
	uint32_t bad = 0; /* ops whose slot is in the read-only page */
	for (uint32_t k = 0; k < NSM; k++)
		bad += ro_page >= 0 && slot_of(k) / PG == (uint64_t)ro_page;
	struct kvx_xport_cpl c[NSM];
	post_small(&r, 0, 128);
	poll_burst(&r, c, 0, 64);   /* moves ops 1..128 in one call, returns 1..64 */
	uint64_t calls1 = cma_calls(&r);
	post_small(&r, 128, 192);
	poll_burst(&r, c, 64, 64);  /* 65..128 were final: 129..192 stay pending */
	cr_assert_eq(cma_calls(&r), calls1, "a poll filled by final completions moved ops");
	post_small(&r, 192, 256);
	poll_burst(&r, c, 128, 64); /* moves 129..256 in one call */
	poll_burst(&r, c, 192, 64);
	if (ro_page < 0) {
		cr_assert_eq(calls1, 1, "128 pending ops took %llu calls",
			     (unsigned long long)calls1);
		cr_assert_eq(cma_calls(&r), 2, "256 ops, two groups of 128: %llu calls",
			     (unsigned long long)cma_calls(&r));
	} else {
		/* A failed group is redone op by op from its first op not fully moved. */
		cr_assert_gt(calls1, 1);
		cr_assert_leq(cma_calls(&r), 2 + NSM);
	}
	uint32_t failed = 0;
	for (uint32_t k = 0; k < NSM; k++) {
		uint64_t s = slot_of(k);
		cr_assert_eq(c[k].n_ops, 1);
		if (ro_page >= 0 && s / PG == (uint64_t)ro_page) {
			cr_assert_eq(c[k].status, -ERANGE, "op %u: %d", k, c[k].status);
			cr_assert_eq(c[k].n_failed, 1);
			cr_assert_eq(c[k].first_failed, 0);
			cr_assert_eq(c[k].bytes, 0);
			cr_assert_eq(pat_check(r.lm + s, SM, LSEED, s), SM, "failed op %u wrote", k);
			failed++;
			continue;
		}
		cr_assert_eq(c[k].status, 0, "op %u: %d", k, c[k].status);
		cr_assert_eq(c[k].n_failed, 0);
		cr_assert_eq(c[k].first_failed, 1);
		cr_assert_eq(c[k].bytes, SM);
		cr_assert_eq(pat_check(r.lm + s, SM, RSEED, (uint64_t)k * SM), SM, "op %u's bytes", k);
	}
	cr_assert_eq(failed, bad);
	cr_assert_eq(pat_check(r.lm + 4 * PG, (NPG - 4) * PG, LSEED, 4 * PG), (NPG - 4) * PG,
		     "bytes outside the ops' slots changed");
	struct kvx_xport_counters k;
	kvx_xport_ep_counters(r.ep, &k);
	cr_assert_eq(k.ops_posted, NSM);
	cr_assert_eq(k.ops_ok, NSM - bad);
	cr_assert_eq(k.ops_failed, bad);
	cr_assert_eq(k.bytes_read, (uint64_t)(NSM - bad) * SM);
	cr_assert_eq(k.batches_done, NSM);
	srig_down(&r);
}

Test(transport_shm_batch, poll_filled_by_final_completions_leaves_group_to_grow_bytes_exact)
{
	small_reads(-1);
}

Test(transport_shm_batch, grown_group_with_failing_ops_fails_only_their_posts)
{
	small_reads(2);
}

/* A poll of 0 completions only drives I/O: it moves the pending group even when final
 * completions wait to be taken, and returns none. */
Test(transport_shm_batch, poll_of_zero_moves_held_group_returns_nothing)
{
	struct srig r;
	srig_up(&r);
	struct kvx_xport_cpl c[NSM];
	post_small(&r, 0, 2);
	cr_assert_eq(kvx_xport_poll_burst(r.ep, c, 1), 1); /* moves ops 1..2, returns 1 */
	cr_assert_eq(c[0].cookie, 1);
	post_small(&r, 2, 3);      /* pending behind final completion 2 */
	cr_assert_eq(kvx_xport_poll_burst(r.ep, c, 0), 0);
	cr_assert_eq(pat_check(r.lm + slot_of(2), SM, RSEED, 2 * SM), SM,
		     "poll(0) did not move the pending op");
	cr_assert_eq(cma_calls(&r), 2);
	cr_assert_eq(kvx_xport_poll_burst(r.ep, c + 1, 2), 2);
	cr_assert_eq(c[1].cookie, 2);
	cr_assert_eq(c[2].cookie, 3);
	cr_assert_eq(c[2].bytes, SM);
	srig_down(&r);
}
