/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_BENCH_TRACE_POOL_H
#define KVX_BENCH_TRACE_POOL_H
/**
 * @file
 * Block-id allocator of a replay side's KV pool (what vLLM's block manager does for an engine):
 * all-or-nothing allocation of k block ids out of num_blocks, freed ids are reused first
 * (LIFO, so reuse of just-released blocks is exercised). Double frees and foreign ids are
 * detected. One owner thread.
 */
#include <stddef.h>
#include <stdint.h>

struct perf_pool;

/**
 * Create a pool of @p num_blocks free block ids 0..num_blocks-1.
 *
 * @retval 0        Success.
 * @retval -EINVAL  num_blocks is 0 or above UINT32_MAX.
 * @retval -ENOMEM  Allocation failed.
 */
int perf_pool_create(uint64_t num_blocks, struct perf_pool **out);

/** Free a pool; NULL is a no-op. */
void perf_pool_destroy(struct perf_pool *p);

/**
 * Take @p k block ids (all or nothing).
 *
 * @param p         Pool.
 * @param k         Blocks wanted, >= 0.
 * @param[out] ids  Array[k] receives the ids.
 * @retval 0        Success (k == 0 always succeeds).
 * @retval -ENOBUFS Fewer than k free blocks; nothing taken.
 * @retval -EINVAL  k exceeds the pool's size (can never succeed).
 */
int perf_pool_alloc(struct perf_pool *p, uint64_t k, uint32_t *ids);

/**
 * Return @p k block ids to the pool.
 *
 * @retval 0        Success.
 * @retval -EINVAL  An id is out of range or already free; nothing is freed.
 */
int perf_pool_free(struct perf_pool *p, const uint32_t *ids, uint64_t k);

/** Free block ids now. */
uint64_t perf_pool_free_count(const struct perf_pool *p);

/** Total block ids. */
uint64_t perf_pool_size(const struct perf_pool *p);

/** Times an allocation failed with -ENOBUFS (pool exhaustion). */
uint64_t perf_pool_exhausted(const struct perf_pool *p);

#endif /* KVX_BENCH_TRACE_POOL_H */
