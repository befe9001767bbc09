/* SPDX-License-Identifier: Apache-2.0 */
/* LRU set of resident prefix hash ids (see trace_prefix.h). Open addressing with linear
 * probing and backward-shift deletion; an intrusive doubly linked list gives the LRU order. */
#include "trace_prefix.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "trace_load.h"

#define NIL UINT32_MAX

struct node {
	uint64_t id;
	uint32_t prev, next; /* LRU list: head = most recent */
};

struct perf_prefix_cache {
	size_t cap, size;
	struct node *nodes;   /* Array[cap] */
	uint32_t *slots;      /* Array[mask + 1]: node index or NIL */
	size_t mask;
	uint32_t head, tail;
	uint32_t free_next;   /* first never-used node */
};

static size_t hash_id(uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	return (size_t)id;
}

int perf_prefix_cache_create(size_t capacity, struct perf_prefix_cache **out)
{
	if (capacity == 0 || capacity > (1u << 30))
		return -EINVAL;
	struct perf_prefix_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	size_t tsz = 16;
	while (tsz < capacity * 2)
		tsz *= 2;
	c->cap = capacity;
	c->mask = tsz - 1;
	c->nodes = malloc(capacity * sizeof(*c->nodes));
	c->slots = malloc(tsz * sizeof(*c->slots));
	if (!c->nodes || !c->slots) {
		perf_prefix_cache_destroy(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < tsz; i++)
		c->slots[i] = NIL;
	c->head = c->tail = NIL;
	*out = c;
	return 0;
}

void perf_prefix_cache_destroy(struct perf_prefix_cache *c)
{
	if (!c)
		return;
	free(c->nodes);
	free(c->slots);
	free(c);
}

size_t perf_prefix_cache_size(const struct perf_prefix_cache *c)
{
	return c->size;
}

/* Slot holding id, or the empty slot where it would go. */
static size_t find_slot(const struct perf_prefix_cache *c, uint64_t id)
{
	size_t i = hash_id(id) & c->mask;
	while (c->slots[i] != NIL && c->nodes[c->slots[i]].id != id)
		i = (i + 1) & c->mask;
	return i;
}

static void unlink_node(struct perf_prefix_cache *c, uint32_t n)
{
	struct node *x = &c->nodes[n];
	if (x->prev != NIL)
		c->nodes[x->prev].next = x->next;
	else
		c->head = x->next;
	if (x->next != NIL)
		c->nodes[x->next].prev = x->prev;
	else
		c->tail = x->prev;
}

static void push_front(struct perf_prefix_cache *c, uint32_t n)
{
	struct node *x = &c->nodes[n];
	x->prev = NIL;
	x->next = c->head;
	if (c->head != NIL)
		c->nodes[c->head].prev = n;
	c->head = n;
	if (c->tail == NIL)
		c->tail = n;
}

static void remove_slot(struct perf_prefix_cache *c, size_t i)
{
	/* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
	c->slots[i] = NIL;
	for (size_t j = (i + 1) & c->mask; c->slots[j] != NIL; j = (j + 1) & c->mask) {
		size_t home = hash_id(c->nodes[c->slots[j]].id) & c->mask;
		bool movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
		if (movable) {
			c->slots[i] = c->slots[j];
			c->slots[j] = NIL;
			i = j;
		}
	}
}

uint32_t perf_prefix_cache_match(struct perf_prefix_cache *c, const uint64_t *ids, uint32_t n)
{
	uint32_t k = 0;
	for (; k < n; k++) {
		size_t s = find_slot(c, ids[k]);
		if (c->slots[s] == NIL)
			break;
		uint32_t node = c->slots[s];
		unlink_node(c, node);
		push_front(c, node);
	}
	return k;
}

void perf_prefix_cache_insert(struct perf_prefix_cache *c, const uint64_t *ids, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++) {
		size_t s = find_slot(c, ids[k]);
		uint32_t node = c->slots[s];
		if (node != NIL) {
			unlink_node(c, node);
			push_front(c, node);
			continue;
		}
		if (c->size < c->cap) {
			node = c->free_next++;
			c->size++;
		} else {
			node = c->tail;
			unlink_node(c, node);
			remove_slot(c, find_slot(c, c->nodes[node].id));
			s = find_slot(c, ids[k]);
		}
		c->nodes[node].id = ids[k];
		c->slots[s] = node;
		push_front(c, node);
	}
}

uint64_t perf_prefix_hit_blocks(uint32_t hit_ids, uint32_t input_tokens, uint32_t block_tokens)
{
	uint64_t hit_tokens = (uint64_t)hit_ids * PERF_TRACE_HASH_BLOCK_TOKENS;
	if (hit_tokens >= input_tokens)
		return ((uint64_t)input_tokens + block_tokens - 1) / block_tokens;
	return hit_tokens / block_tokens;
}
