/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RING_H
#define KVX_RING_H
/**
 * @file
 * kvx_ring: bounded, power-of-two FIFO rings of pointers or fixed-size elements, SP/MP, SC/MC
 * (docs/runtime-notes.md §1.4); the only objects shared between threads on the hot path. The
 * enqueue/dequeue bodies are inline (kvxfer/ring_impl.h). Included by kvxfer/lcore.h.
 */
#include <stdbool.h>
#include <stdint.h>

#include "kvxfer/common.h"
#include "kvxfer/waiter.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * Rings
 * ========================================================================================== */

/** Ring creation flags (kvx_ring_params::flags). */
/** Capacity is exactly `count` (any 1..2^31); the table is rounded up to a power of two.
 *  Without it `count` must be a power of two >= 2 and the capacity is `count`. */
#define KVX_RING_F_EXACT_SZ 0x1u
/** Allocate the ring on a NUMA node (kvx_ring_params::numa_node) with libnuma. */
#define KVX_RING_F_NUMA 0x2u

/** Parameters of kvx_ring_create(). */
struct kvx_ring_params {
	const char *name;  /**< Diagnostic name (copied, truncated to 31 bytes); may be NULL. */
	uint32_t count;    /**< Capacity in elements (see KVX_RING_F_EXACT_SZ), <= 2^31. */
	uint32_t elem_size; /**< Element size in bytes: 0 = pointer ring (sizeof(void *)); else a
	                         multiple of 4, 4..1024 (e.g. 64-byte descriptors). */
	unsigned flags;    /**< KVX_RING_F_* bits. */
	int numa_node;     /**< NUMA node with KVX_RING_F_NUMA, ignored otherwise. */
};

struct kvx_ring;

/**
 * Create a bounded FIFO ring of pointers or of fixed-size elements.
 *
 * Any ring supports every enqueue/dequeue variant; the `_sp`/`_mp`/`_sc`/`_mc` qualifier of
 * each call is the caller's promise about concurrency: `_sp` only while no other thread
 * enqueues, `_sc` only while no other thread dequeues (docs/architecture.md: one ring per thread pair,
 * SPSC on the fast path).
 *
 * @param p         Parameters; not NULL.
 * @param[out] out  New ring; not NULL; set only on success.
 * @return          0 on success.
 * @retval -EINVAL  count 0, not a power of two (without EXACT_SZ) or > 2^31; bad elem_size;
 *                  unknown flags.
 * @retval -ENOMEM  Allocation failed.
 * @par Thread safety  Setup thread.
 */
KVX_API int kvx_ring_create(const struct kvx_ring_params *p, struct kvx_ring **out);

/**
 * Free a ring. NULL is a no-op. No thread may use it any more.
 *
 * @param r  Ring or NULL.
 */
KVX_API void kvx_ring_destroy(struct kvx_ring *r);

/**
 * Attach the consumer's waiter: every successful enqueue then calls kvx_waiter_wake().
 *
 * @param r  Ring; not NULL.
 * @param w  Waiter (e.g. kvx_lcore_waiter()), or NULL to detach.
 * @par Thread safety  Setup thread, before producers use the ring.
 */
KVX_API void kvx_ring_set_waiter(struct kvx_ring *r, struct kvx_waiter *w);

/** The ring's diagnostic name ("" if none). @param r Ring; not NULL. */
KVX_API const char *kvx_ring_name(const struct kvx_ring *r);

/* The inline hot path (struct kvx_ring body, enqueue/dequeue) follows. */
#include "kvxfer/ring_impl.h"

/**
 * Capacity of a ring, elements.
 * @param r  Ring; not NULL.
 * @return   Capacity (the `count` of kvx_ring_params).
 */
static inline uint32_t kvx_ring_capacity(const struct kvx_ring *r);

/**
 * Element size of a ring, bytes (sizeof(void *) for a pointer ring).
 * @param r  Ring; not NULL.
 * @return   Bytes per element.
 */
static inline uint32_t kvx_ring_elem_size(const struct kvx_ring *r);

/**
 * Entries in the ring (a snapshot; exact only when no thread enqueues or dequeues).
 * @param r  Ring; not NULL.
 * @return   0..capacity.
 * @par Thread safety  Any thread.
 */
static inline uint32_t kvx_ring_count(const struct kvx_ring *r);

/**
 * Free slots in the ring (snapshot, as kvx_ring_count()).
 * @param r  Ring; not NULL.
 * @return   0..capacity.
 */
static inline uint32_t kvx_ring_free_count(const struct kvx_ring *r);

