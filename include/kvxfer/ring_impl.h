/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RING_IMPL_H
#define KVX_RING_IMPL_H
/**
 * @file
 * @internal
 * Inline hot-path bodies of kvxfer/ring.h (the waiter wake is in kvxfer/waiter.h). Not for
 * direct inclusion: include kvxfer/ring.h. Layout follows docs/runtime-notes.md §1.4 (rte_ring, C11 orders of
 * rte_ring_c11_pvt.h) and §4.1 (cached opposite tail for SPSC).
 *
 * Index arithmetic: head/tail are free-running uint32_t, masked (& mask) only to address a
 * slot. All differences are taken modulo 2^32: entries = prod.tail - cons.head and
 * free = capacity + cons.tail - prod.head stay exact across the 2^32 wrap because the true
 * distance between any two indices is always <= capacity <= 2^31 < 2^32.
 *
 * Ordering edges (labels used in the comments below):
 *  R1 producer store-release of prod.tail  -> A4 consumer load-acquire of prod.tail:
 *     slot writes happen-before the consumer reads them.
 *  R2 consumer store-release of cons.tail  -> A1 producer load-acquire of cons.tail:
 *     slot reads happen-before a producer overwrites the slots.
 *  R3 MP head CAS (acq_rel)                -> A2 next MP producer's acquire of prod.head:
 *     the cons.tail it checked is visible, so head - cons.tail <= capacity holds for it.
 *  R5 MC head CAS (acq_rel)                -> A5 next MC consumer's acquire of cons.head.
 *  A3/A6 MP/MC wait for the previous producer's/consumer's tail (acquire of its R1/R2) so our
 *     own R1/R2 publishes its slots too.
 *  W1 waiter: seq_cst fence after R1 in kvx_waiter_wake() vs P1, the seq_cst fence after
 *     sleeping = 1 in kvx_waiter_prepare(): one side sees the other's store. Under TSan both
 *     sides use acq_rel RMWs on sleeping instead (same guarantee, fences are not modelled).
 */
#ifndef KVX_RING_H
#error "kvxfer/ring_impl.h is not for direct inclusion; include kvxfer/ring.h"
#endif

#include <assert.h>
#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** @internal Spin-wait hint (x86 PAUSE, arm64 YIELD). */
static inline void kvx_lcore_pause_impl(void)
{
#if defined(__x86_64__) || defined(__i386__)
	_mm_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#endif
}

/** @internal Out-of-line yield used when an earlier MP/MC thread was preempted mid-copy. */
KVX_API KVX_COLD void kvx_ring_yield_impl(void);
/** @internal One side (producer or consumer) of a ring: head, tail, cached opposite tail. */
struct kvx_ring_headtail_impl {
	_Atomic uint32_t head; /**< Next index to reserve. */
	_Atomic uint32_t tail; /**< Index up to which the side has finished (published). */
	uint32_t opp_cache;    /**< SP/SC only: last opposite tail seen (private to that thread). */
};

/** @internal Ring body; exposed only for the inline hot path. Fields are private. */
struct kvx_ring {
	uint32_t mask;            /**< size - 1 (size = power of two). */
	uint32_t capacity;        /**< Usable elements, <= size. */
	uint32_t esize;           /**< Bytes per element. */
	uint32_t flags;           /**< KVX_RING_F_* given at create. */
	struct kvx_waiter *waiter; /**< Consumer's waiter, or NULL. */
	void *slots;              /**< Array[size] of esize-byte elements (cache-line aligned). */
	void *alloc_base;         /**< What to free. */
	size_t alloc_len;         /**< Bytes allocated (for numa_free). */
	char name[32];            /**< Diagnostic name. */
	alignas(KVX_CACHE_LINE) struct kvx_ring_headtail_impl prod; /**< Producer line. */
	char guard_prod[KVX_CACHE_LINE]; /**< Guard line: no adjacent-line prefetch sharing. */
	alignas(KVX_CACHE_LINE) struct kvx_ring_headtail_impl cons; /**< Consumer line. */
	char guard_cons[KVX_CACHE_LINE]; /**< Guard line. */
};

static_assert(offsetof(struct kvx_ring, prod) % KVX_CACHE_LINE == 0, "prod on its own line");
static_assert(offsetof(struct kvx_ring, cons) % KVX_CACHE_LINE == 0, "cons on its own line");
static_assert(offsetof(struct kvx_ring, prod) >= KVX_CACHE_LINE, "prod apart from config line");
static_assert(offsetof(struct kvx_ring, cons) - offsetof(struct kvx_ring, prod) >= 2 * KVX_CACHE_LINE,
	      "prod and cons separated by a guard line");
static_assert(sizeof(struct kvx_ring) - offsetof(struct kvx_ring, cons) >= 2 * KVX_CACHE_LINE,
	      "guard line after cons");

