/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layer-ready gate: items (a layer's WRITEs) wait here until their event queries ready. The
 * polling lcore calls kvx_mem_gate_poll() every loop iteration and posts what comes out; no
 * blocking synchronize anywhere. Held items stay in push order (compaction keeps order).
 */
#include <errno.h>
#include <stdlib.h>

#include "mem_internal.h"

struct gate_entry {
	struct kvx_mem_event ev;
	void *item;
};

struct kvx_mem_gate {
	uint32_t capacity;
	uint32_t count;
	struct gate_entry e[];
};

int kvx_mem_gate_create(uint32_t capacity, struct kvx_mem_gate **out)
{
	struct kvx_mem_gate *g;

	if (!out || capacity == 0 || capacity > 65536)
		return -EINVAL;
	g = calloc(1, sizeof(*g) + (size_t)capacity * sizeof(g->e[0]));
	if (!g)
		return -ENOMEM;
	g->capacity = capacity;
	*out = g;
	return 0;
}

void kvx_mem_gate_destroy(struct kvx_mem_gate *g)
{
	free(g);
}

int kvx_mem_gate_push(struct kvx_mem_gate *g, const struct kvx_mem_event *ev, void *item)
{
	if (KVX_UNLIKELY(g->count == g->capacity))
		return -ENOBUFS;
	g->e[g->count].ev = *ev;
	g->e[g->count].item = item;
	g->count++;
	return 0;
}

uint32_t kvx_mem_gate_poll(struct kvx_mem_gate *g, struct kvx_mem_gate_item *out, uint32_t n)
{
	uint32_t keep = 0, got = 0, i;

	for (i = 0; i < g->count; i++) {
		struct gate_entry *x = &g->e[i];
		int r = got < n ? kvx_mem_event_query(&x->ev) : 0;

		if (r != 0) {
			out[got].item = x->item;
			out[got].status = r < 0 ? r : 0;
			got++;
			continue;
		}
		if (keep != i)
			g->e[keep] = *x;
		keep++;
	}
	g->count = keep;
	return got;
}

uint32_t kvx_mem_gate_count(const struct kvx_mem_gate *g)
{
	return g->count;
}
