/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_WAITER_H
#define KVX_WAITER_H
/**
 * @file
 * kvx_waiter: eventfd + "sleeping" flag, the race-free sleep/wake hand-off between producers
 * and one consumer thread (docs/runtime-notes.md §1.7). Rings wake their consumer's waiter
 * (kvx_ring_set_waiter(), kvxfer/ring.h); lcores own one each (kvx_lcore_waiter()).
 * Included by kvxfer/lcore.h.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * Waiter: eventfd + "sleeping" flag, race-free sleep/wake between producers and a consumer
 * ========================================================================================== */

/**
 * Waiter of one consumer thread. Caller's memory (init/fini); fields are private (body
 * exposed only for the inline wake on the ring hot path).
 *
 * Protocol (no lost wake-up):
 *   consumer: kvx_waiter_prepare(w); re-check every source (rings, sockets);
 *             if work -> kvx_waiter_cancel(w); else kvx_waiter_sleep(w, t) or, when the fd
 *             sits in another poll set (zmq_poll), poll then kvx_waiter_finish(w).
 *   producer: publish the work (release), then kvx_waiter_wake(w).
 * prepare stores sleeping = 1 then a seq_cst fence before the re-check; wake issues a seq_cst
 * fence after publishing, then reads sleeping: at least one side sees the other's store
 * (store-buffer litmus, forbidden with two seq_cst fences). Only the producer that swaps
 * sleeping 1 -> 0 writes the eventfd, so an awake consumer costs producers one fence + load.
 * With an lcore's `follow_waker`, that producer also narrows the consumer's affinity to its own
 * CPU between the swap and the write; who writes, and when, is unchanged.
 */
struct kvx_waiter {
	_Alignas(KVX_CACHE_LINE) _Atomic uint32_t sleeping; /**< Private: 1 = consumer may sleep. */
	int efd;                 /**< Private: the eventfd (EFD_NONBLOCK | EFD_CLOEXEC), -1 if none. */
	_Atomic uint64_t wakes;  /**< Private: eventfd writes done by wakers. */
	_Atomic int32_t follow_tid;   /**< Private: consumer's thread id while it follows its
	                                   wakers to their CPU (lcore idle `follow_waker`), else 0. */
	_Atomic uint32_t narrowed;    /**< Private: 1 = a waker moved the consumer to its own CPU. */
	_Atomic uint64_t follow_cpus; /**< Private: bit c = a waker on CPU c may move the consumer
	                                   there (c < 64). */
	_Atomic uint64_t follow_home; /**< Private: the consumer's own CPUs as a bitmask; a waker on
	                                   its only CPU has nothing to move. */
	_Atomic uint32_t in_follow;   /**< Private: wakers between reading follow_tid and narrowed. */
	_Atomic uint64_t narrows;     /**< Private: affinity moves made by wakers (diagnostics, tests). */
};

/**
 * Initialise a waiter (creates its eventfd).
 *
 * @param[out] w    Waiter; not NULL.
 * @return          0 on success.
 * @retval -EMFILE  Too many open files (or another negative errno from eventfd(2)).
 * @par Thread safety  Setup thread.
 */
KVX_API int kvx_waiter_init(struct kvx_waiter *w);

/**
 * Release a waiter (closes its eventfd). Idempotent: a second call is a no-op.
 *
 * @param w  Waiter; not NULL. No producer may call kvx_waiter_wake() on it any more.
 */
KVX_API void kvx_waiter_fini(struct kvx_waiter *w);

/**
 * The waiter's eventfd, readable (POLLIN) after a wake; put it in a poll/zmq_poll set.
 *
 * @param w  Waiter; not NULL.
 * @return   File descriptor (>= 0) after kvx_waiter_init().
 */
KVX_API int kvx_waiter_fd(const struct kvx_waiter *w);

/**
 * Consumer: announce the intent to sleep (sleeping = 1, seq_cst fence). The caller must then
 * re-check all its sources before sleeping.
 *
 * @param w  Waiter; not NULL.
 * @par Thread safety  The waiter's one consumer thread.
 */