/** Whether kvx_ring_count() is 0. @param r Ring; not NULL. @return true if empty. */
static inline bool kvx_ring_is_empty(const struct kvx_ring *r);

/** Whether kvx_ring_free_count() is 0. @param r Ring; not NULL. @return true if full. */
static inline bool kvx_ring_is_full(const struct kvx_ring *r);

/**
 * Enqueue up to n pointers (single-producer, best effort).
 *
 * @param r                Pointer ring (elem_size 0 at create); not NULL.
 * @param objs             Array[n] of pointers; not retained after return.
 * @param n                Count, 0..capacity.
 * @param[out] free_space  If non-NULL, free slots left after the call (elements).
 * @return                 Number enqueued, 0..n (0 when full, or if @p r is not a pointer ring).
 * @par Thread safety  One producer at a time; concurrent with any consumers.
 * @par Context        Hot path: lock-free, non-blocking, no allocation; no syscall unless a
 *                     waiter is attached and its consumer sleeps.
 * @par Ordering       Writes to the slots happen-before their dequeue (release on prod.tail).
 * @see kvx_ring_dequeue_burst_sc()
 */
static inline unsigned kvx_ring_enqueue_burst_sp(struct kvx_ring *r, void *const *objs, unsigned n,
						 unsigned *free_space);
/** As kvx_ring_enqueue_burst_sp(), safe with several concurrent producers (CAS on prod.head).
 *  @param r Ring. @param objs Array[n]. @param n Count. @param[out] free_space May be NULL.
 *  @return Number enqueued, 0..n. @par Context Lock-free; spins while an earlier producer
 *  finishes its copy (sched_yield after 1024 spins, only when that producer was preempted). */
static inline unsigned kvx_ring_enqueue_burst_mp(struct kvx_ring *r, void *const *objs, unsigned n,
						 unsigned *free_space);
/** As kvx_ring_enqueue_burst_sp(), all-or-nothing. @param r Ring. @param objs Array[n].
 *  @param n Count. @param[out] free_space May be NULL. @return n or 0. */
static inline unsigned kvx_ring_enqueue_bulk_sp(struct kvx_ring *r, void *const *objs, unsigned n,
						unsigned *free_space);
/** As kvx_ring_enqueue_burst_mp(), all-or-nothing. @param r Ring. @param objs Array[n].
 *  @param n Count. @param[out] free_space May be NULL. @return n or 0. */
static inline unsigned kvx_ring_enqueue_bulk_mp(struct kvx_ring *r, void *const *objs, unsigned n,
						unsigned *free_space);

/**
 * Dequeue up to n pointers (single-consumer, best effort).
 *
 * @param r               Pointer ring; not NULL.
 * @param[out] objs       Array[n] receiving the pointers in FIFO order.
 * @param n               Count, 0..capacity.
 * @param[out] available  If non-NULL, entries left after the call.
 * @return                Number dequeued, 0..n (0 when empty).
 * @par Thread safety  One consumer at a time; concurrent with any producers.
 * @par Context        Hot path: lock-free, non-blocking, no allocation, no syscall.
 * @par Ordering       Acquire on prod.tail pairs with the producer's release; release on
 *                     cons.tail lets producers reuse the slots after we have read them.
 */
static inline unsigned kvx_ring_dequeue_burst_sc(struct kvx_ring *r, void **objs, unsigned n,
						 unsigned *available);
/** As kvx_ring_dequeue_burst_sc(), safe with several concurrent consumers. @param r Ring.
 *  @param[out] objs Array[n]. @param n Count. @param[out] available May be NULL.
 *  @return Number dequeued, 0..n. */
static inline unsigned kvx_ring_dequeue_burst_mc(struct kvx_ring *r, void **objs, unsigned n,
						 unsigned *available);
/** As kvx_ring_dequeue_burst_sc(), all-or-nothing. @param r Ring. @param[out] objs Array[n].
 *  @param n Count. @param[out] available May be NULL. @return n or 0. */
static inline unsigned kvx_ring_dequeue_bulk_sc(struct kvx_ring *r, void **objs, unsigned n,
						unsigned *available);
/** As kvx_ring_dequeue_burst_mc(), all-or-nothing. @param r Ring. @param[out] objs Array[n].
 *  @param n Count. @param[out] available May be NULL. @return n or 0. */
static inline unsigned kvx_ring_dequeue_bulk_mc(struct kvx_ring *r, void **objs, unsigned n,
						unsigned *available);

