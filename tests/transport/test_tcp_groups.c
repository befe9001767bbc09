/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tcp target progress groups (params.progress_groups, issue 16): each accepted endpoint is
 * served by one group, group g by the thread that calls kvx_xport_progress_group(ctx, g).
 * A target endpoint's group is its poll group (kvx_xport_ep_set_group()) mod the group count.
 * Checked here: the API's bounds, bytes moved while every group runs on its own thread, that
 * only the owning group serves an endpoint, that a destroyed endpoint is served by no call
 * after the destroy, and that closing the context frees an endpoint still in a group's inbox
 * (ASan build). Real sockets on loopback, one process. The TSan build runs it with the
 * in-process runner (Criterion cannot start there: tests/lcore/tsan_runner.h).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#ifdef KVX_TSAN_RUNNER
#include "tests/lcore/tsan_runner.h"
#else
#include <criterion/criterion.h>
#endif

#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

enum { LEN = 1 << 20, NG = 3 };

static struct kvx_xport_ctx *open_ctx(uint32_t groups)
{
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.progress_groups = groups;
	struct kvx_xport_ctx *c = NULL;
	cr_assert_eq(kvx_xport_open("tcp", &prm, &c), 0);
	return c;
}

static struct kvx_xport_mr *reg(struct kvx_xport_ctx *c, void *addr, size_t len)
{
	struct kvx_xport_mr *mr = NULL;
	struct kvx_xport_mr_params p = {.addr = addr, .len_bytes = len, .access = KVX_XPORT_ACCESS_ALL};
	cr_assert_eq(kvx_xport_mr_register(c, &p, &mr), 0);
	return mr;
}

/* A new initiator endpoint of ini connected to tgt, with tgt's region tmr imported; the target
 * endpoint is put in poll group pg right after the accept (as the engine does). */
static struct kvx_xport_rmr *connect_import(struct kvx_xport_ctx *ini, struct kvx_xport_ctx *tgt,
					    struct kvx_xport_mr *tmr, uint32_t pg,
					    struct kvx_xport_ep **iep, struct kvx_xport_ep **tep)
{
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al, bl;
	cr_assert_eq(kvx_xport_ep_create(ini, iep, a, sizeof(a), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, tep, b, sizeof(b), &bl), 0);
	cr_assert_eq(kvx_xport_ep_set_group(*tep, pg), 0);
	cr_assert_eq(kvx_xport_ep_connect(*iep, b, bl), 0);
	cr_assert_eq(kvx_xport_mr_export(tmr, d, sizeof(d), NULL), 0);
	struct kvx_xport_rmr *rr = NULL;
	cr_assert_eq(kvx_xport_rmr_import(*iep, d, sizeof(d), &rr), 0);
	return rr;
}

/* Poll ep until one completion, calling the target groups in mask (bit g) between polls
 * (none: another thread serves). */
static struct kvx_xport_cpl drive(struct kvx_xport_ctx *tgt, unsigned mask, struct kvx_xport_ep *ep)
{
	struct kvx_xport_cpl c;
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0) {
		for (uint32_t g = 0; g < 16; g++)
			if (mask & (1u << g))
				(void)kvx_xport_progress_group(tgt, g);
		if (!mask)
			kvx_xport_ep_wait(ep, 1);
		cr_assert_lt(kvx_now_ns(), deadline, "no completion within 30 s");
	}
	return c;
}

static uint64_t served(const struct kvx_xport_ctx *tgt)
{
	struct kvx_xport_counters k;
	kvx_xport_ctx_service_counters(tgt, &k);
	return k.reqs_served;
}