KVX_API void kvx_waiter_prepare(struct kvx_waiter *w);

/**
 * Consumer: abandon a prepared sleep (work was found on the re-check).
 *
 * @param w  Waiter; not NULL.
 * @par Thread safety  The waiter's consumer thread.
 */
KVX_API void kvx_waiter_cancel(struct kvx_waiter *w);

/**
 * Consumer: sleep after kvx_waiter_prepare() until a wake or a timeout (ppoll on the eventfd),
 * then drain the eventfd and clear the sleeping flag.
 *
 * @param w           Waiter; not NULL; prepared.
 * @param timeout_ns  Longest sleep, ns; UINT64_MAX = no timeout.
 * @return            1 if woken through the eventfd, 0 on timeout or signal.
 * @retval -EBADF     The waiter is not initialised (or another ppoll errno).
 * @par Context  Blocking syscall: a QSBR reader must be offline (kvx_rcu_offline()).
 */
KVX_API int kvx_waiter_sleep(struct kvx_waiter *w, uint64_t timeout_ns);

/**
 * Consumer: after an external poll (zmq_poll) that included kvx_waiter_fd() returned, drain
 * the eventfd (non-blocking read) and clear the sleeping flag.
 *
 * @param w  Waiter; not NULL.
 * @return   true if the eventfd had been signalled.
 */
KVX_API bool kvx_waiter_finish(struct kvx_waiter *w);

/**
 * Producer: wake the consumer if it is (about to be) asleep. Call after publishing the work.
 *
 * @param w  Waiter; not NULL.
 * @par Thread safety  Any number of threads.
 * @par Context  Hot path: one seq_cst fence and one load; eventfd write(2) only when the
 *               consumer is asleep.
 */
static inline void kvx_waiter_wake(struct kvx_waiter *w);

/**
 * Whether the consumer has announced a sleep (kvx_waiter_prepare()) that no wake, cancel or
 * finish has ended yet (diagnostics, tests, benchmarks).
 *
 * @param w  Waiter; not NULL.
 * @return   true while the sleeping flag is set.
 * @par Thread safety  Any thread (relaxed load; a snapshot).
 */
KVX_API bool kvx_waiter_is_sleeping(const struct kvx_waiter *w);

/**
 * Eventfd writes performed by kvx_waiter_wake() so far (diagnostics, tests).
 *
 * @param w  Waiter; not NULL.
 * @return   Count.
 */
KVX_API uint64_t kvx_waiter_wake_count(const struct kvx_waiter *w);

/* ---- Inline hot path (ordering edge W1/P1: see kvxfer/ring_impl.h) ---------------------- */

/** @internal Out-of-line slow part of kvx_waiter_wake(): swap sleeping 1 -> 0, write eventfd. */
KVX_API KVX_COLD void kvx_waiter_signal_impl(struct kvx_waiter *w);

static inline void kvx_waiter_wake(struct kvx_waiter *w)
{
#if defined(__SANITIZE_THREAD__)
	/* TSan does not model fences (gcc rejects them with -fsanitize=thread): use the RMW form
	 * of W1. Our RMW and the consumer's exchange in kvx_waiter_prepare() are ordered in the
	 * modification order of sleeping; whichever comes second reads the other's value and
	 * synchronizes with it (acq_rel), so again one side sees the other. */
	uint32_t sleeping = atomic_fetch_or_explicit(&w->sleeping, 0, memory_order_acq_rel);
#else
	/* W1: pairs with P1 in kvx_waiter_prepare(); orders our earlier publish (R1) before the
	 * load of sleeping. A fence + plain load keeps the waiter's line shared among producers. */
	atomic_thread_fence(memory_order_seq_cst);
	uint32_t sleeping = atomic_load_explicit(&w->sleeping, memory_order_relaxed);
#endif
	if (KVX_UNLIKELY(sleeping))
		kvx_waiter_signal_impl(w);
}

#ifdef __cplusplus
}
#endif
#endif /* KVX_WAITER_H */
