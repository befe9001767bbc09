/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVX_RUNTIME_FENCE_H
#define KVX_RUNTIME_FENCE_H
/*
 * Module-private: confirming a reader fence when several threads serve the tcp target
 * (docs/architecture.md §3, "Who serves tcp requests").
 *
 * The control thread cuts: it destroys the target endpoints, then publishes cut number c
 * (release). Each of the n threads that run target progress loads the cut (acquire) before a
 * round of progress calls and, once that round has returned, records it with
 * kvx_fence_note(). A call that began after the cut serves no destroyed endpoint, so fence c
 * is done once every thread has recorded c or later: done is the smallest record.
 *
 * struct kvx_fence_set: seen[k] is written by thread k only; done by whichever thread records
 * last (compare-and-swap, it only grows); both are read by any thread. n is set before the
 * threads run.
 */
#include <stdatomic.h>
#include <stdint.h>

#define KVX_FENCE_MAX_THREADS 16

struct kvx_fence_set {
	_Atomic uint64_t done;
	_Atomic uint64_t seen[KVX_FENCE_MAX_THREADS];
	uint32_t n; /* threads that record, 1..KVX_FENCE_MAX_THREADS */
};

/**
 * Thread k's progress calls since it loaded @p cut have returned: record @p cut for k and
 * advance done to the smallest record of the n threads.
 *
 * Each thread stores its record, then loads every record (all sequentially consistent), so of
 * two threads recording at once at least one sees the other's record: the last thread to record
 * a cut advances done to it. A record equal to the thread's last one costs one relaxed load.
 *
 * @param f    The set; not NULL.
 * @param k    The calling thread's index, 0..f->n-1.
 * @param cut  The cut it loaded before the calls; not below its previous record.
 * @return     done as this call left it (done may be higher by the time it returns).
 * @par Thread safety  Thread k only, for its own k; any number of threads with distinct k.
 * @par Source  kvxfer (issue 16).
 */
uint64_t kvx_fence_note(struct kvx_fence_set *f, uint32_t k, uint64_t cut);

/**
 * The last confirmed cut. Acquire: what the threads did before their records is visible (a
 * buffer they no longer serve can be reused).
 *
 * @param f  The set; not NULL.
 * @return   The smallest cut every thread has recorded (0 before any).
 * @par Thread safety  Any thread.
 */
static inline uint64_t kvx_fence_done(struct kvx_fence_set *f)
{
	return atomic_load_explicit(&f->done, memory_order_acquire);
}

#endif /* KVX_RUNTIME_FENCE_H */
