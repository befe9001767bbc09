/* SPDX-License-Identifier: Apache-2.0 */
/* Timer heap: order, arm/cancel/re-arm, callbacks that re-arm, many timers, poll timeout. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "kvxfer/lcore.h"

TestSuite(timer, .timeout = 30.0);

struct rec {
	uint64_t order[4096];
	unsigned n;
};

struct tctx {
	struct rec *rec;
	uint64_t id;
	struct kvx_timer_heap *h;
	int rearm_times;
	uint64_t rearm_at;
	struct kvx_timer *cancel_other;
};

static void record(struct kvx_timer *t, void *arg)
{
	struct tctx *c = arg;
	c->rec->order[c->rec->n++] = c->id;
	if (c->cancel_other)
		kvx_timer_cancel(c->h, c->cancel_other);
	if (c->rearm_times > 0) {
		c->rearm_times--;
		cr_assert_eq(kvx_timer_arm(c->h, t, c->rearm_at), 0);
	}
}

Test(timer, runs_expired_in_deadline_order_fifo_on_ties)
{
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(2, &h), 0); /* small: forces growth */
	struct rec rec = {0};
	struct kvx_timer t[6];
	struct tctx c[6];
	const uint64_t dl[6] = {50, 10, 30, 10, 70, 20};
	for (int i = 0; i < 6; i++) {
		c[i] = (struct tctx){.rec = &rec, .id = (uint64_t)i, .h = h};
		kvx_timer_init(&t[i], record, &c[i]);
		cr_assert_not(kvx_timer_is_armed(&t[i]));
		cr_assert_eq(kvx_timer_arm(h, &t[i], dl[i]), 0);
	}
	cr_assert_eq(kvx_timer_heap_count(h), 6);
	cr_assert_eq(kvx_timer_heap_next_ns(h), 10);
	cr_assert_eq(kvx_timer_heap_run(h, 9), 0);
	cr_assert_eq(kvx_timer_heap_run(h, 30), 4);
	const uint64_t want[4] = {1, 3, 5, 2};
	cr_assert_arr_eq(rec.order, want, sizeof(want));
	cr_assert_eq(kvx_timer_heap_next_ns(h), 50);
	cr_assert(kvx_timer_is_armed(&t[0]));
	cr_assert_not(kvx_timer_is_armed(&t[1]));
	kvx_timer_heap_destroy(h);
	cr_assert_not(kvx_timer_is_armed(&t[0]), "destroy disarms");
}

Test(timer, cancel_and_rearm)
{
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct rec rec = {0};
	struct kvx_timer a, b;
	struct tctx ca = {.rec = &rec, .id = 1, .h = h}, cb = {.rec = &rec, .id = 2, .h = h};
	kvx_timer_init(&a, record, &ca);
	kvx_timer_init(&b, record, &cb);
	cr_assert_not(kvx_timer_cancel(h, &a), "not armed");
	cr_assert_eq(kvx_timer_arm(h, &a, 100), 0);
	cr_assert_eq(kvx_timer_arm(h, &b, 200), 0);
	cr_assert_eq(kvx_timer_arm(h, &a, 300), 0, "re-arm moves it");
	cr_assert_eq(kvx_timer_heap_count(h), 2);
	cr_assert_eq(kvx_timer_heap_next_ns(h), 200);
	cr_assert(kvx_timer_cancel(h, &b));
	cr_assert_not(kvx_timer_cancel(h, &b));
	cr_assert_eq(kvx_timer_heap_run(h, 1000), 1);
	cr_assert_eq(rec.n, 1);
	cr_assert_eq(rec.order[0], 1);
	cr_assert_eq(kvx_timer_heap_next_ns(h), UINT64_MAX);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 0), -1);
	kvx_timer_heap_destroy(h);
}

