/* SPDX-License-Identifier: Apache-2.0 */
/* Waiter: eventfd written only for a sleeper; no lost wake-up under a concurrent producer. */
#ifdef KVX_TSAN_RUNNER
#include "tsan_runner.h" /* Criterion cannot start under TSan: see that header */
#else
#include <criterion/criterion.h>
#endif
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "kvxfer/lcore.h"

TestSuite(waiter, .timeout = 60.0);

static bool readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) == 1;
}

Test(waiter, wake_of_awake_consumer_writes_nothing)
{
	struct kvx_waiter w;
	cr_assert_eq(kvx_waiter_init(&w), 0);
	cr_assert_geq(kvx_waiter_fd(&w), 0);
	kvx_waiter_wake(&w);
	kvx_waiter_wake(&w);
	cr_assert_eq(kvx_waiter_wake_count(&w), 0);
	cr_assert_not(readable(kvx_waiter_fd(&w)));
	kvx_waiter_prepare(&w);
	kvx_waiter_cancel(&w);
	kvx_waiter_wake(&w);
	cr_assert_eq(kvx_waiter_wake_count(&w), 0, "cancelled sleep: no write");
	kvx_waiter_fini(&w);
	kvx_waiter_fini(&w); /* idempotent */
}

Test(waiter, wake_of_prepared_consumer_writes_once)
{
	struct kvx_waiter w;
	cr_assert_eq(kvx_waiter_init(&w), 0);
	kvx_waiter_prepare(&w);
	kvx_waiter_wake(&w);
	kvx_waiter_wake(&w); /* second waker sees sleeping == 0 */
	cr_assert_eq(kvx_waiter_wake_count(&w), 1);
	cr_assert(readable(kvx_waiter_fd(&w)));
	cr_assert_eq(kvx_waiter_sleep(&w, 5000000000ull), 1, "returns at once: already woken");
	cr_assert_not(readable(kvx_waiter_fd(&w)), "drained");
	kvx_waiter_prepare(&w);
	uint64_t t0 = kvx_now_ns();
	cr_assert_eq(kvx_waiter_sleep(&w, 20000000ull), 0, "timeout");
	cr_assert_geq(kvx_now_ns() - t0, 20000000ull);
	kvx_waiter_fini(&w);
}

Test(waiter, external_poll_then_finish)
{
	struct kvx_waiter w;
	cr_assert_eq(kvx_waiter_init(&w), 0);
	kvx_waiter_prepare(&w);
	kvx_waiter_wake(&w);
	struct pollfd p = {.fd = kvx_waiter_fd(&w), .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 5000), 1); /* what the control lcore's zmq_poll would see */
	cr_assert(kvx_waiter_finish(&w));
	cr_assert_not(kvx_waiter_finish(&w));
	kvx_waiter_wake(&w);
	cr_assert_eq(kvx_waiter_wake_count(&w), 1, "finish cleared sleeping");
	kvx_waiter_fini(&w);
}

#define ITEMS 20000u

struct pc {
	struct kvx_ring *r;
	struct kvx_waiter w;
};

static void *producer(void *arg)
{
	struct pc *pc = arg;
	for (uintptr_t i = 1; i <= ITEMS;) {
		if (kvx_ring_enqueue_sp(pc->r, (void *)i) == 0)
			i++;
		else
			sched_yield();
		if (i % 64 == 0) /* vary the timing: let the consumer reach its sleep sometimes */
			sched_yield();
	}
	return NULL;
}

Test(waiter, no_lost_wakeup_with_concurrent_producer)
{
	struct pc pc;
	struct kvx_ring_params p = {.count = 128};
	cr_assert_eq(kvx_ring_create(&p, &pc.r), 0);
	cr_assert_eq(kvx_waiter_init(&pc.w), 0);
	kvx_ring_set_waiter(pc.r, &pc.w);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, producer, &pc), 0);
	uintptr_t expect = 1;
	unsigned sleeps = 0, timeouts = 0;
	while (expect <= ITEMS) {
		void *o[32];
		unsigned n = kvx_ring_dequeue_burst_sc(pc.r, o, 32, NULL);
		for (unsigned k = 0; k < n; k++, expect++)
			cr_assert_eq((uintptr_t)o[k], expect);
		if (n)
			continue;
		kvx_waiter_prepare(&pc.w);
		if (!kvx_ring_is_empty(pc.r)) {
			kvx_waiter_cancel(&pc.w);
			continue;
		}
		/* A lost wake-up would leave us here for the whole 10 s: count those. */
		int r = kvx_waiter_sleep(&pc.w, 10000000000ull);
		sleeps++;
		if (r == 0)
			timeouts++;
		cr_assert_lt(timeouts, 1, "lost wake-up after %u sleeps at item %lu", sleeps,
			     (unsigned long)expect);
	}
	pthread_join(t, NULL);
	cr_log_info("%u sleeps, %lu eventfd writes", sleeps, (unsigned long)kvx_waiter_wake_count(&pc.w));
	kvx_ring_destroy(pc.r);
	kvx_waiter_fini(&pc.w);
}