static inline uint32_t kvx_ring_capacity(const struct kvx_ring *r)
{
	return r->capacity;
}

static inline uint32_t kvx_ring_elem_size(const struct kvx_ring *r)
{
	return r->esize;
}

static inline uint32_t kvx_ring_count(const struct kvx_ring *r)
{
	uint32_t ct = atomic_load_explicit(&r->cons.tail, memory_order_relaxed);
	uint32_t pt = atomic_load_explicit(&r->prod.tail, memory_order_relaxed);
	uint32_t n = pt - ct;
	/* The two loads are not one snapshot: clamp (a negative distance reads as huge). */
	return n > r->capacity ? (n > (UINT32_MAX >> 1) ? 0 : r->capacity) : n;
}

static inline uint32_t kvx_ring_free_count(const struct kvx_ring *r)
{
	return r->capacity - kvx_ring_count(r);
}

static inline bool kvx_ring_is_empty(const struct kvx_ring *r)
{
	return kvx_ring_count(r) == 0;
}

static inline bool kvx_ring_is_full(const struct kvx_ring *r)
{
	return kvx_ring_count(r) == r->capacity;
}

/** @internal Copy n elements into the slots starting at index @p head (wraps once at most). */
static inline void kvx_ring_copy_in_impl(struct kvx_ring *r, uint32_t head, const void *src,
					 unsigned n, bool ptrs)
{
	uint32_t idx = head & r->mask;
	uint32_t size = r->mask + 1;
	uint32_t first = size - idx < n ? size - idx : n;
	if (ptrs) {
		void **slots = (void **)r->slots;
		void *const *objs = (void *const *)src;
		for (uint32_t i = 0; i < first; i++)
			slots[idx + i] = objs[i];
		for (uint32_t i = first; i < n; i++)
			slots[i - first] = objs[i];
	} else {
		const unsigned char *s = (const unsigned char *)src;
		unsigned char *d = (unsigned char *)r->slots;
		memcpy(d + (size_t)idx * r->esize, s, (size_t)first * r->esize);
		if (n > first)
			memcpy(d, s + (size_t)first * r->esize, (size_t)(n - first) * r->esize);
	}
}

/** @internal Copy n elements out of the slots starting at index @p head. */
static inline void kvx_ring_copy_out_impl(const struct kvx_ring *r, uint32_t head, void *dst,
					  unsigned n, bool ptrs)
{
	uint32_t idx = head & r->mask;
	uint32_t size = r->mask + 1;
	uint32_t first = size - idx < n ? size - idx : n;
	if (ptrs) {
		void *const *slots = (void *const *)r->slots;
		void **objs = (void **)dst;
		for (uint32_t i = 0; i < first; i++)
			objs[i] = slots[idx + i];
		for (uint32_t i = first; i < n; i++)
			objs[i] = slots[i - first];
	} else {
		const unsigned char *s = (const unsigned char *)r->slots;
		unsigned char *d = (unsigned char *)dst;
		memcpy(d, s + (size_t)idx * r->esize, (size_t)first * r->esize);
		if (n > first)
			memcpy(d + (size_t)first * r->esize, s, (size_t)(n - first) * r->esize);
	}
}

/** @internal Wait until an earlier MP producer / MC consumer has published up to @p expect. */
static inline void kvx_ring_wait_tail_impl(_Atomic uint32_t *tail, uint32_t expect)
{
	unsigned spins = 0;
	/* A3/A6: acquire, so the earlier thread's slot accesses are ordered before our release. */
	while (atomic_load_explicit(tail, memory_order_acquire) != expect) {
		kvx_lcore_pause_impl();
		if (KVX_UNLIKELY(++spins == 1024)) {
			spins = 0;
			kvx_ring_yield_impl(); /* that thread was preempted: let it run */
		}
	}
}