Test(timer, callback_rearming_in_the_past_runs_next_call_only)
{
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct rec rec = {0};
	struct kvx_timer a, b;
	struct tctx ca = {.rec = &rec, .id = 1, .h = h, .rearm_times = 3, .rearm_at = 0};
	struct tctx cb = {.rec = &rec, .id = 2, .h = h};
	kvx_timer_init(&a, record, &ca);
	kvx_timer_init(&b, record, &cb);
	cr_assert_eq(kvx_timer_arm(h, &a, 10), 0);
	cr_assert_eq(kvx_timer_arm(h, &b, 20), 0);
	cr_assert_eq(kvx_timer_heap_run(h, 100), 2, "a once (its re-arm waits), then b");
	cr_assert_eq(rec.order[0], 1);
	cr_assert_eq(rec.order[1], 2);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 100), 0, "due now");
	cr_assert_eq(kvx_timer_heap_run(h, 100), 1);
	cr_assert_eq(kvx_timer_heap_run(h, 100), 1);
	cr_assert_eq(kvx_timer_heap_run(h, 100), 1);
	cr_assert_eq(kvx_timer_heap_run(h, 100), 0, "re-armed 3 times only");
	kvx_timer_heap_destroy(h);
}

Test(timer, callback_may_cancel_another_due_timer)
{
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct rec rec = {0};
	struct kvx_timer a, b;
	struct tctx ca = {.rec = &rec, .id = 1, .h = h, .cancel_other = &b};
	struct tctx cb = {.rec = &rec, .id = 2, .h = h};
	kvx_timer_init(&a, record, &ca);
	kvx_timer_init(&b, record, &cb);
	kvx_timer_arm(h, &a, 1);
	kvx_timer_arm(h, &b, 2);
	cr_assert_eq(kvx_timer_heap_run(h, 5), 1);
	cr_assert_eq(rec.n, 1);
	kvx_timer_heap_destroy(h);
}

Test(timer, timeout_ms_rounds_up)
{
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct kvx_timer a;
	struct rec rec = {0};
	struct tctx ca = {.rec = &rec, .h = h};
	kvx_timer_init(&a, record, &ca);
	kvx_timer_arm(h, &a, 5000001);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 0), 6);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 4000001), 1);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 5000001), 0);
	kvx_timer_arm(h, &a, UINT64_MAX - 1);
	cr_assert_eq(kvx_timer_heap_timeout_ms(h, 0), INT32_MAX);
	kvx_timer_heap_destroy(h);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct many {
	uint64_t *fired;
	unsigned n;
};

static void many_cb(struct kvx_timer *t, void *arg)
{
	struct many *m = arg;
	m->fired[m->n++] = t->deadline_ns;
}

Test(timer, many_timers_with_random_cancels_fire_sorted)
{
	enum { N = 20000 };
	struct kvx_timer_heap *h;
	cr_assert_eq(kvx_timer_heap_create(0, &h), 0);
	struct kvx_timer *t = calloc(N, sizeof(*t));
	struct many m = {.fired = calloc(N, sizeof(uint64_t))};
	uint64_t x = 88172645463325252ull;
	unsigned live = 0;
	for (unsigned i = 0; i < N; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		kvx_timer_init(&t[i], many_cb, &m);
		cr_assert_eq(kvx_timer_arm(h, &t[i], x % 1000000), 0);
	}
	uint64_t *want = calloc(N, sizeof(*want));
	for (unsigned i = 0; i < N; i++) {
		if (i % 3 == 0)
			cr_assert(kvx_timer_cancel(h, &t[i]));
		else if (i % 3 == 1)
			cr_assert_eq(kvx_timer_arm(h, &t[i], t[i].deadline_ns / 2), 0);
	}
	for (unsigned i = 0; i < N; i++)
		if (kvx_timer_is_armed(&t[i]))
			want[live++] = t[i].deadline_ns;
	cr_assert_eq(kvx_timer_heap_count(h), live);
	qsort(want, live, sizeof(*want), cmp_u64);
	unsigned ran = 0;
	for (uint64_t now = 0; now <= 1000000; now += 50000)
		ran += kvx_timer_heap_run(h, now);
	cr_assert_eq(ran, live);
	cr_assert_arr_eq(m.fired, want, live * sizeof(uint64_t), "fired in deadline order");
	cr_assert_eq(kvx_timer_heap_count(h), 0);
	free(t);
	free(m.fired);
	free(want);
	kvx_timer_heap_destroy(h);
}
