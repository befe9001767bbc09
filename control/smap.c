/* SPDX-License-Identifier: Apache-2.0 */
/* The control module's string map: chained hash + LRU list (ctl_impl.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_impl.h"

static uint64_t shash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

int ctl_smap_init(struct smap *m, uint32_t nb)
{
	memset(m, 0, sizeof(*m));
	m->b = calloc(nb, sizeof(*m->b));
	m->nb = nb;
	return m->b ? 0 : -ENOMEM;
}

struct snode *ctl_smap_find(struct smap *m, const char *key)
{
	uint64_t h = shash(key);
	for (struct snode *n = m->b[h & (m->nb - 1)]; n; n = n->hnext)
		if (n->h == h && !strcmp(n->key, key))
			return n;
	return NULL;
}

static void lru_unlink(struct smap *m, struct snode *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		m->head = n->next;
	if (n->next)
		n->next->prev = n->prev;
	else
		m->tail = n->prev;
	n->prev = n->next = NULL;
}

static void lru_push(struct smap *m, struct snode *n)
{
	n->prev = NULL;
	n->next = m->head;
	if (m->head)
		m->head->prev = n;
	m->head = n;
	if (!m->tail)
		m->tail = n;
}

void ctl_smap_touch(struct smap *m, struct snode *n)
{
	lru_unlink(m, n);
	lru_push(m, n);
}

struct snode *ctl_smap_add(struct smap *m, const char *key, void *val)
{
	struct snode *n = calloc(1, sizeof(*n));
	if (!n || !(n->key = strdup(key))) {
		free(n);
		return NULL;
	}
	n->h = shash(key);
	n->val = val;
	struct snode **slot = &m->b[n->h & (m->nb - 1)];
	n->hnext = *slot;
	*slot = n;
	lru_push(m, n);
	m->count++;
	return n;
}

void ctl_smap_del(struct smap *m, struct snode *n)
{
	struct snode **pp = &m->b[n->h & (m->nb - 1)];
	while (*pp != n)
		pp = &(*pp)->hnext;
	*pp = n->hnext;
	lru_unlink(m, n);
	m->count--;
	free(n->key);
	free(n);
}

void ctl_smap_fini(struct smap *m, void (*free_val)(void *))
{
	while (m->head) {
		if (free_val)
			free_val(m->head->val);
		ctl_smap_del(m, m->head);
	}
	free(m->b);
	m->b = NULL;
}
