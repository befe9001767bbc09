/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RCU_H
#define KVX_RCU_H
/**
 * @file
 * kvx_rcu: QSBR thread helpers (liburcu qsbr flavour) and a read-mostly hash table over
 * cds_lfht (docs/runtime-notes.md §4.2). Included by kvxfer/lcore.h.
 */
#include <stdbool.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * RCU (liburcu QSBR flavour) and the read-mostly table
 * ========================================================================================== */

/**
 * Register the calling thread as a QSBR reader (urcu_qsbr_register_thread); it starts online.
 * kvx_lcore_poll_loop() does this itself. Threads calling the kvx_rcu_table_* updaters must be
 * registered too (liburcu's rule for cds_lfht).
 *
 * @par Thread safety  Calling thread only; once per thread (pair with kvx_rcu_unregister()).
 */
KVX_API void kvx_rcu_register(void);

/** Unregister the calling thread (urcu_qsbr_unregister_thread); it must be online. */
KVX_API void kvx_rcu_unregister(void);

/**
 * Announce a quiescent state: the caller holds no pointer obtained from an RCU table.
 * @par Context  Hot path (a few loads/stores); once per poll-loop iteration.
 */
KVX_API void kvx_rcu_quiescent(void);

/** Go offline before blocking (sleep, poll): grace periods no longer wait for this thread. */
KVX_API void kvx_rcu_offline(void);

/** Come back online after kvx_rcu_offline(). */
KVX_API void kvx_rcu_online(void);

/** Wait for a grace period (urcu_qsbr_synchronize_rcu); the caller must be offline or
 *  unregistered. @par Context Slow path, blocks. */
KVX_API void kvx_rcu_synchronize(void);

/** Wait until every deferred free queued so far (table deletes/replaces) has run
 *  (urcu_qsbr_barrier). Call before exit. @par Context Slow path, blocks. */
KVX_API void kvx_rcu_barrier(void);

/** Key type of a kvx_rcu_table. */
enum kvx_rcu_key {
	KVX_RCU_KEY_U64 = 0, /**< 64-bit integer keys (*_u64 functions). */
	KVX_RCU_KEY_STR = 1, /**< NUL-terminated string keys, copied (*_str functions). */
};

/** Called after a grace period for every value removed from a table (delete, replace,
 *  destroy). Runs on liburcu's call_rcu thread (or the destroying thread). */
typedef void (*kvx_rcu_free_fn)(void *value, void *ctx);

/** Parameters of kvx_rcu_table_create(). */
struct kvx_rcu_table_params {
	enum kvx_rcu_key key_type; /**< U64 or STR. */
	uint32_t init_buckets;     /**< Initial buckets, power of two (0 = 64); auto-resizes. */
	kvx_rcu_free_fn free_fn;   /**< Frees removed values; NULL = values are not owned. */
	void *free_ctx;            /**< Second argument of free_fn. */
};

struct kvx_rcu_table;

/**
 * Create a read-mostly hash table (cds_lfht, QSBR flavour, auto-resize).
 *
 * Readers (registered, online QSBR threads) look values up without locks; a returned value
 * stays valid until the reader's next quiescent state (kvx_rcu_quiescent(), or going offline).
 * Updaters (registered threads) add, replace and delete; removed values are passed to free_fn
 * after a grace period (call_rcu).
 *
 * @param p         Parameters; not NULL.
 * @param[out] out  New table; not NULL.
 * @return          0 on success.
 * @retval -EINVAL  Unknown key type, init_buckets not a power of two.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Setup thread.
 */
KVX_API int kvx_rcu_table_create(const struct kvx_rcu_table_params *p, struct kvx_rcu_table **out);

/**
 * Destroy a table: removes every entry, waits for a grace period, frees the values with
 * free_fn. NULL is a no-op.
 *
 * @param t  Table or NULL. No reader may use it any more (pollers stopped or past a quiescent
 *           state after they dropped it). The caller must not be an online QSBR reader.
 */
KVX_API void kvx_rcu_table_destroy(struct kvx_rcu_table *t);

/**
 * Add an entry if the key is absent (u64 table).
 * @param t      Table (KVX_RCU_KEY_U64); not NULL.
 * @param key    Key.
 * @param value  Value; not NULL.
 * @return       0 on success.
 * @retval -EEXIST  The key is present (nothing changed).
 * @retval -ENOMEM  Allocation failed.
 * @retval -EINVAL  Wrong key type or NULL value.
 * @par Thread safety  Registered RCU threads; concurrent updaters and readers allowed.
 */
KVX_API int kvx_rcu_table_add_u64(struct kvx_rcu_table *t, uint64_t key, void *value);

/**
 * Insert or replace an entry (u64 table); the old value goes to free_fn after a grace period.
 * @param t      Table; not NULL.
 * @param key    Key.
 * @param value  New value; not NULL.
 * @return       0 if added, 1 if an entry was replaced.
 * @retval -ENOMEM  Allocation failed.
 * @retval -EINVAL  Wrong key type or NULL value.
 * @par Thread safety  Registered RCU threads.
 */
KVX_API int kvx_rcu_table_replace_u64(struct kvx_rcu_table *t, uint64_t key, void *value);

/**
 * Delete an entry (u64 table); its value goes to free_fn after a grace period.
 * @param t    Table; not NULL.
 * @param key  Key.
 * @return     0 on success.
 * @retval -ENOENT  No such key.
 * @retval -EINVAL  Wrong key type.
 * @par Thread safety  Registered RCU threads.
 */
KVX_API int kvx_rcu_table_del_u64(struct kvx_rcu_table *t, uint64_t key);

/**
 * Look a key up (u64 table).
 * @param t    Table; not NULL.
 * @param key  Key.
 * @return     The value, valid until the caller's next quiescent state; NULL if absent.
 * @par Thread safety  Registered, online QSBR threads.
 * @par Context  Hot path: lock-free, no allocation.
 */
KVX_API void *kvx_rcu_table_lookup_u64(struct kvx_rcu_table *t, uint64_t key);

/** As kvx_rcu_table_add_u64() for a string-keyed table (key copied; NULL -> -EINVAL).
 *  @param t Table. @param key Key string. @param value Value.
 *  @return 0. @retval -EEXIST Present. @retval -ENOMEM No memory. @retval -EINVAL Bad args. */
KVX_API int kvx_rcu_table_add_str(struct kvx_rcu_table *t, const char *key, void *value);
/** As kvx_rcu_table_replace_u64() for a string-keyed table. @param t Table. @param key Key.
 *  @param value Value. @return 0 added, 1 replaced. @retval -ENOMEM No memory.
 *  @retval -EINVAL Bad args. */
KVX_API int kvx_rcu_table_replace_str(struct kvx_rcu_table *t, const char *key, void *value);
/** As kvx_rcu_table_del_u64() for a string-keyed table. @param t Table. @param key Key.
 *  @return 0. @retval -ENOENT Absent. @retval -EINVAL Bad args. */
KVX_API int kvx_rcu_table_del_str(struct kvx_rcu_table *t, const char *key);
/** As kvx_rcu_table_lookup_u64() for a string-keyed table. @param t Table. @param key Key.
 *  @return Value or NULL. */
KVX_API void *kvx_rcu_table_lookup_str(struct kvx_rcu_table *t, const char *key);

/**
 * Number of entries (approximate while updaters run).
 * @param t  Table; not NULL.
 * @return   Count.
 * @par Thread safety  Registered RCU threads.
 */
KVX_API uint64_t kvx_rcu_table_count(struct kvx_rcu_table *t);

#ifdef __cplusplus
}
#endif
#endif /* KVX_RCU_H */
