/* SPDX-License-Identifier: Apache-2.0 */
/* LIFO block-id allocator with double-free detection (see trace_pool.h). */
#include "trace_pool.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

struct perf_pool {
	uint64_t n, nfree, exhausted;
	uint32_t *stack; /* Array[n]: free ids in [0, nfree) */
	bool *in_use;    /* Array[n] */
};

int perf_pool_create(uint64_t num_blocks, struct perf_pool **out)
{
	if (num_blocks == 0 || num_blocks > UINT32_MAX)
		return -EINVAL;
	struct perf_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->stack = malloc(num_blocks * sizeof(*p->stack));
	p->in_use = calloc(num_blocks, sizeof(*p->in_use));
	if (!p->stack || !p->in_use) {
		perf_pool_destroy(p);
		return -ENOMEM;
	}
	p->n = p->nfree = num_blocks;
	/* Lowest ids on top, so the first request gets 0, 1, 2, ... */
	for (uint64_t i = 0; i < num_blocks; i++)
		p->stack[i] = (uint32_t)(num_blocks - 1 - i);
	*out = p;
	return 0;
}

void perf_pool_destroy(struct perf_pool *p)
{
	if (!p)
		return;
	free(p->stack);
	free(p->in_use);
	free(p);
}

int perf_pool_alloc(struct perf_pool *p, uint64_t k, uint32_t *ids)
{
	if (k > p->n)
		return -EINVAL;
	if (k > p->nfree) {
		p->exhausted++;
		return -ENOBUFS;
	}
	for (uint64_t i = 0; i < k; i++) {
		uint32_t id = p->stack[--p->nfree];
		p->in_use[id] = true;
		ids[i] = id;
	}
	return 0;
}

int perf_pool_free(struct perf_pool *p, const uint32_t *ids, uint64_t k)
{
	for (uint64_t i = 0; i < k; i++)
		if (ids[i] >= p->n || !p->in_use[ids[i]])
			return -EINVAL;
	/* Free in reverse so a later alloc of the same size returns the ids in the same order. */
	for (uint64_t i = k; i-- > 0;) {
		if (!p->in_use[ids[i]]) {
			/* Duplicate id in this batch: undo what this call freed. */
			for (uint64_t j = i + 1; j < k; j++) {
				p->nfree--;
				p->in_use[ids[j]] = true;
			}
			return -EINVAL;
		}
		p->in_use[ids[i]] = false;
		p->stack[p->nfree++] = ids[i];
	}
	return 0;
}

uint64_t perf_pool_free_count(const struct perf_pool *p)
{
	return p->nfree;
}

uint64_t perf_pool_size(const struct perf_pool *p)
{
	return p->n;
}

uint64_t perf_pool_exhausted(const struct perf_pool *p)
{
	return p->exhausted;
}