/** @internal Generic enqueue: mp = multi-producer, fixed = all-or-nothing, ptrs = pointer ring. */
static inline unsigned kvx_ring_enqueue_impl(struct kvx_ring *r, const void *src, unsigned n,
					     bool mp, bool fixed, bool ptrs, unsigned *free_space)
{
	uint32_t head, next, free_entries;
	unsigned want = n;
	const uint32_t cap = r->capacity;
	if (!mp) {
		head = atomic_load_explicit(&r->prod.head, memory_order_relaxed); /* only we write it */
		free_entries = cap + r->prod.opp_cache - head;
		/* Reload the consumer tail when the cache is short, or stale beyond capacity
		 * (another enqueue mode ran in between). */
		if (free_entries < want || free_entries > cap) {
			/* A1: pairs with R2; the consumer is done reading the slots we reuse. */
			r->prod.opp_cache = atomic_load_explicit(&r->cons.tail, memory_order_acquire);
			free_entries = cap + r->prod.opp_cache - head;
		}
		if (want > free_entries)
			n = fixed ? 0 : free_entries;
		if (n == 0)
			goto out;
		next = head + n;
		atomic_store_explicit(&r->prod.head, next, memory_order_relaxed);
	} else {
		/* A2: pairs with R3 of the producer that stored this head. */
		head = atomic_load_explicit(&r->prod.head, memory_order_acquire);
		do {
			/* A1: pairs with R2. */
			uint32_t ct = atomic_load_explicit(&r->cons.tail, memory_order_acquire);
			free_entries = cap + ct - head;
			n = want;
			if (want > free_entries)
				n = fixed ? 0 : free_entries;
			if (n == 0)
				goto out;
			next = head + n;
			/* R3 on success; A2 on failure (head reloaded). */
		} while (!atomic_compare_exchange_weak_explicit(&r->prod.head, &head, next,
								memory_order_acq_rel,
								memory_order_acquire));
	}
	kvx_ring_copy_in_impl(r, head, src, n, ptrs);
	if (mp)
		kvx_ring_wait_tail_impl(&r->prod.tail, head);
	/* R1: slot writes happen-before the consumer's A4. */
	atomic_store_explicit(&r->prod.tail, next, memory_order_release);
	if (r->waiter)
		kvx_waiter_wake(r->waiter);
out:
	if (free_space)
		*free_space = free_entries - n;
	return n;
}

/** @internal Generic dequeue: mc = multi-consumer, fixed = all-or-nothing, ptrs = pointer ring. */
static inline unsigned kvx_ring_dequeue_impl(struct kvx_ring *r, void *dst, unsigned n, bool mc,
					     bool fixed, bool ptrs, unsigned *available)
{
	uint32_t head, next, entries;
	unsigned want = n;
	const uint32_t cap = r->capacity;
	if (!mc) {
		head = atomic_load_explicit(&r->cons.head, memory_order_relaxed); /* only we write it */
		entries = r->cons.opp_cache - head;
		if (entries < want || entries > cap) {
			/* A4: pairs with R1; the producer's slot writes are visible. */
			r->cons.opp_cache = atomic_load_explicit(&r->prod.tail, memory_order_acquire);
			entries = r->cons.opp_cache - head;
		}
		if (want > entries)
			n = fixed ? 0 : entries;
		if (n == 0)
			goto out;
		next = head + n;
		atomic_store_explicit(&r->cons.head, next, memory_order_relaxed);
	} else {
		/* A5: pairs with R5 of the consumer that stored this head. */
		head = atomic_load_explicit(&r->cons.head, memory_order_acquire);
		do {
			/* A4: pairs with R1. */
			uint32_t pt = atomic_load_explicit(&r->prod.tail, memory_order_acquire);
			entries = pt - head;
			n = want;
			if (want > entries)
				n = fixed ? 0 : entries;
			if (n == 0)
				goto out;
			next = head + n;
			/* R5 on success; A5 on failure. */
		} while (!atomic_compare_exchange_weak_explicit(&r->cons.head, &head, next,
								memory_order_acq_rel,
								memory_order_acquire));
	}
	kvx_ring_copy_out_impl(r, head, dst, n, ptrs);
	if (mc)
		kvx_ring_wait_tail_impl(&r->cons.tail, head);
	/* R2: our slot reads happen-before a producer's A1 that reuses the slots. */
	atomic_store_explicit(&r->cons.tail, next, memory_order_release);
out:
	if (available)
		*available = entries - n;
	return n;
}

/** @internal Pointer API on an element ring is a caller bug: do nothing. */
static inline bool kvx_ring_is_ptr_impl(const struct kvx_ring *r, unsigned *out_count)
{
	if (KVX_LIKELY(r->esize == sizeof(void *)))
		return true;
	if (out_count)
		*out_count = 0;
	return false;
}

#define KVX_RING_PTR_OP_IMPL(r, cnt, call) (kvx_ring_is_ptr_impl((r), (cnt)) ? (call) : 0u)

static inline unsigned kvx_ring_enqueue_burst_sp(struct kvx_ring *r, void *const *objs, unsigned n,
						 unsigned *free_space)
{
	return KVX_RING_PTR_OP_IMPL(r, free_space,
				    kvx_ring_enqueue_impl(r, objs, n, false, false, true, free_space));
}

static inline unsigned kvx_ring_enqueue_burst_mp(struct kvx_ring *r, void *const *objs, unsigned n,
						 unsigned *free_space)
{
	return KVX_RING_PTR_OP_IMPL(r, free_space,
				    kvx_ring_enqueue_impl(r, objs, n, true, false, true, free_space));
}

