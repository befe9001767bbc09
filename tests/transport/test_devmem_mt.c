/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Threads around device staging (tcp) and device mappings (shm), in one process so that it also
 * runs under TSan (Criterion cannot start there: tests/lcore/tsan_runner.h): the target's
 * progress runs on its own thread and the initiator's poller on another while the control
 * thread registers device regions on both contexts and imports them, i.e. while the providers
 * publish their staging (tcp) or stream (shm) to threads already driving the context or the
 * endpoint. Memory is the hostdev mock; bytes are checked exactly.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVX_TSAN_RUNNER
#include "tests/lcore/tsan_runner.h"
#else
#include <criterion/criterion.h>
#endif

#include "kvxfer/mem.h"
#include "kvxfer/transport.h"

#define LEN ((uint64_t)(2u << 20) + 4099)

TestSuite(xport_devmem_mt, .timeout = 120);

struct shared {
	struct kvx_xport_ctx *target;
	struct kvx_xport_ep *ep;
	_Atomic int stop;
	_Atomic int go; /* control -> poller: lmr/rmr below are ready (release/acquire) */
	struct kvx_xport_mr *lmr;
	struct kvx_xport_rmr *rmr;
	int read_status, write_status;
};

static void fill(uint8_t *p, uint64_t n, uint32_t seed)
{
	for (uint64_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
}

static void *progress_main(void *arg)
{
	struct shared *s = arg;
	while (!atomic_load_explicit(&s->stop, memory_order_acquire))
		(void)kvx_xport_progress(s->target);
	return NULL;
}

static int run_op(struct kvx_xport_ep *ep, enum kvx_xport_opcode opc, struct kvx_xport_mr *l,
		  struct kvx_xport_rmr *r, uint64_t cookie)
{
	struct kvx_xport_op op = {.lmr = l, .rmr = r, .loff = 0, .roff = 0, .len = LEN};
	struct kvx_xport_cpl c;
	uint64_t deadline = kvx_now_ns() + 60000000000ull;
	if (kvx_xport_post_bulk(ep, opc, &op, 1, cookie))
		return -EIO;
	while (kvx_xport_poll_burst(ep, &c, 1) == 0)
		if (kvx_now_ns() > deadline)
			return -ETIMEDOUT;
	return c.cookie == cookie ? c.status : -EPROTO;
}

/* The endpoint's poller: drives the endpoint before the regions exist, then moves them. */
static void *poller_main(void *arg)
{
	struct shared *s = arg;
	while (!atomic_load_explicit(&s->go, memory_order_acquire))
		(void)kvx_xport_poll_burst(s->ep, NULL, 0);
	s->read_status = run_op(s->ep, KVX_XPORT_OP_READ, s->lmr, s->rmr, 1);
	s->write_status = run_op(s->ep, KVX_XPORT_OP_WRITE, s->lmr, s->rmr, 2);
	return NULL;
}

static struct kvx_xport_mr *reg(struct kvx_xport_ctx *ctx, void *p)
{
	struct kvx_xport_mr_params mp = {.addr = p, .len_bytes = LEN,
					 .access = KVX_XPORT_ACCESS_ALL,
					 .mem_type = KVX_XPORT_MEM_HOSTDEV};
	struct kvx_xport_mr *mr = NULL;
	cr_assert_eq(kvx_xport_mr_register(ctx, &mp, &mr), 0);
	return mr;
}

static void run(const char *provider)
{
	struct kvx_mem_type t = {.kind = KVX_MEM_HOSTDEV};
	struct kvx_mem *m = NULL;
	struct kvx_xport_ctx_params tp, ip;
	struct shared s;
	uint8_t *rdev, *ldev, *a = malloc(LEN), *b = malloc(LEN), *got = malloc(LEN);
	uint8_t ba[KVX_XPORT_BLOB_MAX], bb[KVX_XPORT_BLOB_MAX], d[KVX_XPORT_RDESC_BYTES];
	size_t al = 0, bl = 0;
	pthread_t prog, pol;

	if (kvx_xport_provider_probe(provider, NULL, 0))
		cr_skip_test("%s unavailable here", provider);
	memset(&s, 0, sizeof(s));
	cr_assert_eq(kvx_mem_open(&t, &m), 0);
	kvx_xport_ctx_params_init(&tp);
	kvx_xport_ctx_params_init(&ip);
	tp.chunk_bytes = 16384; /* target pieces smaller than the initiator's chunks */
	ip.chunk_bytes = 65536;
	cr_assert_eq(kvx_xport_open(provider, &tp, &s.target), 0);
	struct kvx_xport_ctx *ini = NULL;
	cr_assert_eq(kvx_xport_open(provider, &ip, &ini), 0);
	cr_assert_eq(pthread_create(&prog, NULL, progress_main, &s), 0);
	struct kvx_xport_ep *tep = NULL;
	cr_assert_eq(kvx_xport_ep_create(ini, &s.ep, ba, sizeof(ba), &al), 0);
	cr_assert_eq(kvx_xport_ep_accept(s.target, ba, al, &tep, bb, sizeof(bb), &bl), 0);
	cr_assert_eq(kvx_xport_ep_connect(s.ep, bb, bl), 0);
	cr_assert_eq(pthread_create(&pol, NULL, poller_main, &s), 0);
	/* Device regions appear while both threads run. */
	cr_assert_eq(kvx_mem_alloc(m, LEN, (void **)&rdev), 0);
	cr_assert_eq(kvx_mem_alloc(m, LEN, (void **)&ldev), 0);
	fill(a, LEN, 1);
	fill(b, LEN, 2);
	cr_assert_eq(kvx_mem_copy_sync(m, rdev, a, LEN, KVX_MEM_H2D), 0);
	struct kvx_xport_mr *rmr = reg(s.target, rdev);
	cr_assert_eq(kvx_xport_mr_export(rmr, d, sizeof(d), NULL), 0);
	s.lmr = reg(ini, ldev);
	cr_assert_eq(kvx_xport_rmr_import(s.ep, d, sizeof(d), &s.rmr), 0);
	/* READ fills ldev with a; then the poller WRITEs ldev back, which we set to b first. */
	atomic_store_explicit(&s.go, 1, memory_order_release);
	cr_assert_eq(pthread_join(pol, NULL), 0);
	cr_assert_eq(s.read_status, 0);
	cr_assert_eq(s.write_status, 0);
	cr_assert_eq(kvx_mem_copy_sync(m, got, ldev, LEN, KVX_MEM_D2H), 0);
	cr_assert_arr_eq(got, a, LEN);
	/* Second round with new bytes, posted from this thread now that the poller is gone. */
	cr_assert_eq(kvx_mem_copy_sync(m, ldev, b, LEN, KVX_MEM_H2D), 0);
	cr_assert_eq(run_op(s.ep, KVX_XPORT_OP_WRITE, s.lmr, s.rmr, 3), 0);
	atomic_store_explicit(&s.stop, 1, memory_order_release);
	cr_assert_eq(pthread_join(prog, NULL), 0);
	cr_assert_eq(kvx_mem_copy_sync(m, got, rdev, LEN, KVX_MEM_D2H), 0);
	cr_assert_arr_eq(got, b, LEN);
	kvx_xport_close(ini);
	kvx_xport_close(s.target);
	kvx_mem_free(m, rdev);
	kvx_mem_free(m, ldev);
	kvx_mem_close(m);
	free(a);
	free(b);
	free(got);
}

Test(xport_devmem_mt, tcp_staging_published_to_running_progress_and_poller)
{
	run("tcp");
}

Test(xport_devmem_mt, shm_stream_published_to_running_poller)
{
	run("shm");
}
