/* SPDX-License-Identifier: Apache-2.0 */
/* Rings: boundaries, wrap near UINT32_MAX, content integrity, MPMC conservation under stress. */
#ifdef KVX_TSAN_RUNNER
#include "tsan_runner.h" /* Criterion cannot start under TSan: see that header */
#else
#include <criterion/criterion.h>
#endif
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "kvxfer/lcore.h"
#include "lcore/lcore_internal.h"

TestSuite(ring, .timeout = 30.0);
TestSuite(ring_stress, .timeout = 120.0);

static struct kvx_ring *mk(uint32_t count, uint32_t esize, unsigned flags)
{
	struct kvx_ring_params p = {.name = "t", .count = count, .elem_size = esize, .flags = flags};
	struct kvx_ring *r = NULL;
	int rc = kvx_ring_create(&p, &r);
	cr_assert_eq(rc, 0, "create count=%u esize=%u: %s", count, esize, kvx_strerror(rc));
	return r;
}

Test(ring, create_rejects_bad_params)
{
	struct kvx_ring *r = (struct kvx_ring *)0x1;
	struct kvx_ring_params p = {.count = 100};
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL); /* not a power of two */
	p.count = 0;
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL);
	p.count = 64;
	p.elem_size = 6; /* not a multiple of 4 */
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL);
	p.elem_size = 2048;
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL);
	p.elem_size = 0;
	p.flags = 0x80;
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL);
	p.flags = 0;
	p.count = (1u << 31) + 1;
	cr_assert_eq(kvx_ring_create(&p, &r), -EINVAL);
	cr_assert_eq(r, (struct kvx_ring *)0x1, "out untouched on error");
	kvx_ring_destroy(NULL);
}

Test(ring, exact_size_capacity_is_the_request)
{
	struct kvx_ring *r = mk(100, 0, KVX_RING_F_EXACT_SZ);
	cr_assert_eq(kvx_ring_capacity(r), 100);
	void *objs[128];
	for (int i = 0; i < 128; i++)
		objs[i] = (void *)(uintptr_t)(i + 1);
	unsigned fs = 99;
	cr_assert_eq(kvx_ring_enqueue_burst_sp(r, objs, 128, &fs), 100);
	cr_assert_eq(fs, 0);
	cr_assert(kvx_ring_is_full(r));
	kvx_ring_destroy(r);
}

Test(ring, empty_dequeue_returns_zero_and_eagain)
{
	struct kvx_ring *r = mk(8, 0, 0);
	void *o[4];
	unsigned avail = 77;
	cr_assert(kvx_ring_is_empty(r));
	cr_assert_eq(kvx_ring_dequeue_burst_sc(r, o, 4, &avail), 0);
	cr_assert_eq(avail, 0);
	cr_assert_eq(kvx_ring_dequeue_burst_mc(r, o, 4, NULL), 0);
	cr_assert_eq(kvx_ring_dequeue_bulk_sc(r, o, 1, NULL), 0);
	void *one = (void *)0x5;
	cr_assert_eq(kvx_ring_dequeue_sc(r, &one), -EAGAIN);
	cr_assert_eq(kvx_ring_dequeue_mc(r, &one), -EAGAIN);
	cr_assert_eq(one, (void *)0x5, "output untouched when empty");
	kvx_ring_destroy(r);
}

Test(ring, full_enqueue_returns_zero_and_enobufs)
{
	struct kvx_ring *r = mk(8, 0, 0);
	void *o[8] = {0};
	for (int i = 0; i < 8; i++)
		o[i] = (void *)(uintptr_t)(0x100 + i);
	unsigned fs;
	cr_assert_eq(kvx_ring_enqueue_bulk_sp(r, o, 8, &fs), 8, "capacity is count (8), not count-1");
	cr_assert_eq(fs, 0);
	cr_assert(kvx_ring_is_full(r));
	cr_assert_eq(kvx_ring_count(r), 8);
	cr_assert_eq(kvx_ring_free_count(r), 0);
	cr_assert_eq(kvx_ring_enqueue_burst_sp(r, o, 1, &fs), 0);
	cr_assert_eq(kvx_ring_enqueue_burst_mp(r, o, 1, NULL), 0);
	cr_assert_eq(kvx_ring_enqueue_sp(r, o[0]), -ENOBUFS);
	cr_assert_eq(kvx_ring_enqueue_mp(r, o[0]), -ENOBUFS);
	void *out[8];
	cr_assert_eq(kvx_ring_dequeue_burst_sc(r, out, 8, NULL), 8);
	cr_assert_arr_eq(out, o, sizeof(o));
	kvx_ring_destroy(r);
}

