/* SPDX-License-Identifier: Apache-2.0 */
/* QSBR table: semantics, and pinned poller lcores reading while an updater replaces/deletes. */
#ifdef KVX_TSAN_RUNNER
#include "tsan_runner.h" /* Criterion cannot start under TSan: see that header */
#else
#include <criterion/criterion.h>
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvxfer/lcore.h"

TestSuite(rcu_table, .timeout = 120.0);

static char g_err[KVX_LCORE_ERRLEN];

/* A peer-like value: engine id + epoch, with a canary that a freed object would not keep. */
struct peer {
	uint64_t key;
	uint64_t epoch;
	uint64_t canary;
};

#define CANARY 0x5eedf00dcafe1234ull

static _Atomic uint64_t g_freed;

static void peer_free(void *v, void *ctx)
{
	struct peer *p = v;
	cr_assert_eq(ctx, (void *)&g_freed);
	cr_assert_eq(p->canary, CANARY, "double free or corrupted value");
	p->canary = 0;
	free(p);
	atomic_fetch_add(&g_freed, 1);
}

static struct peer *peer_new(uint64_t key, uint64_t epoch)
{
	struct peer *p = malloc(sizeof(*p));
	cr_assert_not_null(p);
	*p = (struct peer){key, epoch, CANARY};
	return p;
}

static struct kvx_rcu_table *table(enum kvx_rcu_key kt)
{
	struct kvx_rcu_table_params p = {.key_type = kt, .init_buckets = 16, .free_fn = peer_free,
					 .free_ctx = (void *)&g_freed};
	struct kvx_rcu_table *t;
	cr_assert_eq(kvx_rcu_table_create(&p, &t), 0);
	return t;
}

Test(rcu_table, create_rejects_bad_params)
{
	struct kvx_rcu_table_params p = {.key_type = 7};
	struct kvx_rcu_table *t;
	cr_assert_eq(kvx_rcu_table_create(&p, &t), -EINVAL);
	p.key_type = KVX_RCU_KEY_U64;
	p.init_buckets = 48;
	cr_assert_eq(kvx_rcu_table_create(&p, &t), -EINVAL);
	kvx_rcu_table_destroy(NULL);
}

Test(rcu_table, u64_add_replace_delete_semantics)
{
	kvx_rcu_register();
	struct kvx_rcu_table *t = table(KVX_RCU_KEY_U64);
	struct peer *a = peer_new(1, 1);
	cr_assert_eq(kvx_rcu_table_add_u64(t, 1, a), 0);
	struct peer *dup = peer_new(1, 9);
	cr_assert_eq(kvx_rcu_table_add_u64(t, 1, dup), -EEXIST);
	free(dup);
	cr_assert_eq(kvx_rcu_table_lookup_u64(t, 1), a);
	cr_assert_null(kvx_rcu_table_lookup_u64(t, 2));
	struct peer *b = peer_new(1, 2);
	cr_assert_eq(kvx_rcu_table_replace_u64(t, 1, b), 1, "replaced");
	cr_assert_eq(kvx_rcu_table_lookup_u64(t, 1), b);
	cr_assert_eq(kvx_rcu_table_replace_u64(t, 2, peer_new(2, 1)), 0, "added");
	cr_assert_eq(kvx_rcu_table_count(t), 2);
	cr_assert_eq(kvx_rcu_table_del_u64(t, 1), 0);
	cr_assert_eq(kvx_rcu_table_del_u64(t, 1), -ENOENT);
	cr_assert_null(kvx_rcu_table_lookup_u64(t, 1));
	cr_assert_eq(kvx_rcu_table_add_str(t, "x", b), -EINVAL, "wrong key type");
	cr_assert_eq(kvx_rcu_table_add_u64(t, 5, NULL), -EINVAL);
	kvx_rcu_offline();
	kvx_rcu_barrier(); /* a (replaced) and b (deleted) are freed after a grace period */
	kvx_rcu_online();
	cr_assert_eq(atomic_load(&g_freed), 2);
	kvx_rcu_offline();
	kvx_rcu_table_destroy(t); /* frees the remaining value */
	kvx_rcu_online();
	cr_assert_eq(atomic_load(&g_freed), 3);
	kvx_rcu_unregister();
}

Test(rcu_table, string_keys_are_copied)
{
	kvx_rcu_register();
	struct kvx_rcu_table *t = table(KVX_RCU_KEY_STR);
	char key[32];
	strcpy(key, "engine-a");
	struct peer *a = peer_new(1, 1);
	cr_assert_eq(kvx_rcu_table_add_str(t, key, a), 0);
	strcpy(key, "engine-b");
	cr_assert_null(kvx_rcu_table_lookup_str(t, "engine-b"));
	cr_assert_eq(kvx_rcu_table_lookup_str(t, "engine-a"), a);
	cr_assert_eq(kvx_rcu_table_replace_str(t, "engine-a", peer_new(1, 2)), 1);
	cr_assert_eq(((struct peer *)kvx_rcu_table_lookup_str(t, "engine-a"))->epoch, 2);
	cr_assert_eq(kvx_rcu_table_del_str(t, "engine-a"), 0);
	cr_assert_eq(kvx_rcu_table_del_str(t, "engine-a"), -ENOENT);
	cr_assert_eq(kvx_rcu_table_add_str(t, NULL, a), -EINVAL);
	cr_assert_eq(kvx_rcu_table_add_u64(t, 1, a), -EINVAL);
	kvx_rcu_offline();
	kvx_rcu_table_destroy(t);
	kvx_rcu_online();
	kvx_rcu_unregister();
}

