/* SPDX-License-Identifier: Apache-2.0 */
/* Ring creation (the enqueue/dequeue hot path is inline in include/kvxfer/ring_impl.h). */
#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lcore_internal.h"

static uint32_t pow2_ceil(uint32_t v)
{
	uint32_t p = 1;
	while (p < v)
		p <<= 1;
	return p;
}

int kvx_ring_create(const struct kvx_ring_params *p, struct kvx_ring **out)
{
	if (!p || !out)
		return -EINVAL;
	if (p->flags & ~(KVX_RING_F_EXACT_SZ | KVX_RING_F_NUMA))
		return -EINVAL;
	uint32_t esize = p->elem_size ? p->elem_size : (uint32_t)sizeof(void *);
	if (esize % 4 || esize > 1024)
		return -EINVAL;
	if (p->count == 0 || p->count > (1u << 31))
		return -EINVAL;
	uint32_t size;
	if (p->flags & KVX_RING_F_EXACT_SZ) {
		size = pow2_ceil(p->count);
	} else {
		if (p->count & (p->count - 1))
			return -EINVAL;
		size = p->count;
	}
	struct kvx_ring *r;
	if (posix_memalign((void **)&r, KVX_CACHE_LINE, sizeof(*r)))
		return -ENOMEM;
	memset(r, 0, sizeof(*r));
	size_t len = (size_t)size * esize;
	len = (len + KVX_CACHE_LINE - 1) & ~(size_t)(KVX_CACHE_LINE - 1);
	if (p->flags & KVX_RING_F_NUMA) {
		if (numa_available() < 0 || p->numa_node < 0 || p->numa_node > numa_max_node()) {
			free(r);
			return -EINVAL;
		}
		r->alloc_base = numa_alloc_onnode(len, p->numa_node); /* page aligned */
		r->alloc_len = len;
	} else if (posix_memalign(&r->alloc_base, KVX_CACHE_LINE, len)) {
		r->alloc_base = NULL;
	}
	if (!r->alloc_base) {
		free(r);
		return -ENOMEM;
	}
	r->slots = r->alloc_base;
	r->mask = size - 1;
	r->capacity = p->count;
	r->esize = esize;
	r->flags = p->flags;
	snprintf(r->name, sizeof(r->name), "%s", p->name ? p->name : "");
	*out = r;
	return 0;
}

void kvx_ring_destroy(struct kvx_ring *r)
{
	if (!r)
		return;
	if (r->flags & KVX_RING_F_NUMA)
		numa_free(r->alloc_base, r->alloc_len);
	else
		free(r->alloc_base);
	free(r);
}

void kvx_ring_set_waiter(struct kvx_ring *r, struct kvx_waiter *w)
{
	r->waiter = w;
}

const char *kvx_ring_name(const struct kvx_ring *r)
{
	return r->name;
}

void kvx_ring_debug_set_index(struct kvx_ring *r, uint32_t idx)
{
	atomic_store_explicit(&r->prod.head, idx, memory_order_relaxed);
	atomic_store_explicit(&r->prod.tail, idx, memory_order_relaxed);
	atomic_store_explicit(&r->cons.head, idx, memory_order_relaxed);
	atomic_store_explicit(&r->cons.tail, idx, memory_order_relaxed);
	r->prod.opp_cache = idx;
	r->cons.opp_cache = idx;
}
