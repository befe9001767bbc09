/* SPDX-License-Identifier: Apache-2.0 */
/* QSBR helpers and the read-mostly table over cds_lfht (docs/runtime-notes.md §4.2, gotcha 5). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/urcu-qsbr.h>
#include <urcu/rculfhash.h>

#include "lcore_internal.h"

/* Registration depth of this thread: nested register/unregister pairs are allowed. */
static _Thread_local unsigned t_rcu_depth;

void kvx_rcu_register(void)
{
	if (t_rcu_depth++ == 0)
		urcu_qsbr_register_thread();
}

void kvx_rcu_unregister(void)
{
	if (t_rcu_depth && --t_rcu_depth == 0)
		urcu_qsbr_unregister_thread();
}

void kvx_rcu_quiescent(void)
{
	urcu_qsbr_quiescent_state();
}

void kvx_rcu_offline(void)
{
	urcu_qsbr_thread_offline();
}

void kvx_rcu_online(void)
{
	urcu_qsbr_thread_online();
}

void kvx_rcu_synchronize(void)
{
	urcu_qsbr_synchronize_rcu();
}

void kvx_rcu_barrier(void)
{
	urcu_qsbr_barrier();
}

/* ---- table ---------------------------------------------------------------------------------- */

struct kvx_rcu_table {
	struct cds_lfht *ht;
	struct kvx_rcu_table_params p;
};

struct rt_node {
	struct cds_lfht_node node;
	struct rcu_head rcu;
	struct kvx_rcu_table *t;
	struct rt_node *next; /* destroy's private list */
	/* Set (release) before the node is published; read (acquire) by readers before any other
	 * field. liburcu's publication (rcu_assign_pointer in an uninstrumented library) orders
	 * this already on every CPU we support; the explicit pair makes the edge C11-visible, so
	 * TSan sees that the node and the value were initialised before a reader uses them. */
	_Atomic uint32_t published;
	void *value;
	uint64_t key;
	char skey[]; /* string tables */
};

struct rt_key {
	uint64_t u;
	const char *s;
};

static uint64_t hash_u64(uint64_t x)
{
	/* splitmix64 finaliser: every key bit affects every hash bit */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64, then mixed */
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 0x100000001b3ull;
	}
	return hash_u64(h);
}

static int match_u64(struct cds_lfht_node *n, const void *key)
{
	struct rt_node *rn = caa_container_of(n, struct rt_node, node);
	(void)atomic_load_explicit(&rn->published, memory_order_acquire); /* pairs with add */
	return rn->key == ((const struct rt_key *)key)->u;
}

static int match_str(struct cds_lfht_node *n, const void *key)
{
	struct rt_node *rn = caa_container_of(n, struct rt_node, node);
	(void)atomic_load_explicit(&rn->published, memory_order_acquire); /* pairs with add */
	return !strcmp(rn->skey, ((const struct rt_key *)key)->s);
}

static void node_free_cb(struct rcu_head *head)
{
	struct rt_node *rn = caa_container_of(head, struct rt_node, rcu);
	if (rn->t->p.free_fn)
		rn->t->p.free_fn(rn->value, rn->t->p.free_ctx);
	free(rn);
}

int kvx_rcu_table_create(const struct kvx_rcu_table_params *p, struct kvx_rcu_table **out)
{
	if (!p || !out || (p->key_type != KVX_RCU_KEY_U64 && p->key_type != KVX_RCU_KEY_STR))
		return -EINVAL;
	unsigned long init = p->init_buckets ? p->init_buckets : 64;
	if (init & (init - 1))
		return -EINVAL;
	struct kvx_rcu_table *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->p = *p;
	/* cds_lfht_new() needs URCU_API_MAP; name the QSBR flavour explicitly (gotcha 5). */
	t->ht = cds_lfht_new_flavor(init, init, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
				    &urcu_qsbr_flavor, NULL);
	if (!t->ht) {
		free(t);
		return -ENOMEM;
	}
	*out = t;
	return 0;
}

void kvx_rcu_table_destroy(struct kvx_rcu_table *t)
{
	if (!t)
		return;
	kvx_rcu_register(); /* cds_lfht_del needs a registered thread; nests if already one */
	struct rt_node *list = NULL;
	struct cds_lfht_iter it;
	struct cds_lfht_node *n;
	urcu_qsbr_read_lock();
	cds_lfht_for_each(t->ht, &it, n) {
		if (cds_lfht_del(t->ht, n) == 0) {
			struct rt_node *rn = caa_container_of(n, struct rt_node, node);
			rn->next = list;
			list = rn;
		}
	}
	urcu_qsbr_read_unlock();
	urcu_qsbr_synchronize_rcu(); /* goes offline around the wait if we are online */
	while (list) {
		struct rt_node *rn = list;
		list = rn->next;
		if (t->p.free_fn)
			t->p.free_fn(rn->value, t->p.free_ctx);
		free(rn);
	}
	urcu_qsbr_barrier(); /* earlier deferred frees still reference t */
	kvx_rcu_offline();
	cds_lfht_destroy(t->ht, NULL);
	kvx_rcu_online();
	kvx_rcu_unregister();
	free(t);
}