/* ---- readers on pinned lcores, updater on this thread ---------------------------------------- */

#define KEYS 64u

struct reader {
	struct kvx_rcu_table *t;
	_Atomic uint64_t lookups;
	_Atomic uint64_t hits;
	_Atomic uint64_t bad;
};

static int read_poller(void *arg)
{
	struct reader *r = arg;
	uint64_t hits = 0, bad = 0;
	for (uint64_t k = 0; k < KEYS; k++) {
		struct peer *p = kvx_rcu_table_lookup_u64(r->t, k);
		if (!p)
			continue;
		/* Read every field: ASan flags a freed value; the canary flags a recycled one. */
		if (p->canary != CANARY || p->key != k || p->epoch == 0)
			bad++;
		hits++;
	}
	atomic_fetch_add_explicit(&r->lookups, KEYS, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->hits, hits, memory_order_relaxed);
	if (bad)
		atomic_fetch_add_explicit(&r->bad, bad, memory_order_relaxed);
	/* IDLE: the adaptive loop then yields and naps (offline) between bursts of reads, so the
	 * updater and liburcu's call_rcu thread get CPU time on a 2-CPU machine. The loop
	 * announces a quiescent state after every call either way. */
	return KVX_POLL_IDLE;
}

Test(rcu_table, readers_on_pinned_lcores_while_updater_replaces_and_deletes, .timeout = 180.0)
{
	atomic_store(&g_freed, 0);
	struct kvx_lcore_cfg *c = malloc(sizeof(*c));
	kvx_lcore_cfg_init(c);
	cr_assert_eq(kvx_lcore_cfg_default(c, 2, KVX_LCORE_DEFAULT_F_NO_CONTROL, g_err, sizeof(g_err)), 0);
	cr_assert_eq(kvx_lcore_cfg_validate(c, NULL, NULL, g_err, sizeof(g_err)), 0, "%s", g_err);
	struct kvx_lcore_set *set;
	cr_assert_eq(kvx_lcore_set_create(c, &set), 0);
	free(c);

	kvx_rcu_register(); /* the updater must be a registered thread */
	struct kvx_rcu_table *t = table(KVX_RCU_KEY_U64);
	for (uint64_t k = 0; k < KEYS; k++)
		cr_assert_eq(kvx_rcu_table_add_u64(t, k, peer_new(k, 1)), 0);
	struct reader rd = {.t = t};
	for (unsigned i = 0; i < kvx_lcore_set_count(set); i++) {
		struct kvx_lcore *lc = kvx_lcore_set_at(set, i);
		cr_assert_eq(kvx_poller_register(lc, read_poller, &rd, "reader", NULL), 0);
		struct kvx_lcore_idle_params ip = {.policy = KVX_LCORE_IDLE_ADAPTIVE, .spin_polls = 2048,
						   .max_sleep_ns = 1000000};
		cr_assert_eq(kvx_lcore_set_idle(lc, &ip), 0);
		cr_assert_eq(kvx_lcore_launch(lc, kvx_lcore_poll_loop, NULL), 0);
	}
	uint64_t replaced = 0, deleted = 0, added = KEYS;
	uint64_t dl = kvx_now_ns() + 4000000000ull; /* bounded: 4 s of updates (TSan is slow) */
#ifdef KVX_TSAN_RUNNER
	const uint64_t rounds = 2000; /* TSan runs this about 100x slower */
#else
	const uint64_t rounds = 20000;
#endif
	for (uint64_t round = 0; round < rounds && kvx_now_ns() < dl; round++) {
		uint64_t k = (round * 7) % KEYS;
		if (round % 3 == 2) {
			if (kvx_rcu_table_del_u64(t, k) == 0)
				deleted++;
			else {
				cr_assert_eq(kvx_rcu_table_add_u64(t, k, peer_new(k, round + 1)), 0);
				added++;
			}
		} else {
			int rc = kvx_rcu_table_replace_u64(t, k, peer_new(k, round + 1));
			cr_assert_geq(rc, 0);
			if (rc == 1)
				replaced++;
			else
				added++;
		}
		kvx_rcu_quiescent(); /* the updater is a reader too: let grace periods end */
		if (round % 256 == 0)
			sched_yield(); /* 2 CPUs: give the pinned readers time */
	}
	/* Readers keep reading while the last deferred frees run. */
	kvx_rcu_offline();
	kvx_rcu_barrier();
	kvx_rcu_online();
	kvx_lcore_set_stop_all(set);
	kvx_lcore_set_wait_all(set);
	cr_assert_eq(atomic_load(&rd.bad), 0, "a reader saw a freed or foreign value");
	cr_assert_gt(atomic_load(&rd.lookups), 0);
	cr_assert_gt(atomic_load(&rd.hits), 0);
	cr_assert_gt(replaced + deleted, 100, "the updater made progress");
	uint64_t live = kvx_rcu_table_count(t);
	cr_assert_eq(added, live + deleted, "entries: added == live + deleted");
	cr_assert_eq(atomic_load(&g_freed), replaced + deleted, "every removed value freed once");
	kvx_rcu_offline();
	kvx_rcu_table_destroy(t);
	kvx_rcu_online();
	cr_assert_eq(atomic_load(&g_freed), replaced + deleted + live);
	kvx_rcu_unregister();
	cr_log_info("%lu lookups, %lu replaced, %lu deleted", (unsigned long)atomic_load(&rd.lookups),
		    (unsigned long)replaced, (unsigned long)deleted);
	kvx_lcore_set_destroy(set);
}
