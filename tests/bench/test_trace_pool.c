/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>

#include <criterion/criterion.h>

#include "trace_pool.h"

TestSuite(bench_trace_pool, .timeout = 30.0);

Test(bench_trace_pool, alloc_is_all_or_nothing_and_counts_exhaustion)
{
	struct perf_pool *p;
	cr_assert_eq(perf_pool_create(8, &p), 0);
	uint32_t a[8], b[8];
	cr_assert_eq(perf_pool_alloc(p, 5, a), 0);
	for (uint32_t i = 0; i < 5; i++)
		cr_assert_eq(a[i], i);
	cr_assert_eq(perf_pool_free_count(p), 3);
	cr_assert_eq(perf_pool_alloc(p, 4, b), -ENOBUFS);
	cr_assert_eq(perf_pool_free_count(p), 3, "failed alloc takes nothing");
	cr_assert_eq(perf_pool_exhausted(p), 1);
	cr_assert_eq(perf_pool_alloc(p, 9, b), -EINVAL);
	cr_assert_eq(perf_pool_alloc(p, 0, b), 0);
	cr_assert_eq(perf_pool_alloc(p, 3, b), 0);
	cr_assert_eq(perf_pool_free_count(p), 0);
	perf_pool_destroy(p);
}

Test(bench_trace_pool, freed_blocks_are_reused_first)
{
	struct perf_pool *p;
	cr_assert_eq(perf_pool_create(100, &p), 0);
	uint32_t a[3], b[3], c[3];
	cr_assert_eq(perf_pool_alloc(p, 3, a), 0);
	cr_assert_eq(perf_pool_alloc(p, 3, b), 0);
	cr_assert_eq(perf_pool_free(p, a, 3), 0);
	cr_assert_eq(perf_pool_alloc(p, 3, c), 0);
	cr_assert_eq(c[0], a[0]);
	cr_assert_eq(c[1], a[1]);
	cr_assert_eq(c[2], a[2]);
	perf_pool_destroy(p);
}

Test(bench_trace_pool, double_free_and_foreign_ids_are_rejected_without_change)
{
	struct perf_pool *p;
	cr_assert_eq(perf_pool_create(10, &p), 0);
	uint32_t a[4];
	cr_assert_eq(perf_pool_alloc(p, 4, a), 0);
	uint32_t bad[2] = {a[0], 10};
	cr_assert_eq(perf_pool_free(p, bad, 2), -EINVAL);
	cr_assert_eq(perf_pool_free_count(p), 6);
	uint32_t dup[3] = {a[1], a[2], a[1]};
	cr_assert_eq(perf_pool_free(p, dup, 3), -EINVAL);
	cr_assert_eq(perf_pool_free_count(p), 6, "duplicate batch is undone");
	cr_assert_eq(perf_pool_free(p, a, 4), 0);
	cr_assert_eq(perf_pool_free(p, a, 1), -EINVAL, "double free");
	cr_assert_eq(perf_pool_free_count(p), 10);
	perf_pool_destroy(p);
}

Test(bench_trace_pool, create_rejects_zero)
{
	struct perf_pool *p = NULL;
	cr_assert_eq(perf_pool_create(0, &p), -EINVAL);
	cr_assert_null(p);
}