Test(transport_tcp_groups, bounds_and_wait_fds)
{
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.progress_groups = 17;
	struct kvx_xport_ctx *c = NULL;
	cr_assert_eq(kvx_xport_open("tcp", &prm, &c), -EINVAL, "17 groups accepted");
	c = open_ctx(NG);
	struct kvx_xport_caps caps;
	cr_assert_eq(kvx_xport_query_caps(c, &caps), 0);
	cr_assert_eq(caps.progress_groups, NG);
	cr_assert_eq(kvx_xport_progress_group(c, NG), -EINVAL);
	cr_assert_eq(kvx_xport_group_wait_fd(c, NG), -EINVAL);
	cr_assert_eq(kvx_xport_group_wait_fd(c, 0), kvx_xport_ctx_wait_fd(c));
	int f1 = kvx_xport_group_wait_fd(c, 1), f2 = kvx_xport_group_wait_fd(c, 2);
	cr_assert_geq(f1, 0);
	cr_assert_geq(f2, 0);
	cr_assert(f1 != f2 && f1 != kvx_xport_ctx_wait_fd(c), "groups share a wait fd");
	for (uint32_t g = 0; g < NG; g++)
		cr_assert_eq(kvx_xport_progress_group(c, g), 0, "idle group %u did work", g);
	kvx_xport_close(c);
	/* Default: one group; shm has one whatever is asked. */
	c = open_ctx(0);
	cr_assert_eq(kvx_xport_query_caps(c, &caps), 0);
	cr_assert_eq(caps.progress_groups, 1);
	cr_assert_eq(kvx_xport_progress_group(c, 1), -EINVAL);
	kvx_xport_close(c);
	prm.progress_groups = 4;
	if (kvx_xport_provider_probe("shm", NULL, 0) == 0) {
		cr_assert_eq(kvx_xport_open("shm", &prm, &c), 0);
		cr_assert_eq(kvx_xport_query_caps(c, &caps), 0);
		cr_assert_eq(caps.progress_groups, 1);
		kvx_xport_close(c);
	}
}

struct gthread {
	struct kvx_xport_ctx *ctx;
	uint32_t g;
	int stopfd; /* eventfd: written to stop the thread */
	atomic_bool stop;
	atomic_ulong work;
};

/* A group's thread as an lcore runs it: progress while there is work, else sleep on the
 * group's wait fd with no timeout, so a lost wake-up (a hand-over or a request that does not
 * make the fd readable) hangs the test instead of being papered over by a timed retry. */
static void *group_thread(void *arg)
{
	struct gthread *t = arg;
	struct pollfd pf[2] = {{.fd = kvx_xport_group_wait_fd(t->ctx, t->g), .events = POLLIN},
			       {.fd = t->stopfd, .events = POLLIN}};
	while (!atomic_load_explicit(&t->stop, memory_order_acquire)) {
		int w = kvx_xport_progress_group(t->ctx, t->g);
		if (w > 0)
			atomic_fetch_add_explicit(&t->work, (unsigned long)w, memory_order_relaxed);
		else
			(void)poll(pf, 2, -1);
	}
	return NULL;
}

