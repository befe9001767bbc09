/* SPDX-License-Identifier: Apache-2.0 */
/* Timers for the control lcore: binary min-heap on (deadline, arm sequence), O(log n). */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "lcore_internal.h"

#define NOT_ARMED UINT32_MAX

struct kvx_timer_heap {
	struct kvx_timer **a; /* Array[cap]; a[0] is the earliest */
	uint32_t n;
	uint32_t cap;
	uint64_t seq;      /* arm counter */
	bool running;      /* inside kvx_timer_heap_run() */
	uint64_t run_now;  /* its now_ns */
};

static bool before(const struct kvx_timer *x, const struct kvx_timer *y)
{
	return x->deadline_ns < y->deadline_ns || (x->deadline_ns == y->deadline_ns && x->seq < y->seq);
}

static void place(struct kvx_timer_heap *h, uint32_t i, struct kvx_timer *t)
{
	h->a[i] = t;
	t->heap_idx = i;
}

static void sift_up(struct kvx_timer_heap *h, uint32_t i)
{
	struct kvx_timer *t = h->a[i];
	while (i > 0) {
		uint32_t p = (i - 1) / 2;
		if (!before(t, h->a[p]))
			break;
		place(h, i, h->a[p]);
		i = p;
	}
	place(h, i, t);
}

static void sift_down(struct kvx_timer_heap *h, uint32_t i)
{
	struct kvx_timer *t = h->a[i];
	for (;;) {
		uint32_t l = 2 * i + 1, m = i;
		const struct kvx_timer *best = t;
		if (l < h->n && before(h->a[l], best)) {
			m = l;
			best = h->a[l];
		}
		if (l + 1 < h->n && before(h->a[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		place(h, i, h->a[m]);
		i = m;
	}
	place(h, i, t);
}

static void remove_at(struct kvx_timer_heap *h, uint32_t i)
{
	struct kvx_timer *t = h->a[i];
	t->heap_idx = NOT_ARMED;
	h->n--;
	if (i == h->n)
		return;
	struct kvx_timer *last = h->a[h->n];
	place(h, i, last);
	if (i > 0 && before(last, h->a[(i - 1) / 2]))
		sift_up(h, i);
	else
		sift_down(h, i);
}

int kvx_timer_heap_create(uint32_t capacity_hint, struct kvx_timer_heap **out)
{
	struct kvx_timer_heap *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->cap = capacity_hint ? capacity_hint : 64;
	h->a = calloc(h->cap, sizeof(h->a[0]));
	if (!h->a) {
		free(h);
		return -ENOMEM;
	}
	*out = h;
	return 0;
}

void kvx_timer_heap_destroy(struct kvx_timer_heap *h)
{
	if (!h)
		return;
	for (uint32_t i = 0; i < h->n; i++)
		h->a[i]->heap_idx = NOT_ARMED;
	free(h->a);
	free(h);
}

void kvx_timer_init(struct kvx_timer *t, kvx_timer_fn fn, void *arg)
{
	t->deadline_ns = 0;
	t->seq = 0;
	t->heap_idx = NOT_ARMED;
	t->fn = fn;
	t->arg = arg;
}

int kvx_timer_arm(struct kvx_timer_heap *h, struct kvx_timer *t, uint64_t deadline_ns)
{
	if (t->heap_idx != NOT_ARMED)
		remove_at(h, t->heap_idx);
	if (h->n == h->cap) {
		if (h->cap > UINT32_MAX / 2)
			return -ENOMEM;
		struct kvx_timer **na = realloc(h->a, (size_t)h->cap * 2 * sizeof(h->a[0]));
		if (!na)
			return -ENOMEM;
		h->a = na;
		h->cap *= 2;
	}
	/* Armed from a callback with a past deadline: clamp to the run's now so that, with the
	 * newer sequence number, it sorts after every timer that was already due (see run). */
	if (h->running && deadline_ns < h->run_now)
		deadline_ns = h->run_now;
	t->deadline_ns = deadline_ns;
	t->seq = h->seq++;
	place(h, h->n++, t);
	sift_up(h, t->heap_idx);
	return 0;
}

bool kvx_timer_cancel(struct kvx_timer_heap *h, struct kvx_timer *t)
{
	if (t->heap_idx == NOT_ARMED || t->heap_idx >= h->n || h->a[t->heap_idx] != t)
		return false;
	remove_at(h, t->heap_idx);
	return true;
}

bool kvx_timer_is_armed(const struct kvx_timer *t)
{
	return t->heap_idx != NOT_ARMED;
}

unsigned kvx_timer_heap_run(struct kvx_timer_heap *h, uint64_t now_ns)
{
	unsigned ran = 0;
	uint64_t seq_limit = h->seq; /* timers armed during this run wait for the next one */
	h->running = true;
	h->run_now = now_ns;
	while (h->n && h->a[0]->deadline_ns <= now_ns && h->a[0]->seq < seq_limit) {
		struct kvx_timer *t = h->a[0];
		remove_at(h, 0);
		t->fn(t, t->arg);
		ran++;
	}
	h->running = false;
	return ran;
}

uint64_t kvx_timer_heap_next_ns(const struct kvx_timer_heap *h)
{
	return h->n ? h->a[0]->deadline_ns : UINT64_MAX;
}

int kvx_timer_heap_timeout_ms(const struct kvx_timer_heap *h, uint64_t now_ns)
{
	if (!h->n)
		return -1;
	uint64_t next = h->a[0]->deadline_ns;
	if (next <= now_ns)
		return 0;
	uint64_t d = next - now_ns;
	uint64_t ms = d / 1000000ull + (d % 1000000ull != 0);
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

uint32_t kvx_timer_heap_count(const struct kvx_timer_heap *h)
{
	return h->n;
}