static struct rt_node *node_new(struct kvx_rcu_table *t, const struct rt_key *k, void *value)
{
	size_t extra = t->p.key_type == KVX_RCU_KEY_STR ? strlen(k->s) + 1 : 0;
	struct rt_node *rn = malloc(sizeof(*rn) + extra);
	if (!rn)
		return NULL;
	cds_lfht_node_init(&rn->node);
	rn->t = t;
	rn->next = NULL;
	rn->value = value;
	rn->key = k->u;
	if (extra)
		memcpy(rn->skey, k->s, extra);
	/* Release: node fields and the caller's writes to *value happen-before a reader's
	 * acquire in match_u64()/match_str(). */
	atomic_store_explicit(&rn->published, 1, memory_order_release);
	return rn;
}

static uint64_t key_hash(const struct kvx_rcu_table *t, const struct rt_key *k)
{
	return t->p.key_type == KVX_RCU_KEY_STR ? hash_str(k->s) : hash_u64(k->u);
}

static cds_lfht_match_fct key_match(const struct kvx_rcu_table *t)
{
	return t->p.key_type == KVX_RCU_KEY_STR ? match_str : match_u64;
}

static int do_add(struct kvx_rcu_table *t, const struct rt_key *k, void *value, bool replace)
{
	if (!value)
		return -EINVAL;
	struct rt_node *rn = node_new(t, k, value);
	if (!rn)
		return -ENOMEM;
	unsigned long h = (unsigned long)key_hash(t, k);
	int rc = 0;
	urcu_qsbr_read_lock();
	if (replace) {
		struct cds_lfht_node *old = cds_lfht_add_replace(t->ht, h, key_match(t), k, &rn->node);
		if (old) {
			urcu_qsbr_call_rcu(&caa_container_of(old, struct rt_node, node)->rcu, node_free_cb);
			rc = 1;
		}
	} else {
		struct cds_lfht_node *got = cds_lfht_add_unique(t->ht, h, key_match(t), k, &rn->node);
		if (got != &rn->node) {
			free(rn); /* never published */
			rc = -EEXIST;
		}
	}
	urcu_qsbr_read_unlock();
	return rc;
}

static int do_del(struct kvx_rcu_table *t, const struct rt_key *k)
{
	struct cds_lfht_iter it;
	int rc = -ENOENT;
	urcu_qsbr_read_lock();
	cds_lfht_lookup(t->ht, (unsigned long)key_hash(t, k), key_match(t), k, &it);
	struct cds_lfht_node *n = cds_lfht_iter_get_node(&it);
	if (n && cds_lfht_del(t->ht, n) == 0) {
		urcu_qsbr_call_rcu(&caa_container_of(n, struct rt_node, node)->rcu, node_free_cb);
		rc = 0;
	}
	urcu_qsbr_read_unlock();
	return rc;
}

static void *do_lookup(struct kvx_rcu_table *t, const struct rt_key *k)
{
	struct cds_lfht_iter it;
	void *v = NULL;
	urcu_qsbr_read_lock();
	cds_lfht_lookup(t->ht, (unsigned long)key_hash(t, k), key_match(t), k, &it);
	struct cds_lfht_node *n = cds_lfht_iter_get_node(&it);
	if (n)
		v = caa_container_of(n, struct rt_node, node)->value;
	urcu_qsbr_read_unlock();
	return v;
}

int kvx_rcu_table_add_u64(struct kvx_rcu_table *t, uint64_t key, void *value)
{
	if (t->p.key_type != KVX_RCU_KEY_U64)
		return -EINVAL;
	struct rt_key k = {.u = key};
	return do_add(t, &k, value, false);
}

int kvx_rcu_table_replace_u64(struct kvx_rcu_table *t, uint64_t key, void *value)
{
	if (t->p.key_type != KVX_RCU_KEY_U64)
		return -EINVAL;
	struct rt_key k = {.u = key};
	return do_add(t, &k, value, true);
}

int kvx_rcu_table_del_u64(struct kvx_rcu_table *t, uint64_t key)
{
	if (t->p.key_type != KVX_RCU_KEY_U64)
		return -EINVAL;
	struct rt_key k = {.u = key};
	return do_del(t, &k);
}

void *kvx_rcu_table_lookup_u64(struct kvx_rcu_table *t, uint64_t key)
{
	if (t->p.key_type != KVX_RCU_KEY_U64)
		return NULL;
	struct rt_key k = {.u = key};
	return do_lookup(t, &k);
}

int kvx_rcu_table_add_str(struct kvx_rcu_table *t, const char *key, void *value)
{
	if (t->p.key_type != KVX_RCU_KEY_STR || !key)
		return -EINVAL;
	struct rt_key k = {.s = key};
	return do_add(t, &k, value, false);
}

int kvx_rcu_table_replace_str(struct kvx_rcu_table *t, const char *key, void *value)
{
	if (t->p.key_type != KVX_RCU_KEY_STR || !key)
		return -EINVAL;
	struct rt_key k = {.s = key};
	return do_add(t, &k, value, true);
}

int kvx_rcu_table_del_str(struct kvx_rcu_table *t, const char *key)
{
	if (t->p.key_type != KVX_RCU_KEY_STR || !key)
		return -EINVAL;
	struct rt_key k = {.s = key};
	return do_del(t, &k);
}

void *kvx_rcu_table_lookup_str(struct kvx_rcu_table *t, const char *key)
{
	if (t->p.key_type != KVX_RCU_KEY_STR || !key)
		return NULL;
	struct rt_key k = {.s = key};
	return do_lookup(t, &k);
}

uint64_t kvx_rcu_table_count(struct kvx_rcu_table *t)
{
	long before = 0, after = 0;
	unsigned long count = 0;
	urcu_qsbr_read_lock();
	cds_lfht_count_nodes(t->ht, &before, &count, &after);
	urcu_qsbr_read_unlock();
	return count;
}
