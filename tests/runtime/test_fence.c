/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reader-fence confirmation by several progress threads (runtime/fence.h): done is the
 * smallest cut every thread has recorded, it only grows, and the last thread to record a cut
 * advances it, also when the threads record at the same time. Built for TSan too, with the
 * in-process runner (Criterion cannot start there: tests/lcore/tsan_runner.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#ifdef KVX_TSAN_RUNNER
#include "tests/lcore/tsan_runner.h"
#else
#include <criterion/criterion.h>
#endif

#include "runtime/fence.h"

Test(runtime_fence, done_is_the_smallest_record)
{
	struct kvx_fence_set f = {.n = 3};
	cr_assert_eq(kvx_fence_done(&f), 0);
	cr_assert_eq(kvx_fence_note(&f, 0, 1), 0, "threads 1 and 2 have not recorded cut 1");
	cr_assert_eq(kvx_fence_note(&f, 2, 1), 0);
	cr_assert_eq(kvx_fence_done(&f), 0);
	cr_assert_eq(kvx_fence_note(&f, 1, 1), 1, "the last of the three to record cut 1");
	cr_assert_eq(kvx_fence_done(&f), 1);
	/* Cuts 2 and 3 came: thread 1 saw only 2 so far. */
	cr_assert_eq(kvx_fence_note(&f, 0, 3), 1);
	cr_assert_eq(kvx_fence_note(&f, 1, 2), 1);
	cr_assert_eq(kvx_fence_note(&f, 2, 3), 2);
	cr_assert_eq(kvx_fence_done(&f), 2);
	cr_assert_eq(kvx_fence_note(&f, 2, 3), 2, "recording the same cut again changes nothing");
	cr_assert_eq(kvx_fence_note(&f, 1, 3), 3);
	cr_assert_eq(kvx_fence_done(&f), 3);
	/* One thread (an engine without a tcp target: poller 0 alone). */
	struct kvx_fence_set one = {.n = 1};
	cr_assert_eq(kvx_fence_note(&one, 0, 7), 7);
	cr_assert_eq(kvx_fence_done(&one), 7);
}

enum { NT = 4, CUTS = 100000 };

struct rec {
	struct kvx_fence_set *f;
	uint32_t k;
	atomic_int bad; /* returned done above the thread's own record */
};

/* Thread k records every (k+1)-th cut and the last one, as a poller that sleeps through some
 * cuts would. */
static void *recorder(void *arg)
{
	struct rec *r = arg;
	for (uint64_t c = 1; c <= CUTS; c++) {
		if (c % (r->k + 1) && c != CUTS)
			continue;
		if (kvx_fence_note(r->f, r->k, c) > c)
			atomic_store(&r->bad, 1);
	}
	return NULL;
}

Test(runtime_fence, concurrent_records_never_pass_a_thread_and_reach_the_last_cut, .timeout = 120)
{
	static struct kvx_fence_set f = {.n = NT};
	struct rec r[NT];
	pthread_t t[NT];
	for (uint32_t k = 0; k < NT; k++) {
		r[k] = (struct rec){.f = &f, .k = k};
		cr_assert_eq(pthread_create(&t[k], NULL, recorder, &r[k]), 0);
	}
	/* Records only grow, so records read after done are at least those done was made from. */
	uint64_t last = 0, d;
	while ((d = kvx_fence_done(&f)) < CUTS) {
		cr_assert_geq(d, last, "done went back from %lu to %lu", (unsigned long)last, (unsigned long)d);
		last = d;
		for (uint32_t k = 0; k < NT; k++) {
			uint64_t s = atomic_load_explicit(&f.seen[k], memory_order_seq_cst);
			cr_assert_leq(d, s, "done %lu passed thread %u's record %lu", (unsigned long)d, k,
				      (unsigned long)s);
		}
		/* The last cut is reached once every thread has recorded it (no sleep: a join
		 * below would hang if it never were). */
		if (atomic_load(&f.seen[0]) == CUTS && atomic_load(&f.seen[1]) == CUTS &&
		    atomic_load(&f.seen[2]) == CUTS && atomic_load(&f.seen[3]) == CUTS)
			break;
	}
	for (uint32_t k = 0; k < NT; k++) {
		pthread_join(t[k], NULL);
		cr_assert_eq(atomic_load(&r[k].bad), 0, "thread %u got a done above its own record", k);
	}
	cr_assert_eq(kvx_fence_done(&f), CUTS, "the last thread to record the last cut advances done");
}
