/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "trace_load.h"
#include "trace_prefix.h"

TestSuite(bench_trace_prefix, .timeout = 30.0);

Test(bench_trace_prefix, create_rejects_zero_capacity)
{
	struct perf_prefix_cache *c = NULL;
	cr_assert_eq(perf_prefix_cache_create(0, &c), -EINVAL);
	cr_assert_null(c);
}

Test(bench_trace_prefix, match_returns_longest_resident_prefix)
{
	struct perf_prefix_cache *c;
	cr_assert_eq(perf_prefix_cache_create(100, &c), 0);
	const uint64_t a[] = {0, 1, 2, 3};
	const uint64_t b[] = {0, 1, 9, 3};
	const uint64_t d[] = {7, 0, 1};
	cr_assert_eq(perf_prefix_cache_match(c, a, 4), 0);
	perf_prefix_cache_insert(c, a, 4);
	cr_assert_eq(perf_prefix_cache_size(c), 4);
	cr_assert_eq(perf_prefix_cache_match(c, a, 4), 4);
	cr_assert_eq(perf_prefix_cache_match(c, b, 4), 2, "stops at the first miss even if later ids are resident");
	cr_assert_eq(perf_prefix_cache_match(c, d, 3), 0);
	perf_prefix_cache_insert(c, a, 4);
	cr_assert_eq(perf_prefix_cache_size(c), 4, "re-insert does not duplicate");
	perf_prefix_cache_destroy(c);
}

Test(bench_trace_prefix, eviction_drops_least_recently_used)
{
	struct perf_prefix_cache *c;
	cr_assert_eq(perf_prefix_cache_create(3, &c), 0);
	const uint64_t x[] = {10, 11, 12};
	perf_prefix_cache_insert(c, x, 3);
	const uint64_t ten[] = {10};
	cr_assert_eq(perf_prefix_cache_match(c, ten, 1), 1); /* 10 is now most recent */
	const uint64_t y[] = {13};
	perf_prefix_cache_insert(c, y, 1); /* evicts 11 */
	cr_assert_eq(perf_prefix_cache_size(c), 3);
	const uint64_t q11[] = {11}, q12[] = {12}, q13[] = {13};
	cr_assert_eq(perf_prefix_cache_match(c, q11, 1), 0);
	cr_assert_eq(perf_prefix_cache_match(c, ten, 1), 1);
	cr_assert_eq(perf_prefix_cache_match(c, q12, 1), 1);
	cr_assert_eq(perf_prefix_cache_match(c, q13, 1), 1);
	perf_prefix_cache_destroy(c);
}

Test(bench_trace_prefix, heavy_churn_keeps_exactly_the_last_capacity_ids)
{
	struct perf_prefix_cache *c;
	const size_t cap = 257;
	cr_assert_eq(perf_prefix_cache_create(cap, &c), 0);
	for (uint64_t i = 0; i < 20000; i++) {
		uint64_t id = i * 1000003u;
		perf_prefix_cache_insert(c, &id, 1);
	}
	cr_assert_eq(perf_prefix_cache_size(c), cap);
	for (uint64_t i = 0; i < 20000; i++) {
		uint64_t id = i * 1000003u;
		uint32_t want = i >= 20000 - cap ? 1 : 0;
		cr_assert_eq(perf_prefix_cache_match(c, &id, 1), want, "id #%lu", (unsigned long)i);
	}
	perf_prefix_cache_destroy(c);
}

Test(bench_trace_prefix, hit_blocks_map_512_token_ids_to_kv_blocks)
{
	cr_assert_eq(perf_prefix_hit_blocks(0, 6758, 16), 0);
	cr_assert_eq(perf_prefix_hit_blocks(1, 6758, 16), 32);
	cr_assert_eq(perf_prefix_hit_blocks(13, 6758, 16), 416);
	cr_assert_eq(perf_prefix_hit_blocks(14, 6758, 16), 423, "full hit covers the partial last block");
	cr_assert_eq(perf_prefix_hit_blocks(2, 6758, 48), 21, "only whole KV blocks count");
}

Test(bench_trace_prefix, real_trace_second_request_hits_first_shared_block)
{
	struct perf_trace *t;
	char err[256] = "";
	cr_assert_eq(perf_trace_load(KVX_BENCH_DATA_DIR "/traces/mooncake_fast25_conversation_trace.head3MB.jsonl",
				     2, &t, err, sizeof(err)), 0, "%s", err);
	struct perf_prefix_cache *c;
	cr_assert_eq(perf_prefix_cache_create(1024, &c), 0);
	const uint64_t *h0 = &t->hash_ids[t->reqs[0].hash_off], *h1 = &t->hash_ids[t->reqs[1].hash_off];
	cr_assert_eq(perf_prefix_cache_match(c, h0, t->reqs[0].n_hash), 0);
	perf_prefix_cache_insert(c, h0, t->reqs[0].n_hash);
	uint32_t hit = perf_prefix_cache_match(c, h1, t->reqs[1].n_hash);
	cr_assert_eq(hit, 1, "requests 1 and 2 share only hash id 0");
	cr_assert_eq(perf_prefix_hit_blocks(hit, t->reqs[1].input_tokens, 16), 32);
	perf_prefix_cache_destroy(c);
	perf_trace_destroy(t);
}