Test(transport_tcp_groups, every_group_serves_its_endpoint_on_its_own_thread, .timeout = 120)
{
	struct kvx_xport_ctx *tgt = open_ctx(NG), *ini = open_ctx(1);
	uint8_t *tmem = malloc((size_t)NG * 2 * LEN), *imem = calloc(NG * 2, LEN);
	for (size_t i = 0; i < (size_t)NG * 2 * LEN; i++)
		tmem[i] = (uint8_t)(i * 11 + i / 4093);
	struct kvx_xport_mr *tmr = reg(tgt, tmem, (size_t)NG * 2 * LEN);
	struct kvx_xport_mr *lmr = reg(ini, imem, (size_t)NG * 2 * LEN);
	struct gthread th[NG];
	pthread_t tid[NG];
	for (uint32_t g = 0; g < NG; g++) {
		th[g] = (struct gthread){.ctx = tgt, .g = g, .stopfd = eventfd(0, EFD_CLOEXEC)};
		cr_assert_geq(th[g].stopfd, 0);
		cr_assert_eq(pthread_create(&tid[g], NULL, group_thread, &th[g]), 0);
	}
	/* Endpoint k goes to progress group k: poll groups 0, 4 and 2 (4 mod 3 = 1). Each READs
	 * its first MiB of target memory and WRITEs its second. */
	static const uint32_t pg[NG] = {0, 4, 2};
	struct kvx_xport_ep *iep[NG], *tep[NG];
	struct kvx_xport_rmr *rr[NG];
	for (uint32_t k = 0; k < NG; k++)
		rr[k] = connect_import(ini, tgt, tmr, pg[k], &iep[k], &tep[k]);
	for (uint32_t k = 0; k < NG; k++) {
		uint64_t base = (uint64_t)k * 2 * LEN;
		memset(imem + base + LEN, (int)(0xa0 + k), LEN);
		struct kvx_xport_op r = {.lmr = lmr, .rmr = rr[k], .loff = base, .roff = base, .len = LEN};
		struct kvx_xport_op w = {.lmr = lmr, .rmr = rr[k], .loff = base + LEN, .roff = base + LEN,
					 .len = LEN};
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_READ, &r, 1, 1), 0);
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_WRITE, &w, 1, 2), 0);
	}
	for (uint32_t k = 0; k < NG; k++)
		for (int i = 0; i < 2; i++)
			cr_assert_eq(drive(tgt, 0, iep[k]).status, 0);
	for (uint32_t k = 0; k < NG; k++) {
		uint64_t base = (uint64_t)k * 2 * LEN;
		cr_assert_arr_eq(imem + base, tmem + base, LEN, "endpoint %u READ", k);
		for (size_t i = 0; i < LEN; i++)
			cr_assert_eq(tmem[base + LEN + i], 0xa0 + k, "endpoint %u WRITE byte %zu", k, i);
	}
	cr_assert_eq(served(tgt), 2 * NG, "one request per op (chunk 1 MiB), summed over the groups");
	for (uint32_t g = 0; g < NG; g++) {
		uint64_t one = 1;
		atomic_store_explicit(&th[g].stop, true, memory_order_release);
		cr_assert_eq(write(th[g].stopfd, &one, sizeof(one)), (ssize_t)sizeof(one));
		pthread_join(tid[g], NULL);
		close(th[g].stopfd);
		cr_assert_gt(atomic_load(&th[g].work), 0, "group %u did nothing", g);
	}
	/* Threads stopped: an op of endpoint k is served by group k and by no other group. The
	 * request is in group k's socket, so any number of calls of the other groups leave it. */
	uint64_t n = served(tgt);
	cr_assert_eq(n, 2 * NG);
	for (uint32_t k = 0; k < NG; k++) {
		struct kvx_xport_op r = {.lmr = lmr, .rmr = rr[k], .loff = (uint64_t)k * 2 * LEN,
					 .roff = (uint64_t)k * 2 * LEN, .len = 4096};
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_READ, &r, 1, 3), 0);
		struct kvx_xport_cpl c;
		for (int i = 0; i < 200; i++) {
			for (uint32_t g = 0; g < NG; g++)
				if (g != k)
					(void)kvx_xport_progress_group(tgt, g);
			cr_assert_eq(kvx_xport_poll_burst(iep[k], &c, 1), 0,
				     "endpoint %u served by a group that does not own it", k);
		}
		cr_assert_eq(served(tgt), n);
		c = drive(tgt, 1u << k, iep[k]);
		cr_assert_eq(c.status, 0);
		cr_assert_eq(c.cookie, 3);
		cr_assert_eq(served(tgt), ++n);
	}
	for (uint32_t k = 0; k < NG; k++) {
		kvx_xport_ep_destroy(iep[k]);
		kvx_xport_ep_destroy(tep[k]);
	}
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(tmem);
	free(imem);
}