Test(ring, bulk_is_all_or_nothing_burst_is_best_effort)
{
	struct kvx_ring *r = mk(16, 0, 0);
	void *o[16];
	for (int i = 0; i < 16; i++)
		o[i] = (void *)(uintptr_t)(i + 1);
	unsigned fs, av;
	cr_assert_eq(kvx_ring_enqueue_bulk_sp(r, o, 10, &fs), 10);
	cr_assert_eq(fs, 6);
	cr_assert_eq(kvx_ring_enqueue_bulk_sp(r, o, 7, &fs), 0, "7 > 6 free: bulk enqueues nothing");
	cr_assert_eq(fs, 6);
	cr_assert_eq(kvx_ring_enqueue_bulk_mp(r, o, 7, &fs), 0);
	cr_assert_eq(kvx_ring_count(r), 10);
	cr_assert_eq(kvx_ring_enqueue_burst_mp(r, o + 10, 7, &fs), 6, "burst takes what fits");
	cr_assert_eq(fs, 0);
	void *out[16];
	cr_assert_eq(kvx_ring_dequeue_bulk_sc(r, out, 17 - 1, &av), 16);
	cr_assert_eq(av, 0);
	for (int i = 0; i < 16; i++)
		cr_assert_eq(out[i], o[i], "FIFO at %d", i);
	cr_assert_eq(kvx_ring_enqueue_bulk_sp(r, o, 3, NULL), 3);
	cr_assert_eq(kvx_ring_dequeue_bulk_mc(r, out, 4, &av), 0, "4 > 3 entries: bulk takes nothing");
	cr_assert_eq(av, 3);
	cr_assert_eq(kvx_ring_dequeue_burst_mc(r, out, 4, &av), 3);
	cr_assert_eq(av, 0);
	kvx_ring_destroy(r);
}

Test(ring, pointer_ops_on_element_ring_do_nothing)
{
	struct kvx_ring *r = mk(8, 64, 0);
	void *o[2] = {(void *)1, (void *)2};
	unsigned fs = 5;
	cr_assert_eq(kvx_ring_enqueue_burst_sp(r, o, 2, &fs), 0);
	cr_assert_eq(fs, 0);
	cr_assert_eq(kvx_ring_count(r), 0);
	cr_assert_eq(kvx_ring_elem_size(r), 64);
	kvx_ring_destroy(r);
}

/* 64-byte descriptor with a per-element pattern (as DPDK's check_updt_elem). */
struct desc {
	uint64_t seq;
	uint64_t words[7];
};
static_assert(sizeof(struct desc) == 64, "descriptor is one cache line");

static void fill(struct desc *d, uint64_t seq)
{
	d->seq = seq;
	for (int i = 0; i < 7; i++)
		d->words[i] = seq * 0x9e3779b97f4a7c15ull + (uint64_t)i;
}

static bool check(const struct desc *d, uint64_t seq)
{
	if (d->seq != seq)
		return false;
	for (int i = 0; i < 7; i++)
		if (d->words[i] != seq * 0x9e3779b97f4a7c15ull + (uint64_t)i)
			return false;
	return true;
}

static void wrap_roundtrip(uint32_t start, bool mp, bool mc)
{
	struct kvx_ring *r = mk(64, sizeof(struct desc), 0);
	kvx_ring_debug_set_index(r, start);
	struct desc in[48], out[48];
	uint64_t next_in = 0, next_out = 0;
	/* 1000 rounds of 1..48 elements: indices cross 2^32 within the first rounds. */
	for (unsigned round = 0; round < 1000; round++) {
		unsigned n = 1 + (round * 7) % 48;
		for (unsigned i = 0; i < n; i++)
			fill(&in[i], next_in + i);
		unsigned got = mp ? kvx_ring_enqueue_elem_bulk_mp(r, in, n, NULL)
				  : kvx_ring_enqueue_elem_bulk_sp(r, in, n, NULL);
		cr_assert_eq(got, n, "round %u enqueue %u at start %u", round, n, start);
		next_in += n;
		cr_assert_eq(kvx_ring_count(r), n);
		unsigned deq = mc ? kvx_ring_dequeue_elem_burst_mc(r, out, 48, NULL)
				  : kvx_ring_dequeue_elem_burst_sc(r, out, 48, NULL);
		cr_assert_eq(deq, n);
		for (unsigned i = 0; i < deq; i++)
			cr_assert(check(&out[i], next_out + i), "round %u element %u corrupted", round, i);
		next_out += deq;
	}
	cr_assert_eq(atomic_load(&r->prod.tail), start + (uint32_t)next_in, "index wrapped modulo 2^32");
	cr_assert_lt(atomic_load(&r->prod.tail), start, "the run crossed UINT32_MAX");
	kvx_ring_destroy(r);
}