static inline unsigned kvx_ring_enqueue_bulk_sp(struct kvx_ring *r, void *const *objs, unsigned n,
						unsigned *free_space)
{
	return KVX_RING_PTR_OP_IMPL(r, free_space,
				    kvx_ring_enqueue_impl(r, objs, n, false, true, true, free_space));
}

static inline unsigned kvx_ring_enqueue_bulk_mp(struct kvx_ring *r, void *const *objs, unsigned n,
						unsigned *free_space)
{
	return KVX_RING_PTR_OP_IMPL(r, free_space,
				    kvx_ring_enqueue_impl(r, objs, n, true, true, true, free_space));
}

static inline unsigned kvx_ring_dequeue_burst_sc(struct kvx_ring *r, void **objs, unsigned n,
						 unsigned *available)
{
	return KVX_RING_PTR_OP_IMPL(r, available,
				    kvx_ring_dequeue_impl(r, objs, n, false, false, true, available));
}

static inline unsigned kvx_ring_dequeue_burst_mc(struct kvx_ring *r, void **objs, unsigned n,
						 unsigned *available)
{
	return KVX_RING_PTR_OP_IMPL(r, available,
				    kvx_ring_dequeue_impl(r, objs, n, true, false, true, available));
}

static inline unsigned kvx_ring_dequeue_bulk_sc(struct kvx_ring *r, void **objs, unsigned n,
						unsigned *available)
{
	return KVX_RING_PTR_OP_IMPL(r, available,
				    kvx_ring_dequeue_impl(r, objs, n, false, true, true, available));
}

static inline unsigned kvx_ring_dequeue_bulk_mc(struct kvx_ring *r, void **objs, unsigned n,
						unsigned *available)
{
	return KVX_RING_PTR_OP_IMPL(r, available,
				    kvx_ring_dequeue_impl(r, objs, n, true, true, true, available));
}

static inline int kvx_ring_enqueue_sp(struct kvx_ring *r, void *obj)
{
	return kvx_ring_enqueue_bulk_sp(r, &obj, 1, NULL) ? 0 : -ENOBUFS;
}

static inline int kvx_ring_enqueue_mp(struct kvx_ring *r, void *obj)
{
	return kvx_ring_enqueue_bulk_mp(r, &obj, 1, NULL) ? 0 : -ENOBUFS;
}

static inline int kvx_ring_dequeue_sc(struct kvx_ring *r, void **obj)
{
	return kvx_ring_dequeue_bulk_sc(r, obj, 1, NULL) ? 0 : -EAGAIN;
}

static inline int kvx_ring_dequeue_mc(struct kvx_ring *r, void **obj)
{
	return kvx_ring_dequeue_bulk_mc(r, obj, 1, NULL) ? 0 : -EAGAIN;
}

static inline unsigned kvx_ring_enqueue_elem_burst_sp(struct kvx_ring *r, const void *elems,
						      unsigned n, unsigned *free_space)
{
	return kvx_ring_enqueue_impl(r, elems, n, false, false, false, free_space);
}

static inline unsigned kvx_ring_enqueue_elem_burst_mp(struct kvx_ring *r, const void *elems,
						      unsigned n, unsigned *free_space)
{
	return kvx_ring_enqueue_impl(r, elems, n, true, false, false, free_space);
}

static inline unsigned kvx_ring_enqueue_elem_bulk_sp(struct kvx_ring *r, const void *elems,
						     unsigned n, unsigned *free_space)
{
	return kvx_ring_enqueue_impl(r, elems, n, false, true, false, free_space);
}

static inline unsigned kvx_ring_enqueue_elem_bulk_mp(struct kvx_ring *r, const void *elems,
						     unsigned n, unsigned *free_space)
{
	return kvx_ring_enqueue_impl(r, elems, n, true, true, false, free_space);
}

static inline unsigned kvx_ring_dequeue_elem_burst_sc(struct kvx_ring *r, void *elems, unsigned n,
						      unsigned *available)
{
	return kvx_ring_dequeue_impl(r, elems, n, false, false, false, available);
}

static inline unsigned kvx_ring_dequeue_elem_burst_mc(struct kvx_ring *r, void *elems, unsigned n,
						      unsigned *available)
{
	return kvx_ring_dequeue_impl(r, elems, n, true, false, false, available);
}

static inline unsigned kvx_ring_dequeue_elem_bulk_sc(struct kvx_ring *r, void *elems, unsigned n,
						     unsigned *available)
{
	return kvx_ring_dequeue_impl(r, elems, n, false, true, false, available);
}

static inline unsigned kvx_ring_dequeue_elem_bulk_mc(struct kvx_ring *r, void *elems, unsigned n,
						     unsigned *available)
{
	return kvx_ring_dequeue_impl(r, elems, n, true, true, false, available);
}

#ifdef __cplusplus
}
#endif
#endif /* KVX_RING_IMPL_H */