Test(transport_tcp_groups, a_destroyed_endpoint_is_served_by_no_later_call_of_its_group, .timeout = 120)
{
	struct kvx_xport_ctx *tgt = open_ctx(2), *ini = open_ctx(1);
	uint8_t *tmem = malloc(LEN), *imem = calloc(1, LEN);
	memset(tmem, 0x5a, LEN);
	struct kvx_xport_mr *tmr = reg(tgt, tmem, LEN), *lmr = reg(ini, imem, LEN);
	struct kvx_xport_ep *iep[2], *tep[2];
	struct kvx_xport_rmr *rr[2];
	for (int k = 0; k < 2; k++)
		rr[k] = connect_import(ini, tgt, tmr, (uint32_t)k, &iep[k], &tep[k]);
	struct kvx_xport_op op[2];
	for (int k = 0; k < 2; k++) {
		op[k] = (struct kvx_xport_op){.lmr = lmr, .rmr = rr[k], .len = 4096};
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_READ, &op[k], 1, 1), 0);
		cr_assert_eq(drive(tgt, 3, iep[k]).status, 0);
	}
	/* Endpoint 1 is group 1's now (its READ was answered; group 0 hands over before it
	 * serves). Its next request waits in the socket when the endpoint is destroyed. */
	uint64_t before = served(tgt);
	cr_assert_eq(kvx_xport_post_bulk(iep[1], KVX_XPORT_OP_READ, &op[1], 1, 2), 0);
	kvx_xport_ep_destroy(tep[1]);
	struct kvx_xport_cpl c = drive(tgt, 1u << 1, iep[1]);
	cr_assert_eq(c.status, -ECONNRESET, "status %d", c.status);
	cr_assert_eq(served(tgt), before, "a request was served after the destroy");
	/* Group 0's endpoint is untouched. */
	cr_assert_eq(kvx_xport_post_bulk(iep[0], KVX_XPORT_OP_READ, &op[0], 1, 3), 0);
	c = drive(tgt, 1u, iep[0]);
	cr_assert_eq(c.status, 0);
	cr_assert_eq(served(tgt), before + 1);
	kvx_xport_ep_destroy(iep[0]);
	kvx_xport_ep_destroy(iep[1]);
	kvx_xport_ep_destroy(tep[0]);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(tmem);
	free(imem);
}

Test(transport_tcp_groups, close_frees_an_endpoint_still_in_a_group_inbox, .timeout = 120)
{
	struct kvx_xport_ctx *tgt = open_ctx(2), *ini = open_ctx(1);
	uint8_t *tmem = calloc(1, 4096), *imem = calloc(1, 4096);
	struct kvx_xport_mr *tmr = reg(tgt, tmem, 4096);
	(void)reg(ini, imem, 4096);
	struct kvx_xport_ep *iep[2], *tep[2];
	for (int k = 0; k < 2; k++)
		(void)connect_import(ini, tgt, tmr, (uint32_t)k, &iep[k], &tep[k]);
	/* Only group 0 runs: it checks both hellos and hands endpoint 1 over, which rings group
	 * 1's wait fd; group 1 never takes it. */
	struct pollfd pf = {.fd = kvx_xport_group_wait_fd(tgt, 1), .events = POLLIN};
	uint64_t deadline = kvx_now_ns() + 30000000000ull;
	while (poll(&pf, 1, 0) == 0) {
		(void)kvx_xport_progress(tgt);
		cr_assert_lt(kvx_now_ns(), deadline, "endpoint 1 never handed to group 1");
	}
	/* kvx_xport_close() destroys the endpoints and frees what the groups hold (leaks show in
	 * the ASan build). */
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	free(tmem);
	free(imem);
}

/* Device memory (the hostdev mock) is staged by each group's own bounce buffers: group 1 got its
 * endpoint before the context's first device region (staging made with the region), group 2
 * after it (staging made when the endpoint was put in the group). */