Test(ring, index_wrap_near_uint32_max_keeps_fifo_sp_sc)
{
	wrap_roundtrip(UINT32_MAX - 100, false, false);
}

Test(ring, index_wrap_near_uint32_max_keeps_fifo_mp_mc)
{
	wrap_roundtrip(UINT32_MAX - 5, true, true);
}

Test(ring, full_and_empty_exact_at_wrap)
{
	struct kvx_ring *r = mk(32, 0, 0);
	kvx_ring_debug_set_index(r, UINT32_MAX - 10);
	void *o[32];
	for (int i = 0; i < 32; i++)
		o[i] = (void *)(uintptr_t)(i + 100);
	unsigned fs;
	cr_assert_eq(kvx_ring_enqueue_burst_sp(r, o, 32, &fs), 32);
	cr_assert_eq(fs, 0);
	cr_assert_eq(kvx_ring_count(r), 32, "count across the wrap");
	cr_assert_eq(kvx_ring_enqueue_sp(r, o[0]), -ENOBUFS);
	void *got[32];
	unsigned av;
	cr_assert_eq(kvx_ring_dequeue_burst_sc(r, got, 32, &av), 32);
	cr_assert_eq(av, 0);
	cr_assert_arr_eq(got, o, sizeof(o));
	cr_assert_eq(kvx_ring_dequeue_sc(r, &got[0]), -EAGAIN);
	kvx_ring_destroy(r);
}

Test(ring, element_content_integrity_with_partial_slots)
{
	struct kvx_ring *r = mk(16, 12, 0); /* 12-byte elements: no power-of-two size */
	uint32_t in[3 * 16], out[3 * 16];
	uint32_t seq = 0, chk = 0;
	for (int round = 0; round < 200; round++) {
		unsigned n = 1 + (unsigned)round % 16;
		for (unsigned i = 0; i < 3 * n; i++)
			in[i] = seq * 3 + i;
		cr_assert_eq(kvx_ring_enqueue_elem_burst_sp(r, in, n, NULL), n);
		seq += n;
		unsigned d = kvx_ring_dequeue_elem_bulk_sc(r, out, n, NULL);
		cr_assert_eq(d, n);
		for (unsigned i = 0; i < 3 * n; i++)
			cr_assert_eq(out[i], chk * 3 + i, "round %d word %u", round, i);
		chk += n;
	}
	kvx_ring_destroy(r);
}

/* ---- multi-threaded conservation ----------------------------------------------------------- */

#define STRESS_PRODUCERS 3
#define STRESS_CONSUMERS 3
#define STRESS_PER_PRODUCER 60000u

struct stress {
	struct kvx_ring *r;
	_Atomic bool stop;
	_Atomic uint64_t enq[STRESS_PRODUCERS];
	_Atomic uint64_t deq_count;
	_Atomic uint64_t deq_sum;
	_Atomic uint64_t bad;
	_Atomic unsigned producers_done;
	/* last sequence seen per producer, per consumer: FIFO per producer within one consumer */
};

struct pctx {
	struct stress *s;
	unsigned id;
};

static void *producer(void *p)
{
	struct pctx *c = p;
	struct stress *s = c->s;
	struct desc batch[8];
	uint64_t i = 0;
	while (i < STRESS_PER_PRODUCER) {
		unsigned n = 1 + (unsigned)(i % 8);
		if (n > STRESS_PER_PRODUCER - i)
			n = (unsigned)(STRESS_PER_PRODUCER - i);
		for (unsigned k = 0; k < n; k++)
			fill(&batch[k], ((uint64_t)c->id << 32) | (i + k));
		unsigned got = (i & 1) ? kvx_ring_enqueue_elem_burst_mp(s->r, batch, n, NULL)
				       : kvx_ring_enqueue_elem_bulk_mp(s->r, batch, n, NULL);
		i += got;
		if (!got)
			sched_yield(); /* ring full: let a consumer run (2-CPU machine) */
	}
	atomic_store(&s->enq[c->id], i);
	atomic_fetch_add(&s->producers_done, 1);
	return NULL;
}