/**
 * Enqueue one pointer (single-producer).
 * @param r    Pointer ring; not NULL.
 * @param obj  Pointer to enqueue (may be NULL).
 * @return     0 on success.
 * @retval -ENOBUFS  The ring is full.
 */
static inline int kvx_ring_enqueue_sp(struct kvx_ring *r, void *obj);
/** As kvx_ring_enqueue_sp(), multi-producer. @param r Ring. @param obj Pointer.
 *  @return 0. @retval -ENOBUFS Full. */
static inline int kvx_ring_enqueue_mp(struct kvx_ring *r, void *obj);
/**
 * Dequeue one pointer (single-consumer).
 * @param r         Pointer ring; not NULL.
 * @param[out] obj  Receives the pointer; not NULL.
 * @return          0 on success.
 * @retval -EAGAIN  The ring is empty.
 */
static inline int kvx_ring_dequeue_sc(struct kvx_ring *r, void **obj);
/** As kvx_ring_dequeue_sc(), multi-consumer. @param r Ring. @param[out] obj Pointer.
 *  @return 0. @retval -EAGAIN Empty. */
static inline int kvx_ring_dequeue_mc(struct kvx_ring *r, void **obj);

/**
 * Enqueue up to n fixed-size elements, copied by value (single-producer, best effort).
 *
 * @param r                Element ring; not NULL.
 * @param elems            Array[n] of kvx_ring_elem_size(r)-byte elements, contiguous.
 * @param n                Count, 0..capacity.
 * @param[out] free_space  If non-NULL, free slots after the call.
 * @return                 Number enqueued, 0..n.
 * @par Thread safety, Context, Ordering  As kvx_ring_enqueue_burst_sp().
 */
static inline unsigned kvx_ring_enqueue_elem_burst_sp(struct kvx_ring *r, const void *elems,
						      unsigned n, unsigned *free_space);
/** Elements, multi-producer, best effort. @param r Ring. @param elems Array[n]. @param n Count.
 *  @param[out] free_space May be NULL. @return 0..n. */
static inline unsigned kvx_ring_enqueue_elem_burst_mp(struct kvx_ring *r, const void *elems,
						      unsigned n, unsigned *free_space);
/** Elements, single-producer, all-or-nothing. @param r Ring. @param elems Array[n].
 *  @param n Count. @param[out] free_space May be NULL. @return n or 0. */
static inline unsigned kvx_ring_enqueue_elem_bulk_sp(struct kvx_ring *r, const void *elems,
						     unsigned n, unsigned *free_space);
/** Elements, multi-producer, all-or-nothing. @param r Ring. @param elems Array[n].
 *  @param n Count. @param[out] free_space May be NULL. @return n or 0. */
static inline unsigned kvx_ring_enqueue_elem_bulk_mp(struct kvx_ring *r, const void *elems,
						     unsigned n, unsigned *free_space);
/**
 * Dequeue up to n fixed-size elements (single-consumer, best effort).
 *
 * @param r               Element ring; not NULL.
 * @param[out] elems      Array[n] of kvx_ring_elem_size(r)-byte slots.
 * @param n               Count, 0..capacity.
 * @param[out] available  If non-NULL, entries left after the call.
 * @return                Number dequeued, 0..n.
 * @par Thread safety, Context, Ordering  As kvx_ring_dequeue_burst_sc().
 */
static inline unsigned kvx_ring_dequeue_elem_burst_sc(struct kvx_ring *r, void *elems, unsigned n,
						      unsigned *available);
/** Elements, multi-consumer, best effort. @param r Ring. @param[out] elems Array[n].
 *  @param n Count. @param[out] available May be NULL. @return 0..n. */
static inline unsigned kvx_ring_dequeue_elem_burst_mc(struct kvx_ring *r, void *elems, unsigned n,
						      unsigned *available);
/** Elements, single-consumer, all-or-nothing. @param r Ring. @param[out] elems Array[n].
 *  @param n Count. @param[out] available May be NULL. @return n or 0. */
static inline unsigned kvx_ring_dequeue_elem_bulk_sc(struct kvx_ring *r, void *elems, unsigned n,
						     unsigned *available);
/** Elements, multi-consumer, all-or-nothing. @param r Ring. @param[out] elems Array[n].
 *  @param n Count. @param[out] available May be NULL. @return n or 0. */
static inline unsigned kvx_ring_dequeue_elem_bulk_mc(struct kvx_ring *r, void *elems, unsigned n,
						     unsigned *available);

#ifdef __cplusplus
}
#endif
#endif /* KVX_RING_H */
