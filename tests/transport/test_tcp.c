/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp provider under the real threading contract: one thread runs kvx_xport_progress() on the
 * target context (as a polling lcore would) while the control thread registers and
 * unregisters regions, accepts and destroys endpoints, and an initiator in the same process
 * moves data. Run under TSan in CI (label stress).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/transport.h"

struct prog {
	struct kvx_xport_ctx *ctx;
	atomic_bool stop;
	atomic_ulong loops;
};

static void *progress_thread(void *arg)
{
	struct prog *p = arg;
	unsigned idle = 0;
	while (!atomic_load_explicit(&p->stop, memory_order_acquire)) {
		int w = kvx_xport_progress(p->ctx);
		idle = w ? 0 : idle + 1;
		if (idle > 256)
			kvx_xport_ctx_wait(p->ctx, 1); /* adaptive idle: 2 cores, several threads */
		atomic_fetch_add_explicit(&p->loops, 1, memory_order_relaxed);
	}
	return NULL;
}

static struct kvx_xport_cpl wait_one(struct kvx_xport_ep *ep)
{
	struct kvx_xport_cpl c;
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0) {
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 30 s");
		kvx_xport_ep_wait(ep, 1);
	}
	return c;
}

Test(transport_tcp, progress_thread_with_control_thread_churn, .timeout = 120)
{
	struct kvx_xport_ctx *tgt = NULL, *ini = NULL;
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.num_channels = 2;
	prm.chunk_bytes = 16384;
	cr_assert_eq(kvx_xport_open("tcp", &prm, &tgt), 0);
	cr_assert_eq(kvx_xport_open("tcp", &prm, &ini), 0);
	struct prog p = {.ctx = tgt};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, progress_thread, &p), 0);
	enum { LEN = 65536 };
	uint8_t *src = malloc(LEN), *dst = malloc(LEN);
	struct kvx_xport_mr *lmr = NULL;
	struct kvx_xport_mr_params lp = {.addr = dst, .len_bytes = LEN, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(ini, &lp, &lmr), 0);
	for (int round = 0; round < 12; round++) {
		for (int i = 0; i < LEN; i++)
			src[i] = (uint8_t)(i * 7 + round);
		struct kvx_xport_mr *rmr_t = NULL;
		struct kvx_xport_mr_params rp = {.addr = src, .len_bytes = LEN,
						 .access = KVX_XPORT_ACCESS_REMOTE_READ};
		cr_assert_eq(kvx_xport_mr_register(tgt, &rp, &rmr_t), 0);
		uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
		size_t al, bl;
		struct kvx_xport_ep *iep = NULL, *tep = NULL;
		cr_assert_eq(kvx_xport_ep_create(ini, &iep, a, sizeof(a), &al), 0);
		cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, &tep, b, sizeof(b), &bl), 0);
		cr_assert_eq(kvx_xport_ep_connect(iep, b, bl), 0);
		cr_assert_eq(kvx_xport_mr_export(rmr_t, d, sizeof(d), NULL), 0);
		struct kvx_xport_rmr *rr = NULL;
		cr_assert_eq(kvx_xport_rmr_import(iep, d, sizeof(d), &rr), 0);
		struct kvx_xport_op ops[4];
		for (int i = 0; i < 4; i++)
			ops[i] = (struct kvx_xport_op){.lmr = lmr, .rmr = rr, .loff = (uint64_t)i * 16384,
						       .roff = (uint64_t)i * 16384, .len = 16384};
		memset(dst, 0, LEN);
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, 1), 0);
		struct kvx_xport_cpl c = wait_one(iep);
		cr_assert_eq(c.status, 0);
		cr_assert_arr_eq(dst, src, LEN);
		/* Unregister while READs keep arriving: each completes with 0 (served before the
		 * key died) or -EACCES (after); unregister answers -EBUSY while one is served. */
		uint64_t posted = 2, done = 0;
		int urc;
		uint64_t deadline = kvx_now_ns() + 30000000000ull;
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, posted++), 0);
		while ((urc = kvx_xport_mr_unregister(rmr_t)) == -EBUSY) {
			struct kvx_xport_cpl cc;
			if (kvx_xport_poll_burst(iep, &cc, 1) == 1) {
				cr_assert(cc.status == 0 || cc.status == -EACCES, "status %d", cc.status);
				done++;
				cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 4, posted++), 0);
			}
			cr_assert_lt(kvx_now_ns(), deadline);
		}
		cr_assert_eq(urc, 0);
		while (done < posted - 2) {
			c = wait_one(iep);
			cr_assert(c.status == 0 || c.status == -EACCES, "status %d", c.status);
			done++;
		}
		cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 1, 99), 0);
		cr_assert_eq(wait_one(iep).status, -EACCES, "key still alive after unregister");
		/* Destroy the target side while the progress thread runs: requests that race with
		 * it are still refused (-EACCES); once the thread drops the connections, the
		 * initiator completes with -ECONNRESET. */
		kvx_xport_ep_destroy(tep);
		for (uint64_t ck = 100;; ck++) {
			cr_assert_eq(kvx_xport_post_bulk(iep, KVX_XPORT_OP_READ, ops, 1, ck), 0);
			int st = wait_one(iep).status;
			if (st == -ECONNRESET)
				break;
			cr_assert_eq(st, -EACCES);
			cr_assert_lt(kvx_now_ns(), deadline);
		}
		kvx_xport_ep_destroy(iep);
	}
	atomic_store_explicit(&p.stop, true, memory_order_release);
	pthread_join(th, NULL);
	cr_assert_gt(atomic_load(&p.loops), 0);
	struct kvx_xport_counters k;
	kvx_xport_ctx_counters(tgt, &k);
	cr_assert_geq(k.reqs_served, 12 * 4);
	cr_assert_geq(k.reqs_rejected, 12);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(src);
	free(dst);
}