Test(transport_tcp_groups, device_regions_are_staged_by_the_group_that_serves_them, .timeout = 120)
{
	enum { DLEN = 256 << 10 };
	struct kvx_mem_type t = {.kind = KVX_MEM_HOSTDEV};
	struct kvx_mem *m = NULL;
	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	struct kvx_xport_ctx_params prm;
	kvx_xport_ctx_params_init(&prm);
	prm.progress_groups = 3;
	prm.chunk_bytes = 16384; /* several bounce-buffer pieces per request */
	struct kvx_xport_ctx *tgt = NULL, *ini = open_ctx(1);
	cr_assert_eq(kvx_xport_open("tcp", &prm, &tgt), 0);
	uint8_t a[KVX_XPORT_BLOB_MAX], b[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al, bl;
	struct kvx_xport_ep *iep[2], *tep[2];
	uint8_t *dev = NULL, *host = malloc(DLEN), *imem = calloc(1, 2 * DLEN);
	cr_assert_eq(kvx_mem_alloc(m, DLEN, (void **)&dev), 0);
	for (size_t i = 0; i < DLEN; i++)
		host[i] = (uint8_t)(i * 29 + i / 8191);
	cr_assert_eq(kvx_mem_copy_sync(m, dev, host, DLEN, KVX_MEM_H2D), 0);
	struct kvx_xport_mr_params mp = {.addr = dev, .len_bytes = DLEN, .access = KVX_XPORT_ACCESS_ALL,
					 .mem_type = KVX_XPORT_MEM_HOSTDEV};
	struct kvx_xport_mr *tmr = NULL, *lmr = reg(ini, imem, 2 * DLEN);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(kvx_xport_ep_create(ini, &iep[k], a, sizeof(a), &al), 0);
		cr_assert_eq(kvx_xport_ep_accept(tgt, a, al, &tep[k], b, sizeof(b), &bl), 0);
		cr_assert_eq(kvx_xport_ep_set_group(tep[k], (uint32_t)k + 1), 0);
		cr_assert_eq(kvx_xport_ep_connect(iep[k], b, bl), 0);
		/* The context's only device region, after endpoint 0 went to group 1 and before
		 * endpoint 1 goes to group 2. */
		if (k == 0)
			cr_assert_eq(kvx_xport_mr_register(tgt, &mp, &tmr), 0);
	}
	cr_assert_eq(kvx_xport_mr_export(tmr, d, sizeof(d), NULL), 0);
	/* Each endpoint READs the whole region; then each WRITEs its half back with new bytes. */
	struct kvx_xport_rmr *rr[2];
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(kvx_xport_rmr_import(iep[k], d, sizeof(d), &rr[k]), 0);
		struct kvx_xport_op r = {.lmr = lmr, .rmr = rr[k], .loff = (uint64_t)k * DLEN, .len = DLEN};
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_READ, &r, 1, 1), 0);
		struct kvx_xport_cpl c = drive(tgt, 7u, iep[k]);
		cr_assert_eq(c.status, 0, "endpoint %d READ: %d", k, c.status);
		cr_assert_arr_eq(imem + (size_t)k * DLEN, host, DLEN, "endpoint %d READ bytes", k);
	}
	for (int k = 0; k < 2; k++) {
		memset(imem + (size_t)k * DLEN, 0xc0 + k, DLEN / 2);
		struct kvx_xport_op w = {.lmr = lmr, .rmr = rr[k], .loff = (uint64_t)k * DLEN,
					 .roff = (uint64_t)k * (DLEN / 2), .len = DLEN / 2};
		cr_assert_eq(kvx_xport_post_bulk(iep[k], KVX_XPORT_OP_WRITE, &w, 1, 2), 0);
		struct kvx_xport_cpl c = drive(tgt, 7u, iep[k]);
		cr_assert_eq(c.status, 0, "endpoint %d WRITE: %d", k, c.status);
	}
	cr_assert_eq(kvx_mem_copy_sync(m, host, dev, DLEN, KVX_MEM_D2H), 0);
	for (size_t i = 0; i < DLEN; i++)
		cr_assert_eq(host[i], i < DLEN / 2 ? 0xc0 : 0xc1, "device byte %zu", i);
	for (int k = 0; k < 2; k++) {
		kvx_xport_ep_destroy(iep[k]);
		kvx_xport_ep_destroy(tep[k]);
	}
	for (int i = 0; i < 4; i++)
		for (uint32_t g = 0; g < 3; g++)
			(void)kvx_xport_progress_group(tgt, g);
	kvx_xport_close(tgt);
	kvx_xport_close(ini);
	kvx_mem_free(m, dev);
	kvx_mem_close(m);
	free(host);
	free(imem);
}