static void *consumer(void *p)
{
	struct pctx *c = p;
	struct stress *s = c->s;
	struct desc batch[8];
	uint64_t last[STRESS_PRODUCERS];
	memset(last, 0xff, sizeof(last));
	for (;;) {
		unsigned n = (c->id & 1) ? kvx_ring_dequeue_elem_burst_mc(s->r, batch, 8, NULL)
					 : kvx_ring_dequeue_elem_bulk_mc(s->r, batch, 4, NULL);
		if (!n) {
			if (atomic_load(&s->stop))
				break;
			sched_yield();
			continue;
		}
		uint64_t sum = 0;
		for (unsigned k = 0; k < n; k++) {
			uint64_t seq = batch[k].seq;
			unsigned prod = (unsigned)(seq >> 32);
			if (!check(&batch[k], seq) || prod >= STRESS_PRODUCERS ||
			    (last[prod] != UINT64_MAX && (seq & 0xffffffffu) <= last[prod])) {
				atomic_fetch_add(&s->bad, 1);
				continue;
			}
			last[prod] = seq & 0xffffffffu;
			sum += seq;
		}
		atomic_fetch_add(&s->deq_count, n);
		atomic_fetch_add(&s->deq_sum, sum);
	}
	return NULL;
}

Test(ring_stress, mpmc_conservation_enqueued_equals_dequeued_plus_drained)
{
	struct stress s = {0};
	s.r = mk(256, sizeof(struct desc), 0);
	kvx_ring_debug_set_index(s.r, UINT32_MAX - 1000); /* wrap during the stress as well */
	pthread_t pt[STRESS_PRODUCERS], ct[STRESS_CONSUMERS];
	struct pctx pc[STRESS_PRODUCERS], cc[STRESS_CONSUMERS];
	for (unsigned i = 0; i < STRESS_CONSUMERS; i++) {
		cc[i] = (struct pctx){&s, i};
		cr_assert_eq(pthread_create(&ct[i], NULL, consumer, &cc[i]), 0);
	}
	for (unsigned i = 0; i < STRESS_PRODUCERS; i++) {
		pc[i] = (struct pctx){&s, i};
		cr_assert_eq(pthread_create(&pt[i], NULL, producer, &pc[i]), 0);
	}
	for (unsigned i = 0; i < STRESS_PRODUCERS; i++)
		pthread_join(pt[i], NULL);
	atomic_store(&s.stop, true);
	for (unsigned i = 0; i < STRESS_CONSUMERS; i++)
		pthread_join(ct[i], NULL);
	/* Drain what the consumers left (they may stop with entries still queued). */
	uint64_t drained = 0, drained_sum = 0;
	struct desc d;
	while (kvx_ring_dequeue_elem_bulk_sc(s.r, &d, 1, NULL) == 1) {
		cr_assert(check(&d, d.seq));
		drained++;
		drained_sum += d.seq;
	}
	uint64_t enq = 0, want_sum = 0;
	for (unsigned p = 0; p < STRESS_PRODUCERS; p++) {
		enq += atomic_load(&s.enq[p]);
		for (uint64_t i = 0; i < STRESS_PER_PRODUCER; i++)
			want_sum += ((uint64_t)p << 32) | i;
	}
	cr_assert_eq(atomic_load(&s.bad), 0, "corrupted, foreign or reordered elements");
	cr_assert_eq(enq, (uint64_t)STRESS_PRODUCERS * STRESS_PER_PRODUCER);
	cr_assert_eq(enq, atomic_load(&s.deq_count) + drained, "enqueued == dequeued + drained");
	cr_assert_eq(want_sum, atomic_load(&s.deq_sum) + drained_sum, "every element exactly once");
	kvx_ring_destroy(s.r);
}

struct spsc {
	struct kvx_ring *r;
	uint64_t n;
	uint64_t bad;
};

static void *spsc_prod(void *p)
{
	struct spsc *s = p;
	void *b[32];
	uint64_t i = 0;
	while (i < s->n) {
		unsigned n = 1 + (unsigned)(i % 32);
		if (n > s->n - i)
			n = (unsigned)(s->n - i);
		for (unsigned k = 0; k < n; k++)
			b[k] = (void *)(uintptr_t)(i + k + 1);
		unsigned got = kvx_ring_enqueue_burst_sp(s->r, b, n, NULL);
		i += got;
		if (!got)
			sched_yield();
	}
	return NULL;
}

Test(ring_stress, spsc_pointer_fifo_under_concurrency)
{
	struct spsc s = {.r = mk(64, 0, 0), .n = 400000};
	kvx_ring_debug_set_index(s.r, UINT32_MAX - 7);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, spsc_prod, &s), 0);
	uint64_t expect = 1;
	void *b[32];
	while (expect <= s.n) {
		unsigned n = kvx_ring_dequeue_burst_sc(s.r, b, 32, NULL);
		if (!n) {
			sched_yield();
			continue;
		}
		for (unsigned k = 0; k < n; k++, expect++)
			if ((uintptr_t)b[k] != expect)
				s.bad++;
	}
	pthread_join(t, NULL);
	cr_assert_eq(s.bad, 0);
	cr_assert_eq(kvx_ring_dequeue_sc(s.r, &b[0]), -EAGAIN, "nothing extra");
	kvx_ring_destroy(s.r);
}
