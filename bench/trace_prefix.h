/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_PREFIX_H
#define KVX_BENCH_TRACE_PREFIX_H
/**
 * @file
 * Consumer-side prefix-cache simulation for `kvxfer-perf trace --prefix-cache`.
 *
 * Mooncake traces name each 512-token prompt block by a hash id; the same id means the same
 * prefix KV. The consumer keeps an LRU set of resident hash ids (bounded, in hash blocks).
 * A new request's longest run of leading ids that are resident is a prefix hit: the KV blocks
 * those tokens cover are already on the consumer and only the suffix is transferred
 * (docs/protocol.md §5.7: a full hit transfers nothing and only releases the producer).
 *
 * Not thread-safe: one owner thread per cache.
 */
#include <stddef.h>
#include <stdint.h>

struct perf_prefix_cache;

/**
 * Create an empty cache.
 *
 * @param capacity  Resident hash ids kept, >= 1; the least recently used one is evicted.
 * @param[out] out  New cache; free with perf_prefix_cache_destroy().
 * @retval 0        Success.
 * @retval -EINVAL  capacity is 0 or too large (> 2^30).
 * @retval -ENOMEM  Allocation failed.
 */
int perf_prefix_cache_create(size_t capacity, struct perf_prefix_cache **out);

/** Free a cache; NULL is a no-op. */
void perf_prefix_cache_destroy(struct perf_prefix_cache *c);

/**
 * Length of the longest resident prefix of @p ids; the matched ids become most recently used.
 *
 * @param c    Cache; not NULL.
 * @param ids  Array[n] hash ids of a request, in prompt order.
 * @param n    Count.
 * @return     0..n.
 */
uint32_t perf_prefix_cache_match(struct perf_prefix_cache *c, const uint64_t *ids, uint32_t n);

/**
 * Make every id of @p ids resident (most recently used), evicting the least recently used.
 *
 * @param c    Cache; not NULL.
 * @param ids  Array[n] hash ids.
 * @param n    Count.
 */
void perf_prefix_cache_insert(struct perf_prefix_cache *c, const uint64_t *ids, uint32_t n);

/** Number of resident ids, 0..capacity. */
size_t perf_prefix_cache_size(const struct perf_prefix_cache *c);

/**
 * KV blocks of a request covered by a prefix hit of @p hit_ids hash blocks.
 *
 * The hit covers min(hit_ids * 512, input_tokens) tokens. A hit over the whole prompt covers
 * every block (the last, partial hash block has its own id); otherwise only whole KV blocks
 * count.
 *
 * @param hit_ids       Matched hash ids (from perf_prefix_cache_match()).
 * @param input_tokens  Prompt tokens of the request, >= 1.
 * @param block_tokens  Tokens per KV block, >= 1.
 * @return              0..ceil(input_tokens / block_tokens).
 */
uint64_t perf_prefix_hit_blocks(uint32_t hit_ids, uint32_t input_tokens, uint32_t block_tokens);

#endif /* KVX_BENCH_TRACE_PREFIX_H */
