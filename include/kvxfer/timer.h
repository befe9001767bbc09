/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_TIMER_H
#define KVX_TIMER_H
/**
 * @file
 * kvx_timer: a binary min-heap of monotonic deadlines with O(log n) arm/cancel, owned by one
 * thread (the control lcore, or an lcore through kvx_lcore_attach_timers()). Included by
 * kvxfer/lcore.h.
 */
#include <stdbool.h>
#include <stdint.h>

#include "kvxfer/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
 * Timers (control lcore): binary min-heap of monotonic deadlines, O(log n) arm/cancel
 * ========================================================================================== */

struct kvx_timer;
struct kvx_timer_heap;
/** Timer callback; runs from kvx_timer_heap_run() on the owner thread. It may re-arm or
 *  cancel any timer of the heap (itself included) and arm new ones. */
typedef void (*kvx_timer_fn)(struct kvx_timer *t, void *arg);

/** A timer; caller's memory, kvx_timer_init() before use. Fields are private. */
struct kvx_timer {
	uint64_t deadline_ns; /**< Private: absolute kvx_now_ns() deadline while armed. */
	uint64_t seq;         /**< Private: arm order (FIFO among equal deadlines). */
	uint32_t heap_idx;    /**< Private: position in the heap, UINT32_MAX when not armed. */
	kvx_timer_fn fn;      /**< Private: callback. */
	void *arg;            /**< Private: its argument. */
};

/**
 * Create a timer heap. Single-threaded: every call on the heap and its timers comes from one
 * owner thread (the control lcore), which calls kvx_timer_heap_run() from its loop and uses
 * kvx_timer_heap_timeout_ms() as its poll timeout.
 *
 * @param capacity_hint  Initial slots (grows by doubling as needed); 0 = 64.
 * @param[out] out       New heap; not NULL.
 * @return               0 on success.
 * @retval -ENOMEM       Allocation failed.
 */
KVX_API int kvx_timer_heap_create(uint32_t capacity_hint, struct kvx_timer_heap **out);

/**
 * Destroy a heap; armed timers are disarmed, not run. NULL is a no-op.
 * @param h  Heap or NULL.
 */
KVX_API void kvx_timer_heap_destroy(struct kvx_timer_heap *h);

/**
 * Initialise a timer (not armed).
 * @param[out] t  Timer; not NULL.
 * @param fn      Callback; not NULL.
 * @param arg     Its argument.
 */
KVX_API void kvx_timer_init(struct kvx_timer *t, kvx_timer_fn fn, void *arg);

/**
 * Arm (or re-arm) a timer at an absolute monotonic deadline. O(log n).
 *
 * @param h            Heap; not NULL.
 * @param t            Timer (kvx_timer_init()); not NULL; not armed on another heap.
 * @param deadline_ns  Absolute deadline, kvx_now_ns() clock, ns (past = runs at the next run).
 * @return             0 on success.
 * @retval -ENOMEM     The heap had to grow and could not.
 * @par Thread safety  The heap's owner thread.
 */
KVX_API int kvx_timer_arm(struct kvx_timer_heap *h, struct kvx_timer *t, uint64_t deadline_ns);

/**
 * Cancel a timer. O(log n).
 * @param h  Heap; not NULL.
 * @param t  Timer; not NULL.
 * @return   true if it was armed, false if not (already run or never armed).
 */
KVX_API bool kvx_timer_cancel(struct kvx_timer_heap *h, struct kvx_timer *t);

/** Whether a timer is armed. @param t Timer; not NULL. @return true if armed. */
KVX_API bool kvx_timer_is_armed(const struct kvx_timer *t);

/**
 * Run every timer whose deadline is <= now_ns, earliest first. A callback that re-arms with a
 * deadline <= now_ns runs again only on the next call (no livelock).
 *
 * @param h       Heap; not NULL.
 * @param now_ns  Current time, kvx_now_ns() clock.
 * @return        Number of callbacks run.
 */
KVX_API unsigned kvx_timer_heap_run(struct kvx_timer_heap *h, uint64_t now_ns);

/**
 * Earliest armed deadline.
 * @param h  Heap; not NULL.
 * @return   Deadline, ns; UINT64_MAX if no timer is armed.
 */
KVX_API uint64_t kvx_timer_heap_next_ns(const struct kvx_timer_heap *h);

/**
 * Poll timeout until the next deadline, rounded up to whole ms (for zmq_poll / poll).
 * @param h       Heap; not NULL.
 * @param now_ns  Current time, ns.
 * @return        -1 if no timer is armed, 0 if one is due, else ceil((next - now) / 1 ms),
 *                capped at INT32_MAX.
 */
KVX_API int kvx_timer_heap_timeout_ms(const struct kvx_timer_heap *h, uint64_t now_ns);

/** Number of armed timers. @param h Heap; not NULL. @return Count. */
KVX_API uint32_t kvx_timer_heap_count(const struct kvx_timer_heap *h);

#ifdef __cplusplus
}
#endif
#endif /* KVX_TIMER_H */
